"""Q-network for DQN (optionally dueling), and its epsilon-greedy numpy twin for runners."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.models.actor_critic import _head, mlp_body
from herdrl.models.numpy_policy import _ACTIVATIONS


class QNetwork(nn.Module):
    """Q(s, .) for a Discrete action space; ``dueling`` splits it into V(s) + A(s, a) - mean_a A(s, a)."""

    def __init__(self, obs_dim: int, action_space: gym.Space, model_config: dict, dueling: bool = False) -> None:
        super().__init__()
        hiddens = list(model_config["fcnet_hiddens"])
        self.activation = model_config["fcnet_activation"]
        self.discrete = True
        self.action_dim = int(action_space.n)
        feature_dim = hiddens[-1] if hiddens else obs_dim
        self.body = mlp_body(obs_dim, hiddens, self.activation)
        self.head = _head(feature_dim, self.action_dim, 1.0)
        self.value_head = _head(feature_dim, 1, 1.0) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values, (batch, actions)."""
        features = self.body(obs)
        q = self.head(features)
        if self.value_head is not None:
            q = self.value_head(features) + q - q.mean(-1, keepdim=True)
        return q

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """argmax_a Q(s, a)."""
        return self.forward(obs).argmax(-1)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, explore: bool = False) -> torch.Tensor:
        """Greedy actions (exploration is the runner's epsilon)."""
        return self.greedy(obs)


class NumpyQPolicy:
    """Epsilon-greedy actions from a QNetwork's weights (views), in numpy; ``epsilon`` set per sample call."""

    def __init__(self, module: QNetwork, rng: np.random.Generator) -> None:
        self.rng, self.epsilon = rng, 0.0
        self.action_dim = module.action_dim
        self._activation = _ACTIVATIONS[module.activation]
        self._layers = [(m.weight.detach().numpy().T, m.bias.detach().numpy())
                        for m in module.body if isinstance(m, nn.Linear)]
        self._head = (module.head.weight.detach().numpy().T, module.head.bias.detach().numpy())
        # Dueling's V(s) shifts every action's Q equally: the argmax needs only the advantages.

    @staticmethod
    def supports(module: nn.Module) -> bool:
        """Whether the module's activation has a numpy twin."""
        return isinstance(module, QNetwork) and module.activation in _ACTIVATIONS

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Per step and env: a uniform draw (explore?) and a random action, packed as (steps, batch, 2)."""
        return np.stack([self.rng.random((steps, batch)),
                         self.rng.integers(0, self.action_dim, (steps, batch))], axis=-1)

    def act(self, obs: np.ndarray, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Greedy actions, replaced by random ones with probability ``epsilon`` when exploring."""
        x = obs
        for weight_t, bias in self._layers:
            x = self._activation(x @ weight_t + bias)
        greedy = (x @ self._head[0] + self._head[1]).argmax(1)
        if not explore or self.epsilon <= 0:
            return greedy
        if noise is None:
            noise = self.noise(1, len(obs))[0]
        return np.where(noise[:, 0] < self.epsilon, noise[:, 1].astype(np.int64), greedy)
