"""``herd bench size``: what the sizing model (:mod:`herdrl.sizing`) picks for an env and algorithm here, from costs
measured in this process, without training: runners, envs per runner, the reason, and the throughput projected
for 1..N nodes like this one ("how many nodes should I ask for?").

    herd bench size --env CartPole-v1
    herd bench size --env herd/Latency-v0 --config 'env_config={step_latency_s: 0.02}' --nodes 8

What is measured (each for about a second): one env stepped alone (random actions); an in-process runner with 1, 4
and 16 envs (the policy's batched forward pass is what a runner's step costs beyond its envs; its CPU time too);
two training iterations in this process (the learner's time per env step of the second); this process's resident
memory (a runner actor imports the same torch, env and policy: an upper bound); and the CPUs, memory and host of
each node (the Ray cluster's when one is joined, else this machine's). Where this machine's nodes advertise more
CPUs than it has cores (fake nodes on loopback, ``--num-cpus`` above the cores), one Ray runner's round (weights
in, a 2-step fragment back) is timed too, in CPU seconds of the driver, the runner and this machine's raylets and
GCS: what each runner adds to the cores they share.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from herdrl.config import AlgorithmConfig
from herdrl.errors import ConfigError
from herdrl.sizing import ENV_CHOICES, Costs, Node, Reservations, Sizing, batch_bounds, choose, projection


def _env_step_seconds(config: AlgorithmConfig, seconds: float) -> float:
    from herdrl.env import make_vector_env

    env = make_vector_env(config.env, config.env_config, 1, "sync")
    env.reset(seed=0)
    env.single_action_space.seed(0)
    steps, start = 0, time.perf_counter()
    while not _timed_enough(time.perf_counter() - start, seconds, steps, 1000) or steps < 3:  # (a 1 s/step env:
        env.step(np.stack([env.single_action_space.sample()]))                                # a few steps)
        steps += 1
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed / steps


def _runner_step_seconds(config: AlgorithmConfig, envs: int, seconds: float,
                         env_step_s: float) -> tuple[float, float, Any]:
    """(seconds, CPU seconds) per env step of an in-process runner with ``envs`` envs (fragments of up to 32
    steps, fewer where the env is slow enough that 32 would overrun ``seconds``; after a one-step warm-up), its
    torch on one thread as a Ray runner's is; and its last fragment."""
    import torch

    from herdrl.rollout import EnvRunner

    length = int(min(32, max(2, seconds / 2 / max(envs * env_step_s, 1e-9))))
    trial = config.copy()
    trial.num_envs_per_env_runner = envs
    trial.rollout_fragment_length = length
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runner = EnvRunner(trial)
    try:
        runner.sample(1)  # warm-up: first forward pass, env resets
        steps, start, cpu = 0, time.perf_counter(), time.process_time()
        while not _timed_enough(time.perf_counter() - start, seconds, steps // (length * envs), 20) or steps == 0:
            fragment = runner.sample(length)
            steps += length * envs
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        runner.stop()
        torch.set_num_threads(threads)
    return elapsed / steps, cpu / steps, fragment


def _timed_enough(elapsed: float, seconds: float, count: int, enough: int) -> bool:
    """Whether a timing has run long enough: ``seconds``, or a tenth of it once ``enough`` repeats are in (a fast
    env's step or runner is timed well in far less than a slow one's: a 6 s CartPole run must not spend 4 s
    measuring)."""
    return elapsed >= seconds or (elapsed >= seconds / 10 and count >= enough)


def _intake_seconds_per_step(fragment: Any, copies: int = 4) -> float:
    """The learner's intake per env step of ``copies`` of ``fragment`` as Ray runners ship them (stacked frames
    packed: :mod:`herdrl.rollout.transport`): rebuilding them side by side, as its batch reads them (best of 3).
    Fetching each from the object store (~0.2-0.5 ms a fragment, ``herd bench ingest``) is not counted."""
    import copy

    from herdrl.rollout.transport import pack, unpack_side_by_side

    best = float("inf")
    for _ in range(3):
        packed = [pack(copy.deepcopy(fragment)) for _ in range(copies)]
        start = time.perf_counter()
        unpack_side_by_side(packed)
        best = min(best, time.perf_counter() - start)
    return best / (copies * fragment.rewards.size)


def _learner_seconds_per_step(config: AlgorithmConfig, runner_step_s: float, seconds: float) -> float:
    """The learner's time per env step of a training iteration in this process (the second: the first warms up),
    on a batch no larger than ``seconds`` of sampling (and, off-policy, replaying) at ``runner_step_s`` (a slow env
    would otherwise take minutes to fill the batch: a learner's time grows with its batch, so the time per env step
    holds)."""
    trial = config.copy()
    trial.num_env_runners, trial.evaluation_interval = 0, None
    steps = int(max(64, seconds / max(runner_step_s, 1e-9)))
    off_policy = "min_sample_timesteps_per_iteration" in trial.fields()
    if off_policy:
        # each iteration samples this many steps and replays training_intensity times as many: a first of 64,
        # learning from the first step on, sizes the second by its cost per step (a learner that replays 256
        # steps per env step would otherwise learn for many seconds on what one second sampled)
        trial.min_sample_timesteps_per_iteration = 64
        trial.num_steps_sampled_before_learning_starts = 0
    elif steps < trial.train_batch_size:
        # (at least one fragment of the in-process runner: IMPALA/APPO's batch holds whole fragments)
        trial.train_batch_size = max(steps, trial.num_envs_per_env_runner * trial.fragment_length()
                                     if trial.samples_while_learning else steps)
        if getattr(trial, "minibatch_size", None):
            trial.minibatch_size = min(trial.minibatch_size, trial.train_batch_size)
    if "num_updates_per_iteration" in trial.fields():  # (IMPALA/APPO: one batch an iteration is enough to time)
        trial.num_updates_per_iteration = 1
    algo = trial.build()
    try:
        row = algo.train()
        if off_policy:
            first = float(row["learn_time_s"]) / max(1.0, float(row["num_env_steps_sampled"]))
            algo.config._values["min_sample_timesteps_per_iteration"] = int(
                min(steps, config.min_sample_timesteps_per_iteration,
                    max(64, seconds / max(runner_step_s + first, 1e-9))))
        row = algo.train()
    finally:
        algo.stop()
    return float(row["learn_time_s"]) / max(1.0, float(row["num_env_steps_sampled"]))


def ray_nodes() -> tuple[Node, ...]:
    """The CPUs and memory of each live node of the Ray cluster this process is connected to."""
    import ray

    return tuple(Node(node["Resources"].get("CPU", 0.0), node["Resources"].get("memory", 0.0),
                      node.get("NodeManagerHostname", ""))
                 for node in ray.nodes() if node.get("Alive"))


def machine_nodes() -> tuple[Node, ...]:
    """This machine as one node: the CPUs this process may use (a Slurm job's) and the memory available."""
    available = 0.0
    with open("/proc/meminfo") as f:  # (Linux: the machines herdrl runs its clusters on)
        for line in f:
            if line.startswith("MemAvailable:"):
                available = float(line.split()[1]) * 1024
    return (Node(this_host()[1], available, this_host()[0]),)


def this_host() -> tuple[str, float]:
    """(this machine's name as Ray reports a node's host, the CPUs this process may use: a Slurm job's)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return socket.gethostname(), float(cpus or 1)


def shares_this_host(nodes: tuple[Node, ...]) -> bool:
    """Whether the nodes on this machine advertise more CPUs than it has cores (fake nodes, ``--num-cpus`` above
    them): their runners share its cores."""
    host = this_host()[0]
    return sum(node.cpus for node in nodes if node.host == host) > (os.cpu_count() or 1)


def _nodes() -> tuple[Node, ...]:
    import sys

    ray = sys.modules.get("ray")
    return ray_nodes() if ray is not None and ray.is_initialized() else machine_nodes()


def reservations(config: AlgorithmConfig, share: float = 1.0) -> Reservations:
    """What ``config`` reserves besides its runners: the driver (and its evaluation runners, counted on the first
    node), its learner actors; ``share`` of the nodes (a Tune trial's). The driver of a run that samples, then
    learns, waits while its runners sample: they may have its CPUs (it holds none of Ray's), unless it is a Tune
    trial's (its bundle holds one); one that learns while they sample (IMPALA, APPO) keeps its own."""
    evaluation = config.evaluation_num_env_runners * config.evaluation_runner_config().num_cpus_per_env_runner
    driver = float(config.num_cpus_for_main_process) if config.samples_while_learning or share < 1 else 0.0
    return Reservations(cpus_per_runner=config.num_cpus_per_env_runner, driver_cpus=driver + evaluation,
                        learners=config.num_learners, cpus_per_learner=config.num_cpus_per_learner, share=share)


def _measuring_copy(config: AlgorithmConfig) -> AlgorithmConfig:
    """``config`` for the throwaway runners and training iterations that measure: in this process, with nothing
    recorded (``output``), no user callbacks, no learner actors, shards or aggregators."""
    trial = config.copy()
    off = {"output": None, "callbacks_class": None, "callbacks_hooks": {}, "num_learners": 0, "shard_fragments": False,
           "num_aggregator_actors_per_learner": 0, "num_env_runners": 0, "max_env_runners": None}
    trial._values.update({key: value for key, value in off.items() if key in trial.fields()})
    return trial


def _cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user and system) the processes ``pids`` have used, from Linux's /proc (gone ones: 0)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += float(fields[11]) + float(fields[12])  # utime, stime (the stat file's 14th and 15th fields)
    return total / os.sysconf("SC_CLK_TCK")


def _ray_daemons() -> list[int]:
    """The raylet and GCS processes on this machine of the cluster this process is joined to (found by its nodes'
    session folders in their command lines: another cluster's, busy with its own work, must not count)."""
    import ray

    sessions = {str(Path(node["RayletSocketName"]).parent.parent) for node in ray.nodes()
                if node.get("Alive") and node.get("RayletSocketName")}
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in ("raylet", "gcs_server"):
                    cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
                    if any(session in cmdline for session in sessions):
                        pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _round_cpu_seconds(config: AlgorithmConfig, seconds: float, step_cpu_s: float) -> float:
    """CPU seconds of one Ray runner's round beyond its env steps (the call, the weights loaded, a 2-step fragment
    back), over ``seconds`` of rounds: the driver's, the runner's and, where the runner is on this machine, its
    raylets' and GCS's CPU time, less what those spend idle (their processes only: other work on the machine is
    not counted)."""
    import ray

    trial = config.copy()
    trial._values.update(num_env_runners=1, num_envs_per_env_runner=1, rollout_fragment_length=2,
                         evaluation_interval=None)
    if not trial.stores_raw_transitions:
        trial._values["train_batch_size"] = 2
        if "minibatch_size" in trial.fields():
            trial._values["minibatch_size"] = 2
    algo = trial.build()
    try:
        runners = algo.runners
        actor = runners.actors[0]
        host = this_host()[0]
        node_id = ray.get(actor.node.remote())[0]
        here = any(node["NodeID"] == node_id and node.get("NodeManagerHostname") == host for node in ray.nodes())
        pids = [os.getpid(), ray.get(actor.pid.remote()), *(_ray_daemons() if here else [])]

        def used() -> float:  # (a runner on another host: its own process CPU, as it reports it)
            return _cpu_seconds(pids) if here else time.process_time() + ray.get(
                actor.apply.remote(lambda runner: time.process_time()))[1]

        weights = algo.runner_weights()
        for version in range(3):  # warm-up: first calls, first forward passes
            runners.sample(weights, None, version)
        idle_start, idle_busy = time.perf_counter(), used()
        time.sleep(seconds / 2)  # (their background: /proc counts 10 ms ticks, so not too short)
        idle = (used() - idle_busy) / (time.perf_counter() - idle_start) if here else 0.0
        rounds, start, busy = 0, time.perf_counter(), used()
        while time.perf_counter() - start < seconds or rounds < 3:
            runners.sample(algo.runner_weights(), None, rounds)
            rounds += 1
        elapsed, busy = time.perf_counter() - start, used() - busy
    finally:
        algo.stop()
    return max(0.0, (busy - idle * elapsed) / rounds - 2 * step_cpu_s)


def _can_join_ray(config: AlgorithmConfig) -> bool:
    import sys

    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized() or config.address or os.environ.get("RAY_ADDRESS"))


