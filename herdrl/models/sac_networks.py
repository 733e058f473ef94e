"""SAC's networks: a tanh-squashed Gaussian actor and twin Q critics, and the actor's numpy twin for runners.

Actions live in the env's Box bounds: the actor samples u ~ N(mu, sigma), squashes a = tanh(u) into [-1, 1]
and scales it to [low, high]; critics see that action mapped back into [-1, 1] (model ``critic_unit_actions``,
the default, as SB3's, and d3rlpy's with its MinMaxActionScaler; False, in checkpoints written before the key:
the env's units). Log-probabilities (and so the entropy that automatic tuning holds at ``target_entropy``) are
those of the squashed action in [-1, 1], as in SB3 and RLlib: the target means the same for every env, whatever
the units of its actions.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.models.actor_critic import box_scaling, mlp_blueprint, weight_views
from herdrl.models.encoders import LegacyNames, build_encoder, head, mlp_body, module_device, to_torch
from herdrl.models.numpy_policy import MLPBlueprint, SquashedGaussian, split_mean_log_std

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


class QCritic(nn.Module):
    """Q(s, a): the observation's leaf features (a CNN for images), the action appended, then an MLP."""

    def __init__(self, observation_space: gym.Space, action_dim: int, model_config: dict) -> None:
        super().__init__()
        self.features = build_encoder(observation_space, model_config, mlp=False)
        hiddens = list(model_config["fcnet_hiddens"])
        in_dim = self.features.out_dim + action_dim
        self.mlp = mlp_body(in_dim, hiddens, model_config["fcnet_activation"])
        self.head = head(hiddens[-1] if hiddens else in_dim, 1, 1.0)

    def forward(self, obs: Any, action: torch.Tensor) -> torch.Tensor:
        return self.head(self.mlp(torch.cat([self.features(obs), action], dim=-1))).squeeze(-1).float()


def check_bounded_box(action_space: gym.Space, algo: str) -> None:
    """Raise ConfigError unless ``action_space`` is a Box with finite bounds (actions are squashed into them)."""
    from herdrl.errors import ConfigError

    if not isinstance(action_space, gym.spaces.Box):
        raise ConfigError(f"{algo} needs Box (continuous) actions; this env has {action_space} (use DQN or PPO)")
    low64, high64 = action_space.low.astype(np.float64), action_space.high.astype(np.float64)
    with np.errstate(over="ignore"):  # +-float32 max bounds: their half-range overflows float32
        finite = np.isfinite(np.float32((high64 - low64) / 2)).all() and np.isfinite(low64).all()
    if not (finite and np.isfinite(high64).all()):
        raise ConfigError(f"{algo} squashes actions into the Box bounds, but this env's action space {action_space} "
                          "is unbounded; wrap the env with gymnasium.wrappers.RescaleAction (or ClipAction) "
                          "to finite bounds, or use PPO")


