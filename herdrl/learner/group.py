"""Learner groups: where learning happens.

``LocalLearnerGroup`` (``num_learners=0``, the default): one Learner in the driver process, sharing its module
with the algorithm (the policy, evaluation and checkpoints read it directly).
``RayLearnerGroup`` (``num_learners >= 1``): one Ray actor per learner, joined in a ``torch.distributed``
process group (gloo on CPU, NCCL on GPU). Every update goes to all of them as one object-store reference; each
learns on its share of every minibatch and they all-reduce gradients, so their weights stay identical; the
driver keeps a CPU copy of the module (for the policy, evaluation and runner weights), refreshed from rank 0.

A learner (or aggregator) that dies takes the whole group with it: the ranks' optimizer states must match, so all
are restarted together and load the newest learner state kept — rank 0's state, asked for every
``learner_state_interval`` updates and left in the object store (this process never fetches it), else the last
checkpoint's — and the call that failed is made again. The updates since that state are lost, and said so.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.config import AlgorithmConfig
from herdrl.errors import HerdError
from herdrl.learner.learner import Learner
from herdrl.rollout.transport import AggregatedInput, FragmentInput, FragmentsLost, LearnerInput, shares

logger = logging.getLogger("herdrl")
#: Tries to start the learners with one state, and the pause between them (Ray needs seconds to notice a dead node).
RESTART_TRIES, RESTART_PAUSE_S = 3, 5.0


class LearnerFailure(HerdError):
    """A learner actor died or timed out, and the group could not be restarted."""


class _LearnerDied(Exception):
    """A learner call failed (its actor died or timed out): the group is restarted, or :class:`LearnerFailure`."""

    def __init__(self, rank: int, reason: str, timed_out: bool = False, exc: BaseException | None = None) -> None:
        super().__init__(f"learner {rank} {reason}")
        self.rank, self.reason, self.timed_out, self.exc = rank, reason, timed_out, exc


class LocalLearnerGroup:
    """The learner in the driver: calls go straight to it."""

    num_restarts = 0
    num_updates_lost = 0
    #: Gives the env-step count an update's scheduled hyperparameters are taken at (set by the algorithm: env steps
    #: sampled so far, this iteration's included); None: they stay as they are.
    step_source: Callable[[], int] | None = None

    def __init__(self, config: AlgorithmConfig, learner_class: type[Learner], observation_space: gym.Space,
                 action_space: gym.Space) -> None:
        self.learner = learner_class(config, observation_space, action_space)
        self.module: torch.nn.Module = self.learner.module
        self.device = self.learner.device

    def update(self, *args: Any) -> Any:
        """The learner's ``update(*args)``; a :class:`~herdrl.rollout.transport.LearnerInput` argument is read here
        first (fragments lost with their node: :class:`FragmentsLost`, and no update)."""
        args = list(args)
        for i, arg in enumerate(args):
            if isinstance(arg, LearnerInput):
                args[i], lost, _ = arg.read(self)
                if lost:
                    return FragmentsLost(lost)
        return self.learner.update_at(self.step_source() if self.step_source else None, *args)

    def apply(self, method: str, *args: Any) -> None:
        """The learner's ``method(*args)``, a change of its state outside updates (self-play snapshots)."""
        getattr(self.learner, method)(*args)

    def checkpoint_written(self) -> None:
        """Nothing to note: this learner cannot be lost without the driver."""

    def end_iteration(self, iteration: int) -> None:
        """Nothing to keep: this learner cannot be lost without the driver."""

    def get_weights(self) -> dict[str, np.ndarray]:
        """The module's weights as numpy arrays."""
        return self.learner.get_weights()

    def state(self) -> dict[str, Any]:
        """The learner's state (module, optimizers, ...) for a checkpoint."""
        return self.learner.state()

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state`."""
        self.learner.load_state(state)

    def sync(self) -> None:
        """Nothing to do: the driver's module is the learner's."""

    def stop(self) -> None:
        """Nothing to release in-process."""


class RayLearnerGroup:
    """``num_learners`` data-parallel learner actors and a CPU copy of the module in the driver."""

    #: Gives the env-step count an update's scheduled hyperparameters are taken at (set by the algorithm: env steps
    #: sampled so far, this iteration's included); None: they stay as they are.
    step_source: Callable[[], int] | None = None

    def __init__(self, config: AlgorithmConfig, learner_class: type[Learner], observation_space: gym.Space,
                 action_space: gym.Space, init_seed: int) -> None:
        import ray
        from ray.util.placement_group import placement_group

        from herdrl.cluster import ClusterError, connect, shipping
        from herdrl.registry import ENCODERS, ENV_CREATORS
        from herdrl.rollout.group import _LIVE_GROUPS, _quiet_worker_died_echo

        self.config = config
        count, cpus, gpus = config.num_learners, config.num_cpus_per_learner, config.num_gpus_per_learner
        self._owns_ray = connect(config, num_cpus=math.ceil(config.total_cpus_requested))
        self.learner = None  # none in this process
        self.module: torch.nn.Module = config.build_module(observation_space, action_space)
        self.module.requires_grad_(False)
        self.device = torch.device("cpu")
        self._spec = (learner_class, observation_space, action_space, init_seed)
        #: Restarts of the whole group so far, and the updates they lost (those after the state restarted from).
        self.num_restarts = self.num_updates_lost = 0
        #: Set by the algorithm: the learner state of its last checkpoint, or None (a restart's last resort).
        self.checkpoint_state: Callable[[], dict[str, Any] | None] | None = None
        self._updates = 0  # updates in the learners' state (rolled back by a restart)
        self._checkpoint_updates: int | None = None  # ... when the last checkpoint was written or restored
        self._kept: list[tuple[Any, int]] = []  # (reference to rank 0's state, its updates), newest first
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        # Inside a Tune trial: the trial's placement group holds the learners' bundles after the runners'.
        current = ray.util.get_current_placement_group()
        first = 1 + config.num_env_runners
        self._own_pg = current is None or len(current.bundle_specs) < first + count
        self._pg, self._first_bundle = (placement_group([bundle] * count, strategy="PACK"), 0) if self._own_pg \
            else (current, first)
        self.actors: list[Any] = []
        self.aggregators: list[list[Any]] = []
        self._stream: Any = None  # the StreamSpec every rank reads its share of (open_stream), or None
        self._warned_unsharded = False
        try:
            ray.get(self._pg.ready(), timeout=max(60.0, config.ray_connect_timeout_s))
        except ray.exceptions.GetTimeoutError:
            free = ray.available_resources()  # read before stop(), which may shut Ray down
            self.stop()
            raise ClusterError(f"the Ray cluster cannot place {count} learners x {cpus:g} CPU"
                               + (f" x {gpus:g} GPU" if gpus else "") + f" (available: {free.get('CPU', 0):g} "
                               f"CPU, {free.get('GPU', 0):g} GPU); lower num_learners or their resources") from None
        shipping.ship_by_value([*ENV_CREATORS.values(), *ENCODERS.values()])  # user code travels with the actors
        _quiet_worker_died_echo()
        _LIVE_GROUPS[0] += 1
        self._counted = True
        try:
            self._start_actors(config.learner_timeout_s)
        except _LearnerDied as died:
            self.stop()
            raise LearnerFailure(f"{died} while starting") from None
        self._dirty = True
        self.sync()
        self._keep()  # a restart before the first kept update goes back to the start

    def _start_actors(self, timeout_s: float) -> None:
        """Start every rank (joined in one process group, built from the same seed) and their aggregators."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from herdrl.env import imports
        from herdrl.learner.remote import LearnerActor
        from herdrl.registry import ENCODERS, ENV_CREATORS

        cfg, count = self.config, self.config.num_learners
        learner_class, observation_space, action_space, init_seed = self._spec
        self.actors = [LearnerActor.options(
            num_cpus=cfg.num_cpus_per_learner, num_gpus=cfg.num_gpus_per_learner, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._pg, placement_group_bundle_index=self._first_bundle + rank),
        ).remote(cfg, rank, count, tuple(imports.IMPORTED), dict(ENV_CREATORS), dict(ENCODERS))
            for rank in range(count)]
        init_method = self._get([self.actors[0].rendezvous.remote()], "start", timeout_s)[0]
        self._get([a.start.remote(init_method, learner_class, observation_space, action_space, init_seed,
                                  cfg.learner_timeout_s) for a in self.actors], "start", timeout_s)
        self.aggregators = self._start_aggregators(cfg.num_aggregator_actors_per_learner, timeout_s)
        if self._stream is not None:  # (restarted ranks stream their shares again, in new orders)
            spec = dataclasses.replace(self._stream, restarts=self.num_restarts)
            self._get([actor.open_stream.remote(spec) for actor in self.actors], "start", timeout_s)

    def open_stream(self, spec: Any) -> list[int]:
        """Every rank opens its own stream of its share of a dataset (a :class:`~herdrl.offline.reader.StreamSpec`;
        updates then take :class:`~herdrl.offline.reader.StreamRows`): the data never passes through this
        process. Returns the transitions each rank's share holds, in rank order."""
        self._stream = spec
        return self._call("start", lambda: [actor.open_stream.remote(spec) for actor in self.actors])

    def stream_epochs(self) -> int:
        """The most passes any rank's stream has begun over its share."""
        return max(self._call("stream epochs", lambda: [actor.stream_epochs.remote() for actor in self.actors]))

    def _start_aggregators(self, per_learner: int, timeout_s: float) -> list[list[Any]]:
        """``per_learner`` aggregator actors on each learner's node (no CPU reserved: they share the learner's)."""
        if not per_learner:
            return []
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from herdrl.learner.remote import FragmentAggregator

        nodes = self._get([actor.node_id.remote() for actor in self.actors], "start", timeout_s)
        return [[FragmentAggregator.options(num_cpus=0, max_restarts=0, scheduling_strategy=(
            NodeAffinitySchedulingStrategy(node, soft=False))).remote() for _ in range(per_learner)]
            for node in nodes]

    def _get(self, refs: list[Any], what: str, timeout_s: float | None = None) -> list[Any]:
        """Results of one call per learner, in rank order. The first learner to fail (or a call past the timeout)
        raises :class:`_LearnerDied` at once, without waiting on its peers (which would block in their next
        all-reduce); an error of herdrl's own inside a learner (a bad config) stops the group and is raised."""
        import ray

        from herdrl.rollout.group import _herd_cause, _one_line

        pending, timeout = list(refs), timeout_s or self.config.learner_timeout_s
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                raise _LearnerDied(refs.index(pending[0]), f"did not finish its {what} within {timeout:g} s "
                                   "(learner_timeout_s)", timed_out=True)
            try:
                ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                cause = _herd_cause(exc)
                if cause is not None:
                    self.stop()
                    raise cause from None
                rank = refs.index(ready[0])
                if not _lost(exc) and not self._peer_died():  # an error of the learner's own: no restart cures it
                    self.stop()
                    raise LearnerFailure(f"learner {rank} failed during its {what} ({_one_line(exc)})") from exc
                raise _LearnerDied(rank, f"failed ({_one_line(exc)})", exc=exc) from exc
        return ray.get(refs)

    def _peer_died(self) -> bool:
        """Whether a learner or aggregator process is gone (an error in one rank's collective often means that its
        peer died); asked of each for at most a few seconds, in a thread of their own (``alive``), so a rank still
        waiting in an all-reduce for a peer whose update failed answers too."""
        import ray

        actors = [*self.actors, *(a for mine in self.aggregators for a in mine)]
        calls = [actor.alive.remote() for actor in actors]
        ready, pending = ray.wait(calls, num_returns=len(calls), timeout=10.0)
        if pending:
            return True
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                return True
        return False

    def _call(self, what: str, calls: Callable[[], list[Any]]) -> list[Any]:
        """``calls()`` (one call per learner, or rank 0's only), made again on a restarted group if a learner
        dies (:meth:`_restart`)."""
        while True:
            try:
                return self._get(calls(), what)
            except _LearnerDied as died:
                self._restart(died, what)

    def _restart(self, died: _LearnerDied, what: str) -> None:
        """Kill every rank and aggregator, start them again and load the newest learner state that can be had:
        kept ones and the last checkpoint's, the newest first. :class:`LearnerFailure` when restarts are off or
        spent, or when no rank can be started with any of them."""
        from herdrl.survival import node_changes

        cfg = self.config
        self._kill_actors()
        node_changes()
        if not cfg.restart_failed_learners or self.num_restarts >= cfg.max_num_learner_restarts:
            why = ("restart_failed_learners is off" if not cfg.restart_failed_learners else
                   f"the restart budget is spent (max_num_learner_restarts={cfg.max_num_learner_restarts})")
            self.stop()
            raise LearnerFailure(f"{died} during its {what}, and {why}: resume from the last checkpoint "
                                 "(herd train --resume)")
        self.num_restarts += 1
        candidates = [(updates, f"the state kept after update {updates}", lambda ref=ref: ref)
                      for ref, updates in self._kept]
        if self.checkpoint_state is not None and self._checkpoint_updates is not None:
            candidates.append((self._checkpoint_updates, "the last checkpoint", self._checkpoint_ref))
        candidates.sort(key=lambda candidate: -candidate[0])  # the newest first, the checkpoint's included
        # Placing the new ranks is bounded: their node may be gone with no room left.
        timeout = max(60.0, cfg.ray_connect_timeout_s)
        failures = []
        for updates, source, state_ref in candidates:
            state = state_ref()
            if state is None:
                failures.append(f"{source}: cannot be read")
                continue
            if not self._start_with(state, source, timeout, failures):
                continue  # that state is gone (with its node): the next one
            lost = self._updates - updates
            self.num_updates_lost += lost
            self._updates = updates
            # States newer than this one hold updates of the abandoned timeline: going forward to one later (a
            # checkpoint unreadable now may be readable then) would count lost updates as found again.
            self._kept = [(ref, n) for ref, n in self._kept if n <= updates]
            if self._checkpoint_updates is not None and self._checkpoint_updates > updates:
                self._checkpoint_updates = None  # (until the next checkpoint is written)
            self._dirty = True
            logger.warning("herdrl: %s during its %s; the learner group was restarted (%d of at most %d restarts) "
                           "from %s: %d update%s lost", died, what, self.num_restarts, cfg.max_num_learner_restarts,
                           source, lost, "" if lost == 1 else "s")
            return
        self.stop()
        raise LearnerFailure(f"{died} during its {what}, and the learner group could not be restarted ("
                             f"{'; '.join(failures) or 'no learner state kept'}): resume from the last checkpoint "
                             "(herd train --resume)")

    def _start_with(self, state: Any, source: str, timeout: float, failures: list[str]) -> bool:
        """Start the ranks and load ``state`` into them; a few tries while they die as they start (placed on a node
        that is dying, before Ray has noticed: its bundles move once it has). False when the state itself is lost,
        or every try failed (``failures`` says why)."""
        for attempt in range(RESTART_TRIES):
            logger.warning("herdrl: restarting the learner group from %s (try %d of %d): waiting up to %g s for Ray "
                           "to place %d learner(s)", source, attempt + 1, RESTART_TRIES, timeout,
                           self.config.num_learners)
            try:
                self._start_actors(timeout)
                self._get([actor.call.remote("load_state", state) for actor in self.actors], "restore", timeout)
                return True
            except _LearnerDied as again:
                failures.append(f"from {source}: {again}")
                self._kill_actors()
                if again.exc is not None and _state_lost(again.exc):
                    return False
                if attempt + 1 < RESTART_TRIES:
                    time.sleep(RESTART_PAUSE_S)
        return False

    def _checkpoint_ref(self) -> Any:
        """The last checkpoint's learner state, in the object store (None if it cannot be read)."""
        import ray

        state = self.checkpoint_state() if self.checkpoint_state is not None else None
        return None if state is None else ray.put(state)

    def checkpoint_written(self) -> None:
        """The algorithm wrote a checkpoint of the learners' current state (a restart may go back to it)."""
        self._checkpoint_updates = self._updates

    def end_iteration(self, iteration: int) -> None:
        """Keep the learner state every ``learner_state_interval`` iterations (counted in iterations, not updates:
        an off-policy iteration makes many small updates)."""
        interval = self.config.learner_state_interval
        if interval and iteration % interval == 0:
            self._keep()

    def _keep(self) -> None:
        """Ask rank 0 for its state and keep the reference (the state stays in the object store, on rank 0's node:
        it outlives the rank's process, not its node); the newest two are kept."""
        self._kept = [(self.actors[0].call.remote("state"), self._updates), *self._kept][:2]

    def update(self, *args: Any) -> Any:
        """Every learner's ``update(*args)`` on one shared copy of the data; their results merged (metrics averaged
        over learners; per-row arrays, such as TD errors, joined in rank order, i.e. in row order). Fragments sampled
        by Ray runners (a :class:`FragmentInput` of references) go as references: each learner fetches them from
        the object store itself, and this process never deserialises them; if any was lost with its node, no learner
        updates and :class:`FragmentsLost` names them. A learner that dies: the group restarts and updates again."""
        import ray

        # Data goes into the object store once for all learners; small arguments (a seed, a count, a policy id, rows
        # to read from each rank's own stream: a learner input that is not fragments) go by value, and a list of
        # references as it is (Ray keeps the objects alive for the learners that borrow them).
        refs = [a if isinstance(a, (int, float, str)) or _by_value_input(a) or _all_refs(a) else ray.put(a)
                for a in args]
        # Every rank takes the scheduled hyperparameters (lr, ...) at the same env-step count: they agree.
        step = self.step_source() if self.step_source else None
        results = self._call("update", lambda: [actor.call.remote("update_at", step,
                                                                  *self._aggregated(self._shared(refs, rank), rank))
                                                for rank, actor in enumerate(self.actors)])
        if isinstance(results[0], FragmentsLost):
            return results[0]  # (the learners agreed on it: none updated)
        self._dirty = True
        self._updates += 1
        if isinstance(results[0], tuple):  # (metrics, rows): off-policy learners
            metrics, rows = zip(*results, strict=True)
            return _mean_metrics(metrics), np.concatenate(rows)
        return _mean_metrics(results)

    def _shared(self, args: list[Any], rank: int) -> list[Any]:
        """``args`` for learner ``rank``: with ``shard_fragments``, its own share of the fragment references (when
        there are at least as many as learners; else every learner reads them all, as without)."""
        count = len(self.actors)
        if not self.config.shard_fragments:
            return args
        few = [len(arg) for arg in args if _all_refs(arg) and len(arg) < count]
        if few and rank == 0 and not self._warned_unsharded:
            self._warned_unsharded = True
            logger.warning("herdrl: shard_fragments: an update of %d fragment(s) between %d learners is not sharded "
                           "(every learner reads them all); more runners or shorter fragments give each learner "
                           "its own", few[0], count)
        return [arg.share(rank, count) if _all_refs(arg) and len(arg) >= count else arg for arg in args]

    def _aggregated(self, args: list[Any], rank: int) -> list[Any]:
        """``args`` for learner ``rank``: with aggregators, its fragment references in consecutive shares, each
        fetched by one of its aggregators (the learner gets their results, in order)."""
        if not self.aggregators:
            return args
        mine = self.aggregators[rank]
        out = []
        for arg in args:
            if _all_refs(arg):
                parts = shares(list(arg), len(mine))
                aggregated = AggregatedInput([aggregator.gather.remote(part)
                                              for aggregator, part in zip(mine, parts, strict=False)],
                                             [len(part) for part in parts])
                aggregated.offset, aggregated.total = arg.offset, arg.total
                arg = aggregated
            out.append(arg)
        return out

    def apply(self, method: str, *args: Any) -> None:
        """Every learner's ``method(*args)``, a change of their state outside updates (self-play snapshots)."""
        self._call(method, lambda: [actor.call.remote(method, *args) for actor in self.actors])
        self._dirty = True
        self._keep()  # a restart must not undo it

    def sync(self) -> None:
        """Load rank 0's weights into the driver's copy if an update happened since."""
        if self._dirty:
            weights = self._call("weight transfer", lambda: [self.actors[0].call.remote("get_weights")])[0]
            # torch.tensor copies: the arrays Ray hands back are read-only
            self.module.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})
            self._dirty = False

    def get_weights(self) -> dict[str, np.ndarray]:
        """The learners' weights (rank 0's; every rank holds the same)."""
        self.sync()
        return {k: v.detach().numpy().copy() for k, v in self.module.state_dict().items()}

    def state(self) -> dict[str, Any]:
        """Rank 0's learner state (every rank holds the same), for a checkpoint."""
        return self._call("checkpoint", lambda: [self.actors[0].call.remote("state")])[0]

    def load_state(self, state: dict[str, Any]) -> None:
        """Load ``state`` into every learner."""
        import ray

        ref = ray.put(state)
        self._call("restore", lambda: [actor.call.remote("load_state", ref) for actor in self.actors])
        self._dirty = True
        self.sync()
        self._kept = []
        self._keep()
        self._checkpoint_updates = self._updates  # (a restore loads a checkpoint's state)

    def call(self, method: str) -> list[Any]:
        """A method of every learner (``get_weights``) or of its actor (``pid``), in rank order."""
        return self._call(method, lambda: [actor.pid.remote() if method == "pid" else actor.call.remote(method)
                                           for actor in self.actors])

    def _kill_actors(self) -> None:
        import ray

        for actor in [*self.actors, *(a for mine in self.aggregators for a in mine)]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        self.actors, self.aggregators = [], []

    def stop(self) -> None:
        """Kill the actors and free their placement group (and leave a Ray this group started)."""
        import ray

        from herdrl.cluster import disconnect
        from herdrl.rollout.group import _LIVE_GROUPS

        self._kill_actors()
        self._kept = []
        if getattr(self, "_counted", False):
            _LIVE_GROUPS[0] -= 1
            self._counted = False
        if getattr(self, "_own_pg", False):
            try:
                ray.util.remove_placement_group(self._pg)
            except Exception:
                pass
            self._own_pg = False
        if getattr(self, "_owns_ray", False):
            self._owns_ray = False
            disconnect()


def _state_lost(exc: BaseException) -> bool:
    """Whether a restore failed because the state's object is gone (not because a rank died)."""
    import ray

    return _caused_by(exc, (ray.exceptions.ObjectLostError,))


def _lost(exc: BaseException) -> bool:
    """Whether a Ray error means a process or object is gone (restartable), not an error raised in a learner."""
    import ray

    return _caused_by(exc, (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError,
                            ray.exceptions.ObjectLostError, ray.exceptions.WorkerCrashedError,
                            ray.exceptions.NodeDiedError))


def _caused_by(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    """Whether ``exc`` or an error it wraps (a learner's task error may wrap the loss of what it fetched: an
    aggregator's result, a state) is one of ``kinds``."""
    for _ in range(10):
        if isinstance(exc, kinds):
            return True
        inner = getattr(exc, "cause", None)
        if not isinstance(inner, BaseException):
            return False
        exc = inner
    return False


def _by_value_input(arg: Any) -> bool:
    """Whether ``arg`` is a learner input that names its rows itself (an offline stream's rows), not fragments."""
    return isinstance(arg, LearnerInput) and not isinstance(arg, FragmentInput)


def _all_refs(arg: Any) -> bool:
    """A :class:`FragmentInput` of object references only (fragments of Ray runners)."""
    import ray

    return isinstance(arg, FragmentInput) and all(isinstance(item, ray.ObjectRef) for item in arg)


def _mean_metrics(results: tuple[dict[str, float], ...] | list[dict[str, float]]) -> dict[str, float]:
    keys = [key for key in results[0] if all(key in r for r in results)]
    return {key: float(np.mean([r[key] for r in results])) for key in keys}


def make_learner_group(config: AlgorithmConfig, learner_class: type[Learner], observation_space: gym.Space,
                       action_space: gym.Space, init_seed: int = 0) -> LocalLearnerGroup | RayLearnerGroup:
    """In the driver for ``num_learners=0``, else Ray actors (``init_seed``: their common initial weights)."""
    if config.num_learners > 0:
        return RayLearnerGroup(config, learner_class, observation_space, action_space, init_seed)
    return LocalLearnerGroup(config, learner_class, observation_space, action_space)
