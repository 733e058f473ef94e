"""CartPole-v1 PPO: in-process vs 2 local Ray env runners, and Ray's fixed start-up cost.

For each seed and runner count, runs ``herd train ppo --env CartPole-v1 --seed S --num-env-runners R`` as a
user would and timestamps, from process spawn: the first iteration's console line (start-up: imports, Ray
start, actors) and the exit (solved; teardown included). Runner counts alternate per seed.

    python benchmarks/ray_runners.py [--seeds 1 2 3] [--runners 0 2]
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

HERD = str(Path(sys.executable).parent / "herd")


def run(seed: int, runners: int, output: str) -> dict:
    trial = f"r{runners}s{seed}"
    cmd = [HERD, "train", "ppo", "--env", "CartPole-v1", "--seed", str(seed), "--num-env-runners", str(runners),
           "--output", output, "--trial", trial, "--no-tensorboard"]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first = None
    for line in proc.stdout:
        if first is None and line.startswith("iter "):
            first = time.time() - start
    code = proc.wait()
    total = time.time() - start
    last = json.loads((Path(output) / "CartPole-v1" / trial / "result.json").read_text().splitlines()[-1])
    return {"runners": runners, "seed": seed, "solved": code == 0, "first_iter_s": first, "solve_s": total,
            "steps": last["num_env_steps_sampled_lifetime"], "train_s": last["time_total_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--runners", type=int, nargs="+", default=[0, 2])
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as output:
        for seed in args.seeds:
            for runners in args.runners:
                runs.append(run(seed, runners, output))
                print(json.dumps(runs[-1]), flush=True)
    print("\n| env runners | solved | first iteration after, s | time to solve (process start -> exit), s | "
          "training time, s | env steps |")
    print("| --- | --- | --- | --- | --- | --- |")
    for runners in args.runners:
        mine = [r for r in runs if r["runners"] == runners]
        med = {key: statistics.median(r[key] for r in mine) for key in ("first_iter_s", "solve_s", "train_s", "steps")}
        print(f"| {runners or 'in-process'} | {sum(r['solved'] for r in mine)}/{len(mine)} | "
              f"{med['first_iter_s']:.1f} | {med['solve_s']:.1f} | {med['train_s']:.1f} | {med['steps']:,.0f} |")


if __name__ == "__main__":
    main()
