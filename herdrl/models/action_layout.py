"""The layout of an action space's actions in numpy: what runners need without torch.

See :mod:`herdrl.models.distributions` for the layouts (distribution inputs, stored actions, exploration
noise); this module holds their numpy half, so a runner whose policy runs in numpy never imports torch.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

ACTION_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary, gym.spaces.Box)


def _parts(space: gym.Space) -> list[gym.Space]:
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for sub in space.spaces for leaf in _parts(sub)]
    if isinstance(space, gym.spaces.Box) and not np.issubdtype(space.dtype, np.floating):
        raise TypeError(f"integer Box {space} (use Discrete, MultiDiscrete or a float Box)")
    if isinstance(space, ACTION_SPACES):
        return [space]
    raise TypeError(f"{type(space).__name__} space {space}")


class ActionLayout:
    """The layout of one action space's actions, in numpy: sizes, stored shape and dtype, exploration noise, the
    env's form. :class:`herdrl.models.distributions.ActionDistribution` adds the torch side (log-probabilities,
    entropy, KL)."""

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
        self.mean_inputs = mean_inputs  # where the Gaussian means sit among the distribution inputs

    # ------------------------------------------------------------------ layout helpers
    def action_shape(self, batch: int) -> tuple[int, ...]:
        """Shape of ``batch`` stored actions."""
        return (batch,) if self.discrete else (batch, self.action_width)

    @property
    def action_dtype(self) -> np.dtype:
        """dtype of stored actions: int64 for Discrete/MultiDiscrete/MultiBinary, float32 for Box and Tuple."""
        return np.dtype(np.int64) if self.integer else np.dtype(np.float32)

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

    def from_env(self, actions: Any) -> np.ndarray:
        """Inverse of :meth:`to_env`: a batch of env actions (recorded in a dataset) in stored form, ``start``
        removed, Box and Tuple actions as float32 columns."""
        if isinstance(self.space, gym.spaces.Tuple):
            parts = []
            self._flatten(self.space, actions, parts)
            return np.concatenate(parts, axis=1).astype(np.float32)
        part = self._part_from_env(self.space, actions)
        return part[:, 0] if self.discrete else part.astype(self.action_dtype, copy=False)

    def _flatten(self, space: gym.Space, actions: Any, out: list[np.ndarray]) -> None:
        if isinstance(space, gym.spaces.Tuple):
            for sub, part in zip(space.spaces, actions, strict=True):
                self._flatten(sub, part, out)
        else:
            out.append(self._part_from_env(space, actions))

    @staticmethod
    def _part_from_env(space: gym.Space, part: Any) -> np.ndarray:
        """One part's env actions as ``(batch, columns)``."""
        part = np.asarray(part)
        batch = len(part)
        if isinstance(space, gym.spaces.Discrete):
            return (part.astype(np.int64) - int(space.start)).reshape(batch, 1)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return (part.astype(np.int64) - space.start).reshape(batch, -1)
        if isinstance(space, gym.spaces.MultiBinary):
            return part.astype(np.int64).reshape(batch, -1)
        return part.astype(np.float32).reshape(batch, -1)

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
