"""Time to solve CartPole-v1 with PPO: herdrl vs Stable-Baselines3, side by side in one invocation.

Time to solve (DESIGN.md, Definitions): wall-clock from the start of the process (interpreter start and
imports included) to the first result that has a 100-episode mean return >= 475. Each run is its own
subprocess; seeds alternate between the tools so machine noise hits both alike.

* herdrl: ``herd train ppo --env CartPole-v1 --seed S`` exactly as a user runs it (defaults, results
  and TensorBoard files written). It exits when solved, so its time is spawn -> exit: teardown is
  counted against herdrl.
* SB3: ``sb3_runner.py PPO CartPole-v1`` (zoo hyperparameters) prints the time it solved; spawn -> that time.

    python benchmarks/time_to_solve.py [--seeds 1 2 3] [--skip-sb3]
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

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def run_herdrl(seed: int, output: str) -> dict:
    cmd = [str(BIN / "herd"), "train", "ppo", "--env", "CartPole-v1", "--seed", str(seed), "--quiet",
           "--output", output, "--trial", f"seed{seed}"]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.time() - start
    rows = (Path(output) / "CartPole-v1" / f"seed{seed}" / "result.json").read_text().splitlines()
    last = json.loads(rows[-1])
    solved = proc.returncode == 0 and last["episode_return_mean"] >= 475
    return {"tool": "herdrl", "seed": seed, "solved": solved, "seconds": elapsed,
            "steps": last["num_env_steps_sampled_lifetime"], "train_s": last["time_total_s"]}


def run_sb3(seed: int) -> dict:
    start = time.time()
    proc = subprocess.run([sys.executable, str(HERE / "sb3_runner.py"), "PPO", "CartPole-v1", str(seed), "475",
                           "100000"], capture_output=True, text=True)
    solved = [line.split() for line in proc.stdout.splitlines() if line.startswith("SOLVED")]
    if not solved:
        return {"tool": "sb3", "seed": seed, "solved": False, "seconds": time.time() - start, "steps": None}
    _, when, steps = solved[0]
    return {"tool": "sb3", "seed": seed, "solved": True, "seconds": float(when) - start, "steps": int(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--skip-sb3", action="store_true")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as output:
        for seed in args.seeds:
            runs.append(run_herdrl(seed, output))
            print(json.dumps(runs[-1]), flush=True)
            if not args.skip_sb3:
                runs.append(run_sb3(seed))
                print(json.dumps(runs[-1]), flush=True)

    def median(tool: str, key: str) -> float | None:
        values = [r[key] for r in runs if r["tool"] == tool and r["solved"]]
        return statistics.median(values) if values else None

    print("\n| tool | solved | time to solve from process start, s (median) | per seed | env steps (median) |")
    print("| --- | --- | --- | --- | --- |")
    for tool in ("herdrl", "sb3"):
        mine = [r for r in runs if r["tool"] == tool]
        if not mine:
            continue
        per_seed = ", ".join(f"{r['seconds']:.1f}" if r["solved"] else "unsolved" for r in mine)
        seconds, steps = median(tool, "seconds"), median(tool, "steps")
        print(f"| {tool} | {sum(r['solved'] for r in mine)}/{len(mine)} | "
              f"{seconds:.1f} | {per_seed} | {steps:,.0f} |" if seconds else f"| {tool} | 0/{len(mine)} | - | - | - |")
    ours, theirs = median("herdrl", "seconds"), median("sb3", "seconds")
    if ours and theirs:
        print(f"\nratio herdrl/SB3 (median time to solve): {ours / theirs:.2f}  (target <= 0.5)")


if __name__ == "__main__":
    main()
