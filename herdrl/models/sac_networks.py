"""SAC's networks: a tanh-squashed Gaussian actor and twin Q critics, and the actor's numpy twin for runners.

Actions live in the env's Box bounds: the actor samples u ~ N(mu, sigma), squashes a = tanh(u) into [-1, 1]
and scales it to [low, high]; critics see the scaled action. Log-probabilities (and so the entropy that
automatic tuning holds at ``target_entropy``) are those of the squashed action in [-1, 1], as in SB3 and
RLlib: the target means the same for every env, whatever the units of its actions.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.models.actor_critic import _head, mlp_body
from herdrl.models.numpy_policy import _ACTIVATIONS

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


class SACModule(nn.Module):
    """Actor (``pi_body``/``pi_head`` -> mean and log std) and critics ``q1``, ``q2`` on (obs, action)."""

    def __init__(self, obs_dim: int, action_space: gym.Space, model_config: dict, twin_q: bool = True) -> None:
        super().__init__()
        if not isinstance(action_space, gym.spaces.Box):
            from herdrl.errors import ConfigError

            raise ConfigError(f"SAC needs Box (continuous) actions; this env has {action_space} (use DQN or PPO)")
        low64, high64 = action_space.low.astype(np.float64), action_space.high.astype(np.float64)
        with np.errstate(over="ignore"):  # +-float32 max bounds: their half-range overflows float32
            finite = np.isfinite(np.float32((high64 - low64) / 2)).all() and np.isfinite(low64).all()
        if not (finite and np.isfinite(high64).all()):
            from herdrl.errors import ConfigError

            raise ConfigError(f"SAC squashes actions into the Box bounds, but this env's action space {action_space} "
                              "is unbounded; wrap the env with gymnasium.wrappers.RescaleAction (or ClipAction) "
                              "to finite bounds, or use PPO")
        hiddens = list(model_config["fcnet_hiddens"])
        self.activation = model_config["fcnet_activation"]
        self.discrete = False
        self.action_dim = int(np.prod(action_space.shape))
        feature_dim = hiddens[-1] if hiddens else obs_dim
        self.pi_body = mlp_body(obs_dim, hiddens, self.activation)
        self.pi_head = _head(feature_dim, 2 * self.action_dim, 0.01)
        critic = lambda: nn.Sequential(mlp_body(obs_dim + self.action_dim, hiddens, self.activation),  # noqa: E731
                                       _head(feature_dim, 1, 1.0))
        self.q1 = critic()
        self.q2 = critic() if twin_q else None
        # In float64, then float32: the half-range of a wide float32 Box is representable, its range may not be.
        self.register_buffer("action_scale", torch.tensor(((high64 - low64) / 2).reshape(-1), dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor(((high64 + low64) / 2).reshape(-1), dtype=torch.float32))

    def mean_log_std(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The pre-squash Gaussian's mean and (clamped) log std."""
        mean, log_std = self.pi_head(self.pi_body(obs)).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised scaled actions and the log-probabilities of their squashed form in [-1, 1] (tanh
        change of variables included, the constant scaling to the env's bounds not)."""
        mean, log_std = self.mean_log_std(obs)
        u = mean + torch.randn_like(mean) * log_std.exp()
        squashed = torch.tanh(u)
        log_prob = (-0.5 * ((u - mean) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob -= (2 * (math.log(2) - u - nn.functional.softplus(-2 * u))).sum(-1)  # log(1 - tanh(u)^2), stable
        return squashed * self.action_scale + self.action_bias, log_prob

    def q_values(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Q1 (and Q2) of scaled actions."""
        x = torch.cat([obs, action], dim=-1)
        return self.q1(x).squeeze(-1), (self.q2(x).squeeze(-1) if self.q2 is not None else None)

    def actor_parameters(self) -> list[nn.Parameter]:
        """The actor's parameters."""
        return [*self.pi_body.parameters(), *self.pi_head.parameters()]

    def critic_parameters(self) -> list[nn.Parameter]:
        """Both critics' parameters."""
        return [*self.q1.parameters(), *(self.q2.parameters() if self.q2 is not None else [])]

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """tanh(mean), scaled: the deterministic action."""
        mean, _ = self.mean_log_std(obs)
        return torch.tanh(mean) * self.action_scale + self.action_bias

    @torch.no_grad()
    def act(self, obs: torch.Tensor, explore: bool = False) -> torch.Tensor:
        """Sampled (``explore``) or deterministic scaled actions."""
        return self.sample(obs)[0] if explore else self.greedy(obs)


class NumpySACPolicy:
    """The squashed-Gaussian actor in numpy, on views of the module's weights."""

    def __init__(self, module: SACModule, rng: np.random.Generator) -> None:
        self.rng = rng
        self.action_dim = module.action_dim
        self._activation = _ACTIVATIONS[module.activation]
        self._layers = [(m.weight.detach().numpy().T, m.bias.detach().numpy())
                        for m in module.pi_body if isinstance(m, nn.Linear)]
        self._head = (module.pi_head.weight.detach().numpy().T, module.pi_head.bias.detach().numpy())
        self._scale = module.action_scale.numpy()
        self._bias = module.action_bias.numpy()

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Standard normal noise for a whole fragment."""
        return self.rng.standard_normal((steps, batch, self.action_dim), dtype=np.float32)

    def act(self, obs: np.ndarray, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Scaled actions (float32, within the Box bounds)."""
        x = obs
        for weight_t, bias in self._layers:
            x = self._activation(x @ weight_t + bias)
        out = x @ self._head[0] + self._head[1]
        mean, log_std = out[:, : self.action_dim], np.clip(out[:, self.action_dim:], LOG_STD_MIN, LOG_STD_MAX)
        if explore:
            if noise is None:
                noise = self.noise(1, len(obs))[0]
            mean = mean + noise * np.exp(log_std)
        return (np.tanh(mean) * self._scale + self._bias).astype(np.float32)
