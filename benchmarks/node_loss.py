"""herdrl and RLlib on the same lost node with no room left: what each does next, side by side.

Three fake nodes (one raylet per 127.0.0.x, token auth, each tool with its own venv's `ray`, Ray's health checks
shortened to ~1.5 s for both), 3 CPUs each, PPO with 9 env runners (every CPU taken) on a sleeping 2 ms env,
100-step fragments, the learner in the driver. After 3 iterations every process of the node 127.0.0.4 is killed:
its 3 runners are lost and their replacements have nowhere to go. Then up to ``--after`` iterations, each bounded by
``--limit`` seconds (a tool that hangs is reported as such): seconds per iteration, env steps sampled, runners in
service. Each tool's own fault-tolerance defaults (herdrl: restart failed runners, keep the batch size; RLlib new
API stack: ``restart_failed_env_runners=True``).

    .venv/bin/python benchmarks/node_loss.py --tool herdrl
    /tmp/rllib-venv/bin/python benchmarks/node_loss.py --tool rllib
    .venv/bin/python benchmarks/node_loss.py --tool herdrl --ray-health-defaults   # a cluster herdrl joins
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3",
          "RAY_health_check_timeout_ms": "500", "RAY_health_check_initial_delay_ms": "0"}


def build(tool: str, address: str, runners: int):
    """The tool's PPO on the fake nodes; returns (algorithm, a function reading (env steps, runners) from a row)."""
    if tool == "herdrl":
        from herdrl import PPOConfig

        algo = (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.002})
                .env_runners(num_env_runners=runners, num_envs_per_env_runner=1, rollout_fragment_length=100,
                             sample_timeout_s=60)
                .training(train_batch_size=100 * runners, minibatch_size=128, num_epochs=1)
                .resources(address=address, node_ip_address="127.0.0.2").build())
        return algo, lambda r: (r["num_env_steps_sampled"], r["num_healthy_env_runners"])
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.tune.registry import register_env
    from rllib_scaling import Sleepy

    ray.init(address=address, _node_ip_address="127.0.0.2", logging_level="ERROR")
    register_env("sleepy", lambda cfg: Sleepy(cfg))
    algo = (PPOConfig().environment("sleepy", env_config={"step_latency_s": 0.002})
            .env_runners(num_env_runners=runners, num_envs_per_env_runner=1, rollout_fragment_length=100)
            .fault_tolerance(restart_failed_env_runners=True)
            .training(train_batch_size_per_learner=100 * runners, minibatch_size=128, num_epochs=1).build_algo())
    return algo, lambda r: (int(r["env_runners"]["num_env_steps_sampled"]),
                            algo.env_runner_group.num_healthy_remote_workers())


def main() -> None:
    """Start the nodes, train, kill a node, train on; print one RESULT line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", choices=("herdrl", "rllib"), required=True)
    parser.add_argument("--runners", type=int, default=9)
    parser.add_argument("--after", type=int, default=6)
    parser.add_argument("--limit", type=float, default=300.0)
    parser.add_argument("--ray-health-defaults", action="store_true",
                        help="leave Ray's health checks at their defaults (a cluster herdrl joins, not one it starts)")
    args = parser.parse_args()
    if not args.ray_health_defaults:
        os.environ.update(HEALTH)
    from rllib_scaling import FakeNodes

    nodes = FakeNodes(3, 3)
    rows: list[dict] = []
    try:
        algo, read = build(args.tool, nodes.address, args.runners)
        algo.train()
        start = time.monotonic()
        for _ in range(2):
            steps, healthy = read(algo.train())
        print(json.dumps({"before_fault_seconds": round((time.monotonic() - start) / 2, 1), "env_steps": steps,
                          "runners": healthy}), flush=True)
        killed = nodes.kill(2)  # 127.0.0.4
        fault = time.monotonic()
        for _ in range(args.after):
            box: dict = {}
            start = time.monotonic()
            def one_iteration(box: dict = box) -> None:
                try:
                    box["row"] = algo.train()
                except Exception as exc:  # the tool gave up: that is the result
                    box["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"

            worker = threading.Thread(target=one_iteration, daemon=True)
            worker.start()
            worker.join(args.limit)
            if worker.is_alive():
                rows.append({"seconds": None, "hung": f"no iteration within {args.limit:g} s"})
                break
            if "error" in box:
                rows.append({"seconds": None, "error": box["error"], "since_fault": round(time.monotonic() - fault, 1)})
                break
            steps, healthy = read(box["row"])
            now = time.monotonic()
            rows.append({"seconds": round(now - start, 1), "since_fault": round(now - fault, 1), "env_steps": steps,
                         "runners": healthy})
            print(json.dumps(rows[-1], default=str), flush=True)
        print(f"killed {killed} processes of 127.0.0.4", flush=True)
        if rows and rows[-1].get("seconds") is not None:
            algo.stop()
    except Exception:
        import traceback

        traceback.print_exc()
    finally:
        print("RESULT " + json.dumps({"tool": args.tool, "after": rows}, default=str), flush=True)
        nodes.stop()
        os._exit(0)  # a hung training thread must not keep the process


if __name__ == "__main__":
    main()
