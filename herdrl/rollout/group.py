"""Runner groups: where sampling happens.

``LocalRunnerGroup`` (``num_env_runners=0``): one EnvRunner in this process, no Ray.
``RayRunnerGroup`` (``num_env_runners >= 1``): one Ray actor per runner, spread over the cluster's nodes
by a placement group (strategy SPREAD, so it nests inside a Tune trial's group). Each iteration the
learner's weights go out once as one object-store reference shared by every runner; runners sample in
parallel; a failed runner is replaced (or dropped) and the iteration goes on with the others' fragments.

A replacement is not called until Ray has placed it: when its node died and the survivors have no room, its
placement-group bundle waits for capacity (a node rejoining or joining) and the run goes on with the runners it has
(:attr:`RayRunnerGroup.num_waiting`); it joins the next sampling round after it starts.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from herdrl.callbacks import CallbackError, callback_code
from herdrl.config import AlgorithmConfig
from herdrl.env import imports
from herdrl.errors import HerdError
from herdrl.rollout.multi_agent import MultiAgentEnvRunner
from herdrl.rollout.runner import EnvRunner
from herdrl.rollout.transport import Sampled, info_of, sampled
from herdrl.survival import forget_nodes, node_changes

logger = logging.getLogger("herdrl")


class RunnerFailure(HerdError):
    """Env runners failed beyond what the fault-tolerance settings allow."""


class LocalRunnerGroup:
    """Sampling in the driver process."""

    num_restarts = 0
    num_healthy = 0  # remote runners: none
    num_waiting = 0
    num_target = 0
    in_fixed_group = False

    def __init__(self, config: AlgorithmConfig, recorder: Callable[..., Any] | None = None) -> None:
        """``recorder``: what makes the runner's episode recorder (see :class:`EnvRunner`)."""
        self.runner = MultiAgentEnvRunner(config) if config.is_multi_agent else \
            EnvRunner(config, worker_index=0, recorder=recorder)
        self.observation_space: gym.Space = self.runner.observation_space
        self.action_space: gym.Space = self.runner.action_space

    def sample(self, weights: dict[str, Any], exploration: dict[str, Any] | None = None,
               version: int | None = None, count: int | None = None) -> list[Sampled]:
        """One fragment from the local runner, sampled with ``weights`` (stamped ``version``) and ``exploration``
        settings (``count``: ignored, there is one runner)."""
        self.runner.set_weights(weights, version)
        self.runner.set_exploration(exploration)
        fragment = self.runner.sample()
        return [Sampled(info_of(fragment), fragment)]

    def reseed(self, epoch: int) -> None:
        """Fresh random streams and episodes for a run resumed at iteration ``epoch``."""
        self.runner.reseed(epoch)

    def stop(self) -> None:
        """Close the envs."""
        self.runner.stop()


def _one_line(exc: BaseException) -> str:
    """The root cause of a Ray error, as one short line (the full text goes to the debug log)."""
    import ray

    logger.debug("herdrl: env runner error in full: %s", exc)
    if isinstance(exc, ray.exceptions.ActorDiedError) and getattr(exc, "actor_init_failed", False):
        herd = _herd_cause(exc)  # the runner could not start: say why, not that it died
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return f"could not start: {herd}" if herd is not None else f"could not start: {lines[-1] if lines else ''}"
    if isinstance(exc, ray.exceptions.ActorDiedError):  # Ray's text is ~600 characters of actor ids
        text = str(exc).lower()
        return ("its node died" if "node" in text and ("died" in text or "dead" in text) and "raylet" in text
                else "its worker process exited" if "exit" in text or "killed" in text else "its actor died")
    cause = getattr(exc, "cause", None)
    while cause is not None and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    if isinstance(cause, BaseException):
        exc = cause
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[-1] if text else ''}"
    return line if len(line) <= 200 else line[:197] + "..."


#: Runner and learner groups alive in this process (a list, so the wrapper reads the live value).
_LIVE_GROUPS = [0]
_STORE_DUMP = re.compile(r"^\s*(Plasma Store Usage:|Eviction Stats:|- (objects|bytes) [a-z ]+: \d+|\(global lru\) .*)?"
                         r"\s*(\[repeated \d+x across cluster\].*)?$")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_dumps_said: set[Any] = set()  # processes whose object-store dump was announced already


class _StoreDumpFilter(logging.Filter):
    """Ray's object-store statistics logged by this process: to the debug log, said once in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False (dropped) for the dump."""
        text = record.getMessage()
        if "Plasma Store Usage" not in text and "(global lru)" not in text:
            return True
        logger.debug("herdrl: from Ray: %s", text.replace("\n", " | "))
        if "driver" not in _dumps_said:
            _dumps_said.add("driver")
            logger.warning("herdrl: Ray's object-store statistics, printed while it fetches objects lost with their "
                           "node, went to the debug log")
        return False


