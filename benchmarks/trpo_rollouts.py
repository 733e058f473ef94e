"""The seed document's TRPO experiment, reproduced: 10 TRPO iterations with rollouts serial vs spread over runners.

The seed ("Parallelizing TRPO") timed the first 10 iterations of modular_rl's TRPO on Pong-ram: 106 s with
serial rollouts, 42 s with 8 parallel Ray rollout tasks on a 16-core EC2 instance (2.5x). Here the env is
``herd/Latency-v0`` (each step sleeps ``--latency`` s, like a simulator waiting on I/O: latency-bound, so it
scales on this 2-core machine); the same ``herd train trpo`` command runs with 0 runners (serial, in the
driver) and with N Ray env runners of one env each, timed from process spawn to exit (Ray start included).

    python benchmarks/trpo_rollouts.py [--runners 8] [--latency 0.001] [--batch 2000] [--env Pong-ram-v0]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERD = str(Path(sys.executable).parent / "herd")


def run(runners: int, latency: float, batch: int, output: str, env: str = "herd/Latency-v0") -> dict:
    """10 TRPO iterations; wall-clock from spawn to exit and the summed sampling time of the result rows."""
    trial = f"r{runners}"
    cmd = [HERD, "train", "trpo", "--env", env, "--stop-iters", "10", "--seed", "0",
           "--num-env-runners", str(runners), "--num-envs-per-env-runner", "1", "--output", output,
           "--name", "trpo", "--trial", trial, "--no-tensorboard", "--quiet",
           "--config", f"train_batch_size={batch}"]
    if env == "herd/Latency-v0":
        cmd.append(f"env_config={{step_latency_s: {latency}}}")
    start = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    total = time.time() - start
    rows = [json.loads(r) for r in (Path(output) / "trpo" / trial / "result.json").read_text().splitlines()]
    return {"runners": runners, "total_s": total, "sample_s": sum(r["sample_time_s"] for r in rows),
            "steps": rows[-1]["num_env_steps_sampled_lifetime"], "iterations": len(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runners", type=int, default=8)
    parser.add_argument("--latency", type=float, default=0.001, help="seconds each env step sleeps")
    parser.add_argument("--batch", type=int, default=2000, help="env steps per TRPO iteration")
    parser.add_argument("--env", default="herd/Latency-v0", help="e.g. Pong-ram-v0, the seed's own env")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        serial = run(0, args.latency, args.batch, out, args.env)
        parallel = run(args.runners, args.latency, args.batch, out, args.env)
    print("| rollouts | iterations | env steps | wall-clock, s (spawn -> exit) | sampling, s "
          "| speedup (wall / sampling) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row, name in ((serial, "serial (in the driver)"), (parallel, f"{args.runners} Ray env runners")):
        print(f"| {name} | {row['iterations']} | {row['steps']:,} | {row['total_s']:.1f} | {row['sample_s']:.1f} | "
              f"{serial['total_s'] / row['total_s']:.2f}x / {serial['sample_s'] / row['sample_s']:.2f}x |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
