"""``herd plot``: learning curves from result folders, without TensorBoard.

Each folder given is one curve: every ``progress.csv`` below it is one run (a seed, a trial); the curve is
their mean, with the min-max spread shaded, on a common x grid (runs are interpolated; past the end of a
run that stopped early, e.g. by ASHA, the curve averages the runs still going).

    herd plot results/CartPole-v1 --out curves.png
    herd plot results/sweep/PPO_a results/sweep/PPO_b --metric evaluation/episode_return_mean --x time_total_s
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from herdrl.errors import HerdError


def read_runs(folder: Path, metric: str, x: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(x, y) arrays of every progress.csv below ``folder`` that has both columns."""
    runs = []
    for path in sorted(Path(folder).rglob("progress.csv")):
        xs, ys = [], []
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    xv, yv = float(row[x]), float(row[metric])
                except (KeyError, TypeError, ValueError):
                    continue
                if math.isfinite(xv) and math.isfinite(yv):
                    xs.append(xv)
                    ys.append(yv)
        if len(xs) >= 1:
            runs.append((np.asarray(xs), np.asarray(ys)))
    return runs


def plot_curves(folders: list[str | Path], metric: str = "episode_return_mean",
                x: str = "num_env_steps_sampled_lifetime", out: str | Path = "curves.png",
                title: str | None = None) -> Path:
    """Draw one mean curve (and min-max band) per folder; write PNG or SVG by ``out``'s suffix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg"):
        raise HerdError(f"--out '{out}': use a .png or .svg file name")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = 0
    for folder in folders:
        if not Path(folder).exists():
            raise HerdError(f"'{folder}' not found")
        runs = read_runs(Path(folder), metric, x)
        if not runs:
            continue
        start, end = min(r[0][0] for r in runs), max(r[0][-1] for r in runs)
        grid = np.linspace(start, end, 200) if end > start else np.array([start])
        ys = np.stack([np.where((grid >= rx[0]) & (grid <= rx[-1]), np.interp(grid, rx, ry), np.nan)
                       for rx, ry in runs])
        label = f"{Path(folder).name} ({len(runs)} run{'s' if len(runs) > 1 else ''})"
        line, = ax.plot(grid, np.nanmean(ys, 0), label=label)
        if len(runs) > 1:
            ax.fill_between(grid, np.nanmin(ys, 0), np.nanmax(ys, 0), color=line.get_color(), alpha=0.2)
        drawn += 1
    if not drawn:
        plt.close(fig)
        raise HerdError(f"no progress.csv with columns '{x}' and '{metric}' under {', '.join(map(str, folders))}")
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.set_title(title or metric)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