def _quiet_worker_died_echo() -> None:
    """Keep Ray's multi-line dumps out of the console while a group is alive: the raylet's "A worker died or was
    killed ..." text (~600 characters of ids, echoed by Ray's driver for every dead actor: the group says what
    happened in one line) and the object-store statistics (~25 lines, repeated) an actor's Ray prints while it
    fetches objects lost with their node (one line per process says where they went; these at any time once a group
    has run) go to the debug log.

    Ray's driver prints them from a thread that looks ``print_to_stdstream`` up in its module on each message,
    so wrapping that function is enough; if a Ray version lacks it, its text is simply printed as before. Only
    while a group is alive (:data:`_LIVE_GROUPS`): a user's own actors at other times keep Ray's text.
    """
    try:
        from ray._private import worker as ray_worker
    except ImportError:  # a Ray without this private module: its text is printed as before
        return

    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "herd_quiet", False):
        return

    def print_to_stdstream(data: dict, *args: Any, **kwargs: Any) -> Any:
        lines = [str(line) for line in data.get("lines", ())] if isinstance(data, dict) else []
        if _LIVE_GROUPS[0] > 0 and lines and data.get("pid") == "raylet" \
                and any("worker died or was killed" in line.lower() or "missed too many heartbeats" in line
                        for line in lines):  # (a dead node: herdrl.survival says which, in one line)
            logger.debug("herdrl: from the raylet: %s", " ".join(lines))
            return None
        return original(data, *args, **kwargs)

    print_to_stdstream.herd_quiet = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = print_to_stdstream
    for handler in logging.getLogger("ray").handlers:  # the driver's own dump, logged where a get met a lost object
        handler.addFilter(_StoreDumpFilter())
    # Workers' own output is printed by print_worker_logs (looked up in the module per batch, after Ray's dedup).
    original_logs = getattr(ray_worker, "print_worker_logs", None)
    if original_logs is None:
        return

    def print_worker_logs(data: dict, *args: Any, **kwargs: Any) -> Any:
        lines = [str(line) for line in data.get("lines", ())] if isinstance(data, dict) else []
        # (also after the groups stopped: Ray's dedup prints its "[repeated Nx]" summary of them at shutdown)
        dump = [bool(_STORE_DUMP.match(_COLOUR.sub("", line))) for line in lines]
        if any(is_dump and _COLOUR.sub("", line).strip() for is_dump, line in zip(dump, lines, strict=True)):
            kept = [line for is_dump, line in zip(dump, lines, strict=True) if not is_dump]
            logger.debug("herdrl: from %s: %s", data.get("pid"), " | ".join(lines))
            if data.get("pid") not in _dumps_said:
                _dumps_said.add(data.get("pid"))
                logger.warning("herdrl: Ray's object-store statistics from %s (pid %s), printed while it fetches "
                               "objects lost with their node, went to the debug log", data.get("actor_name") or
                               "a worker", data.get("pid"))
            if not kept:
                return None
            data = {**data, "lines": kept}
        return original_logs(data, *args, **kwargs)

    ray_worker.print_worker_logs = print_worker_logs


def _herd_cause(exc: BaseException) -> HerdError | None:
    """The HerdError inside a Ray error (e.g. an env that cannot be built), if any.

    A task error carries the original exception (``.cause``); an actor that died in ``__init__`` carries
    only the remote traceback's text, whose last ``herdrl.errors.X: message`` line we rebuild.
    """
    import re

    from herdrl import errors

    inner: BaseException | None = exc
    for _ in range(10):
        if inner is None or isinstance(inner, HerdError):
            break
        inner = getattr(inner, "cause", None) or inner.__cause__
    if isinstance(inner, HerdError):
        return inner
    found = re.findall(r"^herdrl\.errors\.(\w+): (.*)$", str(exc), flags=re.M)
    if found:
        name, message = found[-1]
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, HerdError):
            return cls(message)
    return None


_said = {"oversubscribed": False}  # notes said once per process


def runner_bundle(config: AlgorithmConfig) -> dict[str, float]:
    """The resources one Ray runner reserves: ``num_cpus_per_env_runner`` CPUs and ``num_gpus_per_env_runner`` GPUs."""
    gpus = float(config.num_gpus_per_env_runner)
    return {"CPU": float(config.num_cpus_per_env_runner), **({"GPU": gpus} if gpus else {})}


def runner_keys(config: AlgorithmConfig) -> dict[str, tuple[str, float]]:
    """What one Ray runner reserves, by config key: key -> (Ray resource, amount)."""
    return {"num_cpus_per_env_runner": ("CPU", float(config.num_cpus_per_env_runner)),
            "num_gpus_per_env_runner": ("GPU", float(config.num_gpus_per_env_runner))}


