"""Runner scaling over fake nodes: `herd/Latency-v0` (20 ms per step by default), 1 env per runner, 100-step
fragments, PPO and APPO, on N raylets on loopback addresses (token auth; benchmarks/ingest.py's fake_nodes).
Sampling throughput (env steps / sampling time) and end-to-end throughput (env steps / iteration time), their
speedup over 1 runner, and each runner process's memory (RSS), which decides how many fit.

    python benchmarks/scaling_nodes.py                            # 4 nodes, 1,8,16,32 runners, PPO and APPO
    python benchmarks/scaling_nodes.py --latency 0.002 --runners 1,8,16
    python benchmarks/scaling_nodes.py --num-learners 1 --runners 1,32   # a learner actor: fragments by reference
"""

from __future__ import annotations

import argparse
import statistics
import time

from ingest import fake_nodes  # benchmarks/ingest.py

from herdrl.registry import get_config_class


def rss_mb(pid: int) -> float:
    """Resident memory of a process on this host."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def measure(algorithm: str, runners: int, latency: float, iters: int, address: str,
            num_learners: int = 0) -> dict[str, float]:
    """Build, warm up one iteration, measure ``iters``; sampling and end-to-end env steps/s, runner RSS.
    ``num_learners``: 0 learns in the driver, which fetches every fragment; 1 or more in learner actors, which fetch
    them by reference from the runners' nodes (the driver reads only their infos)."""
    config = (get_config_class(algorithm)()
              .environment("herd/Latency-v0", env_config={"step_latency_s": latency})
              .env_runners(num_env_runners=runners, num_envs_per_env_runner=1, rollout_fragment_length=100)
              .resources(address=address, node_ip_address="127.0.0.2").learners(num_learners=num_learners))
    if algorithm == "ppo":
        config.training(train_batch_size=100 * runners, minibatch_size=min(128, 100 * runners), num_epochs=1)
    else:  # APPO: one update per 100 x runners steps, the cheap learner the issue names
        config.training(train_batch_size=100 * runners, minibatch_size=min(128, 100 * runners),
                        num_updates_per_iteration=4, circular_buffer_num_batches=2)
    algo = config.build()
    try:
        algo.train()
        start = time.perf_counter()
        results = [algo.train() for _ in range(iters)]
        wall = time.perf_counter() - start
        memory = statistics.mean(rss_mb(pid) for pid in algo.runners.call("pid"))
    finally:
        algo.stop()
    steps = sum(r["num_env_steps_sampled"] for r in results)
    return {"sample": steps / sum(r["sample_time_s"] for r in results), "end_to_end": steps / wall,
            "rss": memory}


def main() -> None:
    """Start the fake nodes, measure every (algorithm, runner count), print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cpus-per-node", type=int, default=16, help="CPUs each fake node offers")
    parser.add_argument("--runners", default="1,8,16,32")
    parser.add_argument("--algorithms", default="ppo,appo")
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--num-learners", type=int, default=0, help="learner actors (0: the learner in the driver)")
    args = parser.parse_args()
    counts = [int(x) for x in args.runners.split(",")]
    print("| algorithm | runners | sampling env steps/s | speedup | end-to-end env steps/s | speedup | runner RSS MB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    with fake_nodes(args.nodes, args.cpus_per_node, 500) as address:
        for algorithm in args.algorithms.split(","):
            one: dict[str, float] | None = None
            for count in counts:
                row = measure(algorithm, count, args.latency, args.iters, address, args.num_learners)
                one = one or row
                print(f"| {algorithm.upper()} | {count} | {row['sample']:,.0f} | {row['sample'] / one['sample']:.2f}x |"
                      f" {row['end_to_end']:,.0f} | {row['end_to_end'] / one['end_to_end']:.2f}x | "
                      f"{row['rss']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
