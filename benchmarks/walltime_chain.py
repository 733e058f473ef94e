"""A run that needs about three times its job's walltime, finished by a chain of Slurm jobs on the real Slurm of the
tests (slurmctld + slurmd "fake nodes" on this host, tests/slurmcluster.py). Run as root:

    python benchmarks/walltime_chain.py                       # --time 00:02:00, a ~4-minute run, --max-jobs 6

Each job: `herd launch slurm --time T --max-jobs N` (Slurm signals the driver --signal-lead seconds before the
walltime; it checkpoints, exits 75; the job submits the next one, which resumes the trial). Prints one line per job
(its state, exit code, the iterations it ran) and checks that the trial's iterations are contiguous and its
env-step counter never goes back.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from clustertools import subprocess_env  # noqa: E402
from slurmcluster import SlurmCluster  # noqa: E402


def main() -> None:
    """Launch the chain, follow it job by job, print what each did."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time", default="00:02:00", help="each job's walltime (Slurm counts whole minutes)")
    parser.add_argument("--lead", type=int, default=45, help="--signal-lead seconds")
    parser.add_argument("--iters", type=int, default=90, help="the run's --stop-iters (~2.5 s each here)")
    parser.add_argument("--max-jobs", type=int, default=6)
    args = parser.parse_args()
    import subprocess

    with SlurmCluster(nodes=1) as slurm, tempfile.TemporaryDirectory(prefix="chain") as tmp:
        env = subprocess_env(SLURM_CONF=str(slurm.conf))
        out = Path(tmp) / "results"
        start = time.monotonic()
        done = subprocess.run(
            ["herd", "launch", "slurm", "--nodes", "1", "--object-store-memory", "80000000", "--time", args.time,
             "--signal-lead", str(args.lead), "--max-jobs", str(args.max_jobs), "--output", str(out), "--",
             "herd", "train", "ppo", "--env", "herd/Latency-v0", "--config", "train_batch_size=1000",
             "minibatch_size=250", "--stop-iters", str(args.iters), "--output", str(out)],
            cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        job = re.search(r"submitted job (\d+)", done.stdout).group(1)
        print("| job | state | exit | iterations | wall s |\n|---|---|---|---|---|", flush=True)
        seen = 0
        while job:
            began = time.monotonic()
            info = slurm.wait_job(job, timeout=3600)
            log = next(out.glob(f"launch/*/slurm-{job}.out")).read_text()
            rows = [json.loads(line) for line in next(out.glob("herd_Latency-v0/*/result.json")).read_text()
                    .splitlines()]
            last = rows[-1]["training_iteration"] if rows else 0
            resumed = re.search(r"resuming from checkpoint_0*(\d+)", log)
            first = int(resumed.group(1)) + 1 if resumed else 1
            print(f"| {job} | {info['JobState']} | {info['ExitCode']} | {first}..{last} | "
                  f"{time.monotonic() - began:.0f} |", flush=True)
            seen += 1
            following = re.search(r"submitted job (\d+)", log)
            job = following.group(1) if following else None
        iterations = [r["training_iteration"] for r in rows]
        steps = [r["num_env_steps_sampled_lifetime"] for r in rows]
        print(f"\n{seen} jobs, {time.monotonic() - start:.0f} s; iterations 1..{iterations[-1]} contiguous: "
              f"{iterations == list(range(1, len(iterations) + 1))}; env steps never back: {steps == sorted(steps)}; "
              f"finished: {iterations[-1] >= args.iters}")


if __name__ == "__main__":
    main()
