"""herdrl and RLlib side by side with many runners on the same fake nodes: a sleeping 2 ms env (herdrl's
`herd/Latency-v0`; the same class registered for RLlib), 1 env per runner, 100-step fragments, PPO, one epoch.
Each tool runs in its own venv and starts its own fake nodes with that venv's `ray` (one raylet per 127.0.0.x,
token auth, torn down by PID); run them one after the other, alone on the machine (32 RLlib EnvRunners need
13-19 GB):

    .venv/bin/python benchmarks/rllib_scaling.py --tool herdrl --runners 8,32
    /tmp/rllib-venv/bin/python benchmarks/rllib_scaling.py --tool rllib --runners 8,32

(RLlib's venv: `python3.11 -m venv /tmp/rllib-venv && /tmp/rllib-venv/bin/pip install torch==2.13.0 gymnasium
"ray[rllib]==2.60.0"`.) Per row: env steps sampled per second over the measured iterations (wall time, learning
included, and sampling time alone), machine-wide CPU seconds per 1,000 env steps from /proc/stat, and the same split
by process (the driver, the runner processes, the raylets, the GCS, Ray's other agents) from /proc/<pid>/stat.
Prints one ``RESULT {json}`` line per row.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np


class Sleepy(gym.Env):
    """herd/Latency-v0's behaviour for RLlib: each step sleeps, 4 random floats, reward = action, 200 steps."""

    def __init__(self, config=None):
        self.latency = float((config or {}).get("step_latency_s", 0.002))
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        time.sleep(self.latency)
        self.t += 1
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), float(action), False, self.t >= 200, {}


def busy_cpu_seconds() -> float:
    """Machine-wide busy CPU time so far (user, nice, system, irq, softirq, steal), in seconds."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]) / os.sysconf("SC_CLK_TCK")


def process_table() -> dict[int, tuple[int, str]]:
    """Every process's (parent pid, command line)."""
    table = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        table[int(pid)] = (ppid, cmd)
    return table


def descendants(table: dict[int, tuple[int, str]], roots: set[int]) -> set[int]:
    """``roots`` and every process below them."""
    found = set(roots)
    while True:
        more = {pid for pid, (ppid, _) in table.items() if ppid in found} - found
        if not more:
            return found
        found |= more


def cpu_by_role(marker: str) -> dict[str, float]:
    """CPU seconds (user + system) used so far by this process (``driver``) and by the processes of the cluster
    whose temp dir is ``marker``: ``runners`` (Ray workers: EnvRunners, idle workers), ``raylets``, ``gcs`` and
    ``other`` (Ray's agents and monitors)."""
    table = process_table()
    cluster = descendants(table, {pid for pid, (_, cmd) in table.items() if marker in cmd}) - {os.getpid()}
    out = dict.fromkeys(("driver", "runners", "raylets", "gcs", "other"), 0.0)
    for pid in cluster | {os.getpid()}:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        cmd = table.get(pid, (0, ""))[1]
        role = ("driver" if pid == os.getpid() else "runners" if cmd.startswith("ray::") else
                "raylets" if "raylet" in cmd.split(" ")[0] else "gcs" if "gcs_server" in cmd else "other")
        out[role] += seconds
    return out


def kill_naming(marker: str) -> int:
    """SIGKILL every process whose command line names ``marker``, and their descendants (never this process);
    returns how many. (Runs in RLlib's venv too, so it cannot use herdrl.cluster.nodes.node_pids.)"""
    table = process_table()
    found = descendants(table, {pid for pid, (_, cmd) in table.items() if marker in cmd} - {os.getpid()})
    found -= {os.getpid()}
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(found)


