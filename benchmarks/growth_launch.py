"""Runners that follow the cluster under `herd launch`: a run started by `mpirun -np 1 herd launch mpi --num-cpus 4`
(herdrl starts the head, with its own token) grows onto a node started by hand mid-run, as a user adds one:
`herd cluster node start --address HEAD --token-stdin < TOKEN`. PPO on `herd/Latency-v0` (20 ms a step, 1 env per
runner), 4 runners, `max_env_runners=8`. How long from the node's start returning to 8 runners sampling, and the
throughput after growth beside a run started with 8 runners on the same two nodes.

    cd benchmarks && ../.venv/bin/python growth_launch.py

The driver (this file with ``--driver``) runs under the launch; this process plays the user who adds the node.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERD = str(Path(sys.executable).parent / "herd")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp"]


def steady(algo, seconds: float) -> float:
    """Env steps/s over the iterations of ``seconds`` (at least one)."""
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or steps == 0:
        steps += algo.train()["num_env_steps_sampled"]
    return steps / (time.perf_counter() - start)


def driver(handoff: Path, latency: float, seconds: float) -> None:
    """Under the launch (RAY_ADDRESS set): 4 runners, then wait for the node the user adds, grow to 8, measure;
    then a run started with 8 on the grown cluster. Writes ``result.json`` in ``handoff``."""
    from herdrl import PPOConfig

    def config(runners: int, most: int | None) -> PPOConfig:
        return (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": latency})
                .env_runners(num_env_runners=runners, max_env_runners=most, num_envs_per_env_runner=1)
                .training(train_batch_size=800, minibatch_size=200, num_epochs=1))

    (handoff / "address.json").write_text(json.dumps({"address": os.environ["RAY_ADDRESS"],
                                                      "token": os.environ["RAY_AUTH_TOKEN_PATH"]}))
    algo = config(4, 8).build()
    before = steady(algo, seconds / 2)
    (handoff / "ready").touch()
    while not (handoff / "joined").exists():  # (the user starts the node now)
        algo.train()
    joined = float((handoff / "joined").read_text())
    rows = []
    while time.time() - joined < 120:
        row = algo.train()
        rows.append([round(time.time() - joined, 2), row["num_healthy_env_runners"], row["num_target_env_runners"]])
        if row["num_healthy_env_runners"] == 8:
            break
    grown_after = time.time() - joined
    algo.train()  # (the first iteration with all 8 may have begun before the last joined)
    grown = steady(algo, seconds)
    algo.stop()
    algo = config(8, None).build()
    algo.train()  # warm-up, as the grown run had
    at_size = steady(algo, seconds)
    algo.stop()
    (handoff / "result.json").write_text(json.dumps({"before": before, "grown_after_s": grown_after, "rows": rows,
                                                     "grown": grown, "at_size": at_size}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.02)
    parser.add_argument("--seconds", type=float, default=30.0, help="steady training measured after growth")
    parser.add_argument("--driver", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        driver(args.driver, args.latency, args.seconds)
        return
    root = Path(tempfile.mkdtemp(prefix="hgl", dir="/tmp"))  # (short: Ray's socket paths have a limit)
    handoff, node = root / "handoff", root / "n"
    handoff.mkdir()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{Path(HERD).parent}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    launch = subprocess.Popen([*MPIRUN, "-np", "1", HERD, "launch", "mpi", "--num-cpus", "4", "--object-store-memory",
                               "300000000", "--", sys.executable, __file__, "--driver", str(handoff), "--latency",
                               str(args.latency), "--seconds", str(args.seconds)], env=env, cwd=root)
    try:
        deadline = time.time() + 600
        while not (handoff / "ready").exists():
            if launch.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the launched driver ended (exit {launch.returncode}) before it was ready")
            time.sleep(0.2)
        cluster = json.loads((handoff / "address.json").read_text())
        # the user's step: a node on this host joins the launched head, with the launch's token
        with open(cluster["token"]) as token:
            subprocess.run([HERD, "cluster", "node", "start", "--address", cluster["address"], "--temp-dir",
                            str(node), "--token-stdin", "--num-cpus", "4", "--object-store-memory", "300000000"],
                           stdin=token, env=env, check=True, stdout=subprocess.DEVNULL)
        (handoff / "joined").write_text(repr(time.time()))
        code = launch.wait(timeout=900)
    finally:
        if launch.poll() is None:
            launch.terminate()
            launch.wait(timeout=60)
        subprocess.run([HERD, "cluster", "node", "stop", "--temp-dir", str(node), "--remove-files"], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads((handoff / "result.json").read_text()) if (handoff / "result.json").exists() else None
    shutil.rmtree(root, ignore_errors=True)
    if code != 0 or result is None:
        raise SystemExit(f"the launch exited {code}")
    print("(seconds after the node's start returned, healthy runners, target):", result["rows"])
    print("| 4 runners, env steps/s | node joined -> 8 runners sampling | after growth, env steps/s | started with 8 "
          "| ratio |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    print(f"| {result['before']:,.0f} | {result['grown_after_s']:.1f} s | {result['grown']:,.0f} | "
          f"{result['at_size']:,.0f} | {result['grown'] / result['at_size']:.2f} |")


if __name__ == "__main__":
    main()
