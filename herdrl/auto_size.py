"""``num_env_runners="auto"`` and ``num_envs_per_env_runner="auto"``: measure, pick, say why, keep the choice.

Before a run's first iteration :func:`size_run` measures what :mod:`herdrl.sizing` decides from (the env's step,
an in-process runner with 1, 4 and 16 envs, the learner's time per env step, this process's memory, the nodes'
CPUs and memory; see :func:`herdrl.bench_size.measure_costs`), sets the keys left to ``"auto"`` and prints one line
with the reason. A number the user gave stays as given. :func:`write_record` puts the measurements in the trial
folder (``sizing.json``); a resumed trial keeps its first choice (:func:`kept_choice`) and measures nothing.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from herdrl.errors import ConfigError
from herdrl.sizing import describe

#: The keys ``"auto"`` may be given to.
AUTO_KEYS = ("num_env_runners", "num_envs_per_env_runner")
#: Seconds measuring may take by default (the issue's bound; 5% of a ``time_total_s`` stop when that is less).
DEFAULT_BUDGET_S = 10.0
RECORD = "sizing.json"


def wants_sizing(config: Any) -> bool:
    """Whether ``config`` leaves a runner count or an env count to herdrl."""
    return any(getattr(config, key) == "auto" for key in AUTO_KEYS)


def check_sizable(config: Any) -> None:
    """One line where ``auto`` cannot size this run (yet)."""
    from herdrl.bench_size import why_not_sized

    why = why_not_sized(config)
    if why:
        keys = " and ".join(key for key in AUTO_KEYS if getattr(config, key) == "auto")
        raise ConfigError(f"{keys}='auto' cannot size this {config.algo_name} run: {why}; give a number")


def budget_for(stop: dict[str, float] | None) -> float:
    """Seconds measuring may take: ~10, or 5% of the run's ``time_total_s`` stop when that is less."""
    limit = (stop or {}).get("time_total_s")
    return DEFAULT_BUDGET_S if limit is None else max(1.0, min(DEFAULT_BUDGET_S, 0.05 * float(limit)))


def size_run(config: Any, budget_s: float = DEFAULT_BUDGET_S, share: float = 1.0,
             echo: Any = print, aggregators: bool = True) -> tuple[Any, dict[str, Any]]:
    """A copy of ``config`` with its ``"auto"`` keys chosen from costs measured here, and the record of how
    (what :func:`write_record` keeps). ``share``: the fraction of the nodes this run may use (a Tune trial's).
    ``aggregators``: whether it may add a learner actor with an aggregator (:func:`may_add_aggregators`). Says the
    choice in one line through ``echo``."""
    from herdrl.bench_size import measure_costs, reservations, shares_this_host, with_round_cost
    from herdrl.sizing import ENV_CHOICES, batch_bounds, choose, fewest_runners, most_worth

    check_sizable(config)
    runners = None if config.num_env_runners == "auto" else int(config.num_env_runners)
    envs = None if config.num_envs_per_env_runner == "auto" else int(config.num_envs_per_env_runner)
    least = fewest_runners(config._values)
    probe = config.copy()
    probe._values.update(num_env_runners=runners if runners is not None else least,
                         num_envs_per_env_runner=envs or 1, max_env_runners=None)
    probe.validate()
    bounds = batch_bounds(probe)
    start = time.perf_counter()
    # (measure_costs spends about 8 of its `seconds` on the parts it times, plus builds and warm-ups; a runner's
    # round, timed where this host's nodes share its cores, ~2 s and 3/4 of one more)
    nodes = _nodes_for(probe)
    seconds = max(0.1, budget_s / (13 if shares_this_host(nodes) else 10))
    costs = measure_costs(probe, ENV_CHOICES if envs is None else (envs,), seconds=seconds, nodes=nodes)
    overlap = probe.samples_while_learning
    reserved = reservations(probe, share)
    aggregators = aggregators and may_add_aggregators(config)
    costs, sizing = with_round_cost(probe, costs, lambda costs: choose(
        costs, reserved, overlap, runners=runners, envs=envs, least=least, bounds=bounds,
        aggregators_allowed=aggregators), seconds)
    took = time.perf_counter() - start
    sized = config.copy()
    sized._values.update(num_env_runners=sizing.num_env_runners, num_envs_per_env_runner=sizing.num_envs_per_env_runner)
    if sizing.aggregators:  # (the learner's intake holds an overlapping run back: an aggregator takes it in)
        _add_aggregators(sized, 1, sizing.aggregators)
    if config.max_env_runners is None and runners is None and sizing.num_env_runners > 0:
        # nodes that join later get runners up to where more stop paying (a learner-bound run: none)
        sized._values["max_env_runners"] = max(sizing.num_env_runners, most_worth(
            costs, overlap, sizing.num_envs_per_env_runner, total_envs=bounds[0],
            aggregators=bool(sizing.aggregators)))
    auto = [key for key in AUTO_KEYS if getattr(config, key) == "auto"]
    echo(f"herd: {', '.join(f'{key}=auto' for key in auto)}: {sizing.reason}; measured in {took:.1f} s")
    record = {"num_env_runners": sizing.num_env_runners, "num_envs_per_env_runner": sizing.num_envs_per_env_runner,
              "max_env_runners": sized.max_env_runners, "num_learners": sized.num_learners,
              "num_aggregator_actors_per_learner": sized.num_aggregator_actors_per_learner, "auto": auto,
              "reason": sizing.reason, "bound": sizing.bound,
              "max_runners": sizing.max_runners,
              "projected_env_steps_per_s": _finite(sizing.throughput), "share": share, "measured_s": round(took, 3),
              "costs": {"env_step_s": costs.env_step_s, "runner_step_s": {str(n): s for n, s in
                                                                           sorted(costs.runner_step_s.items())},
                        "runner_cpu_s": {str(n): s for n, s in sorted(costs.runner_cpu_s.items())},
                        "intake_s_per_env_step": costs.intake_s_per_step,
                        "round_cpu_s": costs.round_cpu_s, "host_cores": costs.host_cores,
                        "learner_s_per_env_step": costs.learner_s_per_step,
                        "runner_rss_bytes": costs.runner_rss_bytes,
                        "nodes": [{"cpus": n.cpus, "memory_bytes": n.memory_bytes, "host": n.host}
                                  for n in costs.nodes]}}
    return sized, record