def measure_costs(config: AlgorithmConfig, envs: tuple[int, ...] = ENV_CHOICES, seconds: float = 1.0,
                  nodes: tuple[Node, ...] | None = None) -> Costs:
    """The costs :func:`herdrl.sizing.choose` decides from, measured in this process (see the module's docstring);
    ``nodes`` where the caller read them (else the joined Ray cluster's, or this machine's). With N learner actors
    the learner's time is one learner's over N (they split each batch: an upper bound of their speed, 1.41-1.49x
    for 2 CPU learners measured here)."""
    learners = max(1, config.num_learners)
    config = _measuring_copy(config)
    env_step = _env_step_seconds(config, seconds / 2)
    # (envs whose two steps would overrun the budget are left to the formula, from the sizes measured)
    timed = {n: _runner_step_seconds(config, n, seconds, env_step) for n in envs
             if n == min(envs) or 2 * n * env_step <= seconds}
    runner_step = {n: wall for n, (wall, _, _) in timed.items()}
    # the policy's share: what a runner's step costs beyond its envs stepped one by one (0 where the env's own
    # vectorised version is faster than that: the measured runner rate is what the model uses then)
    inference = {n: max(0.0, n * runner_step[n] - n * env_step) for n in runner_step}
    learner = _learner_seconds_per_step(config, min(runner_step.values()), 2 * seconds) / learners
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # (kB on Linux)
    # the machine's cores, not this process's share of them (a driver pinned to one CPU of a node whose raylet
    # offers them all would look oversubscribed)
    host, cores = this_host()[0], float(os.cpu_count() or 1)
    length = config.fragment_length() if config.samples_while_learning else config.rollout_fragment_length
    costs = Costs(env_step_s=env_step, inference_s=inference, learner_s_per_step=learner, runner_rss_bytes=rss,
                  nodes=nodes or _nodes(), runner_step_s=runner_step,
                  runner_cpu_s={n: cpu for n, (_, cpu, _) in timed.items()}, host_cores={host: cores},
                  train_batch=config.train_batch_size, fragment_steps=length if isinstance(length, int) else None,
                  intake_s_per_step=_intake_seconds_per_step(timed[max(timed)][2]))
    return costs


