"""Actor-critic: an encoder (``herdrl.models.encoders``) with a Categorical (Discrete actions) or diagonal
Gaussian (Box actions) policy head and a value head."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.models.encoders import (  # noqa: F401  (mlp_body: imported from here by older code)
    ACTIVATION_MODULES,
    build_encoder,
    has_image,
    legacy_keys,
    mlp_body,
    to_torch,
)
from herdrl.obs import obs_len

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _head(in_dim: int, out_dim: int, gain: float) -> nn.Linear:
    linear = nn.Linear(in_dim, out_dim)
    nn.init.orthogonal_(linear.weight, gain)
    nn.init.zeros_(linear.bias)
    return linear


class ActorCritic(nn.Module):
    """Policy and value networks on encoders sized by RLlib's ``model`` config keys.

    The observation space picks the encoder (MLP ``fcnet_hiddens`` for vectors, a CNN for images, one per
    leaf for Dict/Tuple). ``vf_share_layers`` puts both heads on one encoder (default: shared for image
    observations, as the Nature/CleanRL/SB3 Atari networks, separate otherwise); ``free_log_std`` (Box
    actions) learns a state-independent log std instead of a second output per action dim.
    """

    #: Weight names before encoders existed (checkpoint format <= 2) -> today's.
    LEGACY_KEYS = {"pi_body.": "pi_encoder.mlp.", "vf_body.": "vf_encoder.mlp."}

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self.action_dim = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.free_log_std = bool(model_config["free_log_std"]) and not self.discrete
        share = model_config.get("vf_share_layers")
        share = has_image(observation_space) if share is None else share

        self.pi_encoder = build_encoder(observation_space, model_config)
        self.vf_encoder = None if share else build_encoder(observation_space, model_config)
        feature_dim = self.pi_encoder.out_dim
        head_out = self.action_dim if (self.discrete or self.free_log_std) else 2 * self.action_dim
        self.pi_head = _head(feature_dim, head_out, 0.01)  # small: near-uniform initial policy
        self.vf_head = _head(feature_dim, 1, 1.0)
        self.log_std = nn.Parameter(torch.zeros(self.action_dim)) if self.free_log_std else None

    def load_state_dict(self, state_dict: dict, strict: bool = True, assign: bool = False) -> Any:
        """As torch's, also taking weights saved before encoders existed."""
        state_dict = legacy_keys(state_dict, self.LEGACY_KEYS, self.state_dict())
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    # ----------------------------------------------------------- learner side
    def forward(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (distribution inputs, values) for a batch of observations (as stored: ``herdrl.obs``)."""
        pi_features = self.pi_encoder(obs)
        vf_features = pi_features if self.vf_encoder is None else self.vf_encoder(obs)
        return self._with_log_std(self.pi_head(pi_features)), self.vf_head(vf_features).squeeze(-1)

    def dist_inputs(self, obs: Any) -> torch.Tensor:
        """Every parameter of the action distribution for a batch of observations: logits, or a
        Gaussian's means followed by its log stds (the free log std included, so a stored copy is frozen)."""
        return self._with_log_std(self.pi_head(self.pi_encoder(obs)))

    def _with_log_std(self, head_out: torch.Tensor) -> torch.Tensor:
        # The free log std is appended to the head's output rather than read from the live parameter later:
        # distribution inputs kept from before an update (TRPO's old policy, PPO's behaviour policy) must
        # describe that distribution, not the one the parameter describes now.
        if not self.free_log_std:
            return head_out
        return torch.cat([head_out, self.log_std.expand_as(head_out)], dim=-1)

    def value(self, obs: Any) -> torch.Tensor:
        """State values V(obs)."""
        encoder = self.pi_encoder if self.vf_encoder is None else self.vf_encoder
        return self.vf_head(encoder(obs)).squeeze(-1)

    @staticmethod
    def _mean_log_std(dist_inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
        params = [*self.pi_encoder.parameters(), *self.pi_head.parameters()]
        return params + ([self.log_std] if self.log_std is not None else [])

    def value_parameters(self) -> list[nn.Parameter]:
        """The value function's own parameters (its head only when the encoder is shared)."""
        body = [] if self.vf_encoder is None else list(self.vf_encoder.parameters())
        return body + list(self.vf_head.parameters())

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The most likely action (index, or the Gaussian's mean) for a batch of observations."""
        return self.act_with_noise(self.dist_inputs(obs), None)

    def act_with_noise(self, dist_inputs: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """Actions from distribution inputs and pre-drawn noise (``None``: the most likely action).

        ``noise`` is what :func:`draw_noise` draws: Gumbel noise for logits (argmax of logits + Gumbel samples
        the softmax), standard normal for a Gaussian. Runners draw it from their own seeded generator.
        """
        if self.discrete:
            return dist_inputs.argmax(-1) if noise is None else (dist_inputs + noise).argmax(-1)
        mean, log_std = self._mean_log_std(dist_inputs)
        return mean if noise is None else mean + noise * log_std.exp()

    @torch.no_grad()
    def act(self, obs: torch.Tensor, explore: bool = True) -> torch.Tensor:
        """Sample (``explore``, with torch's global generator) or pick the most likely action."""
        dist_inputs = self.dist_inputs(obs)
        if not explore:
            return self.act_with_noise(dist_inputs, None)
        if self.discrete:
            noise = -torch.log(-torch.log(torch.rand_like(dist_inputs).clamp_min(1e-12)))
        else:
            noise = torch.randn_like(dist_inputs[..., : self.action_dim])
        return self.act_with_noise(dist_inputs, noise)


def draw_noise(rng: np.random.Generator, discrete: bool, steps: int, batch: int, action_dim: int) -> np.ndarray:
    """Exploration noise for ``steps`` action choices of ``batch`` envs, drawn at once from ``rng``.

    Discrete: Gumbel noise (argmax of logits + Gumbel noise samples the softmax); Box: standard normal.
    Drawing a fragment's noise in one call costs far less than a draw per step.
    """
    if discrete:
        uniform = rng.random((steps, batch, action_dim), dtype=np.float32)
        return -np.log(-np.log(np.maximum(uniform, np.float32(1e-12))))
    return rng.standard_normal((steps, batch, action_dim), dtype=np.float32)


class TorchPolicy:
    """Runner-side policy for modules without a numpy twin: torch inference, same interface as NumpyPolicy.

    Noise comes from the runner's seeded numpy generator, as for NumpyPolicy, so seeded runs reproduce on
    any process and a restarted runner does not replay its predecessor's draws.
    """

    def __init__(self, module: ActorCritic, rng: np.random.Generator) -> None:
        self.module = module
        self.rng = rng

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Exploration noise for a whole fragment (see :func:`draw_noise`)."""
        return draw_noise(self.rng, self.module.discrete, steps, batch, self.module.action_dim)

    @torch.inference_mode()
    def act(self, obs: Any, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Actions for a batch of stored observations (``noise``: one step of :meth:`noise`): one forward pass."""
        if explore and noise is None:
            noise = self.noise(1, obs_len(obs))[0]
        dist_inputs = self.module.dist_inputs(to_torch(obs))
        return self.module.act_with_noise(dist_inputs, torch.from_numpy(noise) if explore else None).numpy()
