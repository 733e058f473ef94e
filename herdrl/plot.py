"""``herd plot``: learning curves from result folders, without TensorBoard.

Every ``progress.csv`` below the folders given is one run (a trial of ``herd train`` or of a sweep). Runs are
grouped by what differs between them: the algorithm, the env, every config key with more than one value (a
swept ``lr``), and the folder when several are given; seeds never split a group. Each group is one curve:
the mean over its runs on a common x grid (runs are interpolated; past the end of a run that stopped early,
e.g. by ASHA, the mean is over the runs still going), with the min-max spread shaded.

    herd plot results/CartPole-v1 --out curves.png                  # PPO and DQN trials: one curve each
    herd plot results/sweep --y evaluation/episode_return_mean --x time

Without ``--x``, each run is drawn against what it advances on: env steps, or gradient updates for a run that
samples no env (BC, MARWIL, CQL and IQL learning from a dataset); the axis label says which.

Without ``--y``, each run is drawn on the metric its algorithm is judged by (its ``stop_metric``): the training
return for on-policy algorithms, the greedy evaluation return for DQN, SAC and TD3, whose training return includes
their exploration; the legend says which when a plot mixes them.
"""

from __future__ import annotations

import csv
import functools
import json
import logging
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from herdrl.errors import HerdError

#: ``metric`` meaning "each run on the metric its algorithm is judged by" (``herd plot`` without ``--y``).
JUDGED = "judged"
#: Short legend names of the metrics algorithms are judged by.
METRIC_NAMES = {"episode_return_mean": "training return", "evaluation/episode_return_mean": "greedy evaluation"}
#: ``--x`` short names -> result columns, and every x column's axis label (with its unit).
X_AXES = {"steps": "num_env_steps_sampled_lifetime", "time": "time_total_s", "iteration": "training_iteration",
          "updates": "num_gradient_updates_lifetime"}
ENV_STEPS, UPDATES = X_AXES["steps"], X_AXES["updates"]
AXIS_LABELS = {
    "num_env_steps_sampled_lifetime": "env steps",
    "time_total_s": "training time (s)",
    "training_iteration": "training iteration",
    UPDATES: "gradient updates",
    "episode_return_mean": "episode return (mean of the last 100 episodes)",
    "evaluation/episode_return_mean": "greedy evaluation return (mean of its episodes)",
    JUDGED: "return: each run on its algorithm's metric (see legend)",
    "episode_len_mean": "episode length (steps, mean of the last 100)",
    "env_steps_per_s": "env steps per second",
}
#: The run parameter that names the x column a run is drawn against (in labels when runs differ in it).
X_PARAM = "x axis"
#: Config keys that never make runs different experiments (where and how they ran, the seed).
NOT_GROUPING = {"seed", "imports", "address", "node_ip_address", "runtime_env", "include_dashboard", "logger",
                "ray_connect_timeout_s", "__trial_index__", "num_env_runners", "num_cpus_per_env_runner",
                "num_cpus_for_main_process", "num_gpus", "sample_timeout_s", "restart_failed_env_runners",
                "max_num_env_runner_restarts", "ignore_env_runner_failures", "gym_env_vectorize_mode", "framework",
                "store_buffer_in_checkpoints"}


@dataclass
class Run:
    """One progress.csv: its columns of interest and the flattened config it ran with."""

    path: Path
    x: np.ndarray
    y: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)
    metric: str = "episode_return_mean"  # the column y holds
    x_column: str = ENV_STEPS  # the column x holds


@dataclass
class Curve:
    """One group of runs: its label, the common x grid, the mean and the min-max band."""

    label: str
    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    runs: int
    metric: str = "episode_return_mean"  # the column its runs show
    x_column: str = ENV_STEPS  # the column its runs are drawn against


