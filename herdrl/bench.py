"""``herd bench scaling``: is there a real speedup from more env runners, on this machine or cluster?

For each runner count it builds the algorithm, runs a warm-up iteration and ``iters`` measured ones, and
reports sampling throughput (env steps / sampling time, learning excluded), whole-iteration time, and the
speedup of sampling over 1 runner and over in-process sampling. Each runner samples the same fragment
length, so N runners collect N times the steps per iteration (weak scaling). Writes ``scaling.csv`` and
``scaling.png``.

    herd bench scaling --env herd/Latency-v0 --runners 1,2,4,8
    herd bench scaling --env CartPole-v1 --runners 1,2 --envs-per-runner 8 --address auto
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from herdrl.config import AlgorithmConfig


@dataclass
class ScalingRow:
    """One measured runner count (0 = in-process)."""

    runners: int
    envs_per_runner: int
    steps_per_iter: float
    sample_steps_per_s: float
    iter_time_s: float
    speedup_vs_1: float | None = None
    speedup_vs_local: float | None = None


def measure(base: AlgorithmConfig, runners: int, iters: int) -> ScalingRow:
    """Build with ``runners`` runners, warm up one iteration, then measure ``iters`` iterations."""
    config = base.copy()
    config.num_env_runners = runners
    fragment = config.fragment_length()
    config.train_batch_size = max(1, runners) * config.num_envs_per_env_runner * fragment
    config.rollout_fragment_length = fragment
    if hasattr(config, "minibatch_size"):
        config.minibatch_size = min(config.minibatch_size, config.train_batch_size)
    algo = config.build()
    try:
        algo.train()  # warm-up: actor start, first weights, JIT-free but cache-cold
        results = [algo.train() for _ in range(iters)]
    finally:
        algo.stop()
    steps = sum(r["num_env_steps_sampled"] for r in results)
    return ScalingRow(
        runners=runners, envs_per_runner=config.num_envs_per_env_runner, steps_per_iter=steps / iters,
        sample_steps_per_s=steps / sum(r["sample_time_s"] for r in results),
        iter_time_s=statistics.mean(r["time_this_iter_s"] for r in results))


def run_scaling(base: AlgorithmConfig, runner_counts: list[int], iters: int, out_dir: Path,
                include_local: bool = True, echo: Any = print) -> list[ScalingRow]:
    """Measure every runner count (and in-process), print the table, write CSV and PNG into ``out_dir``."""
    from herdrl.cluster import connect, disconnect

    base.validate()
    owns_ray = connect(base, num_cpus=max(runner_counts) * base.num_cpus_per_env_runner)  # one Ray for all rows
    rows: list[ScalingRow] = []
    try:
        for count in ([0] if include_local else []) + runner_counts:
            rows.append(measure(base, count, iters))
            echo(f"measured {count or 'in-process'} runner(s): {rows[-1].sample_steps_per_s:,.0f} sampled steps/s")
    finally:
        if owns_ray:
            disconnect()
    one = next((r for r in rows if r.runners == 1), None)
    local = next((r for r in rows if r.runners == 0), None)
    for row in rows:
        row.speedup_vs_1 = row.sample_steps_per_s / one.sample_steps_per_s if one else None
        row.speedup_vs_local = row.sample_steps_per_s / local.sample_steps_per_s if local else None
    echo(format_table(rows))
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "scaling.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    plot(rows, out_dir / "scaling.png", title=str(base.env))
    echo(f"wrote {out_dir / 'scaling.csv'} and {out_dir / 'scaling.png'}")
    return rows


def format_table(rows: list[ScalingRow]) -> str:
    """A Markdown table of the rows."""
    fmt = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
    lines = ["| runners | envs/runner | steps/iter | sampling env steps/s | iteration time s | speedup vs 1 runner "
             "| speedup vs in-process |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r.runners or 'in-process'} | {r.envs_per_runner} | {r.steps_per_iter:,.0f} | "
                     f"{r.sample_steps_per_s:,.0f} | {r.iter_time_s:.3f} | {fmt(r.speedup_vs_1)} | "
                     f"{fmt(r.speedup_vs_local)} |")
    return "\n".join(lines)


def plot(rows: list[ScalingRow], path: Path, title: str) -> None:
    """Sampling speedup vs runner count, with the ideal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    remote = [r for r in rows if r.runners > 0 and r.speedup_vs_1 is not None]
    fig, ax = plt.subplots(figsize=(5, 4))
    if remote:
        xs = [r.runners for r in remote]
        ax.plot(xs, [r.speedup_vs_1 for r in remote], "o-", label="measured")
        ax.plot(xs, xs, "--", color="grey", label="ideal")
    ax.set_xlabel("env runners")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # runner counts are whole numbers
    ax.set_ylabel("sampling speedup vs 1 runner")
    ax.set_title(f"herd bench scaling: {title}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
