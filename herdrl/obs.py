"""Observations of any Gymnasium space as plain arrays, in their own dtypes.

An observation is stored as its *leaves*: a Box, Discrete, MultiDiscrete or MultiBinary space
is one leaf; a Dict or Tuple (nested) has one leaf per such space inside it, named by its path
(``"image"``, ``"state/pos"``, ``"0"`` for a Tuple's first item). A batch of observations is then
one array (a single-leaf space: the common case, no dict in the hot loop) or a dict of arrays,
leaf name -> array. Every leaf keeps a compact dtype: uint8 frames stay uint8 on runners, in
fragments, through Ray's object store and in replay buffers; the model's encoder turns them into
floats on the learner's device (``herdrl.models.encoders``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np

#: A batch of observations: one array, or leaf name -> array.
ObsArray = np.ndarray | dict[str, np.ndarray]
LEAF_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


#: Frames narrower than this on a side are not images (a (10, 2, 3) tensor of features stays a vector).
IMAGE_MIN_SIDE = 8


def image_layout(space: gym.Space) -> tuple[int, int, int, str] | None:
    """(channels, height, width, layout) of an image leaf; None for any other space.

    ``layout`` is ``"HWC"``, ``"CHW"``, ``"HW"`` (one channel), ``"SHWC"`` or ``"SCHW"`` (a stack of frames that
    have channels: their channels are the stack's times the frame's). Rank 3: the smaller of the first and last
    axes holds the channels (HWC when equal, Gymnasium's layout for frames; a 4-frame stack of 84 x 84 is CHW from
    Gymnasium's FrameStackObservation and ale-py, HWC from SB3's VecFrameStack). Rank 2 with uint8/bool values:
    one channel. Height and width must be at least :data:`IMAGE_MIN_SIDE`.
    """
    if not isinstance(space, gym.spaces.Box):
        return None
    shape = space.shape
    if len(shape) == 4:  # a stack of (H, W, C) or (C, H, W) frames
        if shape[3] <= shape[1]:
            found = (shape[0] * shape[3], shape[1], shape[2], "SHWC")
        else:
            found = (shape[0] * shape[1], shape[2], shape[3], "SCHW")
    elif len(shape) == 3:
        found = (shape[0], shape[1], shape[2], "CHW") if shape[0] < shape[-1] else (shape[2], shape[0], shape[1],
                                                                                      "HWC")
    elif len(shape) == 2 and (space.dtype == np.uint8 or space.dtype == np.bool_):
        found = (1, shape[0], shape[1], "HW")
    else:
        return None
    return found if min(found[1], found[2]) >= IMAGE_MIN_SIDE and found[0] >= 1 else None


def leaf_spaces(space: gym.Space, prefix: str = "") -> dict[str, gym.Space]:
    """The leaves of ``space`` by path, in a fixed order (Dict keys as Gymnasium orders them, Tuple items in order).

    Raises ``TypeError`` naming the first space that is neither a leaf nor a Dict/Tuple (Text, Graph, Sequence).
    """
    if isinstance(space, LEAF_SPACES):
        return {prefix: space}
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        items = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space.spaces)
        leaves: dict[str, gym.Space] = {}
        for key, sub in items:
            leaves.update(leaf_spaces(sub, f"{prefix}/{key}" if prefix else str(key)))
        return leaves
    raise TypeError(f"{type(space).__name__} space{' ' + repr(prefix) if prefix else ''} ({space})")


def storage_dtype(space: gym.Space) -> np.dtype:
    """How a leaf is stored: floats as float32, integer and bool Boxes as they are (uint8 frames stay uint8),
    Discrete/MultiDiscrete indices as int64, MultiBinary as int8."""
    if isinstance(space, gym.spaces.Box):
        return np.dtype(np.float32) if np.issubdtype(space.dtype, np.floating) else np.dtype(space.dtype)
    if isinstance(space, gym.spaces.MultiBinary):
        return np.dtype(np.int8)
    return np.dtype(np.int64)


def _leaf_shape(space: gym.Space) -> tuple[int, ...]:
    return () if isinstance(space, gym.spaces.Discrete) else tuple(space.shape)


class ObsSpec:
    """The stored form of one observation space: its leaves, their shapes and dtypes.

    ``single``: the space is one leaf, so batches are plain arrays; otherwise dicts of arrays.
    """

    def __init__(self, space: gym.Space) -> None:
        self.space = space
        self.leaves = leaf_spaces(space)
        self.single = len(self.leaves) == 1 and "" in self.leaves
        self.shapes = {name: _leaf_shape(s) for name, s in self.leaves.items()}
        self.dtypes = {name: storage_dtype(s) for name, s in self.leaves.items()}

    def empty(self, lead: tuple[int, ...]) -> ObsArray:
        """Uninitialised storage for observations with leading dims ``lead`` (e.g. (T+1, B))."""
        arrays = {n: np.empty((*lead, *self.shapes[n]), self.dtypes[n]) for n in self.leaves}
        return arrays[""] if self.single else arrays

    def zeros(self, lead: tuple[int, ...]) -> ObsArray:
        """Zeroed storage (replay buffers: memory is committed lazily, page by page)."""
        arrays = {n: np.zeros((*lead, *self.shapes[n]), self.dtypes[n]) for n in self.leaves}
        return arrays[""] if self.single else arrays

    def batch(self, raw: Any) -> ObsArray:
        """A vector env's observations (array, dict or tuple, nested as the space is) in stored form."""
        if self.single:
            return np.asarray(raw).astype(self.dtypes[""], copy=False)
        return {name: np.asarray(value).astype(self.dtypes[name], copy=False)
                for name, value in _raw_leaves(raw, self.space)}

    def one(self, raw: Any) -> ObsArray:
        """One observation (not a batch) in stored form with a leading batch dim of 1."""
        if self.single:
            return np.asarray(raw).astype(self.dtypes[""], copy=False)[None]
        return {name: np.asarray(value).astype(self.dtypes[name], copy=False)[None]
                for name, value in _raw_leaves(raw, self.space)}

    def write(self, out: ObsArray, raw: Any) -> None:
        """Write a vector env's observations into ``out`` (one row of storage), casting to the stored dtypes."""
        if self.single:
            np.copyto(out, raw, casting="unsafe")
            return
        for name, value in _raw_leaves(raw, self.space):
            np.copyto(out[name], value, casting="unsafe")