def _flatten(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value
    return out


@functools.cache
def _defaults(algorithm: str) -> tuple[type, dict[str, Any]]:
    """An algorithm's config class and its default config (computed once per algorithm)."""
    from herdrl.registry import get_config_class

    config_class = get_config_class(algorithm)
    return config_class, config_class().to_dict()


def _params(trial_dir: Path) -> dict[str, Any]:
    """A trial's flattened config, completed with its algorithm's defaults (a Tune trial's params.json holds
    only the keys its sweep set; `herd train` writes them all), so equal settings compare equal."""
    from herdrl.experiment import trial_algorithm

    try:
        params = json.loads((trial_dir / "params.json").read_text())
    except (OSError, ValueError):
        params = {}
    params = dict(params) if isinstance(params, dict) else {}
    algorithm = trial_algorithm(trial_dir, params)
    params.pop("algorithm", None)
    if algorithm is not None:
        config_class, defaults = _defaults(algorithm)
        known = {}
        for key, value in params.items():
            try:
                known[config_class.canonical_key(key)] = value
            except HerdError:
                known[key] = value  # not a config key (e.g. imports): kept as is
        params = {**defaults, **known}
    return {**_flatten(params), "algorithm": algorithm}


def _number(row: dict[str, str], column: str) -> float:
    """A cell as a float; NaN where it is missing or not a number."""
    try:
        return float(row[column])
    except (KeyError, TypeError, ValueError):
        return math.nan


def _advancing_x(rows: list[dict[str, str]]) -> str:
    """The x column a run advances on: env steps, or gradient updates where it samples no env (an offline run's
    env steps stay 0)."""
    if any(_number(row, ENV_STEPS) > 0 for row in rows) or not any(_number(row, UPDATES) > 0 for row in rows):
        return ENV_STEPS
    return UPDATES


def read_runs(folder: Path, metric: str, x: str | None) -> list[Run]:
    """Every progress.csv below ``folder`` that has both columns (finite values only). ``metric`` :data:`JUDGED`:
    each run's algorithm's ``stop_metric``; ``x`` None: each run's :func:`_advancing_x`."""
    from herdrl.registry import judged_metric

    runs = []
    for path in sorted(Path(folder).rglob("progress.csv")):
        params = _params(path.parent)
        column = judged_metric(params.get("algorithm")) if metric == JUDGED else metric
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                rows = list(reader)
        except (UnicodeDecodeError, csv.Error) as exc:  # a damaged file: the others are still drawn
            logging.getLogger("herdrl").warning("herdrl: %s is not a readable progress file (%s); left out", path,
                                                str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            continue
        if metric == JUDGED and column not in (reader.fieldnames or ()):
            column = "episode_return_mean"  # a run that never evaluated: its training return is all there is
        x_column = x or _advancing_x(rows)
        points = np.array([(_number(row, x_column), _number(row, column)) for row in rows]).reshape(-1, 2)
        points = points[np.isfinite(points).all(1)]
        if len(points):
            order = np.argsort(points[:, 0], kind="stable")  # interpolation needs increasing x (--x env_steps_per_s)
            runs.append(Run(path, points[order, 0], points[order, 1], params, column, x_column))
    return runs


def _label(params: dict[str, Any], varying: list[str]) -> str:
    def short(value: Any) -> str:
        return f"{value:g}" if isinstance(value, float) else str(value)

    named = ("folder", "algorithm", "env")
    words = [short(params[k]) if k in named else f"{k}={short(params.get(k))}"
             for k in varying if k not in ("metric", X_PARAM) and (params.get(k) is not None or k not in named)]
    if "metric" in varying:
        words.append(f"[{params['metric']}]")
    if X_PARAM in varying:
        words.append(f"[x: {params[X_PARAM]}]")
    return " ".join(words)


def _varying(runs: list[Run], keys: list[str]) -> list[str]:
    return [k for k in keys if len({repr(run.params.get(k)) for run in runs}) > 1]


def group_curves(folders: list[str | Path], metric: str = JUDGED, x: str | None = None) -> list[Curve]:
    """The curves :func:`plot_curves` draws: runs grouped by what differs between them, one mean each; with
    ``metric`` :data:`JUDGED` (each run on its algorithm's metric), runs on different metrics never share a curve,
    and when they differ the labels say which each curve shows. ``x`` None: each run against what it advances on
    (env steps, or gradient updates for a run that samples no env); runs on different x columns never share a
    curve either."""
    runs: list[Run] = []
    seen: set[Path] = set()  # a folder given twice (once relative, once absolute) counts its runs once
    for folder in folders:
        if not Path(folder).exists():
            raise HerdError(f"'{folder}' not found")
        # A trial given on its own stands for its experiment: `herd plot results/X/PPO_*` averages the seeds.
        experiment = Path(folder).parent if (Path(folder) / "progress.csv").exists() else Path(folder)
        for run in read_runs(Path(folder), metric, x):
            if run.path.resolve() in seen:
                continue
            seen.add(run.path.resolve())
            run.params["folder"] = os.path.abspath(experiment)  # comparable however given (relative or absolute)
            runs.append(run)
    if not runs:
        what = "a return column" if metric == JUDGED else f"'{metric}'"
        columns = f"'{x}'" if x else f"'{ENV_STEPS}' (or '{UPDATES}')"
        offline = metric == JUDGED and any(run.x_column == UPDATES for folder in folders
                                           for run in read_runs(Path(folder), UPDATES, None))
        hint = ": an offline run without an env has no return; plot one of its losses (--y policy_loss)" \
            if offline else ""
        raise HerdError(f"no progress.csv with columns {columns} and {what} under "
                        f"{', '.join(map(str, folders))}{hint}")
    mixed = len({run.metric for run in runs}) > 1
    for run in runs:
        run.params["metric"] = METRIC_NAMES.get(run.metric, run.metric)
        run.params[X_PARAM] = AXIS_LABELS.get(run.x_column, run.x_column)
    # Experiments first (folder, algorithm, env), then within each the config keys its runs differ in: two
    # algorithms have different keys by design, and only a key swept within one makes its runs differ.
    outer = ["folder", "algorithm", "env"]
    outer = _varying(runs, outer) or ["algorithm"]
    if mixed:
        outer.append("metric")
    if len({run.x_column for run in runs}) > 1:  # online and offline runs: each curve says what its x counts
        outer.append(X_PARAM)
    if "folder" in outer:  # name folders by what tells them apart: their paths below a common parent
        common = os.path.commonpath([run.params["folder"] for run in runs])
        for run in runs:
            run.params["folder"] = os.path.relpath(run.params["folder"], common)
    groups: dict[tuple, list[Run]] = {}
    for run in runs:
        groups.setdefault(tuple(repr(run.params.get(k)) for k in outer), []).append(run)
    labelled: dict[str, list[Run]] = {}
    for experiment in groups.values():
        keys = sorted({k for run in experiment for k in run.params} - NOT_GROUPING
                      - {"folder", "algorithm", "env", "metric", X_PARAM})
        varying = outer + _varying(experiment, keys)
        for run in experiment:
            labelled.setdefault(_label(run.params, varying) or "runs", []).append(run)
    curves = []
    for label, members in labelled.items():
        start, end = min(r.x[0] for r in members), max(r.x[-1] for r in members)
        grid = np.linspace(start, end, 200) if end > start else np.array([start])
        ys = np.stack([np.where((grid >= r.x[0]) & (grid <= r.x[-1]), np.interp(grid, r.x, r.y), np.nan)
                       for r in members])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a grid point between runs that do not overlap
            stats = np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)
        curves.append(Curve(label, grid, *stats, len(members), members[0].metric, members[0].x_column))
    # Natural order: lr=0.0001 before lr=0.001, num_epochs=4 before num_epochs=10.
    return sorted(curves, key=lambda c: [(0, float(t), "") if t[:1].isdigit() else (1, 0.0, t)
                                         for t in re.split(r"(\d+(?:\.\d+)?(?:e-?\d+)?)", c.label) if t])


def _x_label(x: str | None, shown: set[str]) -> str:
    """The x axis's label: the column asked for, or what the runs drawn advance on."""
    if x:
        return AXIS_LABELS.get(x, x)
    if shown == {ENV_STEPS}:
        return AXIS_LABELS[ENV_STEPS]
    if shown == {UPDATES}:
        return "gradient updates (offline runs: no env steps)"
    return "env steps, or gradient updates for offline runs (see legend)"


def plot_curves(folders: list[str | Path], metric: str | None = None, x: str | None = None,
                out: str | Path = "curves.png", title: str | None = None) -> Path:
    """Draw one mean curve (and min-max band) per group of runs; write PNG or SVG by ``out``'s suffix.

    ``x``: a result column or ``steps``, ``time``, ``iteration``, ``updates``, or None for each run's own progress
    (env steps, or gradient updates for a run that samples no env: offline BC, MARWIL, CQL, IQL; the axis label
    says which); ``metric``: any numeric result column, or None for each run's algorithm's own metric (the greedy
    evaluation return for DQN, SAC and TD3).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg"):
        raise HerdError(f"--out '{out}': use a .png or .svg file name")
    x = X_AXES.get(x, x) if x else None
    metric = metric or JUDGED
    curves = group_curves(folders, metric, x)
    if metric == JUDGED:  # one metric for every curve: name it on the axis, as --y would
        shown = {c.metric for c in curves}
        metric = shown.pop() if len(shown) == 1 else JUDGED
    many = len(curves) > 4
    fig, ax = plt.subplots(figsize=(9 if many else 7, 4.5))
    for curve in curves:
        label = f"{curve.label} ({curve.runs} run{'s' if curve.runs > 1 else ''})"
        line, = ax.plot(curve.x, curve.mean, label=label)
        if curve.runs > 1:
            ax.fill_between(curve.x, curve.low, curve.high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel(_x_label(x, {c.x_column for c in curves}))
    ax.set_ylabel(AXIS_LABELS.get(metric, metric))
    ax.set_title(title or f"{'return' if metric == JUDGED else metric}: mean over runs, band min-max")
    ax.grid(alpha=0.3)
    if many:  # beside the plot, where it hides no curve
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    else:
        ax.legend(loc="best", fontsize="small")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # tight: the legend outside is never cut off
    plt.close(fig)
    return out
