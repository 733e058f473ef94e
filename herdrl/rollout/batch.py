"""Turn on-policy fragments into a learner batch: values and old log-probs in one pass, GAE, masking."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from herdrl.models import ActorCritic
from herdrl.models.encoders import to_torch
from herdrl.obs import obs_concat, obs_map
from herdrl.rollout.advantages import compute_gae
from herdrl.rollout.runner import Fragment


def take(batch: dict[str, Any], index: torch.Tensor) -> dict[str, Any]:
    """Rows ``index`` of every entry of a learner batch (observations may be dicts of tensors)."""
    return {key: obs_map(lambda value: value[index], value) for key, value in batch.items()}


@torch.no_grad()
def on_policy_batch(module: ActorCritic, fragments: list[Fragment], gamma: float, lam: float,
                    device: torch.device) -> dict[str, Any]:
    """Flat tensors of the real steps (reset-only steps dropped) with advantages and value targets.

    Keys: ``obs`` (in its stored dtypes: frames cross to the device as uint8), ``actions``, ``old_logp``,
    ``old_values``, ``advantages``, ``returns``.
    """
    cat = lambda name: np.concatenate([getattr(f, name) for f in fragments], axis=1)  # noqa: E731
    obs = obs_concat([f.obs for f in fragments], axis=1)  # (T+1, B, ...): envs of all fragments side by side
    actions = cat("actions")
    steps, envs = actions.shape[:2]
    flat_obs = to_torch(obs_map(lambda a: a.reshape(-1, *a.shape[2:]), obs), device)
    dist_inputs, values = module(flat_obs)
    values_np = values.cpu().numpy().reshape(steps + 1, envs)
    advantages, returns = compute_gae(cat("rewards"), values_np, cat("terminateds"), cat("truncateds"), gamma, lam)
    valid = torch.from_numpy(cat("valid").reshape(-1)).to(device)
    n = steps * envs
    flat_actions = torch.from_numpy(actions.reshape(n, *actions.shape[2:])).to(device)
    old_logp, _ = module.log_prob_entropy(dist_inputs[:n], flat_actions)
    to_device = lambda a: torch.from_numpy(a.reshape(-1)).to(device)[valid]  # noqa: E731
    return {
        "obs": obs_map(lambda o: o[:n][valid], flat_obs),
        "actions": flat_actions[valid],
        "old_logp": old_logp[valid],
        "old_values": values[:n][valid],
        "advantages": to_device(advantages),
        "returns": to_device(returns),
    }