def _raw_leaves(raw: Any, space: gym.Space, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _raw_leaves(raw[key], sub, f"{prefix}/{key}" if prefix else str(key))
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from _raw_leaves(raw[i], sub, f"{prefix}/{i}" if prefix else str(i))
    else:
        yield prefix, raw


def _rebuild(space: gym.Space, leaf: Callable[[str], Any], prefix: str = "") -> Any:
    """The nested structure of ``space`` with ``leaf(path)`` at every leaf."""
    if isinstance(space, gym.spaces.Dict):
        return {key: _rebuild(sub, leaf, f"{prefix}/{key}" if prefix else str(key))
                for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_rebuild(sub, leaf, f"{prefix}/{i}" if prefix else str(i)) for i, sub in enumerate(space.spaces))
    return leaf(prefix)


def map_leaf_spaces(space: gym.Space, fn: Callable[[str, gym.Space], gym.Space], prefix: str = "") -> gym.Space:
    """``space`` with each leaf replaced by ``fn(path, leaf)``, Dicts and Tuples rebuilt around them."""
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({key: map_leaf_spaces(sub, fn, f"{prefix}/{key}" if prefix else str(key))
                                for key, sub in space.spaces.items()})
    if isinstance(space, gym.spaces.Tuple):
        return gym.spaces.Tuple([map_leaf_spaces(sub, fn, f"{prefix}/{i}" if prefix else str(i))
                                 for i, sub in enumerate(space.spaces)])
    return fn(prefix, space)


def nest(space: gym.Space, flat: dict[str, Any] | Any) -> Any:
    """Leaf name -> value (or one value for a single leaf) back into the space's nested dicts and tuples; what
    custom encoders receive, with tensors as the values."""
    if not isinstance(flat, dict):
        return flat
    return _rebuild(space, lambda name: flat[name])


def obs_map(fn: Callable[..., Any], *batches: ObsArray) -> Any:
    """``fn`` applied leaf by leaf to one or more batches of the same structure."""
    first = batches[0]
    if isinstance(first, dict):
        return {name: fn(*(b[name] for b in batches)) for name in first}
    return fn(*batches)


def obs_concat(batches: list[ObsArray], axis: int = 0) -> ObsArray:
    """Concatenate batches of the same structure along ``axis``; leaves that are consecutive blocks of one array
    along ``axis`` (frames rebuilt side by side: ``herdrl.rollout.transport``) are joined without a copy."""

    def join(*arrays: np.ndarray) -> np.ndarray:
        view = joined_view(arrays, axis) if len(arrays) > 1 else None
        return np.concatenate(arrays, axis=axis) if view is None else view

    return obs_map(join, *batches)


def joined_view(arrays: tuple[np.ndarray, ...], axis: int) -> np.ndarray | None:
    """The view that ``arrays`` make side by side along ``axis`` — plain arrays of one dtype viewing one buffer
    with the same strides, each starting where the one before ends — or None. Writable only if all of them are."""
    first = arrays[0]
    owner, step = first.base, first.strides[axis]
    if owner is None or step <= 0 or any(type(array) is not np.ndarray or array.dtype != first.dtype
                                         for array in arrays):
        return None
    address = first.__array_interface__["data"][0]
    for before, array in zip(arrays[:-1], arrays[1:], strict=True):
        address += before.shape[axis] * step
        if array.base is not owner or array.strides != first.strides or \
                array.__array_interface__["data"][0] != address or \
                array.shape[:axis] + array.shape[axis + 1:] != first.shape[:axis] + first.shape[axis + 1:]:
            return None
    shape = list(first.shape)
    shape[axis] = sum(array.shape[axis] for array in arrays)
    writeable = all(array.flags.writeable for array in arrays)
    return np.lib.stride_tricks.as_strided(first, tuple(shape), first.strides, writeable=writeable)


def obs_len(obs: ObsArray) -> int:
    """The leading dimension of a batch."""
    return len(next(iter(obs.values())) if isinstance(obs, dict) else obs)
