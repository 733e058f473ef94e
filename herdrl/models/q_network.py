"""Q-network for DQN (optionally dueling) on an encoder, and its epsilon-greedy runner policy."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.models.actor_critic import ACTION_MASK, action_mask_size, mlp_blueprint, weight_views
from herdrl.models.encoders import LegacyNames, build_encoder, head, module_device, to_torch
from herdrl.models.numpy_policy import EpsilonGreedy, MLPBlueprint

#: A ruled-out action's Q value for argmax and max (see :meth:`QNetwork.allowed`).
MASKED_Q = -1e9


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
        #: Whether observations carry an ``action_mask`` leaf (PettingZoo's classic games): ruled-out actions are
        #: never greedy, never explored, and never the max of a target.
        self.masked = action_mask_size(observation_space, action_space) is not None

    def forward(self, obs: Any) -> torch.Tensor:
        """Q-values, (batch, actions)."""
        features = self.encoder(obs)
        q = self.head(features).float()  # float32 under bf16 autocast too
        if self.value_head is not None:
            q = self.value_head(features).float() + q - q.mean(-1, keepdim=True)
        return q

    def allowed(self, q: torch.Tensor, obs: Any) -> torch.Tensor:
        """``q`` with the actions an ``action_mask`` leaf rules out set to :data:`MASKED_Q` (below any real Q value,
        finite: a terminal row's discount of 0 times it is 0, not NaN); ``q`` as it is without a mask. A row whose
        mask allows nothing (a game over; an env that gives a waiting agent an empty mask at a truncation, whose
        value is still bootstrapped) keeps its Q values: a backup from them, not from -1e9."""
        return masked_q(q, obs[ACTION_MASK]) if self.masked else q

    def greedy(self, obs: Any) -> torch.Tensor:
        """argmax_a Q(s, a) over the allowed actions."""
        return self.allowed(self.forward(obs), obs).argmax(-1)

    @torch.no_grad()
    def act(self, obs: Any, explore: bool = False) -> torch.Tensor:
        """Greedy actions (exploration is the runner's epsilon)."""
        return self.greedy(obs)


def masked_q(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``q`` (..., actions) with the actions ``mask`` (same shape) rules out at :data:`MASKED_Q`; a row whose mask
    allows nothing keeps its Q values (see :meth:`QNetwork.allowed`)."""
    ruled_out = mask == 0
    return q.masked_fill(ruled_out & ~ruled_out.all(-1, keepdim=True), MASKED_Q)


def q_blueprint(module: QNetwork) -> MLPBlueprint | None:
    """The greedy policy's numpy twin as plain data, for an MLP Q-network on a vector (dueling's V(s) shifts every
    action's Q equally: the argmax needs only the advantages)."""
    if module.masked:  # (its observations are Dicts, which have no numpy input anyway)
        return None
    return mlp_blueprint(module, module.encoder, module.head, kind="epsilon_greedy", action_dim=module.action_dim)


class EpsilonGreedyPolicy(EpsilonGreedy):
    """Epsilon-greedy actions from a QNetwork (``epsilon`` set per sample call): the greedy part in numpy on views
    of the weights for an MLP on a vector (cheaper than a torch call), one torch forward pass otherwise (CNNs)."""

    def __init__(self, module: QNetwork, rng: np.random.Generator) -> None:
        self.module = module
        blueprint = q_blueprint(module)
        if blueprint is not None:
            forward = weight_views(module, blueprint).forward
            super().__init__(lambda obs: forward(obs).argmax(1), module.action_dim, rng)
            return
        device = module_device(module)  # a GPU with num_gpus_per_env_runner (then no numpy twin)

        def greedy(obs: Any) -> np.ndarray:
            with torch.inference_mode():
                return module.greedy(to_torch(obs, device)).cpu().numpy()

        super().__init__(greedy, module.action_dim, rng, masked=module.masked)
