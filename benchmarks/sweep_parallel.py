"""A 4-trial sweep run one trial after another vs on Ray Tune, with the same CPUs (this machine's).

Trials: PPO, lr in {1e-3, 2e-3} x seed in {1, 2}, a fixed number of iterations each (so the two ways do
the same computation). Sequential: four `herd train` processes one after the other. Tune: one `herd tune`
over the same grid (a private Ray with this machine's CPUs; one CPU per trial).

    python benchmarks/sweep_parallel.py                                   # CartPole-v1: CPU-bound
    python benchmarks/sweep_parallel.py --env herd/Latency-v0 --iters 10  # a simulator that waits 1 ms a step
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERD = str(Path(sys.executable).parent / "herd")
LATENCY = {"herd/Latency-v0": ["num_envs_per_env_runner=4", "train_batch_size=400", "minibatch_size=100",
                                "env_config={step_latency_s: 0.001}"]}


def sequential(output: str, env: str, iters: int) -> float:
    start = time.time()
    for lr in ("1e-3", "2e-3"):
        for seed in ("1", "2"):
            subprocess.run([HERD, "train", "ppo", "--env", env, "--seed", seed, "--stop-iters", str(iters),
                            "--config", f"lr={lr}", *LATENCY.get(env, []), "--quiet", "--no-tensorboard",
                            "--output", output], check=True, capture_output=True)
    return time.time() - start


def on_tune(output: str, env: str, iters: int) -> float:
    sweep = Path(output) / "sweep.yaml"
    extra = "".join(f"  {item.replace('=', ': ', 1)}\n" for item in LATENCY.get(env, []))
    sweep.write_text(f"name: sweep\nalgorithm: PPO\nenv: {env}\nstop: {{training_iteration: {iters}}}\n"
                     "config:\n  lr: {grid_search: [1e-3, 2e-3]}\n  seed: {grid_search: [1, 2]}\n" + extra)
    start = time.time()
    subprocess.run([HERD, "tune", "-f", str(sweep), "--output", output, "--verbose", "0"], check=True,
                   capture_output=True)
    return time.time() - start


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--iters", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        seq = sequential(a, args.env, args.iters)
        par = on_tune(b, args.env, args.iters)
    print(f"| {args.env}, 4 trials x {args.iters} iterations | wall-clock, s (process start to exit) |")
    print("| --- | --- |")
    print(f"| sequential `herd train` x4 | {seq:.1f} |")
    print(f"| `herd tune` (Ray Tune, same CPUs) | {par:.1f} |")
    print(f"\nspeedup: {seq / par:.2f}x")


if __name__ == "__main__":
    main()
