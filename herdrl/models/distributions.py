"""Action distributions for every action space a policy-gradient algorithm takes.

Discrete -> a categorical; MultiDiscrete -> one categorical per dimension; MultiBinary -> a two-way
categorical per bit; Box -> a diagonal Gaussian; Tuple (nested) -> its parts side by side, independent.

Layouts, fixed for a space:

* **distribution inputs** (what the policy head produces, plus a free log std): the parts in order —
  a categorical's logits, a Gaussian's means — followed by the log stds of all Gaussian dimensions. So a
  Discrete space has ``n`` logits and a Box ``2 d`` numbers (means, then log stds), as before Tuple existed.
* **stored actions** (fragments, batches): Discrete ``(B,)`` int64, Box ``(B, d)`` float32, MultiDiscrete and
  MultiBinary ``(B, k)`` int64, Tuple ``(B, width)`` float32 with each part's columns in order (indices as
  floats: exact below 2**24).
* **exploration noise** (drawn by runners from their own seeded generator): one Gumbel number per logit, then one
  standard normal per Gaussian dimension; ``argmax(logits + Gumbel)`` samples a softmax.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
ACTION_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary, gym.spaces.Box)


def _parts(space: gym.Space) -> list[gym.Space]:
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for sub in space.spaces for leaf in _parts(sub)]
    if isinstance(space, gym.spaces.Box) and not np.issubdtype(space.dtype, np.floating):
        raise TypeError(f"integer Box {space} (use Discrete, MultiDiscrete or a float Box)")
    if isinstance(space, ACTION_SPACES):
        return [space]
    raise TypeError(f"{type(space).__name__} space {space}")


class ActionDistribution:
    """The distribution of one action space: sizes, log-probabilities, entropy, KL, sampling, env actions."""

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        self.parts = _parts(space)
        self.categorical_sizes: list[int] = []  # one per categorical, in order
        self.categorical_columns: list[int] = []  # its action column
        self.gaussian_columns: list[int] = []  # action column of each Gaussian dimension
        self.widths: list[int] = []  # action columns per part
        mean_inputs: list[int] = []
        inputs = column = 0
        for part in self.parts:
            if isinstance(part, gym.spaces.Box):
                dim = int(np.prod(part.shape))
                mean_inputs += range(inputs, inputs + dim)
                self.gaussian_columns += range(column, column + dim)
                inputs, column, width = inputs + dim, column + dim, dim
            else:
                sizes = ([int(part.n)] if isinstance(part, gym.spaces.Discrete)
                         else [int(n) for n in np.asarray(part.nvec).reshape(-1)]
                         if isinstance(part, gym.spaces.MultiDiscrete) else [2] * int(np.prod(part.shape)))
                self.categorical_sizes += sizes
                self.categorical_columns += range(column, column + len(sizes))
                inputs, column, width = inputs + sum(sizes), column + len(sizes), len(sizes)
            self.widths.append(width)
        self.num_logits = sum(self.categorical_sizes)
        self.gaussian_dim = len(self.gaussian_columns)
        self.num_inputs = self.num_logits + 2 * self.gaussian_dim
        self.action_width = column
        self.discrete = isinstance(space, gym.spaces.Discrete)
        self.integer = isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary))
        self._logit_starts = np.cumsum([0, *self.categorical_sizes])[:-1].tolist()
        # Box bounds, flat, once: to_env runs every runner step.
        self._bounds = {id(p): (p.low.ravel(), p.high.ravel()) for p in self.parts if isinstance(p, gym.spaces.Box)}
        # Inputs in layout order: the means sit between logits of different parts; gather them once.
        self._mean_index = torch.tensor(mean_inputs, dtype=torch.long)
        self._logit_index = torch.tensor([i for i in range(inputs) if i not in set(mean_inputs)], dtype=torch.long)

    # ------------------------------------------------------------------ layout helpers
    def action_shape(self, batch: int) -> tuple[int, ...]:
        """Shape of ``batch`` stored actions."""
        return (batch,) if self.discrete else (batch, self.action_width)

    @property
    def action_dtype(self) -> np.dtype:
        """dtype of stored actions: int64 for Discrete/MultiDiscrete/MultiBinary, float32 for Box and Tuple."""
        return np.dtype(np.int64) if self.integer else np.dtype(np.float32)

    def _columns(self, actions: torch.Tensor) -> torch.Tensor:
        return actions.unsqueeze(-1) if self.discrete else actions

    def _split(self, dist_inputs: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """(logits per categorical, Gaussian means, Gaussian log stds)."""
        logits = dist_inputs[..., : self.num_inputs - self.gaussian_dim]
        log_std = dist_inputs[..., self.num_inputs - self.gaussian_dim:]
        if self.gaussian_dim and self.num_logits:
            means = logits.index_select(-1, self._mean_index.to(logits.device))
            logits = logits.index_select(-1, self._logit_index.to(logits.device))
        elif self.gaussian_dim:
            means, logits = logits, logits[..., :0]
        else:
            means = logits[..., :0]
        per_categorical = [logits[..., s:s + n] for s, n in zip(self._logit_starts, self.categorical_sizes,
                                                                strict=True)]
        return per_categorical, means, log_std

    # ------------------------------------------------------------------ learner side
    def log_prob_entropy(self, dist_inputs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of stored ``actions`` and the entropy, per sample (sums over independent parts)."""
        categoricals, mean, log_std = self._split(dist_inputs)
        columns = self._columns(actions)
        log_prob = dist_inputs.new_zeros(dist_inputs.shape[:-1])
        entropy = dist_inputs.new_zeros(dist_inputs.shape[:-1])
        for logits, column in zip(categoricals, self.categorical_columns, strict=True):
            log_p = torch.log_softmax(logits, dim=-1)
            index = columns[..., column].long().unsqueeze(-1)
            log_prob = log_prob + log_p.gather(-1, index).squeeze(-1)
            entropy = entropy - (log_p.exp() * log_p).sum(-1)
        if self.gaussian_dim:
            x = columns[..., self.gaussian_columns] if self.num_logits else columns
            z = (x - mean) * torch.exp(-log_std)
            log_prob = log_prob + (-0.5 * z.pow(2) - log_std - _LOG_SQRT_2PI).sum(-1)
            entropy = entropy + (log_std + 0.5 + _LOG_SQRT_2PI).sum(-1)
        return log_prob, entropy

    def kl(self, old_inputs: torch.Tensor, new_inputs: torch.Tensor) -> torch.Tensor:
        """KL(old || new) per sample."""
        old_cats, old_mean, old_log_std = self._split(old_inputs)
        new_cats, new_mean, new_log_std = self._split(new_inputs)
        kl = old_inputs.new_zeros(old_inputs.shape[:-1])
        for old, new in zip(old_cats, new_cats, strict=True):
            old_log_p, new_log_p = torch.log_softmax(old, -1), torch.log_softmax(new, -1)
            kl = kl + (old_log_p.exp() * (old_log_p - new_log_p)).sum(-1)
        if self.gaussian_dim:
            old_var, new_var = (2 * old_log_std).exp(), (2 * new_log_std).exp()
            kl = kl + (new_log_std - old_log_std + (old_var + (old_mean - new_mean).pow(2)) / (2 * new_var)
                       - 0.5).sum(-1)
        return kl

    # ------------------------------------------------------------------ acting
    def act_with_noise(self, dist_inputs: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """Stored actions from distribution inputs and pre-drawn noise (``None``: the most likely action)."""
        categoricals, mean, log_std = self._split(dist_inputs)
        if self.discrete:
            return categoricals[0].argmax(-1) if noise is None else (categoricals[0] + noise).argmax(-1)
        gumbel = None if noise is None else noise[..., : self.num_logits]
        picks = []
        for logits, start in zip(categoricals, self._logit_starts, strict=True):
            if gumbel is not None:
                logits = logits + gumbel[..., start:start + logits.shape[-1]]
            picks.append(logits.argmax(-1))
        gaussian = mean
        if noise is not None and self.gaussian_dim:
            gaussian = mean + noise[..., self.num_logits:] * log_std.exp()
        if not self.num_logits:
            return gaussian
        if not self.gaussian_dim:
            return torch.stack(picks, -1)
        out = dist_inputs.new_empty((*dist_inputs.shape[:-1], self.action_width))
        out[..., self.categorical_columns] = torch.stack(picks, -1).to(out.dtype)
        out[..., self.gaussian_columns] = gaussian
        return out

    def draw_noise(self, rng: np.random.Generator, steps: int, batch: int) -> np.ndarray:
        """Noise for ``steps`` action choices of ``batch`` envs, drawn at once (a draw per step costs far more)."""
        gumbel = -np.log(-np.log(np.maximum(rng.random((steps, batch, self.num_logits), dtype=np.float32),
                                            np.float32(1e-12))))
        if not self.gaussian_dim:
            return gumbel
        normal = rng.standard_normal((steps, batch, self.gaussian_dim), dtype=np.float32)
        return normal if not self.num_logits else np.concatenate([gumbel, normal], axis=-1)

    def to_env(self, actions: np.ndarray) -> Any:
        """A batch of stored actions as a vector env takes them: Discrete/MultiDiscrete shifted by ``start``, Box
        clipped to its bounds, MultiBinary as int8, Tuple as a tuple of batched parts (nested as the space)."""
        batch = len(actions)
        if not isinstance(self.space, gym.spaces.Tuple):
            return self._part_to_env(self.space, actions if self.discrete else actions.reshape(batch, -1))
        columns = iter(np.split(actions, np.cumsum(self.widths)[:-1], axis=1))
        return self._nest(self.space, columns)

    def _nest(self, space: gym.Space, columns: Any) -> Any:
        if isinstance(space, gym.spaces.Tuple):
            return tuple(self._nest(sub, columns) for sub in space.spaces)
        part = next(columns)
        if isinstance(space, gym.spaces.Discrete):
            part = part[:, 0]
        return self._part_to_env(space, part)

    def _part_to_env(self, space: gym.Space, part: np.ndarray) -> np.ndarray:
        batch = len(part)
        if isinstance(space, gym.spaces.Discrete):
            part = part.astype(np.int64, copy=False)
            return part + int(space.start) if space.start else part
        if isinstance(space, gym.spaces.MultiDiscrete):
            part = part.astype(np.int64, copy=False).reshape(batch, *space.shape)
            return part + space.start if np.any(space.start) else part
        if isinstance(space, gym.spaces.MultiBinary):
            return part.astype(np.int8).reshape(batch, *space.shape)
        low, high = self._bounds[id(space)]
        return np.clip(part, low, high).reshape(batch, *space.shape).astype(space.dtype, copy=False)