#: A runner's round at its dearest (measured here: 4-10 ms of CPU a round, driver, raylet and runner together):
#: where a choice would hold even at this, measuring the round is skipped.
ROUND_CPU_CEILING_S = 0.03


def with_round_cost(config: AlgorithmConfig, costs: Costs, decide: Callable[[Costs], Sizing],
                    seconds: float = 1.0) -> tuple[Costs, Sizing]:
    """``costs`` with a runner's round measured (``round_cpu_s``) where it may change ``decide``'s choice: the
    runners would share this host's cores (its nodes advertise more CPUs than it has), and the choice differs
    between a free round and a dear one (:data:`ROUND_CPU_CEILING_S`); with the choice on those costs."""
    sizing = decide(costs)
    if costs.shared_cores() is None or sizing.num_env_runners == 0 or not _can_join_ray(config):
        return costs, sizing  # (a round's cost only makes runners dearer: in-process sampling stays the choice)
    dear = decide(dataclasses.replace(costs, round_cpu_s=ROUND_CPU_CEILING_S))
    if (dear.num_env_runners, dear.num_envs_per_env_runner) == (sizing.num_env_runners,
                                                                  sizing.num_envs_per_env_runner):
        return costs, sizing
    costs = dataclasses.replace(costs, round_cpu_s=_round_cpu_seconds(
        _measuring_copy(config), seconds / 2, costs.runner_cpu_s[min(costs.runner_cpu_s)]))
    return costs, decide(costs)


