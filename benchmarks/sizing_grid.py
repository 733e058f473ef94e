"""Does `num_env_runners="auto"` pick well? PPO's end-to-end env steps/s (sampling and learning, `train_batch_size`
fixed) over a grid of runners x envs per runner, beside what `auto` picks and the default (no flags), per workload:

* `latency2`, `latency20`: `herd/Latency-v0` at 2 ms and 20 ms a step, on 4 fake nodes (raylets on loopback
  addresses advertising CPUs this machine does not have: the env sleeps, it does not compute);
* `cartpole`, `pong`: CartPole-v1 and a Pong-shaped `herd/Latency-v0` (uint8 84x84x4 frames, 1 ms a step, a CNN
  policy) on this machine alone (a private Ray per cell).

    python benchmarks/sizing_grid.py                                  # every workload, 30 s per cell
    python benchmarks/sizing_grid.py --workloads latency20 --seconds 10
    python benchmarks/sizing_grid.py --runners none                  # auto and the default only

The grid's best is reported twice: over every cell, and over the cells whose train batch keeps fragments of at
least 16 steps (runners x envs <= train_batch_size / 16: what `auto` may choose; past it PPO learns on 2-step
fragments, whose throughput is no use).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time

from ingest import fake_nodes  # benchmarks/ingest.py

from herdrl import PPOConfig

WORKLOADS = {
    "latency2": ("herd/Latency-v0", {"step_latency_s": 0.002}, True),
    "latency20": ("herd/Latency-v0", {"step_latency_s": 0.02}, True),
    "cartpole": ("CartPole-v1", {}, False),
    "pong": ("herd/Latency-v0", {"step_latency_s": 0.001, "pixels": True}, False),
}


def throughput(config: PPOConfig, seconds: float) -> tuple[float, PPOConfig, float]:
    """(env steps/s over the iterations of ``seconds`` after a warm-up one, at least one; the built config; the
    seconds building took, measuring included where the config leaves counts to ``auto``)."""
    start = time.perf_counter()
    algo = config.build()
    built = time.perf_counter() - start
    try:
        algo.train()  # warm-up: actors started, first forward passes
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds or steps == 0:
            steps += algo.train()["num_env_steps_sampled"]
        return steps / (time.perf_counter() - start), algo.config, built
    finally:
        algo.stop()


def run(workload: str, runner_counts: list[int], envs: list[int], seconds: float, batch: int) -> None:
    env, env_config, on_fake_nodes = WORKLOADS[workload]
    nodes = fake_nodes(4, 16, 500) if on_fake_nodes else contextlib.nullcontext(None)
    with nodes as address:
        def config() -> PPOConfig:
            base = PPOConfig().environment(env, env_config=env_config).training(train_batch_size=batch)
            return base.resources(address=address, node_ip_address="127.0.0.2") if address else base

        grid = {}
        for runners in runner_counts:
            for count in envs:
                rate, _, _ = throughput(config().env_runners(num_env_runners=runners, num_envs_per_env_runner=count),
                                        seconds)
                grid[runners, count] = rate
                print(f"{workload}: {runners} runners x {count} envs: {rate:,.0f} env steps/s", flush=True)
        if not grid:
            grid[-1, -1] = float("nan")
        auto_rate, chosen, measuring = throughput(
            config().env_runners(num_env_runners="auto", num_envs_per_env_runner="auto"), seconds)
        default_rate, default, _ = throughput(config(), seconds)
    best = max(grid, key=grid.get)
    held = {cell: rate for cell, rate in grid.items() if max(1, cell[0]) * cell[1] <= batch // 16} or grid
    fair = max(held, key=held.get)
    print(f"| {workload} | {best[0]} x {best[1]}: {grid[best]:,.0f} | {fair[0]} x {fair[1]}: {held[fair]:,.0f} | "
          f"{chosen.num_env_runners} x {chosen.num_envs_per_env_runner}: {auto_rate:,.0f} "
          f"({auto_rate / held[fair]:.2f}, measured in {measuring:.0f} s) | {default.num_env_runners} x "
          f"{default.num_envs_per_env_runner}: {default_rate:,.0f} ({default_rate / held[fair]:.2f}) |", flush=True)


def main() -> None:
    """Run the grid of each workload asked for; one table row per workload at the end of its grid."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=30.0, help="steady training per cell, after a warm-up")
    parser.add_argument("--envs", default="1,4,16")
    parser.add_argument("--runners", default="", help="runner counts of the grid (default: 0-16, and 32 on fake "
                                                      "nodes); 'none': auto and the default only")
    parser.add_argument("--batch", type=int, default=1024, help="train_batch_size, the same in every cell")
    parser.add_argument("--no-header", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.no_header:
        print("| workload | grid's best: runners x envs, env steps/s | best with fragments >= 16 steps | auto (ratio "
              "to that) | default, no flags |")
        print("| --- | --- | --- | --- | --- |", flush=True)
    workloads = args.workloads.split(",")
    if len(workloads) > 1:  # one process each: Ray keeps the first cluster's auth token for the process's life
        for workload in workloads:
            subprocess.run([sys.executable, __file__, "--workloads", workload, "--seconds", str(args.seconds),
                            "--envs", args.envs, "--batch", str(args.batch), "--runners", args.runners,
                            "--no-header"], check=True)
        return
    workload = workloads[0]
    counts = [0, 1, 2, 4, 8, 16, 32] if WORKLOADS[workload][2] else [0, 1, 2, 4, 8, 16]
    if args.runners:
        counts = [] if args.runners == "none" else [int(n) for n in args.runners.split(",")]
    run(workload, counts, [int(n) for n in args.envs.split(",")], args.seconds, args.batch)


if __name__ == "__main__":
    main()
