"""Q-network for DQN (optionally dueling) on an encoder, and its epsilon-greedy runner policy."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.models.encoders import LegacyNames, build_encoder, head, module_device, to_torch
from herdrl.models.numpy_policy import numpy_forward
from herdrl.obs import obs_len


class QNetwork(LegacyNames):
    """Q(s, .) for a Discrete action space; ``dueling`` splits it into V(s) + A(s, a) - mean_a A(s, a)."""

    #: Weight names before encoders existed (checkpoint format <= 2) -> today's.
    LEGACY_KEYS = {"body.": "encoder.mlp."}

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict,
                 dueling: bool = False) -> None:
        super().__init__()
        self.discrete = True
        self.action_dim = int(action_space.n)
        self.encoder = build_encoder(observation_space, model_config)
        self.head = head(self.encoder.out_dim, self.action_dim, 1.0)
        self.value_head = head(self.encoder.out_dim, 1, 1.0) if dueling else None

    def forward(self, obs: Any) -> torch.Tensor:
        """Q-values, (batch, actions)."""
        features = self.encoder(obs)
        q = self.head(features).float()  # float32 under bf16 autocast too
        if self.value_head is not None:
            q = self.value_head(features).float() + q - q.mean(-1, keepdim=True)
        return q

    def greedy(self, obs: Any) -> torch.Tensor:
        """argmax_a Q(s, a)."""
        return self.forward(obs).argmax(-1)

    @torch.no_grad()
    def act(self, obs: Any, explore: bool = False) -> torch.Tensor:
        """Greedy actions (exploration is the runner's epsilon)."""
        return self.greedy(obs)


class EpsilonGreedyPolicy:
    """Epsilon-greedy actions from a QNetwork (``epsilon`` set per sample call): the greedy part in numpy on views
    of the weights for an MLP on a vector (cheaper than a torch call), one torch forward pass otherwise (CNNs)."""

    def __init__(self, module: QNetwork, rng: np.random.Generator) -> None:
        self.rng, self.epsilon = rng, 0.0
        self.action_dim = module.action_dim
        self.module = module
        self.device = module_device(module)  # a GPU with num_gpus_per_env_runner (then no numpy twin)
        # Dueling's V(s) shifts every action's Q equally: the argmax needs only the advantages.
        self._numpy = numpy_forward(module.encoder, module.head)

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Per step and env: a uniform draw (explore?) and a random action, packed as (steps, batch, 2)."""
        return np.stack([self.rng.random((steps, batch)),
                         self.rng.integers(0, self.action_dim, (steps, batch))], axis=-1)

    def _greedy(self, obs: Any) -> np.ndarray:
        if self._numpy is not None:
            return self._numpy(obs).argmax(1)
        with torch.inference_mode():
            return self.module.greedy(to_torch(obs, self.device)).cpu().numpy()

    def act(self, obs: Any, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Greedy actions, replaced by random ones with probability ``epsilon`` when exploring."""
        greedy = self._greedy(obs)
        if not explore or self.epsilon <= 0:
            return greedy
        if noise is None:
            noise = self.noise(1, obs_len(obs))[0]
        return np.where(noise[:, 0] < self.epsilon, noise[:, 1].astype(np.int64), greedy)
