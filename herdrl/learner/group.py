"""Learner groups: where learning happens.

``LocalLearnerGroup`` (``num_learners=0``, the default): one Learner in the driver process, sharing its module
with the algorithm (the policy, evaluation and checkpoints read it directly).
``RayLearnerGroup`` (``num_learners >= 1``): one Ray actor per learner, joined in a ``torch.distributed``
process group (gloo on CPU, NCCL on GPU). Every update goes to all of them as one object-store reference; each
learns on its share of every minibatch and they all-reduce gradients, so their weights stay identical; the
driver keeps a CPU copy of the module (for the policy, evaluation and runner weights), refreshed from rank 0.
A learner that dies ends the run with one line naming it and the checkpoint to resume from: no retry, since the
survivors' optimizer state moved on without it.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.config import AlgorithmConfig
from herdrl.errors import HerdError
from herdrl.learner.learner import Learner
from herdrl.rollout.transport import AggregatedInput, FragmentInput, FragmentsLost, resolve, shares


class LearnerFailure(HerdError):
    """A learner actor died or timed out."""


class LocalLearnerGroup:
    """The learner in the driver: calls go straight to it."""

    def __init__(self, config: AlgorithmConfig, learner_class: type[Learner], observation_space: gym.Space,
                 action_space: gym.Space) -> None:
        self.learner = learner_class(config, observation_space, action_space)
        self.module: torch.nn.Module = self.learner.module
        self.device = self.learner.device

    def update(self, *args: Any) -> Any:
        """The learner's ``update(*args)``; a :class:`FragmentInput` argument is fetched here first (its fragments
        lost with their node: :class:`FragmentsLost`, and no update)."""
        args = list(args)
        for i, arg in enumerate(args):
            if isinstance(arg, FragmentInput):
                args[i], lost = resolve(arg)
                if lost:
                    return FragmentsLost(lost)
        return self.learner.update(*args)

    def apply(self, method: str, *args: Any) -> None:
        """The learner's ``method(*args)``, a change of its state outside updates (self-play snapshots)."""
        getattr(self.learner, method)(*args)

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

    def __init__(self, config: AlgorithmConfig, learner_class: type[Learner], observation_space: gym.Space,
                 action_space: gym.Space, init_seed: int) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from herdrl.cluster import ClusterError, connect, shipping
        from herdrl.env import imports
        from herdrl.learner.remote import LearnerActor
        from herdrl.registry import ENCODERS, ENV_CREATORS

        self.config = config
        count, cpus, gpus = config.num_learners, config.num_cpus_per_learner, config.num_gpus_per_learner
        self._owns_ray = connect(config, num_cpus=math.ceil(config.total_cpus_requested))
        self.learner = None  # none in this process
        self.module: torch.nn.Module = config.build_module(observation_space, action_space)
        self.module.requires_grad_(False)
        self.device = torch.device("cpu")
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        # Inside a Tune trial: the trial's placement group holds the learners' bundles after the runners'.
        current = ray.util.get_current_placement_group()
        first = 1 + config.num_env_runners
        self._own_pg = current is None or len(current.bundle_specs) < first + count
        self._pg, self._first_bundle = (placement_group([bundle] * count, strategy="PACK"), 0) if self._own_pg \
            else (current, first)
        self.actors: list[Any] = []
        try:
            ray.get(self._pg.ready(), timeout=max(60.0, config.ray_connect_timeout_s))
        except ray.exceptions.GetTimeoutError:
            free = ray.available_resources()  # read before stop(), which may shut Ray down
            self.stop()
            raise ClusterError(f"the Ray cluster cannot place {count} learners x {cpus:g} CPU"
                               + (f" x {gpus:g} GPU" if gpus else "") + f" (available: {free.get('CPU', 0):g} "
                               f"CPU, {free.get('GPU', 0):g} GPU); lower num_learners or their resources") from None
        shipping.ship_by_value([*ENV_CREATORS.values(), *ENCODERS.values()])  # user code travels with the actors
        self.actors = [LearnerActor.options(
            num_cpus=cpus, num_gpus=gpus, max_restarts=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                self._pg, placement_group_bundle_index=self._first_bundle + rank),
        ).remote(config, rank, count, tuple(imports.IMPORTED), dict(ENV_CREATORS), dict(ENCODERS))
            for rank in range(count)]
        init_method = self._get([self.actors[0].rendezvous.remote()], "start")[0]
        self._get([a.start.remote(init_method, learner_class, observation_space, action_space, init_seed,
                                  config.learner_timeout_s) for a in self.actors], "start")
        self.aggregators = self._start_aggregators(config.num_aggregator_actors_per_learner)
        self._dirty = True
        self.sync()

    def _start_aggregators(self, per_learner: int) -> list[list[Any]]:
        """``per_learner`` aggregator actors on each learner's node (no CPU reserved: they share the learner's)."""
        if not per_learner:
            return []
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from herdrl.learner.remote import FragmentAggregator

        nodes = self._get([actor.node_id.remote() for actor in self.actors], "start")
        return [[FragmentAggregator.options(num_cpus=0, max_restarts=0, scheduling_strategy=(
            NodeAffinitySchedulingStrategy(node, soft=False))).remote() for _ in range(per_learner)]
            for node in nodes]

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        """Results of one call per learner, in rank order; the first learner to fail (or a call past the timeout)
        stops the group and raises :class:`LearnerFailure` at once, without waiting on its peers (which would
        block in their next all-reduce)."""
        import ray

        from herdrl.rollout.group import _herd_cause, _one_line

        pending, timeout = list(refs), self.config.learner_timeout_s
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                self.stop()
                raise LearnerFailure(f"a learner did not finish its {what} within learner_timeout_s={timeout:g} s; "
                                     "resume from the last checkpoint (herd train --resume)")
            try:
                ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                rank = refs.index(ready[0])
                self.stop()
                cause = _herd_cause(exc)
                if cause is not None:
                    raise cause from None
                raise LearnerFailure(f"learner {rank} failed during {what} ({_one_line(exc)}); the run cannot go on "
                                     "without it: resume from the last checkpoint (herd train --resume)") from exc
        return ray.get(refs)

    def update(self, *args: Any) -> Any:
        """Every learner's ``update(*args)`` on one shared copy of the data; their results merged (metrics averaged
        over learners; per-row arrays, such as TD errors, joined in rank order, i.e. in row order). Fragments sampled
        by Ray runners (a :class:`FragmentInput` of references) go as references: each learner fetches them from
        the object store itself, and this process never deserialises them; if any was lost with its node, no learner
        updates and :class:`FragmentsLost` names them."""
        import ray

        # Data goes into the object store once for all learners; small arguments (a seed, a count) go by value, and
        # a list of references as it is (Ray keeps the objects alive for the learners that borrow them).
        refs = [a if isinstance(a, (int, float)) or _all_refs(a) else ray.put(a) for a in args]
        results = self._get([actor.call.remote("update", *self._aggregated(refs, rank))
                             for rank, actor in enumerate(self.actors)], "update")
        if isinstance(results[0], FragmentsLost):
            return results[0]  # (the learners agreed on it: none updated)
        self._dirty = True
        if isinstance(results[0], tuple):  # (metrics, rows): off-policy learners
            metrics, rows = zip(*results, strict=True)
            return _mean_metrics(metrics), np.concatenate(rows)
        return _mean_metrics(results)

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
                arg = AggregatedInput([aggregator.gather.remote(part) for aggregator, part in zip(mine, parts,
                                                                                                   strict=False)],
                                      [len(part) for part in parts])
            out.append(arg)
        return out

    def apply(self, method: str, *args: Any) -> None:
        """Every learner's ``method(*args)``, a change of their state outside updates (self-play snapshots)."""
        self._get([actor.call.remote(method, *args) for actor in self.actors], method)
        self._dirty = True

    def sync(self) -> None:
        """Load rank 0's weights into the driver's copy if an update happened since."""
        if self._dirty:
            weights = self._get([self.actors[0].call.remote("get_weights")], "weight transfer")[0]
            # torch.tensor copies: the arrays Ray hands back are read-only
            self.module.load_state_dict({k: torch.tensor(v) for k, v in weights.items()})
            self._dirty = False

    def get_weights(self) -> dict[str, np.ndarray]:
        """The learners' weights (rank 0's; every rank holds the same)."""
        self.sync()
        return {k: v.detach().numpy().copy() for k, v in self.module.state_dict().items()}

    def state(self) -> dict[str, Any]:
        """Rank 0's learner state (every rank holds the same)."""
        return self._get([self.actors[0].call.remote("state")], "checkpoint")[0]

    def load_state(self, state: dict[str, Any]) -> None:
        """Load ``state`` into every learner."""
        import ray

        ref = ray.put(state)
        self._get([actor.call.remote("load_state", ref) for actor in self.actors], "restore")
        self._dirty = True
        self.sync()

    def call(self, method: str) -> list[Any]:
        """A method of every learner (``get_weights``) or of its actor (``pid``), in rank order."""
        calls = [actor.pid.remote() if method == "pid" else actor.call.remote(method) for actor in self.actors]
        return self._get(calls, method)

    def stop(self) -> None:
        """Kill the actors and free their placement group (and leave a Ray this group started)."""
        import ray

        from herdrl.cluster import disconnect

        for actor in [*self.actors, *(a for mine in getattr(self, "aggregators", []) for a in mine)]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        self.actors, self.aggregators = [], []
        if getattr(self, "_own_pg", False):
            try:
                ray.util.remove_placement_group(self._pg)
            except Exception:
                pass
            self._own_pg = False
        if getattr(self, "_owns_ray", False):
            self._owns_ray = False
            disconnect()


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
