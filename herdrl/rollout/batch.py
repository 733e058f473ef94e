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


#: Per-step entries of a recurrent batch, laid out ``(sequences, max_seq_len, ...)``.
STEP_KEYS = ("actions", "old_logp", "old_values", "advantages", "returns", "behaviour_logp", "old_dist_inputs",
             "vs")


def forward_flat(module: ActorCritic, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(distribution inputs, values, the batch's per-step entries) for the batch's real steps, one row each: a
    plain batch as it is; a recurrent one (:func:`recurrent_batch`) unrolled from its sequences' states, its
    padding and reset-only steps dropped."""
    if "valid" not in batch:
        dist_inputs, values = module(batch["obs"])
        return dist_inputs, values, batch
    dist_inputs, values = module.unroll(batch["obs"], batch["state"], batch["starts"])
    valid = batch["valid"]
    return dist_inputs[valid], values[valid], {key: batch[key][valid] for key in STEP_KEYS if key in batch}


def _to_sequences(array: np.ndarray, seq_len: int) -> np.ndarray:
    """``(T, B, ...)`` -> ``(chunks * B, seq_len, ...)``: sequence ``k * B + b`` is env b's steps ``k * seq_len``
    to ``(k + 1) * seq_len - 1``, zero-padded past T."""
    steps, envs = array.shape[:2]
    chunks = -(-steps // seq_len)
    padded = np.zeros((chunks * seq_len, envs, *array.shape[2:]), array.dtype)
    padded[:steps] = array
    return padded.reshape(chunks, seq_len, envs, *array.shape[2:]).swapaxes(1, 2).reshape(
        chunks * envs, seq_len, *array.shape[2:])


def from_sequences(array: np.ndarray, steps: int, envs: int) -> np.ndarray:
    """Inverse of :func:`_to_sequences` (padding dropped)."""
    seq_len = array.shape[1]
    chunks = array.shape[0] // envs
    return array.reshape(chunks, envs, seq_len, *array.shape[2:]).swapaxes(1, 2).reshape(
        chunks * seq_len, envs, *array.shape[2:])[:steps]


def sequence_batch(module: Any, fragments: list[Fragment], seq_len: int,
                   device: torch.device) -> tuple[dict[str, Any], torch.Tensor, np.ndarray]:
    """The fragments as sequences of ``seq_len`` steps for a recurrent module (``herdrl.models.recurrent``),
    unrolled once: (batch, distribution inputs ``(N, L, D)``, values ``(T+1, B)`` on the fragments' grid, the
    last row bootstrapped from the state the runner held after the fragment).

    Batch keys: ``obs`` ``(N, L, ...)``, ``state`` ``(N, 2, H)`` (what the runner's LSTM held entering each
    sequence), ``starts`` ``(N, L)`` (zero the state before this step: the step before was reset-only), ``valid``
    ``(N, L)`` (real steps: not padding, not reset-only), ``actions`` ``(N, L, ...)`` and ``old_values``.
    """
    cat = lambda name: np.concatenate([getattr(f, name) for f in fragments], axis=1)  # noqa: E731
    obs = obs_concat([f.obs for f in fragments], axis=1)
    actions, valid = cat("actions"), cat("valid")
    steps, envs = actions.shape[:2]
    starts = np.zeros((steps, envs), bool)
    starts[1:] = ~valid[:-1]
    seq = lambda a: _to_sequences(a, seq_len)  # noqa: E731
    seq_starts = seq(starts)
    seq_starts[:, 0] = False  # a sequence's first step: the runner's state, already zeroed where it had to be
    batch = {
        "obs": to_torch(obs_map(lambda o: seq(o[:-1]), obs), device),
        "state": torch.from_numpy(np.concatenate([f.state_in for f in fragments], axis=1).reshape(
            -1, 2, module.cell_size)).to(device),
        "starts": torch.from_numpy(seq_starts).to(device),
        "valid": torch.from_numpy(seq(valid)).to(device),
        "actions": torch.from_numpy(seq(actions)).to(device),
    }
    dist_inputs, values = module.unroll(batch["obs"], batch["state"], batch["starts"])
    last_state = torch.from_numpy(np.concatenate([f.state_last for f in fragments])).to(device)
    last_out, _ = module.step(to_torch(obs_map(lambda o: o[-1], obs), device), last_state)
    bootstrap = module.vf_head(last_out).squeeze(-1).float()
    grid_values = np.concatenate([from_sequences(values.cpu().numpy(), steps, envs), bootstrap.cpu().numpy()[None]])
    batch["old_values"] = values
    return batch, dist_inputs, grid_values


def sequence_logp(module: Any, dist_inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Log-probabilities ``(N, L)`` of a sequence batch's actions under distribution inputs ``(N, L, D)``."""
    n, length = actions.shape[:2]
    flat_actions = actions.reshape(n * length, *actions.shape[2:])
    return module.log_prob_entropy(dist_inputs.reshape(n * length, -1), flat_actions)[0].reshape(n, length)


def to_sequences(batch: dict[str, Any], array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A ``(T, B)`` array of the fragments' grid in a sequence batch's ``(N, L)`` layout, on ``device``."""
    return torch.from_numpy(_to_sequences(array, batch["starts"].shape[1])).to(device)


@torch.no_grad()
def recurrent_batch(module: Any, fragments: list[Fragment], gamma: float, lam: float, seq_len: int,
                    device: torch.device) -> dict[str, Any]:
    """:func:`sequence_batch` with GAE: per step ``old_logp``, ``old_values``, ``advantages`` and ``returns``
    ``(N, L)``. Values and log-probabilities are the module's, unrolled from the same states the loss unrolls
    from."""
    batch, dist_inputs, values = sequence_batch(module, fragments, seq_len, device)
    cat = lambda name: np.concatenate([getattr(f, name) for f in fragments], axis=1)  # noqa: E731
    advantages, returns = compute_gae(cat("rewards"), values, cat("terminateds"), cat("truncateds"), gamma, lam)
    batch.update({"old_logp": sequence_logp(module, dist_inputs, batch["actions"]),
                  "advantages": to_sequences(batch, advantages.astype(np.float32), device),
                  "returns": to_sequences(batch, returns.astype(np.float32), device)})
    return batch


def learner_batch(module: Any, fragments: list[Fragment], config: Any, device: torch.device) -> dict[str, Any]:
    """:func:`recurrent_batch` for a recurrent module, else :func:`on_policy_batch` (PPO, A2C)."""
    if getattr(module, "recurrent", False):
        return recurrent_batch(module, fragments, config.gamma, config.lambda_, int(config.model["max_seq_len"]),
                               device)
    return on_policy_batch(module, fragments, config.gamma, config.lambda_, device)


def real_steps(batch: dict[str, Any], key: str) -> torch.Tensor:
    """A per-step entry at the real steps only (a recurrent batch's padding and reset-only steps dropped)."""
    return batch[key][batch["valid"]] if "valid" in batch else batch[key]


def normalize_advantages(batch: dict[str, Any]) -> None:
    """Advantages to mean 0, std 1 over the real steps, in place."""
    adv = real_steps(batch, "advantages")
    if len(adv) > 1:
        batch["advantages"] = (batch["advantages"] - adv.mean()) / (adv.std() + 1e-8)
