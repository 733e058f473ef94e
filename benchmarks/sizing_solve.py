"""Does `num_env_runners="auto"` pick well for time to solve? CartPole-v1 PPO (herdrl's defaults, `train_batch_size`
1024) from process spawn to a solved exit, over runners x envs per runner, beside `auto` and the default (no flags):
median of 3 seeds per cell.

Each run is `herd train ppo --env CartPole-v1 --seed S --num-env-runners N --num-envs-per-env-runner E` as a user
runs it (a private Ray for N >= 1; `auto` measures first, and its measuring counts), stopped at a 100-episode mean
of 475 (solved) or at `--max-steps` env steps (not solved). Cells whose fragments would be shorter than 16 steps
(N x E > 64) are left out: `auto` never picks them.

    python benchmarks/sizing_solve.py                       # the grid, auto and the default, seeds 1 2 3
    python benchmarks/sizing_solve.py --runners none        # auto and the default only
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


def run(seed: int, runners: str, envs: str, output: str, max_steps: int) -> dict:
    """One run from spawn to exit: solved or not, seconds, env steps, and the counts it ran with."""
    trial = f"r{runners}e{envs}s{seed}"
    cmd = [HERD, "train", "ppo", "--env", "CartPole-v1", "--seed", str(seed), "--output", output, "--trial", trial,
           "--no-tensorboard", "--quiet", "--stop-reward", "475", "--stop-timesteps", str(max_steps)]
    if runners != "default":
        cmd += ["--num-env-runners", runners, "--num-envs-per-env-runner", envs]
    start = time.time()
    code = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    seconds = time.time() - start
    folder = Path(output) / "CartPole-v1" / trial
    if not (folder / "result.json").exists() or not (folder / "params.json").exists():  # (it failed to start)
        return {"cell": f"{runners} x {envs}", "seed": seed, "solved": False, "seconds": seconds, "steps": 0,
                "chosen": f"failed (exit {code})"}
    last = json.loads((folder / "result.json").read_text().splitlines()[-1])
    params = json.loads((folder / "params.json").read_text())
    solved = code == 0 and last.get("episode_return_mean", 0) >= 475
    return {"cell": f"{runners} x {envs}", "seed": seed, "solved": solved, "seconds": seconds,
            "steps": last["num_env_steps_sampled_lifetime"],
            "chosen": f"{params['num_env_runners']} x {params['num_envs_per_env_runner']}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--runners", default="0,1,2,4,8,16", help="'none': auto and the default only")
    parser.add_argument("--envs", default="1,4,16")
    parser.add_argument("--max-steps", type=int, default=400_000, help="env steps after which a run counts as "
                                                                     "not solved (CartPole: ~60k to solve)")
    args = parser.parse_args()
    cells = [] if args.runners == "none" else [
        (str(n), str(e)) for n in map(int, args.runners.split(",")) for e in map(int, args.envs.split(","))
        if max(1, n) * e <= 1024 // 16]
    cells += [("auto", "auto"), ("default", "default")]
    runs: dict[tuple[str, str], list[dict]] = {cell: [] for cell in cells}
    with tempfile.TemporaryDirectory() as output:
        for seed in args.seeds:  # (seed by seed: a slower hour of the machine falls on every cell alike)
            for cell in cells:
                runs[cell].append(run(seed, *cell, output, args.max_steps))
                print(json.dumps(runs[cell][-1]), flush=True)
    print("\n| runners x envs | solved | time to solve from spawn, s (median) | per seed | env steps (median) |")
    print("| --- | --- | --- | --- | --- |")
    medians = {}
    for cell, mine in runs.items():
        times = [r["seconds"] if r["solved"] else float("inf") for r in mine]
        medians[cell] = statistics.median(times)
        name = f"{cell[0]} x {cell[1]}" if cell[0] not in ("auto", "default") else \
            f"{cell[0]} ({', '.join(sorted({r['chosen'] for r in mine}))})"
        print(f"| {name} | {sum(r['solved'] for r in mine)}/{len(mine)} | {medians[cell]:.1f} | "
              + ", ".join(f"{t:.1f}" for t in times) + f" | {statistics.median(r['steps'] for r in mine):,.0f} |")
    grid = {cell: t for cell, t in medians.items() if cell[0] not in ("auto", "default")}
    if grid:
        best = min(grid, key=grid.get)
        print(f"\ngrid's best: {best[0]} x {best[1]}, {grid[best]:.1f} s; auto {medians['auto', 'auto']:.1f} s "
              f"(best / auto = {grid[best] / medians['auto', 'auto']:.2f}); default "
              f"{medians['default', 'default']:.1f} s ({grid[best] / medians['default', 'default']:.2f})")


if __name__ == "__main__":
    main()
