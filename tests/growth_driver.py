"""Run as a subprocess by test_multinode.py: PPO on a `ray start` cluster on loopback addresses (token auth, short
health checks) with 2 runners on its one worker node and ``max_env_runners=4``. A second worker node joins mid-run:
the run starts 2 more runners there and takes them into service (the node added as a user adds one, with
`herd cluster node start --token-stdin`), fragments shortened so the train batch keeps its
size. Then that node is stopped: its runners' replacements find no room and the 2 left sample for them (the
degraded path). Prints one ``RESULT {json}`` line."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from raycluster import RayStartCluster  # noqa: E402


def add_node_by_hand(cluster: RayStartCluster) -> str:
    """A node joins as a user adds one: `herd cluster node start --address HEAD --token-stdin < TOKEN`, from a
    shell with no Ray auth settings of its own; returns its address."""
    ip = f"127.0.0.{2 + len(cluster.temps)}"
    temp = cluster.root / f"w{len(cluster.temps)}"
    cluster.temps.append(temp)
    shell = {key: value for key, value in cluster.env.items() if not key.startswith("RAY_AUTH")}
    with open(cluster.env["RAY_AUTH_TOKEN_PATH"]) as token:
        subprocess.run([str(Path(sys.executable).parent / "herd"), "cluster", "node", "start", "--address",
                        cluster.address, "--temp-dir", str(temp), "--token-stdin", "--num-cpus", "2",
                        "--node-ip-address", ip, "--object-store-memory", "80000000"],
                       stdin=token, env=shell, check=True, capture_output=True, timeout=120)
    return ip


def main() -> None:
    cluster = RayStartCluster().start(workers=1, head_cpus=0, worker_cpus=2, fast_health_checks=True)
    os.environ.update({key: value for key, value in cluster.env.items() if key.startswith("RAY_AUTH")})
    try:
        from herdrl import PPOConfig
        from herdrl.cluster.nodes import stop_node

        algo = (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.002, "episode_len": 100_000})
                .env_runners(num_env_runners=2, num_envs_per_env_runner=1, max_env_runners=4, sample_timeout_s=60)
                .training(train_batch_size=400, minibatch_size=100, num_epochs=1)
                .resources(address=cluster.address, node_ip_address="127.0.0.2").debugging(seed=0).build())
        keys = ("num_healthy_env_runners", "num_target_env_runners", "num_env_runners_waiting", "num_env_steps_sampled",
                "num_extra_fragments")
        before = [[row[key] for key in keys] for row in (algo.train(), algo.train())]
        new_ip = add_node_by_hand(cluster)
        joined_at, grown = time.monotonic(), []
        while time.monotonic() - joined_at < 60:
            grown.append([algo.train()[key] for key in keys])
            if grown[-1][0] == 4:
                break
        seconds = time.monotonic() - joined_at
        runner_ips = sorted(ip for _, ip in algo.runners.call("node"))
        stop_node(cluster.temps[-1])  # the new node leaves
        after = [[algo.train()[key] for key in keys] for _ in range(3)]
        print("RESULT " + json.dumps({"before": before, "grown": grown, "seconds": seconds, "new_ip": new_ip,
                                      "runner_ips": runner_ips, "after": after}), flush=True)
        algo.stop()
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
