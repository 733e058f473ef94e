"""The multi-agent learner: the algorithm's own Learner once per policy, updated in one fixed order.

Each policy has its own module, optimizer and update (the algorithm's ``Learner`` subclass, unchanged); this
learner routes each policy's fragments to it. The policies that learn are updated in sorted order of their ids on
every learner, so with N data-parallel learners every rank issues the same all-reduces in the same order and
nothing can desynchronise (RLlib's multi-learner desync, ray#63819, is a rank updating its modules in another
order). A policy with no rows in a batch is skipped on every rank alike: all ranks see the same batch.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.config import AlgorithmConfig
from herdrl.learner.learner import Learner, learner_device
from herdrl.multi_agent import MultiAgentModule, policy_config, trained_policies
from herdrl.rollout.multi_agent import pad_front


class MultiAgentLearner(Learner):
    """One ``config``'s Learner per policy (spaces: policy id -> space); the module is all of theirs."""

    def __init__(self, config: AlgorithmConfig, observation_space: dict[str, gym.Space],
                 action_space: dict[str, gym.Space], device: torch.device | None = None, rank: int = 0,
                 world_size: int = 1) -> None:
        inner = config.algo_class().learner_class
        self.config = config
        self.observation_space, self.action_space = observation_space, action_space
        self.device = device if device is not None else learner_device(config)
        self.rank, self.world_size = rank, world_size
        self._sum_seconds = 0.0
        self.seed_arg = inner.seed_arg
        self.learners: dict[str, Learner] = {
            pid: inner(policy_config(config, pid), observation_space[pid], action_space[pid], self.device, rank,
                       world_size)
            for pid in sorted(observation_space)}
        self.module = MultiAgentModule({pid: learner.module for pid, learner in self.learners.items()})
        self.trained = trained_policies(config)
        self.hp = {f"{key}/{pid}": value for pid, learner in self.learners.items() for key, value in learner.hp.items()}

    def at_step(self, step: int | dict[str, int]) -> None:
        """Every policy's learner at its own count: ``step`` maps policy ids to their agent steps sampled (a policy
        left out is at 0); a plain number is every policy's count."""
        steps = step if isinstance(step, dict) else dict.fromkeys(self.learners, step)
        for pid, learner in self.learners.items():
            learner.at_step(steps.get(pid, 0))  # each with its own config's schedules (policies' own lr, ...)
        self.hp = {f"{key}/{pid}": value for pid, learner in self.learners.items() for key, value in learner.hp.items()}

    def update(self, fragments: list[Any] | str, *args: Any) -> Any:
        """Each trained policy's update on its fragments, in sorted order; metrics ``<policy id>/<name>``.
        ``args`` are the algorithm's (PPO's seed; IMPALA's passes and seed): the seed among them (the inner
        learner's ``seed_arg``) gives each policy its own seed, drawn in that order.

        Replay algorithms (DQN, SAC, TD3, DDPG) update one policy at a time: ``update(policy_id, batch, weights,
        steps)`` is that policy's learner's update on a batch replayed from its own buffer; returns its metrics
        (named as above) and TD errors."""
        if isinstance(fragments, str):
            metrics, td_errors = self.learners[fragments].update(*args)
            return {f"{fragments}/{key}": value for key, value in metrics.items()}, td_errors
        at = self.seed_arg
        rng = np.random.default_rng(args[at]) if len(args) > at else None
        metrics: dict[str, float] = {}
        for pid in self.trained:
            own = args if rng is None else (*args[:at], int(rng.integers(2**63)), *args[at + 1:])
            parts = [f.policies[pid] for f in fragments if pid in f.policies and f.policies[pid].valid.any()]
            if not parts:
                continue
            length = max(len(part.valid) for part in parts)  # runners' fragments differ in length: align them
            parts = [pad_front(part, length) for part in parts]
            for key, value in self.learners[pid].update(parts, *own).items():
                metrics[f"{pid}/{key}"] = value
        return metrics

    def load_matching_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy ``weights`` (named ``<policy id>.<weight>``) into the policies they name; targets follow."""
        for pid, learner in self.learners.items():
            own = {k[len(pid) + 1:]: v for k, v in weights.items() if k.startswith(f"{pid}.")}
            if own:
                learner.load_matching_weights(own)

    def copy_policy(self, pairs: list[tuple[str, str]]) -> None:
        """Copy weights from policy to policy, pair by pair in order (self-play snapshots)."""
        for source, target in pairs:
            self.module[target].load_state_dict(self.module[source].state_dict())

    def sum_seconds(self) -> float:
        """Seconds the policies' learners spent in gradient all-reduces since the last call."""
        return sum(learner.sum_seconds() for learner in self.learners.values())

    def state(self) -> dict[str, Any]:
        """Every policy's learner state (module, optimizers, extras), by policy id."""
        return {"policies": {pid: learner.state() for pid, learner in self.learners.items()}}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state`; every policy of this run must be in it."""
        saved = state["policies"]
        missing = sorted(set(self.learners) - set(saved))
        if missing:
            raise KeyError(f"no policy {missing[0]!r} in the checkpoint (it has {sorted(saved)})")
        for pid, learner in self.learners.items():
            learner.load_state(saved[pid])
