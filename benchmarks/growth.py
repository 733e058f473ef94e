"""Runners that follow the cluster: PPO on `herd/Latency-v0` (20 ms a step, 1 env per runner) with 8 runners on one
fake node and `max_env_runners=16`; a second fake node joins mid-run (a raylet started with `ray start --address`).
How long until 16 runners sample, and the throughput after growth beside a run started with 16 runners on the same
two nodes.

    cd benchmarks && ../.venv/bin/python growth.py
    cd benchmarks && ../.venv/bin/python growth.py --latency 0.002 --seconds 30
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from ingest import fake_nodes  # benchmarks/ingest.py

from herdrl import PPOConfig
from herdrl.cluster.nodes import NodeSpec, start_node, stop_node


def config(address: str, latency: float, runners: int, most: int | None) -> PPOConfig:
    return (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": latency})
            .env_runners(num_env_runners=runners, max_env_runners=most, num_envs_per_env_runner=1)
            .training(train_batch_size=1600, minibatch_size=400, num_epochs=1)
            .resources(address=address, node_ip_address="127.0.0.2"))


def steady(algo, seconds: float) -> float:
    """Env steps/s over the iterations of ``seconds`` (at least one)."""
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or steps == 0:
        steps += algo.train()["num_env_steps_sampled"]
    return steps / (time.perf_counter() - start)


def main() -> None:
    """Start a head (no CPUs) and one 8-CPU node, grow a run onto a second, then a run started at that size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--seconds", type=float, default=30.0, help="steady training measured after growth")
    args = parser.parse_args()
    with fake_nodes(2, 8, 300, head_cpus=0) as address:
        algo = config(address, args.latency, 8, 16).build()
        before = steady(algo, args.seconds / 2)
        joining = Path(tempfile.mkdtemp(prefix="hg", dir="/tmp")) / "w"  # (short: Ray's socket paths have a limit)
        start_node(NodeSpec(joining, address=address, node_ip_address="127.0.0.4", num_cpus=8,
                            object_store_memory=300_000_000))
        try:
            joined = time.perf_counter()
            while algo.train()["num_healthy_env_runners"] < 16 and time.perf_counter() - joined < 120:
                pass
            seconds = time.perf_counter() - joined
            algo.train()  # (the first iteration with all 16 may have begun before the last joined)
            grown = steady(algo, args.seconds)
            algo.stop()
            algo = config(address, args.latency, 16, None).build()
            algo.train()  # warm-up, as the grown run had
            at_size = steady(algo, args.seconds)
            algo.stop()
        finally:
            stop_node(joining)
            shutil.rmtree(joining.parent, ignore_errors=True)
    print("| 8 runners, env steps/s | node joined -> 16 runners sampling | after growth, env steps/s | started with 16 "
          "| ratio |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    print(f"| {before:,.0f} | {seconds:.1f} s | {grown:,.0f} | {at_size:,.0f} | {grown / at_size:.2f} |")


if __name__ == "__main__":
    main()