def _check_room(config: AlgorithmConfig, count: int, cpus: float) -> None:
    """A joined cluster that can never hold the runners fails now, not after a minute of waiting; a private Ray
    holds them all (it offers a CPU per runner) and oversubscribes the cores on purpose: say so once."""
    import os

    import ray

    from herdrl.cluster import ClusterError
    from herdrl.cluster.connect import check_fits_one_node

    if ray.util.get_current_placement_group() is not None:
        return  # inside a Tune trial: its placement group already holds the runners
    joined = config.address or os.environ.get("RAY_ADDRESS")
    gpus = count * config.num_gpus_per_env_runner + config.num_learners * config.num_gpus_per_learner
    have_gpus = ray.cluster_resources().get("GPU", 0.0)
    if gpus > have_gpus and (not joined or os.environ.get("HERD_CLUSTER_AUTOSCALES", "0") != "1"):
        raise ClusterError(
            f"{count} env runners x {config.num_gpus_per_env_runner:g} GPU and {config.num_learners} learners x "
            f"{config.num_gpus_per_learner:g} GPU need {gpus:g} GPUs but the Ray cluster "
            f"{f'at {joined} ' if joined else '(private, this machine) '}has {have_gpus:g}: set "
            "num_gpus_per_env_runner=0 (CPU inference) or a fraction that fits, or add GPU nodes")
    if joined and os.environ.get("HERD_CLUSTER_AUTOSCALES", "0") != "1":
        if count:
            check_fits_one_node(runner_keys(config), f"the Ray cluster at {joined}")
        have = ray.cluster_resources().get("CPU", 0.0)
        if count * cpus > have:
            raise ClusterError(
                f"{count} env runners x {cpus:g} CPU need {count * cpus:g} CPUs but the Ray cluster at {joined} has "
                f"{have:g}: lower --num-env-runners to {math.floor(have / cpus)} or fewer, or add nodes "
                "(an autoscaling cluster: set HERD_CLUSTER_AUTOSCALES=1)")
        learners = config.num_learners * config.num_cpus_per_learner
        if count * cpus + learners > have:
            raise ClusterError(
                f"{count} env runners x {cpus:g} CPU and {config.num_learners} learners x "
                f"{config.num_cpus_per_learner:g} CPU need {count * cpus + learners:g} CPUs but the Ray cluster at "
                f"{joined} has {have:g}: lower num_learners or num_cpus_per_learner (fractions share a CPU), or "
                "add nodes")
    elif count * cpus > (os.cpu_count() or 1) and not _said["oversubscribed"]:
        _said["oversubscribed"] = True
        cores = os.cpu_count() or 1
        if cpus > cores:  # the private Ray is sized to hold the runners (connect()): they start, on fewer cores
            logger.warning("herdrl: note: num_cpus_per_env_runner=%g is more than this machine's %d cores: the private "
                           "Ray starts the runners anyway, sharing the %d cores (on a cluster each runner needs a node "
                           "with %g CPUs); set it to %d or less to reserve real cores", cpus, cores, cores, cpus, cores)
        else:
            logger.warning("herdrl: note: %d env runners on %d cores: the private Ray offers the %g CPUs they reserve, "
                           "so the cores are shared (latency-bound envs gain from it; CPU-bound envs gain nothing past "
                           "%d)", count, cores, count * cpus, cores)


