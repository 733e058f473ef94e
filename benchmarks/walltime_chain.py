"""A run that needs about three times its job's walltime, finished by a chain of Slurm jobs on the real Slurm of the
tests (slurmctld + slurmd "fake nodes" on this host, tests/slurmcluster.py). Run as root:

    python benchmarks/walltime_chain.py                       # --time 00:02:00, a ~4-minute run, --max-jobs 6
    python benchmarks/walltime_chain.py --tune                # the same for a 2-trial `herd tune` sweep

Each job: `herd launch slurm --time T --max-jobs N` (Slurm signals the driver --signal-lead seconds before the
walltime; it checkpoints, exits 75; the job submits the next one, which resumes the trial; a sweep's
trials each checkpoint and the next job's `herd tune --resume` continues them). Prints one line per job (its state,
exit code, the iterations each trial had at its end) and checks that every trial's iterations are contiguous and its
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
    parser.add_argument("--tune", action="store_true", help="chain a 2-trial `herd tune` sweep instead")
    args = parser.parse_args()
    import subprocess

    with SlurmCluster(nodes=1) as slurm, tempfile.TemporaryDirectory(prefix="chain") as tmp:
        env = subprocess_env(SLURM_CONF=str(slurm.conf))
        out = Path(tmp) / "results"
        start = time.monotonic()
        if args.tune:
            (Path(tmp) / "sweep.yaml").write_text(
                f"name: chain\nalgorithm: PPO\nenv: herd/Latency-v0\nstop: {{training_iteration: {args.iters}}}\n"
                "config:\n  train_batch_size: 1000\n  minibatch_size: 250\n  lr: {grid_search: [1e-4, 3e-4]}\n")
            driver, results = ["herd", "tune", "-f", "sweep.yaml", "--output", str(out), "--verbose", "0"], "chain/*"
        else:
            driver = ["herd", "train", "ppo", "--env", "herd/Latency-v0", "--config", "train_batch_size=1000",
                      "minibatch_size=250", "--stop-iters", str(args.iters), "--output", str(out)]
            results = "herd_Latency-v0/*"
        done = subprocess.run(
            ["herd", "launch", "slurm", "--nodes", "1", "--object-store-memory", "80000000", "--time", args.time,
             "--signal-lead", str(args.lead), "--max-jobs", str(args.max_jobs), "--output", str(out), "--", *driver],
            cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        job = re.search(r"submitted job (\d+)", done.stdout).group(1)
        print("| job | state | exit | iterations at its end, per trial | wall s |\n|---|---|---|---|---|", flush=True)
        seen = 0
        while job:
            began = time.monotonic()
            info = slurm.wait_job(job, timeout=3600)
            log = next(out.glob(f"launch/*/slurm-{job}.out")).read_text()
            trials = {path.parent.name: [json.loads(line) for line in path.read_text().splitlines()]
                      for path in sorted(out.glob(f"{results}/result.json"))}
            lasts = ", ".join(str(rows[-1]["training_iteration"] if rows else 0) for rows in trials.values())
            print(f"| {job} | {info['JobState']} | {info['ExitCode']} | {lasts} | {time.monotonic() - began:.0f} |",
                  flush=True)
            seen += 1
            following = re.search(r"submitted job (\d+)", log)
            job = following.group(1) if following else None
        for name, rows in trials.items():
            iterations = [r["training_iteration"] for r in rows]
            steps = [r["num_env_steps_sampled_lifetime"] for r in rows]
            print(f"{name}: iterations 1..{iterations[-1]} contiguous: "
                  f"{iterations == list(range(1, len(iterations) + 1))}; env steps never back: "
                  f"{steps == sorted(set(steps))}; finished: {iterations[-1] >= args.iters}")
        print(f"\n{seen} jobs, {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
