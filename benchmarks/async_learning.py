"""Time and env steps to solve CartPole-v1 on 2 Ray runners: APPO and IMPALA vs synchronous PPO, 3 seeds each.

Each run is ``herd train ALGO --env CartPole-v1 --num-env-runners 2 --seed S --stop-reward R`` in its own process,
timed from spawn to exit (Ray start and teardown included), with the algorithm's defaults. "Solved" is the
100-episode mean of training returns reaching R (450 for APPO and IMPALA, whose exploring policies keep an entropy
bonus; 475 for PPO), within 1M env steps.

    python benchmarks/async_learning.py [--seeds 1 2 3] [--algos appo impala ppo]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
TARGETS = {"appo": 450, "impala": 450, "ppo": 475}


def run(algo: str, seed: int, output: str) -> dict:
    cmd = [str(BIN / "herd"), "train", algo, "--env", "CartPole-v1", "--num-env-runners", "2", "--seed", str(seed),
           "--stop-reward", str(TARGETS[algo]), "--stop-timesteps", "1000000", "--quiet", "--output", output,
           "--trial", f"{algo}{seed}"]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.time() - start
    rows = (Path(output) / "CartPole-v1" / f"{algo}{seed}" / "result.json").read_text().splitlines()
    last = json.loads(rows[-1])
    return {"solved": proc.returncode == 0 and last["episode_return_mean"] >= TARGETS[algo], "seconds": elapsed,
            "steps": last["num_env_steps_sampled_lifetime"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--algos", nargs="+", default=list(TARGETS))
    args = parser.parse_args()
    results: dict[str, list[dict]] = {algo: [] for algo in args.algos}
    with tempfile.TemporaryDirectory() as output:
        for seed in args.seeds:  # seeds outside, algorithms inside: machine noise hits all alike
            for algo in args.algos:
                results[algo].append(run(algo, seed, output))
                print(algo, seed, results[algo][-1], flush=True)
    print("| algorithm | target | solved | median time, s | median env steps | per seed (s / steps) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for algo, runs in results.items():
        per_seed = ", ".join(f"{r['seconds']:.1f}/{r['steps']:,}" for r in runs)
        print(f"| {algo.upper()} | {TARGETS[algo]} | {sum(r['solved'] for r in runs)}/{len(runs)} | "
              f"{statistics.median(r['seconds'] for r in runs):.1f} | "
              f"{statistics.median(r['steps'] for r in runs):,.0f} | {per_seed} |")


if __name__ == "__main__":
    main()
