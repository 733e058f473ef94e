"""Learner groups: where learning happens.

``LocalLearnerGroup`` (``num_learners=0``, the default): one Learner in the driver process, sharing its module
with the algorithm (the policy, evaluation and checkpoints read it directly).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.config import AlgorithmConfig
from herdrl.learner.learner import Learner


class LocalLearnerGroup:
    """The learner in the driver: calls go straight to it."""

    def __init__(self, config: AlgorithmConfig, learner_class: type[Learner], observation_space: gym.Space,
                 action_space: gym.Space) -> None:
        self.learner = learner_class(config, observation_space, action_space)
        self.module: torch.nn.Module = self.learner.module
        self.device = self.learner.device

    def update(self, *args: Any) -> Any:
        """The learner's ``update(*args)``."""
        return self.learner.update(*args)

    def get_weights(self) -> dict[str, np.ndarray]:
        """The module's weights as numpy arrays."""
        return self.learner.get_weights()

    def state(self) -> dict[str, Any]:
        """The learner's state (module, optimizers, ...) for a checkpoint."""
        return self.learner.state()

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state`."""
        self.learner.load_state(state)

    def stop(self) -> None:
        """Nothing to release in-process."""


def make_learner_group(config: AlgorithmConfig, learner_class: type[Learner], observation_space: gym.Space,
                       action_space: gym.Space) -> LocalLearnerGroup:
    """The learner(s) ``config`` asks for."""
    return LocalLearnerGroup(config, learner_class, observation_space, action_space)
