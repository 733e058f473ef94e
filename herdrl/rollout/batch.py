"""Turn on-policy fragments into a learner batch: values and old log-probs in one pass, GAE, masking."""

from __future__ import annotations

import numpy as np
import torch

from herdrl.models import ActorCritic
from herdrl.rollout.advantages import compute_gae
from herdrl.rollout.runner import Fragment


@torch.no_grad()
def on_policy_batch(module: ActorCritic, fragments: list[Fragment], gamma: float, lam: float,
                    device: torch.device) -> dict[str, torch.Tensor]:
    """Flat tensors of the real steps (reset-only steps dropped) with advantages and value targets.

    Keys: ``obs``, ``actions``, ``old_logp``, ``old_values``, ``advantages``, ``returns``.
    """
    cat = lambda name: np.concatenate([getattr(f, name) for f in fragments], axis=1)  # noqa: E731
    obs = cat("obs")  # (T+1, B, obs_dim): envs of all fragments side by side
    steps, envs = obs.shape[0] - 1, obs.shape[1]
    actions = cat("actions")
    flat_obs = torch.from_numpy(obs.reshape(-1, obs.shape[-1])).to(device)
    dist_inputs, values = module(flat_obs)
    values_np = values.cpu().numpy().reshape(steps + 1, envs)
    advantages, returns = compute_gae(cat("rewards"), values_np, cat("terminateds"), cat("truncateds"), gamma, lam)
    valid = torch.from_numpy(cat("valid").reshape(-1)).to(device)
    n = steps * envs
    flat_actions = torch.from_numpy(actions.reshape(n, *actions.shape[2:])).to(device)
    old_logp, _ = module.log_prob_entropy(dist_inputs[:n], flat_actions)
    to_torch = lambda a: torch.from_numpy(a.reshape(-1)).to(device)[valid]  # noqa: E731
    return {
        "obs": flat_obs[:n][valid],
        "actions": flat_actions[valid],
        "old_logp": old_logp[valid],
        "old_values": values[:n][valid],
        "advantages": to_torch(advantages),
        "returns": to_torch(returns),
    }
