"""Turn on-policy fragments into a learner batch: values and old log-probs in one pass, GAE, masking."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from herdrl.models import ActorCritic
from herdrl.models.encoders import to_torch
from herdrl.models.protocol import concat_states, state_batch, state_rows, state_to_torch
from herdrl.obs import obs_concat, obs_map
from herdrl.rollout.advantages import compute_gae
from herdrl.rollout.runner import Fragment
from herdrl.rollout.transport import side_by_side_field


def side_by_side(fragments: list[Fragment]) -> Any:
    """The fragments' observations laid side by side (T+1, sum of B, ...): one fragment's as they are (an
    aggregator's joined share of the batch, read where it lies in the object store), several joined."""
    return fragments[0].obs if len(fragments) == 1 else obs_concat([f.obs for f in fragments], axis=1)


def with_recorded_logp(old_logp: torch.Tensor, fragments: list[Fragment],
                       layout: Callable[[np.ndarray], torch.Tensor]) -> torch.Tensor:
    """``old_logp`` with the log-probabilities the runners recorded where they did (multi-agent PPO and TRPO: a
    turn-based agent's row carried into a fragment, chosen maybe by the weights before; recomputing it would start
    its ratio at 1); ``layout``: the fragments' ``(T, B)`` grid to ``old_logp``'s layout."""
    if any(f.logp is None for f in fragments):
        return old_logp
    recorded = layout(side_by_side_field(fragments, "logp"))
    return torch.where(torch.isnan(recorded), old_logp, recorded)


def take(batch: dict[str, Any], index: torch.Tensor) -> dict[str, Any]:
    """Rows ``index`` of every entry of a learner batch (observations may be dicts of tensors)."""
    return {key: state_rows(value, index) if key == "state" else obs_map(lambda value: value[index], value)
            for key, value in batch.items()}


@torch.no_grad()
def on_policy_batch(module: ActorCritic, fragments: list[Fragment], gamma: float, lam: float,
                    device: torch.device) -> dict[str, Any]:
    """Flat tensors of the real steps (reset-only steps dropped) with advantages and value targets.

    Keys: ``obs`` (in its stored dtypes: frames cross to the device as uint8), ``actions``, ``old_logp``,
    ``old_values``, ``advantages``, ``returns``.
    """
    cat = partial(side_by_side_field, fragments)
    obs = side_by_side(fragments)  # (T+1, B, ...): envs of all fragments side by side
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
    old_logp = with_recorded_logp(old_logp, fragments, lambda a: torch.from_numpy(a.reshape(-1)).to(device))
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
        dist_inputs, values = module.forward_train(batch["obs"])
        return dist_inputs, values, batch
    dist_inputs, values = module.forward_train(batch["obs"], batch["state"], batch["starts"])
    valid = batch["valid"]
    return dist_inputs[valid], values[valid], {key: batch[key][valid] for key in STEP_KEYS if key in batch}


def sequence_index(valid: np.ndarray, seq_len: int) -> np.ndarray:
    """The training sequences of one fragment, as indices into its flattened ``(T, B)`` grid: ``(N, seq_len)``,
    -1 for padding. Each env's steps are cut where the fragment starts, where an episode starts (the step after a
    reset-only one: each sequence stays inside one episode, so backpropagation through time reaches back to the
    episode's first step whenever it is at most ``max_seq_len`` steps back) and every ``seq_len`` steps after
    either; a reset-only step closes the sequence before it. The order (by step, then env) is the order in which
    the runner recorded the states entering them (``Fragment.state_in``)."""
    steps, envs = valid.shape
    position = np.zeros((steps, envs), np.int64)
    for t in range(1, steps):
        position[t] = np.where(valid[t - 1], position[t - 1] + 1, 0)
    split = position % seq_len == 0  # a split every seq_len steps at most: no sequence is longer
    env_of, start = np.nonzero(split.T)  # by env, then step: each sequence ends where its env's next one starts
    same_env = np.append(env_of[1:] == env_of[:-1], False)
    end = np.where(same_env, np.append(start[1:], steps), steps)
    order = np.lexsort((env_of, start))  # by step, then env: the runner's order
    env_of, start, end = env_of[order], start[order], end[order]
    offset = np.arange(seq_len)
    return np.where(offset < (end - start)[:, None], (start[:, None] + offset) * envs + env_of[:, None], -1)


def _to_sequences(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``(T, B, ...)`` -> ``(N, L, ...)`` along ``index`` (:func:`sequence_index`), zeros where it pads."""
    flat = array.reshape(-1, *array.shape[2:])
    out = flat[np.maximum(index, 0)]
    out[index < 0] = 0
    return out


def from_sequences(batch: dict[str, Any], array: np.ndarray, steps: int, envs: int) -> np.ndarray:
    """Inverse of :func:`to_sequences`: a sequence batch's ``(N, L, ...)`` array back on the fragments' ``(T, B)``
    grid (padding dropped)."""
    index = batch["seq_index"].cpu().numpy()
    grid = np.zeros((steps * envs, *array.shape[2:]), array.dtype)
    grid[index[index >= 0]] = array[index >= 0]
    return grid.reshape(steps, envs, *array.shape[2:])


def sequence_batch(module: Any, fragments: list[Fragment], seq_len: int,
                   device: torch.device) -> tuple[dict[str, Any], torch.Tensor, np.ndarray]:
    """The fragments as sequences of at most ``seq_len`` steps (:func:`sequence_index`) for a module with a state
    (any state of the module protocol, ``herdrl.models.protocol``), unrolled once: (batch, distribution inputs
    ``(N, L, D)``, values ``(T+1, B)`` on the fragments' grid, the last row bootstrapped from the state the runner
    held after the fragment).

    Batch keys: ``obs`` ``(N, L, ...)``, ``state`` (leaves ``(N, ...)``: what the runner's module held entering
    each sequence, its initial state where an episode starts), ``starts`` ``(N, L)`` (all False: no sequence
    crosses an episode start), ``valid`` ``(N, L)`` (real steps: not padding, not reset-only), ``actions``
    ``(N, L, ...)``, ``old_values``, and ``seq_index`` (where each sequence step sits on the fragments' grid, -1
    for padding).
    """
    cat = partial(side_by_side_field, fragments)
    obs = side_by_side(fragments)
    actions, valid = cat("actions"), cat("valid")
    steps, envs = actions.shape[:2]
    indices, offset = [], 0  # each fragment's sequences, in the order its runner recorded their states
    for f in fragments:
        index = sequence_index(f.valid, seq_len)
        width = f.valid.shape[1]
        if len(index) != state_batch(f.state_in):
            raise ValueError(f"a fragment has {state_batch(f.state_in)} sequence states for {len(index)} sequences "
                             "(a runner with another max_seq_len?)")
        # From the fragment's own (T, b) grid to the batch's (T, B): fragments sit side by side.
        indices.append(np.where(index >= 0, index // width * envs + index % width + offset, -1))
        offset += width
    index = np.concatenate(indices)
    seq = lambda a: _to_sequences(a, index)  # noqa: E731
    batch = {
        "obs": to_torch(obs_map(lambda o: seq(o[:-1]), obs), device),
        "state": state_to_torch(concat_states([f.state_in for f in fragments]), device),
        "starts": torch.zeros(index.shape, dtype=torch.bool, device=device),
        "valid": torch.from_numpy(seq(valid) & (index >= 0)).to(device),
        "actions": torch.from_numpy(seq(actions)).to(device),
        "seq_index": torch.from_numpy(index).to(device),
    }
    dist_inputs, values = module.forward_train(batch["obs"], batch["state"], batch["starts"])
    last_state = state_to_torch(concat_states([f.state_last for f in fragments]), device)
    bootstrap = module.forward_value(to_torch(obs_map(lambda o: o[-1], obs), device), last_state)  # (return units)
    grid_values = np.concatenate([from_sequences(batch, values.cpu().numpy(), steps, envs),
                                  bootstrap.cpu().numpy()[None]])
    batch["old_values"] = values
    return batch, dist_inputs, grid_values


def sequence_logp(module: Any, dist_inputs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """Log-probabilities ``(N, L)`` of a sequence batch's actions under distribution inputs ``(N, L, D)``."""
    n, length = actions.shape[:2]
    flat_actions = actions.reshape(n * length, *actions.shape[2:])
    return module.log_prob_entropy(dist_inputs.reshape(n * length, -1), flat_actions)[0].reshape(n, length)


def to_sequences(index: np.ndarray, array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A ``(T, B)`` array of the fragments' grid in a sequence batch's ``(N, L)`` layout (``index``: its
    ``seq_index`` as a numpy array), on ``device``."""
    return torch.from_numpy(_to_sequences(array, index)).to(device)


@torch.no_grad()
def recurrent_batch(module: Any, fragments: list[Fragment], gamma: float, lam: float, seq_len: int,
                    device: torch.device) -> dict[str, Any]:
    """:func:`sequence_batch` with GAE: per step ``old_logp``, ``old_values``, ``advantages`` and ``returns``
    ``(N, L)``. Values and log-probabilities are the module's, unrolled from the same states the loss unrolls
    from (but recorded log-probabilities: :func:`with_recorded_logp`)."""
    batch, dist_inputs, values = sequence_batch(module, fragments, seq_len, device)
    cat = partial(side_by_side_field, fragments)
    advantages, returns = compute_gae(cat("rewards"), values, cat("terminateds"), cat("truncateds"), gamma, lam)
    index = batch["seq_index"].cpu().numpy()
    old_logp = with_recorded_logp(sequence_logp(module, dist_inputs, batch["actions"]), fragments,
                                  lambda a: torch.from_numpy(np.where(index >= 0, _to_sequences(a, index),
                                                                      np.nan)).to(device))
    batch.update({"old_logp": old_logp,
                  "advantages": to_sequences(index, advantages.astype(np.float32), device),
                  "returns": to_sequences(index, returns.astype(np.float32), device)})
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


def minibatches(batch: dict[str, Any], minibatch_size: int | None, rng: np.random.Generator,
                layout: Callable[[int, int], tuple[int, int, int]] | None = None) -> list[np.ndarray | None]:
    """One pass's minibatches: shuffled row indices, about ``minibatch_size`` real steps each (rows are steps, or
    sequences of a recurrent batch), never an empty one; ``[None]`` (the whole batch, one step) when
    ``minibatch_size`` is None.

    ``layout`` (a learner's :meth:`~herdrl.learner.Learner.share_layout`, when its batch is one share of the whole
    batch the learners hold between them): the whole batch's minibatches, drawn as one learner would draw them
    from the shares laid end to end in rank order, each cut to this share's rows (a share may have none in a
    minibatch; the minibatch itself is never empty)."""
    if minibatch_size is None:
        return [None]
    size = len(batch["advantages"])
    steps = len(real_steps(batch, "advantages"))
    if layout is None:
        return np.array_split(rng.permutation(size), max(1, min(size, round(steps / minibatch_size))))
    offset, total_size, total_steps = layout(size, steps)
    parts = np.array_split(rng.permutation(total_size), max(1, min(total_size, round(total_steps / minibatch_size))))
    return [part[(part >= offset) & (part < offset + size)] - offset for part in parts]


def normalize_advantages(batch: dict[str, Any], sums: Callable[[list[float]], list[float]] | None = None) -> None:
    """Advantages to mean 0, std 1 over the real steps, in place (``sums``: a learner's
    :meth:`~herdrl.learner.Learner.global_sums` when its batch is one share: over every share's)."""
    adv = real_steps(batch, "advantages")
    if sums is None:
        if len(adv) > 1:
            batch["advantages"] = (batch["advantages"] - adv.mean()) / (adv.std() + 1e-8)
        return
    wide = adv.double()
    count, total, squares = sums([float(len(adv)), float(wide.sum()), float((wide * wide).sum())])
    if count > 1:
        mean = total / count
        std = max((squares - count * mean * mean) / (count - 1), 0.0) ** 0.5  # (unbiased, as torch's std)
        batch["advantages"] = (batch["advantages"] - mean) / (std + 1e-8)
