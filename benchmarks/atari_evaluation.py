"""Where the time of ``herd train dqn --env ALE/Breakout-v5 --stop-iters 2`` goes: training vs evaluation.

Runs that command (the CLI, in a subprocess, into a temporary folder) and splits each iteration's time from its
result row: ``evaluation/time_s`` (DQN evaluates 10 greedy episodes every iteration, in the driver) and the rest
(sampling and learning). An untrained greedy agent that never presses FIRE lost its first ball and then stood still
until ALE's 108,000-frame truncation (27,000 steps per episode); ``fire_after_life_loss`` (on by default) plays
FIRE after each lost life, and ``evaluation_sample_timeout_s`` (120 s by default) bounds an evaluation whatever the
game does. ``--variant no-life-loss-fire`` turns the FIRE after a lost life off, to show the bound alone.

    python benchmarks/atari_evaluation.py [--env ALE/Breakout-v5] [--iters 2] [--variant default no-life-loss-fire]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {"default": [], "no-life-loss-fire": ["--config", "env_config={fire_after_life_loss: false}"]}


def run(env: str, iters: int, variant: str) -> None:
    """Time the command once and print one line per iteration."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-m", "herdrl.cli", "train", "dqn", "--env", env, "--stop-iters", str(iters),
                   "--output", out, "--trial", "t", "--quiet", "--no-tensorboard", *VARIANTS[variant]]
        start = time.perf_counter()
        subprocess.run(command, check=True)
        wall = time.perf_counter() - start
        (result,) = Path(out).glob("*/t/result.json")
        rows = [json.loads(line) for line in result.read_text().splitlines() if line.strip()]
    print(f"{variant}: `{' '.join(command[2:])}` took {wall:.0f} s in all")
    for row in rows:
        evaluation = row.get("evaluation/time_s", 0.0)
        print(f"  iteration {row['training_iteration']}: {row['time_this_iter_s']:.1f} s = train "
              f"{row['time_this_iter_s'] - evaluation:.1f} s + evaluation {evaluation:.1f} s "
              f"({row.get('evaluation/num_episodes', 0):.0f} episodes, length mean "
              f"{row.get('evaluation/episode_len_mean', float('nan')):.0f} steps, "
              f"{row.get('evaluation/num_episodes_cut', 0):.0f} cut)", flush=True)


def main() -> None:
    """Run each variant once."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ALE/Breakout-v5")
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--variant", nargs="+", choices=sorted(VARIANTS), default=["default"])
    args = parser.parse_args()
    for variant in args.variant:
        run(args.env, args.iters, variant)


if __name__ == "__main__":
    main()
