"""What DQN and SAC share: a replay buffer in the driver, sampling rounds, and a replay ratio.

An iteration samples ``min_sample_timesteps_per_iteration`` env steps in rounds of one fragment per runner.
Once the buffer holds ``num_steps_sampled_before_learning_starts`` transitions, each round is followed by as
many gradient steps of ``train_batch_size`` replayed transitions as keep replayed/sampled at
``training_intensity``. Learning waits on what the buffer holds, not on lifetime steps: a run resumed without
its buffer (``store_buffer_in_checkpoints`` off) refills it before it learns again. Training episodes
explore, so "solved" is judged on greedy evaluation episodes (``evaluation/...``, every iteration).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from herdrl.algorithms.base import Algorithm
from herdrl.buffers import REPLAY_DEFAULTS, ReplayBuffer, check_replay_config, fragment_transitions, make_buffer
from herdrl.checkpoint import CheckpointError, read_arrays
from herdrl.config import AlgorithmConfig, Field, shared_field
from herdrl.learner import Learner
from herdrl.models.encoders import to_torch
from herdrl.rollout.transport import resolve

logger = logging.getLogger("herdrl")


class OffPolicyConfig(AlgorithmConfig):
    """Keys every replay-based algorithm has (RLlib's names)."""

    #: Training episodes explore: stop and "solved" use the greedy evaluation metric.
    stop_metric = "evaluation/episode_return_mean"
    #: The replay buffer holds raw transitions; each replayed batch is normalised with the current statistics.
    stores_raw_transitions = True
    FIELDS = {
        "evaluation_interval": shared_field("evaluation_interval", 1),
        "replay_buffer_config": Field(REPLAY_DEFAULTS, (dict,), "training",
                                      doc="type uniform|prioritized, capacity, alpha, beta"),
        "num_steps_sampled_before_learning_starts": Field(1000, (int,), "training", low=0),
        "min_sample_timesteps_per_iteration": Field(1000, (int,), "training", low=1),
        "training_intensity": Field(32.0, (float,), "training", low=0, low_open=True,
                                    doc="replayed transitions per sampled env step"),
        "n_step": Field(1, (int,), "training", low=1),
        "store_buffer_in_checkpoints": Field(
            False, (bool,), "training",
            doc="save the replay buffer (plain arrays) with the newest checkpoint, so a resumed run learns at once"),
    }
    ALIASES = {"learning_starts": "num_steps_sampled_before_learning_starts"}

    def validate_algorithm(self) -> None:
        """Replay settings."""
        check_replay_config(self.replay_buffer_config, self.train_batch_size)


#: Defaults SAC and TD3 share (SB3's): one env per runner, a gradient step of 256 per env step, soft targets.
ACTOR_CRITIC_FIELDS = {
    "num_envs_per_env_runner": shared_field("num_envs_per_env_runner", 1),
    "rollout_fragment_length": shared_field("rollout_fragment_length", 16),
    "train_batch_size": shared_field("train_batch_size", 256),
    "lr": shared_field("lr", 1e-3),
    "gamma": shared_field("gamma", 0.99),
    "training_intensity": shared_field("training_intensity", 256.0, OffPolicyConfig),  # a step per env step
    "num_steps_sampled_before_learning_starts": shared_field("num_steps_sampled_before_learning_starts", 100,
                                                             OffPolicyConfig),
    "tau": Field(0.005, (float,), "training", low=0, low_open=True, high=1, doc="Polyak factor of the targets"),
}


class OffPolicyLearner(Learner):
    """A learner with a frozen target copy of its network, updated on a schedule of sampled env steps."""

    def setup(self) -> None:
        """The target network (a copy of the module, no gradients)."""
        self.target = self.config.build_module(self.observation_space, self.action_space).to(self.device)
        self.target.load_state_dict(self.module.state_dict())
        self.target.requires_grad_(False)

    def update(self, batch: dict[str, Any], weights: np.ndarray, env_steps: int) -> tuple[dict[str, float], np.ndarray]:
        """Let ``env_steps`` sampled env steps pass (target updates fall due), then one gradient step on a replayed
        ``batch`` (numpy arrays; ``weights``: importance weights). Returns metrics and the TD errors of this
        learner's rows of the batch (for priorities)."""
        self.advance_learning_clock(env_steps)
        batch = {k: to_torch(v, self.device) for k, v in batch.items()}  # obs: dicts for Dict spaces
        batch["weights"] = torch.from_numpy(weights).to(self.device)
        metrics, td_errors = self.replay_step(batch)
        return metrics, td_errors.cpu().numpy()

    def replay_step(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor]:
        """One gradient step on a replayed batch (with its importance ``weights``); metrics and TD errors."""
        raise NotImplementedError

    def advance_learning_clock(self, env_steps: int) -> None:
        """Called as learning passes ``env_steps`` more sampled env steps, between gradient steps, so schedules
        in env steps (DQN's target updates) fall between the right gradient steps."""

    def extra_state(self) -> dict[str, Any]:
        """The target network."""
        return {"target": self.target.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`extra_state`."""
        self.target.load_state_dict(state["target"])


class OffPolicyAlgorithm(Algorithm):
    """The sampling/replay loop; subclasses give their learner (``learner_class``) and may override
    :meth:`exploration`."""

    def setup(self) -> None:
        """The replay buffer."""
        self.buffer = self._empty_buffer()
        self._replay_debt = 0.0  # replayed transitions owed to keep training_intensity
        self._pending_clock = 0  # sampled env steps the learner's clock has not seen yet

    def _empty_buffer(self) -> ReplayBuffer:
        """A new buffer as ``replay_buffer_config`` says (vector actions for Box spaces)."""
        return make_buffer(self.config.replay_buffer_config, self.obs_spec, self.rng,
                           None if self.module.discrete else self.module.action_dim)

    def exploration(self, env_steps: int) -> dict[str, Any] | None:
        """Exploration settings sent to the runners for the next round (DQN: epsilon)."""
        return None

    def training_step(self) -> dict[str, float]:
        """Sample rounds and gradient steps until this iteration sampled its share of env steps."""
        cfg = self.config
        sampled, updates, sums = 0, 0, {}
        while sampled < cfg.min_sample_timesteps_per_iteration:
            # The replay buffer lives here, so its fragments are fetched here (a lost one is only lost data).
            fragments, lost = resolve([item.data for item in self.sample(self.exploration(
                self.env_steps_lifetime + self._iter_steps))])
            self._iter_fragments_lost += len(lost)
            for fragment in fragments:
                self.buffer.add(fragment_transitions(fragment, cfg.gamma, cfg.n_step))
            new_steps, sampled = self._iter_steps - sampled, self._iter_steps
            if len(self.buffer) < max(1, min(cfg.num_steps_sampled_before_learning_starts, self.buffer.capacity)):
                continue
            self._replay_debt += cfg.training_intensity * new_steps
            due = int(self._replay_debt // cfg.train_batch_size)
            self._replay_debt -= due * cfg.train_batch_size
            clock = 0
            for j in range(due):  # the round's env steps, spread evenly over its gradient steps
                data, slots, weights = self.buffer.sample(cfg.train_batch_size)
                data = self.normalized(data)
                # The learner's clock (target updates) moves with each gradient step; steps after the round's last
                # one reach it with the next round's first (the target is only read by gradient steps).
                passed = self._pending_clock + new_steps * j // due - clock
                metrics, td_errors = self.learners.update(data, weights, passed)
                self._pending_clock, clock = 0, new_steps * j // due
                self.buffer.update_priorities(slots, td_errors)
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
                updates += 1
            self._pending_clock += new_steps - clock
        means = {k: v / updates for k, v in sums.items()} if updates else {}
        return {**means, "num_gradient_updates": updates, "replay_buffer_size": len(self.buffer),
                **(self.exploration(self.env_steps_lifetime + sampled) or {})}

    def normalized(self, data: dict[str, Any]) -> dict[str, Any]:
        """A replayed batch of raw transitions as the learner reads it: observations filtered and rewards scaled
        with the run's current statistics (``herdrl.filters``); as it is without normalisation."""
        norm = self.normalizer
        if not norm.active:
            return data
        return {**data, "obs": norm.normalize(data["obs"]), "next_obs": norm.normalize(data["next_obs"]),
                "rewards": norm.scale_rewards(data["rewards"])}

    # ------------------------------------------------------------ the buffer in checkpoints
    def checkpoint_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """The replay buffer, when ``store_buffer_in_checkpoints`` is on."""
        return {"replay_buffer": self.buffer.state()} if self.config.store_buffer_in_checkpoints else {}

    def load_checkpoint_arrays(self, path: Path) -> None:
        """Refill the buffer from a checkpoint that holds one (with or without the setting on now); without one
        (or with one that cannot be read) the buffer starts empty: no transitions of another timeline stay."""
        self.buffer = self._empty_buffer()
        try:
            state = read_arrays(path, "replay_buffer")
            if state is not None:
                self.buffer.load_state(state)
        except (CheckpointError, KeyError, ValueError) as exc:
            self.buffer = self._empty_buffer()
            logger.warning("herdrl: %s; resuming with an empty replay buffer", str(exc).splitlines()[0])

    def learner_state(self) -> dict[str, Any]:
        """The learner's state plus the replayed transitions still owed (so a resume replays as before)."""
        return {**super().learner_state(), "replay_debt": self._replay_debt, "pending_clock": self._pending_clock}

    def load_learner_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`learner_state`."""
        super().load_learner_state(state)
        self._replay_debt = float(state.get("replay_debt", 0.0))  # format 1 did not save it
        self._pending_clock = int(state.get("pending_clock", 0))