def may_add_aggregators(config: Any) -> bool:
    """Whether ``auto`` may give this run a learner actor with an aggregator: the runner count is left to it, the
    learners and aggregators are not set, and its learner takes fragments (not replayed batches)."""
    return (config.num_env_runners == "auto" and not config.stores_raw_transitions
            and not config.is_explicit("num_learners") and not config.is_explicit("num_aggregator_actors_per_learner"))


def _add_aggregators(config: Any, learners: int, aggregators: int) -> None:
    """Learner actors with aggregators on ``config``: the driver's learner GPU (``num_gpus``) becomes the learner
    actor's (``num_gpus_per_learner``), as learner actors take theirs."""
    config._values.update(num_learners=learners, num_aggregator_actors_per_learner=aggregators)
    if config.num_gpus:
        config._values.update(num_gpus_per_learner=config.num_gpus, num_gpus=0)


def sized_config(config: Any) -> Any:
    """``config`` sized (:func:`size_run`, saying the choice) and validated on its choice."""
    sized, _ = size_run(config)
    sized.validate()
    return sized


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value


def _nodes_for(config: Any) -> Any:
    """The nodes the run will use: a Ray cluster's (joined for the reading, left again where this call joined it:
    the runners join it as they always do), else this machine's."""
    import os
    import sys

    from herdrl.bench_size import machine_nodes, ray_nodes

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return ray_nodes()
    if not (config.address or os.environ.get("RAY_ADDRESS")):
        return machine_nodes()
    from herdrl.cluster.connect import connect, disconnect

    joined = connect(config)
    try:
        return ray_nodes()
    finally:
        if joined:
            disconnect()


def write_record(trial_dir: Path, record: dict[str, Any]) -> None:
    """Keep how the run was sized in its trial folder (JSON: read back with ``json``, never unpickled)."""
    (Path(trial_dir) / RECORD).write_text(json.dumps(record, indent=1) + "\n")


def kept_choice(config: Any, trial_dir: Path, echo: Any = print) -> Any | None:
    """A resumed trial's first choice for the ``"auto"`` keys (its ``sizing.json``), set on a copy of ``config``;
    None where the trial has no record (it was not sized: the caller measures)."""
    path = Path(trial_dir) / RECORD
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        chosen = {key: record[key] for key in AUTO_KEYS}
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{path} is not a sizing record herdrl wrote ({type(exc).__name__}); delete it to measure "
                          "again") from exc
    if any(type(value) is not int for value in chosen.values()) or chosen["num_env_runners"] < 0 \
            or chosen["num_envs_per_env_runner"] < 1:
        raise ConfigError(f"{path} holds a runner or env count that is not a whole number in range; delete it to "
                          "measure again")
    kept = config.copy()
    auto = [key for key in AUTO_KEYS if getattr(config, key) == "auto"]
    kept._values.update({key: chosen[key] for key in auto})
    most = record.get("max_env_runners")
    if config.max_env_runners is None and "num_env_runners" in auto and type(most) is int and most >= 1 \
            and kept.num_env_runners >= 1:
        kept._values["max_env_runners"] = max(most, kept.num_env_runners)
    aggregators, learners = record.get("num_aggregator_actors_per_learner"), record.get("num_learners")
    if may_add_aggregators(config) and type(aggregators) is int and aggregators >= 1 and type(learners) is int \
            and learners >= 1:
        _add_aggregators(kept, learners, aggregators)
    echo(f"herd: {', '.join(f'{key}=auto' for key in auto)}: the trial's first choice, "
         f"{describe(kept.num_env_runners, kept.num_envs_per_env_runner)} (kept on resume, not measured again)")
    return kept