class BoxCritics:
    """Critics ``q1`` (and ``q2``) of actions in a Box's bounds (SAC's, CQL's, IQL's and TD3's modules): with
    ``critic_unit_actions`` they see the action mapped into [-1, 1] by ``action_scale`` and ``action_bias``."""

    q1: QCritic
    q2: QCritic | None
    action_scale: torch.Tensor
    action_bias: torch.Tensor
    critic_unit_actions: bool

    def set_action_box(self, action_space: gym.spaces.Box, model_config: dict) -> None:
        """The Box's half-range and centre as buffers (``action_scale``, ``action_bias``), and whether the critics
        see actions in [-1, 1] (model ``critic_unit_actions``)."""
        low64, high64 = action_space.low.astype(np.float64), action_space.high.astype(np.float64)
        # In float64, then float32: the half-range of a wide float32 Box is representable, its range may not be.
        self.register_buffer("action_scale", torch.tensor(((high64 - low64) / 2).reshape(-1), dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor(((high64 + low64) / 2).reshape(-1), dtype=torch.float32))
        self.critic_unit_actions = bool(model_config["critic_unit_actions"])

    def unit_action(self, action: torch.Tensor) -> torch.Tensor:
        """An action in the env's bounds mapped into [-1, 1] (a dimension with ``low == high`` to 0)."""
        return (action - self.action_bias) / self.action_scale.clamp_min(torch.finfo(torch.float32).tiny)

    def critic_action(self, action: torch.Tensor) -> torch.Tensor:
        """What the critics see of an action in the env's bounds: it mapped into [-1, 1] (``critic_unit_actions``)
        or as it is."""
        return self.unit_action(action) if self.critic_unit_actions else action

    def q_values(self, obs: Any, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Q1 (and Q2; None without twin critics) of actions in the env's bounds."""
        action = self.critic_action(action)
        return self.q1(obs, action), (self.q2(obs, action) if self.q2 is not None else None)


class SACModule(BoxCritics, LegacyNames):
    """Actor (``pi_encoder``/``pi_head`` -> mean and log std) and critics ``q1``, ``q2`` on (obs, action)."""

    #: Weight names before encoders existed (checkpoint format <= 2) -> today's.
    LEGACY_KEYS = {"pi_body.": "pi_encoder.mlp.", "q1.0.": "q1.mlp.", "q1.1.": "q1.head.",
                   "q2.0.": "q2.mlp.", "q2.1.": "q2.head."}

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict,
                 twin_q: bool = True) -> None:
        super().__init__()
        check_bounded_box(action_space, "SAC")
        self.discrete = False
        self.action_dim = int(np.prod(action_space.shape))
        self.pi_encoder = build_encoder(observation_space, model_config)
        self.pi_head = head(self.pi_encoder.out_dim, 2 * self.action_dim, 0.01)
        self.q1 = QCritic(observation_space, self.action_dim, model_config)
        self.q2 = QCritic(observation_space, self.action_dim, model_config) if twin_q else None
        self.set_action_box(action_space, model_config)

    def mean_log_std(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The pre-squash Gaussian's mean and (clamped) log std."""
        mean, log_std = self.pi_head(self.pi_encoder(obs)).float().chunk(2, dim=-1)  # float32 under bf16 autocast
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised scaled actions and the log-probabilities of their squashed form in [-1, 1] (tanh
        change of variables included, the constant scaling to the env's bounds not)."""
        return self._sample(*self.mean_log_std(obs))

    def sample_n(self, obs: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` samples per observation (as :meth:`sample` of each observation repeated ``n`` times, rows
        ``i * n .. i * n + n - 1`` for observation ``i``), the actor run once per observation."""
        mean, log_std = self.mean_log_std(obs)
        return self._sample(mean.repeat_interleave(n, dim=0), log_std.repeat_interleave(n, dim=0))

    def _sample(self, mean: torch.Tensor, log_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = mean + torch.randn_like(mean) * log_std.exp()
        squashed = torch.tanh(u)
        log_prob = (-0.5 * ((u - mean) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob -= (2 * (math.log(2) - u - nn.functional.softplus(-2 * u))).sum(-1)  # log(1 - tanh(u)^2), stable
        return squashed * self.action_scale + self.action_bias, log_prob

    def log_prob(self, obs: torch.Tensor, action: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """The log-probability :meth:`sample` gives a scaled ``action`` (one recorded in a dataset: IQL's actor
        imitates those), its squashed form clipped to ``1 - eps`` inside [-1, 1] so actions on a bound stay finite."""
        mean, log_std = self.mean_log_std(obs)
        squashed = self.unit_action(action).clamp(-1 + eps, 1 - eps)
        u = torch.atanh(squashed)
        log_prob = (-0.5 * ((u - mean) / log_std.exp()).pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        return log_prob - torch.log1p(-squashed.pow(2)).sum(-1)

    def actor_parameters(self) -> list[nn.Parameter]:
        """The actor's parameters."""
        return [*self.pi_encoder.parameters(), *self.pi_head.parameters()]

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


def sac_blueprint(module: SACModule, log_std_bounds: tuple[float, float] = (LOG_STD_MIN, LOG_STD_MAX),
                  noise_after_tanh: bool = False) -> MLPBlueprint | None:
    """The actor's numpy twin as plain data, for an MLP on a vector (``log_std_bounds``, ``noise_after_tanh``:
    IQL's actor, see :class:`~herdrl.models.numpy_policy.SquashedGaussian`)."""
    return mlp_blueprint(module, module.pi_encoder, module.pi_head, kind="squashed_gaussian",
                         action_dim=module.action_dim, log_std=getattr(module, "log_std", None),
                         params={**box_scaling(module), "log_std_min": log_std_bounds[0],
                                 "log_std_max": log_std_bounds[1], "noise_after_tanh": noise_after_tanh})


class NumpySACPolicy(SquashedGaussian):
    """The squashed-Gaussian actor: in numpy on views of the module's weights for an MLP on a vector, one torch
    forward pass otherwise (CNNs); noise from the runner's generator either way (``log_std_bounds``,
    ``noise_after_tanh``: IQL's actor)."""

    def __init__(self, module: SACModule, rng: np.random.Generator,
                 log_std_bounds: tuple[float, float] = (LOG_STD_MIN, LOG_STD_MAX),
                 noise_after_tanh: bool = False) -> None:
        self.module = module
        low, high = log_std_bounds
        blueprint = sac_blueprint(module, log_std_bounds, noise_after_tanh)
        if blueprint is not None:
            views = weight_views(module, blueprint)
            mean_log_std = split_mean_log_std(views.forward, module.action_dim, low, high, views.log_std)
        else:
            device = module_device(module)  # a GPU with num_gpus_per_env_runner (then no numpy twin)

            def mean_log_std(obs: Any) -> tuple[np.ndarray, np.ndarray]:
                with torch.inference_mode():
                    mean, log_std = module.mean_log_std(to_torch(obs, device))
                return mean.cpu().numpy(), np.clip(log_std.cpu().numpy(), low, high)

        super().__init__(mean_log_std, module.action_dim, module.action_scale.cpu().numpy(),
                         module.action_bias.cpu().numpy(), rng, noise_after_tanh)
