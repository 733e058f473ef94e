"""How many env runners, and how many envs on each: the model behind sizing a run from measured costs (issue 64;
the measurements, ``num_env_runners="auto"`` and ``herd bench size`` build on it).

A runner with ``E`` envs steps them one after another, then runs one batched forward pass for all of them::

    rate(E) = E / (E * env_step_s + inference_s(E))                 env steps per second, one runner

The learner trains ``1 / learner_s_per_step`` env steps per second. An algorithm that samples, then learns (PPO,
A2C, DQN, SAC, ... in herdrl) spends ``1 / (N * rate)`` sampling and ``learner_s_per_step`` learning per env step::

    throughput(N, E) = 1 / (1 / (N * rate(E)) + learner_s_per_step)

and one that overlaps them (APPO, IMPALA) is held back by the slower of the two::

    throughput(N, E) = min(N * rate(E), 1 / learner_s_per_step)

``N`` is bounded by the runner slots the nodes hold (their CPUs less the driver's and the learner actors', in
whole ``num_cpus_per_env_runner`` reservations on one node each) and by their memory (a runner's RSS). The choice
is the fewest runners, and for them the envs per runner, whose throughput is within ``tolerance`` of the best
any allowed pair reaches: past it, more runners cost CPUs for little (the learner, or the slots, bound the run).

Where nodes on one host advertise more CPUs than it has (several raylets on one machine, or a node started with
``--num-cpus`` above its cores, for an env that waits), the runners share its cores: each env step costs a
runner's CPU (``runner_cpu_s``) and each runner's round, one fragment, costs the call, the weights and the
fragment's way back (``round_cpu_s``: driver, raylet and runner together). Sampling is then no faster than::

    cores / (runner_cpu_s(E) + round_cpu_s / steps per round)      steps per round: train_batch / N, or E x L

which falls as ``N`` grows: the choice is where the throughput peaks (more runners would take CPU the others need).

Fragments from Ray runners also cost the learner their intake (packed frames rebuilt): ``learner_s_per_step``
plus ``intake_s_per_step``. An aggregator actor takes the intake in on a core of its own; for a run that learns
while its runners sample, the learner then spends the larger of the two per env step, not their sum, and the
choice may add one learner actor with one aggregator where that pays by more than the tolerance.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from herdrl.errors import ConfigError

#: Envs per runner tried when the user leaves them to herdrl (the issue's grid).
ENV_CHOICES = (1, 4, 16)
#: The shortest fragment a sample-then-learn run's train batch is cut into where its fragment length is "auto"
#: (GAE over fewer steps is mostly bootstrapped values).
MIN_FRAGMENT = 16


def fewest_runners(values) -> int:
    """The fewest runners a config (its raw values: ``validate`` asks before it checks their types) works with:
    one per learner that takes its own fragments (``shard_fragments``), one where runners are added to Ray runners
    (``max_env_runners``), else none (sampling in the driver)."""
    learners = values["num_learners"]
    least = learners if values["shard_fragments"] is True and isinstance(learners, int) else 0
    return max(least, 1) if isinstance(values["max_env_runners"], int) else least


def batch_bounds(config) -> tuple[int | None, int | None]:
    """(the most envs in all, the most envs per runner) ``config``'s train batch holds: a sample-then-learn run fills
    ``train_batch_size`` with one fragment per env, of its ``rollout_fragment_length`` (or ``MIN_FRAGMENT`` steps
    where that is "auto"), so more envs would grow its batch or shrink its fragments; IMPALA/APPO's batch holds at
    least one runner's fragment; off-policy runs replay what they sample (None: no bound)."""
    if config.stores_raw_transitions:
        return None, None
    length = config.rollout_fragment_length
    most = max(1, config.train_batch_size // (length if isinstance(length, int) else MIN_FRAGMENT))
    return (None, most) if config.samples_while_learning else (most, None)


@dataclass(frozen=True)
class Node:
    """One node's capacity: CPUs and bytes of memory free for runners."""

    cpus: float
    memory_bytes: float
    host: str = ""  # the machine it runs on: nodes on one host share its cores


@dataclass(frozen=True)
class Costs:
    """Measured costs that decide the size (seconds, bytes).

    ``inference_s`` maps a batch size (envs per runner) to one forward pass of the policy on that many
    observations; sizes not measured are interpolated linearly (extrapolated from the last two beyond them).
    ``runner_step_s``, where given, is a runner's measured seconds per env step with that many envs: it replaces
    the formula for those sizes (an env's own vectorised version steps copies faster than one by one).
    ``runner_cpu_s``: the CPU seconds of those steps; ``round_cpu_s``: the CPU seconds of one runner's round beyond
    its steps; ``host_cores``: the cores of hosts known (the driver's); ``train_batch`` and ``fragment_steps`` (per
    env; None: "auto", the batch shared among the envs) give the steps per round. They matter only where a host's
    nodes advertise more CPUs than its cores (see the module's docstring). ``intake_s_per_step``: the learner's
    intake of fragments from Ray runners per env step (frames rebuilt, fragments joined), which an aggregator
    actor takes off the learner's process.
    """

    env_step_s: float
    inference_s: dict[int, float]
    learner_s_per_step: float
    runner_rss_bytes: float
    nodes: tuple[Node, ...]
    runner_step_s: dict[int, float] = field(default_factory=dict)
    runner_cpu_s: dict[int, float] = field(default_factory=dict)
    round_cpu_s: float = 0.0
    host_cores: dict[str, float] = field(default_factory=dict)
    train_batch: int = 1
    fragment_steps: int | None = None
    intake_s_per_step: float = 0.0

    def __post_init__(self) -> None:
        if self.env_step_s < 0 or self.learner_s_per_step < 0 or self.runner_rss_bytes < 0:
            raise ConfigError("sizing costs must be >= 0 (env step, learner time per step, runner memory)")
        if not self.inference_s or any(size < 1 or seconds < 0 for size, seconds in self.inference_s.items()):
            raise ConfigError("sizing needs the policy's inference time for at least one batch size >= 1")
        if not self.nodes:
            raise ConfigError("sizing needs at least one node")

    def inference_at(self, batch: int) -> float:
        """One forward pass on ``batch`` observations: measured, else linear between (or past) measured sizes."""
        sizes = sorted(self.inference_s)
        if batch in self.inference_s:
            return self.inference_s[batch]
        if len(sizes) == 1:
            return self.inference_s[sizes[0]]
        below = [s for s in sizes if s < batch][-1:] or sizes[:1]
        above = [s for s in sizes if s > batch][:1] or sizes[-1:]
        lo, hi = (below[0], above[0]) if below[0] != above[0] else (sizes[-2], sizes[-1])
        slope = (self.inference_s[hi] - self.inference_s[lo]) / (hi - lo)
        return max(0.0, self.inference_s[lo] + slope * (batch - lo))

    def runner_rate(self, envs: int) -> float:
        """Env steps per second of one runner with ``envs`` envs."""
        if envs in self.runner_step_s:
            return math.inf if self.runner_step_s[envs] == 0 else 1.0 / self.runner_step_s[envs]
        seconds = envs * self.env_step_s + self.inference_at(envs)
        return math.inf if seconds == 0 else envs / seconds

    def learner_time(self, runners: int, overlap: bool, aggregators: bool = False) -> float:
        """Seconds the learner spends per env step: its update, and its intake of fragments from Ray runners;
        an aggregator takes the intake in, on a core of its own, while an overlapping learner updates."""
        intake = self.intake_s_per_step if runners > 0 else 0.0
        return max(self.learner_s_per_step, intake) if aggregators and overlap else self.learner_s_per_step + intake

    def shared_cores(self, share: float = 1.0) -> float | None:
        """The cores all runners share, where some host's nodes advertise more CPUs than it has (None elsewhere:
        each runner has the CPUs it reserves); ``share`` of them for a run given a share of the cluster."""
        advertised: dict[str, float] = {}
        for node in self.nodes:
            advertised[node.host] = advertised.get(node.host, 0.0) + node.cpus
        if not any(self.host_cores.get(host, cpus) < cpus for host, cpus in advertised.items()):
            return None
        return share * sum(min(cpus, self.host_cores.get(host, cpus)) for host, cpus in advertised.items())

    def sampling_cpu_s(self, runners: int, envs: int) -> float:
        """CPU seconds per env step sampled by ``runners`` Ray runners of ``envs`` envs: their steps' (as measured
        at the nearest size at most ``envs``) and their rounds' share (one fragment per runner a round)."""
        if not self.runner_cpu_s:
            return 0.0
        sizes = sorted(self.runner_cpu_s)
        step = self.runner_cpu_s[([s for s in sizes if s <= envs] or sizes)[-1]]
        per_env = self.fragment_steps or math.ceil(self.train_batch / (max(1, runners) * envs))
        return step + self.round_cpu_s / (per_env * envs)


@dataclass(frozen=True)
class Reservations:
    """What a run reserves besides its runners: the driver on the first node, learner actors wherever they fit."""

    cpus_per_runner: float = 1.0
    driver_cpus: float = 1.0
    learners: int = 0
    cpus_per_learner: float = 1.0
    share: float = 1.0  # a fraction of the cluster (concurrent `herd tune` trials share it)


@dataclass
class Sizing:
    """The choice, why, and what it projects."""

    num_env_runners: int
    num_envs_per_env_runner: int
    throughput: float  # projected env steps per second
    bound: str  # "learner", "slots", "memory" or "cores": what stops more runners from paying
    max_runners: int  # runners the nodes hold
    costs: Costs
    reason: str = field(default="")
    aggregators: int = 0  # aggregator actors for the one learner actor (0: the learner takes its fragments in)


def runner_slots(costs: Costs, reserved: Reservations) -> tuple[int, str]:
    """(how many runners the nodes hold, "slots" or "memory": which of CPUs and memory bounds them first), node
    by node: a runner is placed on one node, where both its CPUs and its memory must be."""
    if not 0 < reserved.share <= 1:
        raise ConfigError(f"sizing share must be in (0, 1], got {reserved.share!r}")
    learners_left = reserved.learners
    total, by_cpu_total = 0, 0
    for i, node in enumerate(costs.nodes):
        cpus = node.cpus * reserved.share - (reserved.driver_cpus if i == 0 else 0.0)
        while learners_left and cpus >= reserved.cpus_per_learner:  # learner actors take whole reservations too
            cpus -= reserved.cpus_per_learner
            learners_left -= 1
        by_cpu = max(0, math.floor(cpus / reserved.cpus_per_runner + 1e-9))
        by_memory = (max(0, math.floor(node.memory_bytes * reserved.share / costs.runner_rss_bytes))
                     if costs.runner_rss_bytes > 0 else by_cpu)
        total += min(by_cpu, by_memory)
        by_cpu_total += by_cpu
    if learners_left:
        raise ConfigError(f"num_learners={reserved.learners} x num_cpus_per_learner={reserved.cpus_per_learner:g} "
                          "do not fit on the nodes beside the driver; lower them or add nodes")
    return total, ("memory" if total < by_cpu_total else "slots")


def throughput(costs: Costs, runners: int, envs: int, overlap: bool, share: float | None = 1.0,
               aggregators: bool = False) -> float:
    """Projected env steps per second with ``runners`` runners of ``envs`` envs (0 runners: sampling in the
    driver, which never overlaps learning); ``share``: the run's share of the cores where runners share a host's
    (None: as if each had its own, whatever the nodes); ``aggregators``: an aggregator takes the learner's intake."""
    sample_rate = max(1, runners) * costs.runner_rate(envs)
    learner_s = costs.learner_time(runners, overlap, aggregators)
    learn_rate = math.inf if learner_s == 0 else 1.0 / learner_s
    cores = costs.shared_cores(share) if share is not None and runners > 0 else None
    cpu = costs.sampling_cpu_s(runners, envs) if cores is not None else 0.0
    if overlap and runners > 0:  # (the learner learns beside the runners, on the same cores: its aggregator too)
        shared = cores / (cpu + costs.learner_time(runners, False)) if cpu > 0 else math.inf
        return min(sample_rate, learn_rate, shared)
    if cpu > 0:
        sample_rate = min(sample_rate, cores / cpu)
    return 1.0 / (1.0 / sample_rate + 1.0 / learn_rate)


def choose(costs: Costs, reserved: Reservations = Reservations(), overlap: bool = False,
           runners: int | None = None, envs: int | None = None, tolerance: float = 0.05, least: int = 0,
           bounds: tuple[int | None, int | None] = (None, None), aggregators_allowed: bool = False) -> Sizing:
    """Runners and envs per runner for these costs; a number the user gave (``runners``, ``envs``) is kept.
    ``least``: the fewest runners the run works with (learners that each take their own fragments); ``bounds``:
    the most envs in all and per runner its train batch holds (:func:`batch_bounds`). ``aggregators_allowed``:
    an overlapping run whose learner's intake holds it back may get one learner actor with an aggregator (one
    more core on the nodes, taken from the runners' slots), where that beats the best without by the tolerance."""
    plain = _choose_on(costs, reserved, overlap, runners, envs, tolerance, least, bounds, False)
    if not (aggregators_allowed and overlap and costs.intake_s_per_step > 0 and plain.num_env_runners > 0):
        return plain
    # a learner actor (where the driver learned), and a core for the aggregator (Ray reserves none for it)
    with_core = dataclasses.replace(reserved, learners=max(1, reserved.learners), driver_cpus=reserved.driver_cpus + 1)
    try:
        aggregated = _choose_on(costs, with_core, overlap, runners, envs, tolerance, max(1, least), bounds, True)
    except ConfigError:  # (no room for them)
        return plain
    return aggregated if aggregated.throughput > (1 + tolerance) * plain.throughput else plain


def _choose_on(costs: Costs, reserved: Reservations, overlap: bool, runners: int | None, envs: int | None,
               tolerance: float, least: int, bounds: tuple[int | None, int | None], aggregators: bool) -> Sizing:
    most, limit = runner_slots(costs, reserved)
    if runners is not None and runners > most:
        raise ConfigError(f"num_env_runners={runners} is more than the nodes hold ({most} runners by "
                          f"{'memory' if limit == 'memory' else 'CPUs'}); lower it or add nodes")
    if runners is None and least > most:
        raise ConfigError(f"this run needs at least {least} runners and the nodes hold {most} (by "
                          f"{'memory' if limit == 'memory' else 'CPUs'}); add nodes or lower num_learners")
    runner_choices = [runners] if runners is not None else range(least, most + 1)
    env_choices = [envs] if envs is not None else ENV_CHOICES
    total, per_runner = bounds
    table = {(n, e): throughput(costs, n, e, overlap, reserved.share, aggregators) for n in runner_choices
             for e in env_choices
             if (total is None or max(1, n) * e <= total) and (per_runner is None or e <= per_runner)}
    if not table:
        where = f"{total} envs" if total is not None else f"{per_runner} envs per runner"
        raise ConfigError(f"the train batch holds at most {where} (train_batch_size / fragment): lower "
                          "num_env_runners or num_envs_per_env_runner, or raise train_batch_size")
    best = max(table.values())
    count = int(aggregators)
    # fewest runners first, then fewest envs: the cheapest pair that reaches the best within the tolerance; where
    # the runners share a host's cores and those hold the best back, the best itself (a runner fewer gives up rate
    # the cores have; a runner more takes CPU the others need)
    top = min(table, key=lambda p: (-table[p], p))
    if costs.shared_cores(reserved.share) is not None and best < (1 - tolerance) * max(
            throughput(costs, n, e, overlap, None, aggregators) for n, e in table):
        n, e = top
        return Sizing(n, e, table[top], "cores", most, costs, _reason(costs, n, e, "cores", most, reserved.share,
                                                                      count), count)
    n, e = min((pair for pair, rate in table.items() if rate >= best * (1 - tolerance)), key=lambda p: (p[0], p[1]))
    # what holds the run back: the learner where the choice is within the tolerance of all it can take, or where
    # the tolerance stopped short of the slots with learning an env step taking at least as long as sampling one;
    # else the slots or the memory (one slot only, say: in-process sampling is then as fast as its runner)
    learner_s = costs.learner_time(n, overlap, aggregators)
    learn_rate = math.inf if learner_s == 0 else 1.0 / learner_s
    sampling_s = 1.0 / (max(1, n) * costs.runner_rate(e))
    near_ceiling = table[(n, e)] >= (1 - tolerance) * learn_rate
    bound = "learner" if near_ceiling or (n < most and sampling_s <= learner_s) else limit
    return Sizing(n, e, table[(n, e)], bound, most, costs, _reason(costs, n, e, bound, most, count=count), count)


def describe(runners: int, envs: int) -> str:
    """``4 runners x 16 envs``, or ``in-process sampling, 16 envs`` for 0 runners."""
    envs_text = f"{envs} env{'s' if envs != 1 else ''}"
    return f"{runners} runner{'s' if runners != 1 else ''} x {envs_text}" if runners else \
        f"in-process sampling, {envs_text}"


def _reason(costs: Costs, runners: int, envs: int, bound: str, most: int, share: float = 1.0,
            count: int = 0) -> str:
    held = f"{most} runner{'s' if most != 1 else ''}"
    cores = costs.shared_cores(share) if bound == "cores" else None
    why = {"learner": "learner-bound: more runners would add little",
           "slots": f"CPU-bound: the nodes hold {held}", "memory": f"memory holds {held}",
           "cores": f"core-bound: the nodes share {cores or 0:g} real cores"
                    + (f" and a runner's round costs {costs.round_cpu_s * 1e3:.1f} ms of CPU" if costs.round_cpu_s
                       else "")}[bound]
    if runners == 0 and most > 0 and bound != "learner":  # (sample-then-learn: as fast as that many runners)
        why += ", which would sample no faster than the driver"
    chosen = describe(runners, envs)
    runner = (f"runner {costs.runner_step_s[envs] * 1e3:.3f} ms per env step with {envs} env{'s' if envs != 1 else ''}"
              if envs in costs.runner_step_s else f"policy {costs.inference_at(envs) * 1e3:.2f} ms per batch of {envs}")
    # (the learner's intake where it is worth a word: packed frames to rebuild, not a vector env's fragments)
    intake = (f" + intake {costs.intake_s_per_step * 1e6:.1f}"
              if runners and costs.intake_s_per_step > 0.01 * costs.learner_s_per_step else "")
    if count:
        chosen += f", 1 learner actor with {count} aggregator (it takes the learner's intake in)"
    return (f"env {costs.env_step_s * 1e3:.2f} ms/step, {runner}, learner {costs.learner_s_per_step * 1e6:.1f}"
            f"{intake} us/step: {chosen} ({why})")


def most_worth(costs: Costs, overlap: bool, envs: int, tolerance: float = 0.05, cap: int = 1024,
               total_envs: int | None = None, aggregators: bool = False) -> int:
    """The runners (of ``envs`` envs) past which more stop paying, whatever the nodes: the fewest within
    ``tolerance`` of the best on unlimited CPUs and memory (at most ``cap``, and ``total_envs`` envs in all: what
    the train batch holds). What ``max_env_runners`` gets from ``auto``: runners added as nodes join stop there."""
    cap = max(1, min(cap, total_envs // envs)) if total_envs is not None else cap
    rates = [throughput(costs, n, envs, overlap, None, aggregators) for n in range(1, cap + 1)]
    best = max(rates)
    return next(n for n, rate in enumerate(rates, start=1) if rate >= best * (1 - tolerance))


def projection(costs: Costs, reserved: Reservations, nodes: int, overlap: bool,
               bounds: tuple[int | None, int | None] = (None, None),
               aggregators_allowed: bool = False) -> list[tuple[int, Sizing]]:
    """What the choice would be on 1..``nodes`` nodes like the first one: the answer to "how many nodes"."""
    first, rows = costs.nodes[0], []
    cores = costs.host_cores.get(first.host)
    for count in range(1, nodes + 1):  # (each on a host of its own, with the first one's cores)
        like = tuple(dataclasses.replace(first, host=f"{first.host}#{i}" if i else first.host) for i in range(count))
        rows.append((count, choose(dataclasses.replace(costs, nodes=like, host_cores={} if cores is None else {
            node.host: cores for node in like}), reserved, overlap, bounds=bounds,
            aggregators_allowed=aggregators_allowed)))
    return rows
