"""What offline algorithms share: a dataset instead of env runners, gradient steps instead of env steps.

An offline algorithm is an ordinary :class:`~herdrl.algorithms.base.Algorithm` whose "sampling" reads its dataset
(``.offline_data(input_=DIR)``): the dataset's episodes are loaded as transitions (:func:`to_transitions`), each
iteration takes ``updates_per_iteration`` gradient steps on uniformly drawn batches of ``train_batch_size``, sent
to the learner (or split between N data-parallel learner actors) ``updates_per_call`` steps at a time. Schedules
(``lr``) count gradient steps. With an env (``.environment(...)``), every ``evaluation_interval`` iterations the
policy plays greedy episodes there (``evaluation/episode_return_mean``, what "solved" is judged on); without one,
the run learns and checkpoints without evaluating.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.algorithms.base import Algorithm
from herdrl.config import AlgorithmConfig, Field, shared_field
from herdrl.errors import ConfigError
from herdrl.models.distributions import ActionDistribution
from herdrl.obs import obs_map
from herdrl.offline.dataset import DatasetError, to_transitions


class OfflineConfig(AlgorithmConfig):
    """Keys every offline algorithm has."""

    learns_offline = True
    stop_metric = "evaluation/episode_return_mean"
    FIELDS = {
        "input_": Field(None, (str,), "offline_data", allow_none=True,
                        doc="the dataset folder to learn from (herd record's, or Minari's: parquet, arrow, hdf5)"),
        "updates_per_iteration": Field(1000, (int,), "training", low=1,
                                       doc="gradient steps per iteration (one result row, one evaluation)"),
        "updates_per_call": Field(50, (int,), "training", low=1,
                                  doc="gradient steps per call to the learner (learner actors: per round trip)"),
        "train_batch_size": shared_field("train_batch_size", 256),
        "lr": shared_field("lr", 1e-3),
        "evaluation_interval": shared_field("evaluation_interval", 1),
    }
    ALIASES = {"input": "input_"}

    def validate_algorithm(self) -> None:
        """A dataset is needed; evaluation needs an env; no normalisation yet."""
        if not self.input_:
            raise ConfigError(f"{self.algo_name} learns from a dataset: set .offline_data(input_=DIR) (herd train: "
                              "--input DIR); record one with herd record CHECKPOINT --out DIR")
        if self.env is None:
            if self.is_explicit("evaluation_interval") and self.evaluation_interval:
                raise ConfigError("evaluation_interval needs an env to evaluate in: set .environment(ENV) (the "
                                  "dataset's env is never made from the dataset itself)")
            self._values["evaluation_interval"] = None
        if self.observation_filter != "NoFilter" or self.norm_reward:
            raise ConfigError(f"{self.algo_name} does not normalise observations or rewards yet: leave "
                              "observation_filter and norm_reward at their defaults")
        if self.model.get("use_lstm"):
            raise ConfigError(f"{self.algo_name} learns from single transitions: model use_lstm is not supported")
        if self.is_multi_agent:
            raise ConfigError(f"{self.algo_name} learns single-agent datasets: .multi_agent() is not supported")


class OfflineAlgorithm(Algorithm):
    """Loads the dataset's transitions into memory and takes gradient steps on uniform batches of them.

    Subclasses give ``learner_class``, whose ``update(batch, steps)`` takes ``steps`` gradient steps on consecutive
    ``train_batch_size`` slices of ``batch`` (numpy arrays: ``obs``, ``actions`` in stored form, ``rewards``,
    ``next_obs``, ``discounts``, ``returns``) and returns their mean metrics.
    """

    config: OfflineConfig

    def setup(self) -> None:
        """The dataset's transitions, in memory."""
        dataset = self.runners.dataset
        episodes = list(dataset.episodes())
        transitions = to_transitions(episodes, self.observation_space, self.config.gamma)
        actions = ActionDistribution(self.action_space)
        transitions["actions"] = actions.from_env(_stacked_actions(self.action_space, episodes))
        self.transitions = transitions
        self.num_transitions = len(transitions["rewards"])
        if self.num_transitions < 1:
            raise DatasetError(f"{dataset.path} holds no transitions")
        self.gradient_steps_lifetime = 0
        self._iter_gradient_steps = 0
        returns = [episode.total_return for episode in episodes]
        self.dataset_summary = {"dataset/episodes": len(episodes), "dataset/transitions": self.num_transitions,
                                "dataset/return_mean": float(np.mean(returns)) if returns else math.nan}

    def _schedule_steps(self) -> int:
        """Schedules count gradient steps (there are no env steps)."""
        return self.gradient_steps_lifetime + self._iter_gradient_steps

    def _scheduled_values(self) -> dict[str, float]:
        return {key: schedule(self.gradient_steps_lifetime) for key, schedule in self.schedules.items()}

    def draw(self, rows: int) -> dict[str, Any]:
        """``rows`` transitions drawn uniformly (with replacement) from the dataset."""
        index = self.rng.integers(0, self.num_transitions, rows)
        return {key: obs_map(lambda array: array[index], value) for key, value in self.transitions.items()}

    def training_step(self) -> dict[str, float]:
        """``updates_per_iteration`` gradient steps, ``updates_per_call`` per learner call."""
        cfg = self.config
        self._iter_gradient_steps = 0
        sums: dict[str, float] = {}
        calls = 0
        while self._iter_gradient_steps < cfg.updates_per_iteration:
            steps = min(cfg.updates_per_call, cfg.updates_per_iteration - self._iter_gradient_steps)
            metrics = self.learners.update(self.draw(steps * cfg.train_batch_size), steps)
            self._iter_gradient_steps += steps
            calls += 1
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value * steps
        self.gradient_steps_lifetime += self._iter_gradient_steps
        done = self._iter_gradient_steps
        return {**{key: value / done for key, value in sums.items()}, "num_gradient_updates": done,
                "num_gradient_updates_lifetime": self.gradient_steps_lifetime, **self.dataset_summary}

    def learner_state(self) -> dict[str, Any]:
        """The learner's state and the gradient steps taken (what schedules follow)."""
        return {**super().learner_state(), "gradient_steps_lifetime": self.gradient_steps_lifetime}

    def load_learner_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`learner_state`."""
        state = dict(state)
        self.gradient_steps_lifetime = int(state.pop("gradient_steps_lifetime", 0))
        super().load_learner_state(state)


def _stacked_actions(space: gym.Space, episodes: list[Any]) -> Any:
    """Every episode's env actions joined along the step axis (tuples part by part)."""
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_stacked_actions(sub, [_Part(e.actions[i]) for e in episodes])
                     for i, sub in enumerate(space.spaces))
    return np.concatenate([np.asarray(e.actions) for e in episodes])


class _Part:
    """One part of a Tuple space's actions, where :func:`_stacked_actions` expects an episode."""

    def __init__(self, actions: Any) -> None:
        self.actions = actions
