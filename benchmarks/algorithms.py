"""Each algorithm to its threshold, 3 seeds, side by side with Stable-Baselines3 (zoo hyperparameters).

Time from process start (imports included) to the first result whose 100-episode mean return reaches the
threshold, and the env steps used (DQN: the greedy evaluation mean, 10 episodes every 1000 env steps in both
tools). herdrl runs as a user runs it (`herd train ALGO --env ENV --stop-reward T`,
spawn -> exit, teardown counted against it); SB3 runs `sb3_runner.py` (spawn -> its SOLVED line). The peer
budget is SB3's median steps; the target is every herdrl seed within 2x of it, and a lower median time.

    python benchmarks/algorithms.py [--only A2C:CartPole-v1] [--seeds 1 2 3]
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
HERD = str(Path(sys.executable).parent / "herd")

# (algorithm, env, threshold, max env steps). Off-policy algorithms are judged on greedy evaluation returns.
CASES = [
    ("DQN", "CartPole-v1", 475.0, 100_000),
    ("DQN", "Acrobot-v1", -100.0, 100_000),
    ("SAC", "Pendulum-v1", -200.0, 20_000),
    ("A2C", "CartPole-v1", 475.0, 500_000),
    ("TRPO", "CartPole-v1", 475.0, 300_000),
    ("TRPO", "Pendulum-v1", -200.0, 400_000),
    ("PPO", "Pendulum-v1", -200.0, 400_000),
]
OFF_POLICY = {"DQN", "SAC"}
HERD_CONFIG = {
    ("DQN", "Acrobot-v1"): ["-f", str(HERE.parent / "examples" / "acrobot-dqn.yaml")],
    ("SAC", "Pendulum-v1"): ["-f", str(HERE.parent / "examples" / "pendulum-sac.yaml")],
    ("PPO", "Pendulum-v1"): ["-f", str(HERE.parent / "examples" / "pendulum-ppo.yaml")],
    ("TRPO", "Pendulum-v1"): ["-f", str(HERE.parent / "examples" / "pendulum-trpo.yaml")],
}


def run_herdrl(algo: str, env: str, target: float, budget: int, seed: int, out: str) -> dict:
    trial = f"{algo}-{env}-{seed}"
    extra = HERD_CONFIG.get((algo, env), [algo.lower()])
    metric = "evaluation/episode_return_mean" if algo in OFF_POLICY else "episode_return_mean"
    # Off-policy: herdrl's default stop is the env's threshold on the evaluation metric (+ the budget).
    stops = ["--budget", str(budget)] if algo in OFF_POLICY else ["--stop-reward", str(target),
                                                                   "--stop-timesteps", str(budget)]
    cmd = [HERD, "train", *extra, "--env", env, "--seed", str(seed), *stops, "--quiet", "--no-tensorboard",
           "--output", out, "--name", "bench", "--trial", trial]
    start = time.time()
    subprocess.run(cmd, capture_output=True, text=True)  # exit 3: budget spent unsolved (reported below)
    elapsed = time.time() - start
    last = json.loads((Path(out) / "bench" / trial / "result.json").read_text().splitlines()[-1])
    return {"tool": "herdrl", "seed": seed, "solved": last.get(metric, -float("inf")) >= target,
            "seconds": elapsed, "steps": last["num_env_steps_sampled_lifetime"]}


def run_sb3(algo: str, env: str, target: float, budget: int, seed: int) -> dict:
    start = time.time()
    proc = subprocess.run([sys.executable, str(HERE / "sb3_runner.py"), algo, env, str(seed), str(target), str(budget)],
                          capture_output=True, text=True)
    solved = [line.split() for line in proc.stdout.splitlines() if line.startswith("SOLVED")]
    if not solved:
        return {"tool": "sb3", "seed": seed, "solved": False, "seconds": time.time() - start, "steps": None}
    return {"tool": "sb3", "seed": seed, "solved": True, "seconds": float(solved[0][1]) - start,
            "steps": int(solved[0][2])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--only", help="ALGO:ENV, e.g. A2C:CartPole-v1")
    args = parser.parse_args()
    rows = []
    for algo, env, target, budget in CASES:
        if args.only and args.only != f"{algo}:{env}":
            continue
        runs = []
        with tempfile.TemporaryDirectory() as out:
            for seed in args.seeds:
                runs.append(run_herdrl(algo, env, target, budget, seed, out))
                runs.append(run_sb3(algo, env, target, budget, seed))
                print(json.dumps(runs[-2]), json.dumps(runs[-1]), flush=True)
        rows.append((algo, env, target, runs))
    print("\n| algorithm | env | threshold | tool | solved | median time, s | median env steps "
          "| per seed (s / steps) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for algo, env, target, runs in rows:
        for tool in ("herdrl", "sb3"):
            mine = [r for r in runs if r["tool"] == tool]
            ok = [r for r in mine if r["solved"]]
            secs = f"{statistics.median(r['seconds'] for r in ok):.1f}" if ok else "-"
            steps = f"{statistics.median(r['steps'] for r in ok):,.0f}" if ok else "-"
            per = ", ".join(f"{r['seconds']:.1f}/{r['steps']:,}" if r["solved"] else "unsolved" for r in mine)
            print(f"| {algo} | {env} | {target:g} | {tool} | {len(ok)}/{len(mine)} | {secs} | {steps} | {per} |")


if __name__ == "__main__":
    main()