class RayRunnerGroup:
    """``num_env_runners`` Ray actors, each with its own vector env."""

    def __init__(self, config: AlgorithmConfig, first_bundle: int = 1, label: str = "env runner",
                 recorder: Callable[..., Any] | None = None) -> None:
        """``first_bundle``: inside a Tune trial, the index of the trial's placement-group bundle of the first runner
        (evaluation runners come after the learners'); ``label``: what the console lines call a runner;
        ``recorder``: what makes each runner's episode recorder (see :class:`EnvRunner`)."""
        import ray
        from ray.util.placement_group import placement_group

        from herdrl.cluster import ClusterError, connect, disconnect, shipping
        from herdrl.registry import ENV_CREATORS
        from herdrl.rollout.light import PENDING, TORCH, RunnerConfig, may_run_light, runner_policy_for

        self.config = config
        self.label = label
        self._runner_options = {} if recorder is None else {"recorder": recorder}
        count, cpus = config.num_env_runners, config.num_cpus_per_env_runner
        self._owns_ray = connect(config, num_cpus=math.ceil(config.total_cpus_requested))
        try:
            _check_room(config, count, cpus)
        except ClusterError:
            if self._owns_ray:
                disconnect()
            raise
        if config.is_multi_agent:
            from herdrl.rollout.remote_multi_agent import RemoteMultiAgentRunner as remote_class
        else:
            from herdrl.rollout.remote import RemoteEnvRunner as remote_class
        self._remote_class = remote_class
        self._creators = dict(ENV_CREATORS)
        env = [config.env] if callable(config.env) else []
        code = callback_code(config)
        shipped = shipping.ship_by_value([*self._creators.values(), *env, *code])
        # Callbacks named "module:Class" go to the actors as the classes themselves (shipped by value above): a
        # node other than this one may not be able to import the module by name.
        self._actor_config = config
        if isinstance(config.callbacks_class, (str, list, tuple)):
            self._actor_config = config.copy()
            self._actor_config._values["callbacks_class"] = [c for c in code if isinstance(c, type)]
        if not config.is_multi_agent:  # light runners: no torch until the policy needs it (herdrl.rollout.light)
            self._actor_config = RunnerConfig(self._actor_config, ray.cloudpickle.dumps(self._actor_config),
                                              PENDING if may_run_light(config) else TORCH)
        if shipped:
            logger.info("herdrl: shipping env and callback code to runners by value: %s", ", ".join(shipped))
        # Inside a Ray Tune trial the trial's placement group already holds a bundle per runner (after the
        # learner's): use it. Otherwise reserve our own, spread over the nodes.
        current = ray.util.get_current_placement_group()
        self._own_pg = current is None or len(current.bundle_specs) < count + first_bundle
        self._pg, self._first_bundle = (placement_group([runner_bundle(config)] * count, strategy="SPREAD"), 0) \
            if self._own_pg else (current, first_bundle)
        try:
            ray.get(self._pg.ready(), timeout=max(60.0, config.ray_connect_timeout_s))
        except ray.exceptions.GetTimeoutError:
            free = ray.available_resources()  # read before disconnect(), which may shut Ray down
            if self._own_pg:
                ray.util.remove_placement_group(self._pg)
            if self._owns_ray:
                disconnect()
            gpus = config.num_gpus_per_env_runner
            need, have, keys = f"{cpus:g} CPU", f"{free.get('CPU', 0):g} CPU", "num_cpus_per_env_runner"
            if gpus:
                need, have = f"{need} + {gpus:g} GPU", f"{have}, {free.get('GPU', 0):g} GPU"
                keys += ", num_gpus_per_env_runner"
            raise ClusterError(f"the Ray cluster cannot place {count} env runners x {need} (available: {have}); "
                               f"lower num_env_runners or {keys}") from None
        _quiet_worker_died_echo()
        if self._owns_ray:
            forget_nodes()  # a new Ray session (a group joining a running one keeps what was seen of it)
        node_changes()  # takes note of the nodes alive now
        _LIVE_GROUPS[0] += 1
        self._counted = True
        self._incarnations = [0] * count  # runners started per index so far, restarts included
        self._placed = count  # runners with a bundle of the placement group; those added later have none
        self._epoch = 0
        self._turn = 0  # the runner index the next partial round of sampling (replacing lost fragments) begins at
        self.actors: list[Any] = [self._start(i) for i in range(count)]
        #: Replacements Ray has not started yet (no room on the cluster): runner index -> (actor, its ready call).
        self.waiting: dict[int, tuple[Any, Any, int]] = {}  # ... and the epoch it was started in
        #: Runners late for a caller's own deadline (call_each): index -> (the call still unanswered, since when).
        self._late: dict[int, tuple[Any, float]] = {}
        self.num_restarts = 0
        #: Runners started where the cluster had room for more (max_env_runners), not yet in service: (actor, its
        #: ready call, the epoch it was started in, when); and when to look for room again.
        self.joining: list[tuple[Any, Any, int, float]] = []
        self._next_look = 0.0
        self._free_at_start: float | None = None
        try:
            start_timeout = None if config.sample_timeout_s is None else max(120.0, config.sample_timeout_s)
            self.observation_space, self.action_space = ray.get(self.actors[0].spaces.remote(),
                                                                timeout=start_timeout)
        except ray.exceptions.RayError as exc:
            self.stop()
            raise _herd_cause(exc) or RunnerFailure(f"{label} 1 could not start: {_one_line(exc)}") from exc
        if isinstance(self._actor_config, RunnerConfig) and self._actor_config.policy == PENDING:
            # The network for these spaces decides: its numpy twin's blueprint, or torch. Told to every runner
            # before any other call (an actor runs its calls in order) and to the ones started later.
            try:
                policy = runner_policy_for(config, self.observation_space, self.action_space)
            except BaseException:  # (a config the spaces refuse: DQN on Box actions, ...)
                self.stop()
                raise
            self._actor_config = self._actor_config.with_policy(policy)
            for actor in self.actors:
                actor.use_policy.remote(policy)

    @property
    def num_healthy(self) -> int:
        """Runners currently in service."""
        return sum(actor is not None for actor in self.actors)

    @property
    def num_waiting(self) -> int:
        """Replacement runners waiting for Ray to place them (their node died and the others have no room)."""
        return len(self.waiting)

    @property
    def num_target(self) -> int:
        """Runners the group aims to have in service: those in it, failed ones restarting, and ones joining (not
        those failed for good)."""
        return self.num_healthy + len(self.waiting) + len(self.joining)

    @property
    def in_fixed_group(self) -> bool:
        """Whether the runners live in a Tune trial's placement group (fixed: no room can be added to it)."""
        return not self._own_pg

    def admit(self) -> list[int]:
        """Put the replacements Ray has started into service (without waiting); returns their indices."""
        import ray

        if not self.waiting:
            return []
        refs = [ref for _, ref, _ in self.waiting.values()]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        admitted = []
        for index, (actor, ref, epoch) in list(self.waiting.items()):
            if ref not in ready:
                continue
            del self.waiting[index]
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:  # it died before it started: handled as any failure
                self.actors[index] = actor
                self._handle_failure(index, exc)
                continue
            if epoch != self._epoch:  # started before a restore reseeded the others: calls run in order
                actor.reseed.remote(self._epoch)
            self.actors[index] = actor
            admitted.append(index)
            logger.warning("herdrl: %s %d is back in service (%d of %d)", self.label, index + 1, self.num_healthy,
                           len(self.actors))
        if admitted:
            node_changes()
        return admitted

    def follow_cluster(self) -> list[int]:
        """With ``max_env_runners``: start runners where the cluster has room that appeared since the run began (a
        node joined, or CPUs were freed), up to that many in all, and put those that started into service (returns
        their indices); each runner started takes its CPUs out of that room. The config's
        ``num_env_runners`` follows them: an ``"auto"`` fragment length shrinks so the train batch keeps its size.
        Looks at most every 2 s, never while a failed runner waits for room, never in a Tune trial's fixed
        placement group."""
        import ray

        from herdrl.sizing import batch_bounds

        limit, now = self.config.max_env_runners, time.monotonic()
        if limit is None or not self._own_pg or now < self._next_look:
            return []
        self._next_look = now + 2.0
        total_envs = batch_bounds(self.config)[0]  # (a sample-then-learn batch: fragments no shorter than 16 steps)
        if total_envs is not None:
            limit = min(limit, max(self._placed, total_envs // self.config.num_envs_per_env_runner))
        added = self._admit_joining()
        free = ray.available_resources().get("CPU", 0.0)
        if self._free_at_start is None:  # (the first look: after the learner actors took theirs)
            self._free_at_start = free
        # only room that appeared since (a node joined, CPUs freed): what was free at the start was left free on
        # purpose (num_env_runners="auto" chose fewer, or the user did)
        room = int(max(0.0, free - self._free_at_start) / self.config.num_cpus_per_env_runner + 1e-9)
        if self.waiting or self.joining:  # replacements, or the last ones added, are still to be placed
            return added
        more = max(0, min(room, limit - len(self.actors)))
        self._free_at_start = free - more * self.config.num_cpus_per_env_runner  # (theirs, once placed)
        for _ in range(more):
            index = len(self.actors) + len(self.joining)
            self._incarnations.append(0)
            actor = self._start(index)
            self.joining.append((actor, actor.pid.remote(), self._epoch, now))
        if more:
            logger.warning("herdrl: the cluster has room for %d more %s%s (max_env_runners=%d): starting them",
                           more, self.label, "" if more == 1 else "s", limit)
        return added

    def _admit_joining(self) -> list[int]:
        """Put the runners started by :meth:`follow_cluster` that are up into service, in the order started (their
        indices were given then); one that failed to start is left out (its slot stays empty, as a runner failed
        for good); if the first is not placed within 60 s (the room went to something else), every one still
        joining is stopped, and the room looked for again."""
        import ray

        if not self.joining:
            return []
        ready = set(ray.wait([ref for _, ref, _, _ in self.joining], num_returns=len(self.joining), timeout=0)[0])
        added, before = [], len(self.actors)
        while self.joining and self.joining[0][1] in ready:
            actor, ref, epoch, _ = self.joining.pop(0)
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:  # its node left, or it failed to start: the run goes on
                self.actors.append(None)
                logger.warning("herdrl: %s %d did not start where the cluster had room (%s); going on without it",
                               self.label, len(self.actors), _one_line(exc))
                continue
            if epoch != self._epoch:  # started before a restore reseeded the others: calls run in order
                actor.reseed.remote(self._epoch)
            self.actors.append(actor)
            added.append(len(self.actors) - 1)
        if self.joining and time.monotonic() - self.joining[0][3] > 60.0:
            for actor, _, _, _ in self.joining:
                ray.kill(actor, no_restart=True)
            del self._incarnations[len(self.actors):]
            logger.warning("herdrl: %d %s%s found no room after all; looking again", len(self.joining), self.label,
                           "" if len(self.joining) == 1 else "s")
            self.joining.clear()
            self._free_at_start = None  # (measured again at the next look)
        if len(self.actors) != before:  # (the algorithm's config: fragments sized for the runners there are)
            self.config._values["num_env_runners"] = len(self.actors)
        if added:
            node_changes()
            logger.warning("herdrl: %d %s%s joined (%d in service)", len(added), self.label,
                           "" if len(added) == 1 else "s", self.num_healthy)
        return added

    def _start(self, index: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = (PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=self._first_bundle + index)
                    if index < self._placed else "SPREAD")  # (one added where the cluster had room: no bundle)
        incarnation = self._incarnations[index]
        self._incarnations[index] += 1
        return self._remote_class.options(
            num_cpus=self.config.num_cpus_per_env_runner, num_gpus=self.config.num_gpus_per_env_runner,
            scheduling_strategy=strategy, max_restarts=0,
        ).remote(self._actor_config, index + 1, self._creators, incarnation, self._epoch, tuple(imports.IMPORTED),
                 **self._runner_options)

    def sample(self, weights: dict[str, Any], exploration: dict[str, Any] | None = None,
               version: int | None = None, count: int | None = None) -> list[Sampled]:
        """One fragment from every healthy runner (or from ``count`` of them, taken in turn: fewer come back when
        some of those fail), in parallel; failed runners are handled per config. Only the fragments' infos come to
        this process: the fragments stay in the object store as references (``herdrl.rollout.transport``)."""
        import ray

        self.admit()
        self.follow_cluster()
        if self.num_healthy == 0:
            self.wait_for_runner()
        weights_ref = ray.put(weights)  # one copy in the object store, shared by every runner
        data: dict[Any, Any] = {}
        # runners added as the cluster grew: every runner's fragment follows the count (the batch keeps its size)
        steps = self.config.fragment_length() if len(self.actors) > self._placed else None

        def call(actor: Any) -> Any:
            info_ref, data_ref = actor.sample_with.options(num_returns=2).remote(weights_ref, exploration, version,
                                                                                 steps=steps)
            data[info_ref] = data_ref
            return info_ref

        healthy = [i for i, actor in enumerate(self.actors) if actor is not None]
        if count is not None and count < len(healthy):  # the next ones in turn, so no runner is always the one
            healthy = sorted(healthy, key=lambda i: (i < self._turn, i))[:count]
            self._turn = (healthy[-1] + 1) % len(self.actors)
        results, failures = self._gather(call, "no fragment", healthy)
        if not results and count is None and failures and not self.waiting:
            index, exc = failures[0]
            raise RunnerFailure(f"every env runner failed in this iteration (runner {index + 1}: "
                                f"{_one_line(exc)})")
        return [sampled(info, data[ref]) for ref, info in results]

    def settle(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for every replacement to start (or fail), then put those started into service."""
        import ray

        refs = [ref for _, ref, _ in self.waiting.values()]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        self.admit()

    def wait_for_runner(self) -> None:
        """With no runner in service, wait (at most ``sample_timeout_s``) until Ray places one of the replacements;
        :class:`RunnerFailure` when none can be."""
        import ray

        if self.num_healthy or not self.waiting:
            return
        timeout = self.config.sample_timeout_s
        logger.warning("herdrl: no env runner in service: waiting %sfor Ray to place one of the %d replacements (the "
                       "cluster has no room for them now)", "" if timeout is None else f"up to {timeout:g} s ",
                       len(self.waiting))
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.num_healthy and self.waiting:  # (a replacement that failed to start is replaced again)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            ray.wait([ref for _, ref, _ in self.waiting.values()], num_returns=1, timeout=left)
            self.admit()
        if not self.num_healthy:
            free = ray.available_resources().get("CPU", 0.0)
            raise RunnerFailure(f"no env runner could be placed within sample_timeout_s={timeout} s (the cluster "
                                f"has {free:g} CPUs free; each runner needs {self.config.num_cpus_per_env_runner:g}): "
                                "add nodes, or lower num_env_runners or num_cpus_per_env_runner")

    def _gather(self, call: Any, what: str, indices: list[int] | None = None,
                deadline_s: float | None = None) -> tuple[list[Any], list[tuple[int, BaseException]]]:
        """``call(actor)`` on every healthy runner (or those at ``indices``), waited for at most
        ``sample_timeout_s`` (a runner stuck in its env, or a replacement that cannot be placed, must not hang us);
        failed runners are handled per config (restarted, or dropped). Returns the results, as (reference, value),
        and the failures, as (runner index, error). ``deadline_s``: a shorter wait, the caller's own; runners late
        for it are left out of the results, not failed."""
        import ray

        chosen = set(range(len(self.actors)) if indices is None else indices)
        calls = [(i, call(actor)) for i, actor in enumerate(self.actors) if actor is not None and i in chosen]
        limit = self.config.sample_timeout_s
        own = deadline_s is not None and (limit is None or deadline_s < limit)
        ready, _ = ray.wait([ref for _, ref in calls], num_returns=len(calls),
                            timeout=max(0.0, deadline_s) if own else limit)
        ready_set = set(ready)
        results, failures = [], []
        for index, ref in calls:
            if ref not in ready_set:
                if own:  # late for the caller's deadline: not a failure (yet: see _still_busy)
                    self._late.setdefault(index, (ref, time.monotonic()))
                    continue
                failures.append((index, TimeoutError(
                    f"{what} within sample_timeout_s={self.config.sample_timeout_s:g} s")))
                continue
            try:
                results.append((ref, ray.get(ref)))
            except ray.exceptions.RayError as exc:
                failures.append((index, exc))
        for index, exc in failures:
            self._handle_failure(index, exc)
        return results, failures

    def _handle_failure(self, index: int, exc: BaseException) -> None:
        import ray

        if isinstance(exc, ray.exceptions.ActorDiedError) and getattr(exc, "actor_init_failed", False):
            cause = _herd_cause(exc)
            if cause is not None:
                raise cause  # its replacement would fail the same way: no restart can help
        if isinstance(_herd_cause(exc), CallbackError):
            raise _herd_cause(exc)  # the user's callback code: a restarted runner would run it again
        cfg, reason = self.config, _one_line(exc)
        try:
            ray.kill(self.actors[index], no_restart=True)
        except Exception:  # already dead
            pass
        self.actors[index] = None
        node_changes()  # a runner failing is often the first sign of its node's death: say so once
        if cfg.restart_failed_env_runners:
            if self.num_restarts >= cfg.max_num_env_runner_restarts:
                raise RunnerFailure(f"{self.label} {index + 1} failed ({reason}) and the restart budget is spent "
                                    f"(max_num_env_runner_restarts={cfg.max_num_env_runner_restarts})")
            # Not called until Ray has placed it (admit()): with no room left it waits, and the run goes on.
            actor = self._start(index)
            self.waiting[index] = (actor, actor.pid.remote(), self._epoch)
            self.num_restarts += 1
            logger.warning("herdrl: %s %d failed (%s); restarting it, %d restart%s so far", self.label, index + 1,
                           reason, self.num_restarts, "" if self.num_restarts == 1 else "s")
            return
        if not cfg.ignore_env_runner_failures:
            raise RunnerFailure(f"{self.label} {index + 1} failed: {reason}; to go on without it, set "
                                ".fault_tolerance(restart_failed_env_runners=True) or ignore_env_runner_failures")
        if self.num_healthy == 0:
            raise RunnerFailure(f"every env runner has failed (last: runner {index + 1}: {reason})")
        logger.warning("herdrl: %s %d failed (%s); going on with %d", self.label, index + 1, reason, self.num_healthy)

    def reseed(self, epoch: int) -> None:
        """Fresh random streams and episodes on every runner (and its replacements) for a run resumed at
        iteration ``epoch``."""
        self._epoch = epoch  # a runner restarted from here on starts in this epoch too
        self._gather(lambda actor: actor.reseed.remote(epoch), "no answer to reseed")

    def call_each(self, method: str, *args: Any, deadline_s: float | None = None) -> list[Any]:
        """``method(*args)`` on every runner in service, in parallel, failures handled as in sampling (restarted or
        dropped); the results of those that answered (within ``deadline_s``, if given), in runner order."""
        import ray

        self.admit()
        if self.num_healthy == 0:
            self.wait_for_runner()
        busy = self._still_busy()
        indices = [i for i, actor in enumerate(self.actors) if actor is not None and i not in busy]
        if not indices:  # every runner still on an earlier call: wait for one (within the deadline), answer nothing
            ray.wait([self._late[i][0] for i in busy], num_returns=1,
                     timeout=None if deadline_s is None else max(0.0, deadline_s))
            return []
        results, _ = self._gather(lambda actor: getattr(actor, method).remote(*args), f"no answer to {method}",
                                  indices=indices, deadline_s=deadline_s)
        return [value for _, value in results]

    def _still_busy(self) -> list[int]:
        """Runners whose call late for an earlier deadline has not answered yet (they are not sent another: calls
        would pile up behind a stuck env); one silent for ``sample_timeout_s`` has failed (replaced per config)."""
        import ray

        busy = []
        for index, (ref, since) in list(self._late.items()):
            limit = self.config.sample_timeout_s
            if self.actors[index] is None or ray.wait([ref], timeout=0)[0]:
                del self._late[index]  # (its answer came too late to count)
            elif limit is not None and time.monotonic() - since > limit:
                del self._late[index]
                self._handle_failure(index, TimeoutError(f"no answer within sample_timeout_s={limit:g} s"))
            else:
                busy.append(index)
        return busy

    def apply_each(self, func: Callable[[Any], Any], indices: list[int] | None = None,
                   deadline_s: float | None = None) -> list[Any]:
        """``func(runner)`` on every runner in service (or those at ``indices``), in their processes; the values in
        runner order (those late for ``deadline_s`` left out). ``func`` raising is a :class:`HerdError` here."""
        self.admit()
        results, _ = self._gather(lambda actor: actor.apply.remote(func), "no answer to foreach_env_runner",
                                  indices=indices, deadline_s=deadline_s)
        failed = [value for _, (ok, value) in results if not ok]
        if failed:
            raise HerdError(f"foreach_env_runner: the function failed in an env runner: {failed[0]}")
        return [value for _, (_, value) in results]

    def call(self, method: str, *args: Any) -> list[Any]:
        """Call a method on every healthy runner and return the results (e.g. ``pid``, ``node``)."""
        import ray

        return ray.get([getattr(a, method).remote(*args) for a in self.actors if a is not None])

    def stop(self) -> None:
        """Stop the actors, free the placement group, and leave Ray if this group started or joined it."""
        import ray

        from herdrl.cluster import disconnect

        if getattr(self, "_counted", False):
            _LIVE_GROUPS[0] -= 1
            self._counted = False
        waiting = [actor for actor, _, _ in getattr(self, "waiting", {}).values()]
        joining = [actor for actor, *_ in getattr(self, "joining", [])]
        for actor in [*getattr(self, "actors", []), *waiting, *joining]:
            if actor is not None:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:
                    pass
        if getattr(self, "_own_pg", False):
            try:
                ray.util.remove_placement_group(self._pg)
            except Exception:
                pass
        if getattr(self, "_owns_ray", False):
            disconnect()


class EnvRunnerGroupView:
    """RLlib's ``EnvRunnerGroup`` as far as scripts use it, over herdrl's runners: ``foreach_env_runner(fn)``,
    ``local_env_runner`` and the counts. Remote runners are numbered from 1 as RLlib's; the in-process runner
    (``num_env_runners=0``) is the local one."""

    def __init__(self, group: Any) -> None:
        self._group = group

    @property
    def local_env_runner(self) -> Any:
        """The in-process runner (``num_env_runners=0``); None when the runners are Ray actors."""
        return getattr(self._group, "runner", None)

    def num_remote_workers(self) -> int:
        """Remote runners, in service or not."""
        return len(getattr(self._group, "actors", []))

    def num_healthy_remote_workers(self) -> int:
        """Remote runners in service."""
        return self._group.num_healthy if isinstance(self._group, RayRunnerGroup) else 0

    def healthy_worker_ids(self) -> list[int]:
        """The ids (from 1) of the remote runners in service."""
        return [i + 1 for i, actor in enumerate(getattr(self._group, "actors", [])) if actor is not None]

    def foreach_env_runner(self, func: Callable[[Any], Any], *, local_env_runner: bool = True,
                           healthy_only: bool = True, remote_worker_ids: list[int] | None = None,
                           timeout_seconds: float | None = None) -> list[Any]:
        """``func(env_runner)`` on each runner, where it lives; the values, the local runner's first. The
        runner is herdrl's EnvRunner (``env``: its gymnasium vector env, ``config``, ``worker_index``, ``module``).
        Only runners in service are called (``healthy_only`` is always so here); ``timeout_seconds`` leaves out
        those that have not answered by then."""
        if isinstance(self._group, RayRunnerGroup):
            indices = None if remote_worker_ids is None else [i - 1 for i in remote_worker_ids]
            return self._group.apply_each(func, indices, timeout_seconds)
        local = self.local_env_runner
        return [func(local)] if local is not None and local_env_runner else []


def make_runner_group(config: AlgorithmConfig,
                      recorder: Callable[..., Any] | None = None) -> LocalRunnerGroup | RayRunnerGroup:
    """In-process for ``num_env_runners=0``, else Ray actors (an offline algorithm's dataset instead:
    :func:`herdrl.offline.source.sample_source`). ``recorder``: see :class:`EnvRunner`."""
    if config.num_env_runners > 0:
        return RayRunnerGroup(config, recorder=recorder)
    return LocalRunnerGroup(config, recorder=recorder)