#: What ``herd bench size`` and ``num_env_runners="auto"`` size: single-agent algorithms that learn from their
#: runners (a learner's time per env step holds on a smaller batch; off-policy ones replay ``training_intensity``
#: times what they sample). Offline and multi-agent runs are not sized. The learner's intake of packed frames is
#: measured in this process; the fetch of each fragment from the object store is not.
SIZED = ("PPO", "A2C", "TRPO", "IMPALA", "APPO", "DQN", "SAC", "TD3")


def why_not_sized(config: AlgorithmConfig) -> str | None:
    """Why herdrl cannot size this run (yet), or None."""
    return ("it learns from a dataset, with no runners to size" if config.learns_offline
            else "multi-agent runs are not sized yet" if config.is_multi_agent
            else f"it sizes {', '.join(SIZED)} for now" if config.algo_name not in SIZED else None)


def run_size(config: AlgorithmConfig, nodes: int = 8, echo: Any = print) -> dict:
    """Measure, print the choice, the costs and the projection for 1..``nodes`` nodes; return them as a dict.
    Numbers the user set (``num_env_runners``, ``num_envs_per_env_runner``) are kept, as given."""
    why = why_not_sized(config)
    if why:
        raise ConfigError(f"herd bench size cannot size this {config.algo_name} run: {why}; size it with "
                          "`herd bench scaling` meanwhile")
    envs = config.num_envs_per_env_runner if config.is_explicit("num_envs_per_env_runner") else None
    runners = config.num_env_runners if config.is_explicit("num_env_runners") else None
    envs, runners = (None if value == "auto" else value for value in (envs, runners))
    config = config.copy()
    config._values.update(num_env_runners=runners or 0, num_envs_per_env_runner=envs or 1)
    config.validate()
    costs = measure_costs(config, ENV_CHOICES if envs is None else (envs,))
    reserved = reservations(config)
    overlap = config.samples_while_learning
    bounds = batch_bounds(config)
    aggregators = runners is None and not config.stores_raw_transitions and not any(
        config.is_explicit(key) for key in ("num_learners", "num_aggregator_actors_per_learner"))
    costs, sizing = with_round_cost(config, costs, lambda costs: choose(
        costs, reserved, overlap, runners=runners, envs=envs, bounds=bounds, aggregators_allowed=aggregators))
    echo(f"herd bench size: {sizing.reason}")
    echo(f"measured: env {costs.env_step_s * 1e3:.3f} ms/step alone; a runner's ms per env step with "
         + ", ".join(f"{n} envs {s * 1e3:.3f}" for n, s in sorted(costs.runner_step_s.items()))
         + " (CPU " + ", ".join(f"{s * 1e3:.3f}" for _, s in sorted(costs.runner_cpu_s.items())) + ")"
         + f"; learner {costs.learner_s_per_step * 1e6:.1f} us/env step (its intake of fragments from Ray runners "
         f"{costs.intake_s_per_step * 1e6:.2f} more); runner memory <= "
         f"{costs.runner_rss_bytes / 2**20:,.0f} MiB; nodes: "
         + ", ".join(f"{n.cpus:g} CPUs/{n.memory_bytes / 2**30:.1f} GiB" for n in costs.nodes)
         + (f"; they share {costs.shared_cores():g} real cores, a runner's round {costs.round_cpu_s * 1e3:.1f} ms "
            "of CPU" if costs.shared_cores() is not None else ""))
    rows = projection(costs, reserved, nodes, overlap, bounds, aggregators)
    echo("| nodes like the first | runners | envs per runner | projected env steps/s | bound |")
    echo("| --- | --- | --- | --- | --- |")
    for count, row in rows:
        echo(f"| {count} | {row.num_env_runners} | {row.num_envs_per_env_runner} | {row.throughput:,.0f} | "
             f"{row.bound}{' (1 learner actor + aggregator)' if row.aggregators else ''} |")
    return {"sizing": sizing, "costs": costs, "projection": rows}