class FakeNodes:
    """``count`` raylets on 127.0.0.2.. started with this venv's ``ray``; stopped by PID."""

    def __init__(self, count: int, cpus: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hs", dir="/tmp"))
        token = self.root / "token"
        token.write_text(secrets.token_hex(32))
        os.chmod(token, 0o600)
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)
        os.environ.update({k: self.env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED")})
        ray = str(Path(sys.executable).parent / "ray")
        port = 20000 + secrets.randbelow(10000)
        self.address = f"127.0.0.2:{port}"
        for i in range(count):
            head = i == 0
            args = ["--head", f"--port={port}", "--include-dashboard=false"] if head else [f"--address={self.address}"]
            subprocess.run([ray, "start", *args, f"--node-ip-address=127.0.0.{2 + i}", f"--num-cpus={cpus}",
                            f"--temp-dir={self.root / f'n{i}'}", "--object-store-memory=500000000"],
                           env=self.env, check=True, capture_output=True, timeout=120)

    def kill(self, index: int) -> int:
        """SIGKILL fake node ``index`` (its raylet and everything under it); returns how many processes."""
        return kill_naming(str(self.root / f"n{index}"))

    def stop(self) -> None:
        """SIGKILL every process naming this cluster's temp dir, and their children."""
        kill_naming(str(self.root))
        shutil.rmtree(self.root, ignore_errors=True)


#: The fake nodes' temp dir while they run (``cpu_by_role`` finds their processes by it).
MARKER = ""
#: CPU seconds by role over the last measured iterations (see ``cpu_by_role``).
SPLIT: dict[str, float] = {}


def timed(algo, iters: int) -> tuple[list[dict], float, float]:
    """One warm-up iteration, then ``iters`` measured: their results, wall seconds and machine-wide busy CPU
    seconds (the split by process role in ``SPLIT``); the algorithm is stopped after."""
    try:
        algo.train()
        start, cpu, roles = time.perf_counter(), busy_cpu_seconds(), cpu_by_role(MARKER)
        results = [algo.train() for _ in range(iters)]
        wall, busy, after = time.perf_counter() - start, busy_cpu_seconds() - cpu, cpu_by_role(MARKER)
        SPLIT.clear()
        SPLIT.update({role: after[role] - roles[role] for role in roles})
        return results, wall, busy
    finally:
        algo.stop()


def measure_herdrl(runners: int, latency: float, iters: int, address: str) -> tuple[int, float, float, float]:
    """(env steps, wall s, sampling s, machine-wide busy CPU s) over ``iters`` iterations after one warm-up."""
    from herdrl import PPOConfig

    algo = (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": latency})
            .env_runners(num_env_runners=runners, num_envs_per_env_runner=1, rollout_fragment_length=100)
            .training(train_batch_size=100 * runners, minibatch_size=min(128, 100 * runners), num_epochs=1)
            .resources(address=address, node_ip_address="127.0.0.2").build())
    results, wall, cpu = timed(algo, iters)
    return (sum(r["num_env_steps_sampled"] for r in results), wall, sum(r["sample_time_s"] for r in results), cpu)


def measure_rllib(runners: int, latency: float, iters: int, address: str) -> tuple[int, float, float, float]:
    """The same with RLlib's PPO (new API stack, defaults but the batch shape)."""
    import ray
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.tune.registry import register_env

    ray.init(address=address, _node_ip_address="127.0.0.2", logging_level="ERROR")
    register_env("sleepy", lambda cfg: Sleepy(cfg))
    algo = (PPOConfig().environment("sleepy", env_config={"step_latency_s": latency})
            .env_runners(num_env_runners=runners, num_envs_per_env_runner=1, rollout_fragment_length=100)
            .training(train_batch_size_per_learner=100 * runners, minibatch_size=min(128, 100 * runners),
                      num_epochs=1).build_algo())
    try:
        results, wall, cpu = timed(algo, iters)
    finally:
        ray.shutdown()
    steps = sum(r["env_runners"]["num_env_steps_sampled"] for r in results)
    sampling = sum(r["timers"]["env_runner_sampling_timer"] for r in results)
    return steps, wall, sampling, cpu


def main() -> None:
    """Fake nodes, then one row per runner count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", choices=("herdrl", "rllib"), required=True)
    parser.add_argument("--runners", default="8,32")
    parser.add_argument("--latency", type=float, default=0.002)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=4)
    args = parser.parse_args()
    counts = [int(x) for x in args.runners.split(",")]
    if len(counts) > 1:  # a fresh process (and cluster) per row: RLlib's env registry does not outlive ray.init
        for count in counts:
            subprocess.run([sys.executable, __file__, "--tool", args.tool, "--runners", str(count), "--latency",
                            str(args.latency), "--iters", str(args.iters), "--nodes", str(args.nodes)], check=True)
        return
    nodes = FakeNodes(args.nodes, -(-(max(counts) + 2) // args.nodes))  # a CPU per runner, two for the learner
    global MARKER
    MARKER = str(nodes.root)
    try:
        if args.tool == "herdrl":
            import ray

            ray.init(address=nodes.address, _node_ip_address="127.0.0.2", logging_level="ERROR")
        for count in counts:
            measure = measure_herdrl if args.tool == "herdrl" else measure_rllib
            steps, wall, sampling, cpu = measure(count, args.latency, args.iters, nodes.address)
            print("RESULT " + json.dumps({
                "tool": args.tool, "runners": count, "env_steps_per_s": steps / wall,
                "sampling_env_steps_per_s": steps / sampling, "cpu_s_per_1k_steps": 1000 * cpu / steps,
                **{f"{role}_cpu_s_per_1k_steps": 1000 * seconds / steps for role, seconds in SPLIT.items()}}),
                flush=True)
    finally:
        if args.tool == "herdrl":
            import ray

            ray.shutdown()
        nodes.stop()

if __name__ == "__main__":
    main()
