"""MLP actor-critic with a Categorical (Discrete actions) or diagonal Gaussian (Box actions) head."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

ACTIVATION_MODULES: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "gelu": nn.GELU,
    "silu": nn.SiLU, "swish": nn.SiLU, "linear": nn.Identity,
}
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def mlp_body(in_dim: int, hiddens: list[int], activation: str) -> nn.Sequential:
    """Linear + activation layers; orthogonal init (gain sqrt 2), zero biases."""
    layers: list[nn.Module] = []
    for size in hiddens:
        linear = nn.Linear(in_dim, size)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers += [linear, ACTIVATION_MODULES[activation]()]
        in_dim = size
    return nn.Sequential(*layers)


def _head(in_dim: int, out_dim: int, gain: float) -> nn.Linear:
    linear = nn.Linear(in_dim, out_dim)
    nn.init.orthogonal_(linear.weight, gain)
    nn.init.zeros_(linear.bias)
    return linear


class ActorCritic(nn.Module):
    """Policy and value networks sized by RLlib's ``model`` config keys.

    ``fcnet_hiddens`` / ``fcnet_activation`` shape both networks; ``vf_share_layers``
    puts both heads on one body; ``free_log_std`` (Box actions) learns a
    state-independent log std instead of a second output per action dim.
    """

    def __init__(self, obs_dim: int, action_space: gym.Space, model_config: dict) -> None:
        super().__init__()
        hiddens = list(model_config["fcnet_hiddens"])
        self.activation = model_config["fcnet_activation"]
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_dim = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.free_log_std = bool(model_config["free_log_std"]) and not self.discrete
        feature_dim = hiddens[-1] if hiddens else obs_dim

        self.pi_body = mlp_body(obs_dim, hiddens, self.activation)
        self.vf_body = None if model_config["vf_share_layers"] else mlp_body(obs_dim, hiddens, self.activation)
        head_out = self.action_dim if (self.discrete or self.free_log_std) else 2 * self.action_dim
        self.pi_head = _head(feature_dim, head_out, 0.01)  # small: near-uniform initial policy
        self.vf_head = _head(feature_dim, 1, 1.0)
        self.log_std = nn.Parameter(torch.zeros(self.action_dim)) if self.free_log_std else None

    # ----------------------------------------------------------- learner side
    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (distribution inputs, values) for a batch of encoded observations."""
        pi_features = self.pi_body(obs)
        vf_features = pi_features if self.vf_body is None else self.vf_body(obs)
        return self.pi_head(pi_features), self.vf_head(vf_features).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """State values V(obs)."""
        features = self.pi_body(obs) if self.vf_body is None else self.vf_body(obs)
        return self.vf_head(features).squeeze(-1)

    def _mean_log_std(self, dist_inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.free_log_std:
            return dist_inputs, self.log_std.expand_as(dist_inputs)
        mean, log_std = dist_inputs.chunk(2, dim=-1)
        return mean, log_std

    def log_prob_entropy(self, dist_inputs: torch.Tensor,
                         actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of ``actions`` and the entropy, per sample."""
        if self.discrete:
            log_p = torch.log_softmax(dist_inputs, dim=-1)
            entropy = -(log_p.exp() * log_p).sum(-1)
            return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), entropy
        mean, log_std = self._mean_log_std(dist_inputs)
        z = (actions - mean) * torch.exp(-log_std)
        log_prob = (-0.5 * z.pow(2) - log_std - _LOG_SQRT_2PI).sum(-1)
        entropy = (log_std + 0.5 + _LOG_SQRT_2PI).sum(-1)
        return log_prob, entropy

    def kl(self, old_inputs: torch.Tensor, new_inputs: torch.Tensor) -> torch.Tensor:
        """KL(old || new) per sample, between the distributions two sets of head outputs describe."""
        if self.discrete:
            old_log_p, new_log_p = torch.log_softmax(old_inputs, -1), torch.log_softmax(new_inputs, -1)
            return (old_log_p.exp() * (old_log_p - new_log_p)).sum(-1)
        old_mean, old_log_std = self._mean_log_std(old_inputs)
        new_mean, new_log_std = self._mean_log_std(new_inputs)
        old_var, new_var = (2 * old_log_std).exp(), (2 * new_log_std).exp()
        return (new_log_std - old_log_std + (old_var + (old_mean - new_mean).pow(2)) / (2 * new_var) - 0.5).sum(-1)

    def policy_parameters(self) -> list[nn.Parameter]:
        """The parameters that shape the action distribution (body, head, free log std)."""
        params = [*self.pi_body.parameters(), *self.pi_head.parameters()]
        return params + ([self.log_std] if self.log_std is not None else [])

    def value_parameters(self) -> list[nn.Parameter]:
        """The value function's own parameters (empty body when layers are shared)."""
        body = [] if self.vf_body is None else list(self.vf_body.parameters())
        return body + list(self.vf_head.parameters())

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The most likely action (index, or the Gaussian's mean) for a batch of encoded observations."""
        dist_inputs = self.pi_head(self.pi_body(obs))
        return dist_inputs.argmax(-1) if self.discrete else self._mean_log_std(dist_inputs)[0]

    @torch.no_grad()
    def act(self, obs: torch.Tensor, explore: bool = True) -> torch.Tensor:
        """Sample (``explore``) or pick the most likely action for a batch of observations."""
        dist_inputs = self.pi_head(self.pi_body(obs))
        if self.discrete:
            if not explore:
                return dist_inputs.argmax(-1)
            return torch.multinomial(torch.softmax(dist_inputs, -1), 1).squeeze(-1)
        mean, log_std = self._mean_log_std(dist_inputs)
        return mean + torch.randn_like(mean) * log_std.exp() if explore else mean


class TorchPolicy:
    """Runner-side policy for modules without a numpy twin: torch inference, same interface as NumpyPolicy."""

    def __init__(self, module: ActorCritic) -> None:
        self.module = module

    def noise(self, steps: int, batch: int) -> list[None]:
        """No pre-drawn noise: torch samples inside ``act``."""
        return [None] * steps

    def act(self, obs: np.ndarray, explore: bool = True, noise: None = None) -> np.ndarray:
        """Actions for a batch of encoded observations."""
        return self.module.act(torch.from_numpy(obs), explore=explore).numpy()
