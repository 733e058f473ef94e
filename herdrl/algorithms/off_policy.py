"""What DQN, SAC, TD3 and DDPG share: a replay buffer in the driver, sampling rounds, and a replay ratio.

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
from herdrl.obs import ObsSpec
from herdrl.rollout.transport import resolve

logger = logging.getLogger("herdrl")


class OffPolicyConfig(AlgorithmConfig):
    """Keys every replay-based algorithm has (RLlib's names)."""

    #: Training episodes explore: stop and "solved" use the greedy evaluation metric.
    stop_metric = "evaluation/episode_return_mean"
    #: A replay buffer per trained policy (OffPolicyAlgorithm's streams).
    supports_multi_agent = True
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
        """Replay settings (each policy's own, in a multi-agent run)."""
        check_replay_config(self.replay_buffer_config, self.train_batch_size)
        if self.is_multi_agent:
            from herdrl.multi_agent import policy_config

            for pid in self.policies or {}:
                check_replay_config(policy_config(self, pid).replay_buffer_config, self.train_batch_size)


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


class _Replay:
    """One replay stream: a buffer and its replay accounting (the run's one, or one per trained policy of a
    multi-agent run, each filled with that policy's rows in its agents' own time)."""

    def __init__(self, config: AlgorithmConfig, buffer: ReplayBuffer) -> None:
        self.config, self.buffer = config, buffer
        self.debt = 0.0  # replayed transitions owed to keep training_intensity
        self.pending_clock = 0  # sampled steps the learner's clock has not seen yet

    @property
    def learning(self) -> bool:
        """Whether the buffer holds enough to learn from."""
        cfg, buffer = self.config, self.buffer
        if hasattr(buffer, "transitions"):  # episode windows (herdrl.sequence_replay): their trained steps, or full
            return len(buffer) >= buffer.capacity or buffer.transitions >= max(
                1, cfg.num_steps_sampled_before_learning_starts)
        return len(buffer) >= max(1, min(cfg.num_steps_sampled_before_learning_starts, buffer.capacity))

    def due(self, new_steps: int) -> int:
        """Gradient steps due after ``new_steps`` more sampled steps (a batch of episode windows replays their
        segments' steps: ``segment_steps`` each, on average)."""
        cfg = self.config
        self.debt += cfg.training_intensity * new_steps
        batch = cfg.train_batch_size * getattr(self.buffer, "segment_steps", 1)
        due = int(self.debt // batch)
        self.debt -= due * batch
        return due


class OffPolicyAlgorithm(Algorithm):
    """The sampling/replay loop; subclasses give their learner (``learner_class``) and may override
    :meth:`exploration`. A multi-agent run replays each trained policy's own rows: a buffer, a replay ratio
    and gradient steps per policy, counted in its agent steps."""

    def setup(self) -> None:
        """The replay buffers."""
        self.streams = self._empty_streams()

    @property
    def buffer(self) -> ReplayBuffer:
        """The replay buffer (single-agent runs; a multi-agent run has one per policy: ``streams[policy_id]``)."""
        if self.multi_agent:
            raise AttributeError("a multi-agent run has a replay buffer per trained policy: streams[policy_id].buffer")
        return self.streams[None].buffer

    def _empty_streams(self) -> dict[str | None, _Replay]:
        """A stream with an empty buffer for the run (key None), or for each trained policy of a multi-agent run
        (key: the policy id), each by its policy's own config."""
        if not self.multi_agent:
            return {None: _Replay(self.config, self._empty_buffer(None))}
        from herdrl.multi_agent import policy_config, trained_policies

        return {pid: _Replay(policy_config(self.config, pid), self._empty_buffer(pid))
                for pid in trained_policies(self.config)}

    def _empty_buffer(self, key: str | None) -> ReplayBuffer:
        """A new buffer for stream ``key`` as ``replay_buffer_config`` says (vector actions for Box spaces)."""
        if key is None:
            config, spec, module = self.config, self.obs_spec, self.module
        else:
            from herdrl.multi_agent import policy_config

            config, spec, module = policy_config(self.config, key), ObsSpec(self.observation_space[key]), \
                self.module[key]
        return make_buffer(config.replay_buffer_config, spec, self.rng, None if module.discrete else module.action_dim)

    def exploration(self, env_steps: int) -> dict[str, Any] | None:
        """Exploration settings sent to the runners for the next round (DQN: epsilon)."""
        return None

    def exploration_metrics(self) -> dict[str, Any]:
        """The exploration settings now, for the row (a single-agent run's :meth:`exploration`)."""
        if self.multi_agent:
            return {}
        return dict(self.exploration(self.env_steps_lifetime + self._iter_steps) or {})

    def training_step(self) -> dict[str, float]:
        """Sample rounds and gradient steps until this iteration sampled its share of env steps."""
        cfg = self.config
        sampled, updates, sums, counts = 0, 0, {}, {}
        while sampled < cfg.min_sample_timesteps_per_iteration:
            # The replay buffers live here, so their fragments are fetched here (a lost one is only lost data).
            items = self.sample(self.exploration(self.env_steps_lifetime + self._iter_steps))
            fragments, lost = resolve([item.data for item in items])
            self._iter_fragments_lost += len(lost)
            new_steps = {}  # sampled steps of each stream in this round: env steps, or a policy's agent steps
            for fragment in fragments:
                for key, part in self._parts(fragment):
                    self.store(key, part)
                    new_steps[key] = new_steps.get(key, 0) + part.env_steps
            if not self.multi_agent:  # env steps sampled, lost fragments' too (as num_env_steps_sampled counts)
                new_steps[None] = self._iter_steps - sampled
            sampled = self._iter_steps
            for key, stream in self.streams.items():
                if not stream.learning:
                    continue
                round_sums, round_counts, due = self._replay(key, stream, new_steps.get(key, 0))
                updates += due
                for name, value in round_sums.items():
                    sums[name] = sums.get(name, 0.0) + value
                    counts[name] = counts.get(name, 0) + round_counts[name]
        means = {k: v / counts[k] for k, v in sums.items()}  # over the gradient steps that reported each metric
        sizes = {"replay_buffer_size": len(self.buffer)} if not self.multi_agent else \
            {f"replay_buffer_size/{pid}": len(stream.buffer) for pid, stream in self.streams.items()}
        return {**means, "num_gradient_updates": updates, **sizes, **self.exploration_metrics()}

    def store(self, key: str | None, fragment: Any) -> None:
        """Add a fragment (a trained policy's part of one) to stream ``key``'s buffer as (n-step) transitions."""
        config = self.streams[key].config
        self.streams[key].buffer.add(fragment_transitions(fragment, config.gamma, config.n_step))

    def _parts(self, fragment: Any) -> list[tuple[str | None, Any]]:
        """(stream key, fragment) pairs: the fragment itself, or each trained policy's part of it."""
        if not self.multi_agent:
            return [(None, fragment)]
        return [(pid, part) for pid, part in fragment.policies.items() if pid in self.streams]

    def _replay(self, key: str | None, stream: _Replay,
                new_steps: int) -> tuple[dict[str, float], dict[str, int], int]:
        """The gradient steps a round of ``new_steps`` sampled steps makes due on one stream: their metrics summed
        (``<policy>/<name>`` in multi-agent runs), how many steps reported each (TD3's actor loss: every
        ``policy_delay``-th), and how many steps there were."""
        cfg = stream.config
        due = stream.due(new_steps)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        clock = 0
        for j in range(due):  # the round's sampled steps, spread evenly over its gradient steps
            data, slots, weights = stream.buffer.sample(cfg.train_batch_size)
            data = self.normalized(data, key)
            # The learner's clock (target updates) moves with each gradient step; steps after the round's last one
            # reach it with the next round's first (the target is only read by gradient steps).
            passed = stream.pending_clock + new_steps * j // due - clock
            args = (data, weights, passed) if key is None else (key, data, weights, passed)
            metrics, td_errors = self.learners.update(*args)
            stream.pending_clock, clock = 0, new_steps * j // due
            stream.buffer.update_priorities(slots, td_errors)
            for name, value in metrics.items():
                sums[name] = sums.get(name, 0.0) + value
                counts[name] = counts.get(name, 0) + 1
        stream.pending_clock += new_steps - clock
        return sums, counts, due

    def normalized(self, data: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        """A replayed batch of raw transitions as the learner reads it: observations filtered and rewards scaled
        with the run's current statistics (``herdrl.filters``; policy ``key``'s own in multi-agent runs); as it is
        without normalisation."""
        norm = self.normalizer if key is None else self.normalizer.parts[key]
        if not norm.active:
            return data
        return {**data, "obs": norm.normalize(data["obs"]), "next_obs": norm.normalize(data["next_obs"]),
                "rewards": norm.scale_rewards(data["rewards"])}

    # ------------------------------------------------------------ the buffer in checkpoints
    def _buffer_names(self) -> dict[str | None, str]:
        """Each stream's array file in a checkpoint: ``replay_buffer``, or ``replay_buffer.<policy id, quoted>``."""
        from urllib.parse import quote

        return {key: "replay_buffer" if key is None else f"replay_buffer.{quote(key, safe='')}" for key in self.streams}

    def checkpoint_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """The replay buffers, when ``store_buffer_in_checkpoints`` is on."""
        if not self.config.store_buffer_in_checkpoints:
            return {}
        return {name: self.streams[key].buffer.state() for key, name in self._buffer_names().items()}

    def load_checkpoint_arrays(self, path: Path) -> None:
        """Refill the buffers from a checkpoint that holds them (with or without the setting on now); without one
        (or with one that cannot be read) a buffer starts empty: no transitions of another timeline stay."""
        for key, name in self._buffer_names().items():
            stream = self.streams[key]
            stream.buffer = self._empty_buffer(key)
            try:
                state = read_arrays(path, name)
                if state is not None:
                    stream.buffer.load_state(state)
            except (CheckpointError, KeyError, ValueError) as exc:
                stream.buffer = self._empty_buffer(key)
                logger.warning("herdrl: %s; resuming with an empty replay buffer%s", str(exc).splitlines()[0],
                               "" if key is None else f" for policy '{key}'")

    def learner_state(self) -> dict[str, Any]:
        """The learner's state plus the replayed transitions still owed (so a resume replays as before)."""
        if not self.multi_agent:
            stream = self.streams[None]
            return {**super().learner_state(), "replay_debt": stream.debt, "pending_clock": stream.pending_clock}
        return {**super().learner_state(),
                "replay": {pid: [stream.debt, stream.pending_clock] for pid, stream in self.streams.items()}}

    def load_learner_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`learner_state`."""
        super().load_learner_state(state)
        if not self.multi_agent:
            stream = self.streams[None]
            stream.debt = float(state.get("replay_debt", 0.0))  # format 1 did not save it
            stream.pending_clock = int(state.get("pending_clock", 0))
            return
        for pid, (debt, clock) in (state.get("replay") or {}).items():
            if pid in self.streams:
                self.streams[pid].debt, self.streams[pid].pending_clock = float(debt), int(clock)
