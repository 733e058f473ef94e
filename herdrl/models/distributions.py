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

import gymnasium as gym
import torch

from herdrl.models.action_layout import ACTION_SPACES, ActionLayout

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
__all__ = ["ACTION_SPACES", "ActionDistribution", "ActionLayout"]


class ActionDistribution(ActionLayout):
    """The distribution of one action space: sizes, log-probabilities, entropy, KL, sampling, env actions."""

    def __init__(self, space: gym.Space) -> None:
        super().__init__(space)
        # Inputs in layout order: the means sit between logits of different parts; gather them once.
        self._mean_index = torch.tensor(self.mean_inputs, dtype=torch.long)
        self._logit_index = torch.tensor([i for i in range(self.num_inputs - self.gaussian_dim)
                                          if i not in set(self.mean_inputs)], dtype=torch.long)

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
