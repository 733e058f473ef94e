"""How fragments travel from Ray runners to whoever learns on them.

A runner returns two objects per fragment (one Ray call, ``num_returns=2``): a small :class:`FragmentInfo` (counts,
finished episodes, normalisation statistics, weight version, bytes: all the driver reports) and the fragment
itself. The driver waits on the infos only; the fragments stay in the object store as references, handed as a
list to whoever learns: learner actors fetch them from the runners' nodes themselves, so with ``num_learners >= 1``
the driver never deserialises an array (fragments under Ray's 100 KiB inline limit travel through its memory as
bytes). A learner in the driver (the default) fetches them once, as before.

A fragment over that limit is put in the object store by the runner itself (``ray.put``), its reference sent in
the info (:attr:`FragmentInfo.fragment_ref`), so the runner, not the driver, owns it: the owner's bookkeeping
(locations, pins, frees) is then done in the runners' processes, spread over them, and the driver's CPU per
fragment no longer grows with its size (benchmarks/results/scaling.md). A fragment then dies with its runner as well as
with its node: either way it is lost, dropped and sampled again.

Stacked image observations (Atari's 4-frame stacks) repeat three of every four frames from the step before;
:func:`pack` ships each distinct frame once plus indices, found by comparing the frames (never assumed: a stack
that is not a shift of the one before, e.g. after a reset, is shipped whole), and :func:`unpack` rebuilds exactly
the arrays the env returned. Packing happens on the runner, unpacking wherever the fragment is fetched.

A fragment whose node died before it was fetched is lost (``ray.exceptions.ObjectLostError``): :func:`resolve`
reports which, and the algorithm drops them and samples again (:meth:`Algorithm.update_on`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any

import numpy as np

from herdrl.errors import HerdError

#: Image leaves whose first axis is a stack of this many frames are packed (a single frame has no repeats; a first
#: axis longer than 16 is an image's height, not a stack).
MIN_STACK, MAX_STACK = 2, 16
#: A fragment of more bytes than this (Ray's limit for returning an object inline, in the caller's memory) is put in
#: the object store by its runner, which then owns it.
RUNNER_PUT_BYTES = 100 * 1024
#: A leaf is shipped as packed only if packing saves at least this share of its bytes (an RGB channels-first image
#: is never a shift of the one before: it is sent as it is, having cost one comparison).
MIN_SAVING = 0.2


@dataclass
class FragmentInfo:
    """What the driver knows of a fragment: what it reports, never the arrays."""

    env_steps: int
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    weights_version: int | dict[str, int] = -1  # multi-agent runs: by policy id
    worker_index: int = 0
    filter_delta: dict[str, np.ndarray] | None = None
    nbytes: int = 0  # as shipped (packed)
    agent_steps: int = 0  # multi-agent runs: decisions of all agents
    agent_returns: dict[str, list[float]] = field(default_factory=dict)
    policy_returns: dict[str, list[float]] = field(default_factory=dict)
    metrics: list | None = None  # custom metrics logged by callbacks (herdrl.callbacks.MetricsLogger.take)
    policy_steps: dict[str, int] = field(default_factory=dict)  # multi-agent: agent steps of each trained policy
    fragment_ref: Any = None  # the fragment, put by its runner (which owns it), or None: it came as the 2nd return


def info_of(fragment: Any, size: int = 0) -> FragmentInfo:
    """The :class:`FragmentInfo` of a single- or multi-agent fragment (``size``: its bytes as shipped)."""
    multi = hasattr(fragment, "policies")
    return FragmentInfo(
        env_steps=fragment.env_steps, episode_returns=list(fragment.episode_returns),
        episode_lengths=list(fragment.episode_lengths), weights_version=fragment.weights_version,
        worker_index=fragment.worker_index, filter_delta=fragment.filter_delta, nbytes=size,
        agent_steps=fragment.agent_steps if multi else 0,
        agent_returns=dict(fragment.agent_returns) if multi else {},
        policy_returns=dict(fragment.policy_returns) if multi else {},
        metrics=getattr(fragment, "metrics", None), policy_steps=dict(fragment.policy_steps) if multi else {})


@dataclass
class Sampled:
    """One sampled fragment as the driver holds it: its info, and the fragment or (from a Ray runner) a reference
    to it."""

    info: FragmentInfo
    data: Any


def sampled(info: FragmentInfo, data: Any) -> Sampled:
    """A :class:`Sampled` from a runner's two returns: its info and ``data`` (the fragment's reference), or the
    reference the runner put in the info. The info lets go of that reference (infos are kept for reporting; a
    reference kept would pin its fragment in the object store)."""
    ref, info.fragment_ref = info.fragment_ref, None
    return Sampled(info, data if ref is None else ref)


class LearnerInput:
    """An update's data, as the learner reads it where it runs: the one shape every learner group passes, whatever
    feeds it. Sampled fragments come as references (:class:`FragmentInput`; fetched by aggregators:
    :class:`AggregatedInput`), a streamed dataset as the rows each rank reads from its own Ray Data stream
    (:class:`~herdrl.offline.reader.StreamRows`): learner actors get the references or the row counts and fetch
    or draw the data themselves (fragments sampled in the driver's own process are put in the object store there)."""

    def read(self, reader: Any) -> tuple[Any, list[int], int]:
        """What the learner's update takes from this input, the indices of the items lost on the way (in the whole
        input: learner ranks agree on them and skip the update together) and how many items could be lost (0:
        none can). ``reader``: the learner group or actor reading it (its ``learner``; an actor's ``rank`` and
        ``stream``)."""
        raise NotImplementedError


class FragmentInput(list, LearnerInput):
    """The fragments a learner's update reads, as a list of fragments or of references to them (the first
    argument of on-policy and asynchronous updates); learner groups resolve it where the learner runs.

    With ``shard_fragments`` each learner is given its own consecutive share: ``offset`` is the share's first
    index in the update's whole input, ``total`` that input's length (None: not a share, every learner reads the
    whole input)."""

    offset: int = 0
    total: int | None = None

    def share(self, rank: int, count: int) -> FragmentInput:
        """Learner ``rank``'s share of ``count`` (consecutive, as even as can be; every share non-empty: at least
        ``count`` items)."""
        parts = shares(list(self), count)
        out = FragmentInput(parts[rank])
        out.offset, out.total = sum(len(part) for part in parts[:rank]), len(self)
        return out

    def read(self, reader: Any) -> tuple[list[Any], list[int], int]:
        """The fragments (fetched, frames unpacked), the lost ones' indices; a share tells the learner its rows are
        one learner's share (``rows_sharded``)."""
        fragments, lost = self.fetch()
        reader.learner.rows_sharded = self.total is not None
        return fragments, [self.offset + i for i in lost], self.total or self.fragment_count()

    def fetch(self) -> tuple[list[Any], list[int]]:
        """The fragments, in order, and the indices of the lost ones in this input."""
        return resolve(self)

    def fragment_count(self) -> int:
        """How many fragments this input stands for (not ``list.count``, which this list keeps)."""
        return len(self)


class AggregatedInput(FragmentInput):
    """A :class:`FragmentInput` fetched by aggregator actors: references to their results, ``(fragments, lost
    indices)`` for consecutive shares of the fragments, ``sizes[i]`` fragments in share ``i``."""

    def __init__(self, refs: list[Any], sizes: list[int]) -> None:
        super().__init__(refs)
        self.sizes = sizes

    def fetch(self) -> tuple[list[Any], list[int]]:
        """The aggregators' fragments in order, and the lost ones' indices."""
        return resolve_aggregated(self)

    def fragment_count(self) -> int:
        """How many fragments the aggregators fetched."""
        return sum(self.sizes)


def shares(items: list[Any], count: int) -> list[list[Any]]:
    """``items`` cut into ``count`` consecutive shares, as even as can be (order kept, so the learner's batch is
    the same whoever fetched it); empty shares left out."""
    size, extra = divmod(len(items), count)
    bounds = [0]
    for i in range(count):
        bounds.append(bounds[-1] + size + (i < extra))
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def resolve_aggregated(arg: AggregatedInput) -> tuple[list[Any], list[int]]:
    """The fragments of an :class:`AggregatedInput`, in order, and the indices of lost ones in the whole input."""
    import ray

    fragments: list[Any] = []
    lost: list[int] = []
    offset = 0
    for (part, part_lost), size in zip(ray.get(list(arg)), arg.sizes, strict=True):
        fragments += part
        lost += [offset + i for i in part_lost]
        offset += size
    return fragments, lost


@dataclass
class FragmentsLost:
    """An update that did not happen: the fragments at ``indices`` of its input were lost with their node."""

    indices: list[int]


class FragmentLostError(HerdError):
    """Fragments kept being lost before a learner could read them (their nodes kept dying)."""


@dataclass
class PackedFrames:
    """A ``(T+1, B, K, *frame)`` stack leaf as each distinct frame once: ``frames[index]`` rebuilds it."""

    frames: np.ndarray  # (F, *frame)
    index: np.ndarray  # (T+1, B, K) int32

    @property
    def nbytes(self) -> int:
        """Bytes as shipped."""
        return self.frames.nbytes + self.index.nbytes

    def unpack(self) -> np.ndarray:
        """The leaf as the env returned it."""
        return self.frames[self.index]


def pack_leaf(leaf: np.ndarray) -> np.ndarray | PackedFrames:
    """A ``(T+1, B, K, *frame)`` leaf with each frame kept once where a stack is the previous step's shifted by one
    frame (checked byte for byte), or the leaf itself where that saves too little."""
    if leaf.ndim < 4 or not MIN_STACK <= leaf.shape[2] <= MAX_STACK or leaf.dtype != np.uint8 \
            or leaf.shape[0] < 2 or leaf.shape[1] == 0:
        return leaf
    steps, envs, depth = leaf.shape[:3]
    # shifted[t, b]: the stack at t+1 is the stack at t minus its oldest frame plus one new frame
    shifted = np.empty((steps - 1, envs), bool)
    for t in range(steps - 1):  # one step at a time bounds the comparison's temporary to one step's frames
        shifted[t] = (leaf[t + 1, :, :-1] == leaf[t, :, 1:]).reshape(envs, -1).all(axis=1)
    new_frames = envs * depth + int((~shifted).sum()) * (depth - 1) + shifted.size
    if new_frames > (1 - MIN_SAVING) * steps * envs * depth:
        return leaf
    index = np.empty((steps, envs, depth), np.int32)
    index[0] = np.arange(envs * depth, dtype=np.int32).reshape(envs, depth)
    parts, count = [leaf[0].reshape(-1, *leaf.shape[3:])], envs * depth
    for t in range(1, steps):
        same, whole = shifted[t - 1], ~shifted[t - 1]
        n_same, n_whole = int(same.sum()), int(whole.sum())
        index[t, same, :-1] = index[t - 1, same, 1:]
        index[t, same, -1] = np.arange(count, count + n_same, dtype=np.int32)
        count += n_same
        index[t, whole] = np.arange(count, count + n_whole * depth, dtype=np.int32).reshape(n_whole, depth)
        count += n_whole * depth
        # Stored in index order: this step's new frames of the shifted stacks, then the whole stacks.
        parts += [leaf[t, same, -1], leaf[t, whole].reshape(-1, *leaf.shape[3:])]
    return PackedFrames(np.concatenate(parts), index)


def _map_arrays(fragment: Any, fn: Any) -> None:
    """Apply ``fn`` to every observation leaf of a fragment (each policy's, in a multi-agent one), in place."""
    for part in fragment.policies.values() if hasattr(fragment, "policies") else [fragment]:
        part.obs = {k: fn(v) for k, v in part.obs.items()} if isinstance(part.obs, dict) else fn(part.obs)


def pack(fragment: Any) -> Any:
    """The fragment with its stacked frame leaves packed (in place; returned for convenience)."""
    _map_arrays(fragment, pack_leaf)
    return fragment


def unpack(fragment: Any) -> Any:
    """Inverse of :func:`pack` (in place; a fragment from the object store is read-only but its fields are not)."""
    _map_arrays(fragment, lambda leaf: leaf.unpack() if isinstance(leaf, PackedFrames) else leaf)
    return fragment


def rebuild_side_by_side(leaves: list[np.ndarray | PackedFrames]) -> list[np.ndarray]:
    """One observation leaf of fragments a learner lays side by side (their env axis, 1), as arrays. Where one is
    packed and all agree in every other axis, they are rebuilt into one array as its consecutive column blocks,
    so :func:`~herdrl.obs.obs_concat` joins them without a copy: each stack is written once, straight where the
    batch reads it (rebuilding each fragment, then concatenating, copied every frame twice)."""
    shapes = {(leaf.index.shape[0], *leaf.index.shape[2:], *leaf.frames.shape[1:], leaf.frames.dtype)
              if isinstance(leaf, PackedFrames) else (leaf.shape[0], *leaf.shape[2:], leaf.dtype) for leaf in leaves}
    if len(leaves) < 2 or len(shapes) != 1 or not any(isinstance(leaf, PackedFrames) for leaf in leaves):
        return [leaf.unpack() if isinstance(leaf, PackedFrames) else leaf for leaf in leaves]
    widths = [(leaf.index if isinstance(leaf, PackedFrames) else leaf).shape[1] for leaf in leaves]
    steps, *rest, dtype = next(iter(shapes))
    batch = np.empty((steps, sum(widths), *rest), dtype)
    out, column = [], 0
    for leaf, width in zip(leaves, widths, strict=True):
        block = batch[:, column:column + width]
        column += width
        if isinstance(leaf, PackedFrames):
            if leaf.index.size and not 0 <= leaf.index.min() <= leaf.index.max() < len(leaf.frames):
                raise ValueError(f"a packed fragment indexes frames up to {leaf.index.max()} of {len(leaf.frames)}")
            for t in range(steps):  # a contiguous row at a time: np.take writes it in place, unbuffered
                np.take(leaf.frames, leaf.index[t], axis=0, out=block[t], mode="clip")
        else:
            block[...] = leaf
        out.append(block)
    return out


def side_by_side_field(fragments: list[Any], name: str) -> np.ndarray:
    """A per-step field of fragments (``actions``, ``rewards``, ...) laid side by side: ``(T, sum of B, ...)``."""
    return np.concatenate([getattr(f, name) for f in fragments], axis=1)


def unpack_side_by_side(fragments: list[Any]) -> list[Any]:
    """:func:`unpack` for fragments a learner concatenates in this order: single-agent fragments' packed leaves
    rebuilt side by side (:func:`rebuild_side_by_side`); multi-agent ones each on its own."""
    if len(fragments) < 2 or any(hasattr(f, "policies") for f in fragments):
        return [unpack(f) for f in fragments]
    first = fragments[0].obs
    if isinstance(first, dict):
        if any(not isinstance(f.obs, dict) or f.obs.keys() != first.keys() for f in fragments):
            return [unpack(f) for f in fragments]
        columns = {key: rebuild_side_by_side([f.obs[key] for f in fragments]) for key in first}
        for i, fragment in enumerate(fragments):
            fragment.obs = {key: columns[key][i] for key in first}
    else:
        for fragment, leaf in zip(fragments, rebuild_side_by_side([f.obs for f in fragments]), strict=True):
            fragment.obs = leaf
    return fragments


def join_side_by_side(fragments: list[Any]) -> list[Any]:
    """Fetched fragments (frames still packed) unpacked and joined into one fragment as wide as all of them: an
    aggregator's share of the learner's batch, built beside it. The stacks are rebuilt straight into the joined
    array (:func:`rebuild_side_by_side`), which the learner then reads from its node's store as it is. Multi-agent
    and recurrent fragments, fragments of different lengths or observation keys, are each unpacked on their own
    instead (contiguous arrays: the object store takes them without a copy). The joined fragment's bookkeeping
    (episodes, statistics, weight versions) is its first fragment's: the driver keeps every fragment's own in its
    infos, and learners read only the arrays."""
    keys = {tuple(f.obs) if isinstance(f.obs, dict) else None for f in fragments if not hasattr(f, "policies")}
    if len(fragments) < 2 or any(hasattr(f, "policies") or f.state_in is not None for f in fragments) \
            or len({f.rewards.shape[0] for f in fragments}) != 1 or len(keys) != 1:
        return [unpack(f) for f in fragments]
    from herdrl.obs import obs_concat

    fragments = unpack_side_by_side(fragments)
    cat = partial(side_by_side_field, fragments)
    return [replace(fragments[0], obs=obs_concat([f.obs for f in fragments], axis=1), actions=cat("actions"),
                    rewards=cat("rewards"), terminateds=cat("terminateds"), truncateds=cat("truncateds"),
                    valid=cat("valid"), logp=None if fragments[0].logp is None else cat("logp"),
                    begins=None if any(f.begins is None for f in fragments)
                    else np.concatenate([f.begins for f in fragments]))]


def nbytes(fragment: Any) -> int:
    """Bytes of a fragment's arrays (packed frames as shipped)."""
    total = 0
    for part in fragment.policies.values() if hasattr(fragment, "policies") else [fragment]:
        for f in fields(part):
            value = getattr(part, f.name)
            for leaf in value.values() if isinstance(value, dict) else [value]:
                if isinstance(leaf, (np.ndarray, PackedFrames)):
                    total += leaf.nbytes
    return total


def resolve(items: list[Any]) -> tuple[list[Any], list[int]]:
    """The fragments of a :class:`FragmentInput` (fetched, frames unpacked side by side, as the learner will
    concatenate them: :func:`unpack_side_by_side`) and the indices of those that were lost with their node."""
    fragments, lost = fetch(items)
    return unpack_side_by_side(fragments), lost


def fetch(items: list[Any]) -> tuple[list[Any], list[int]]:
    """The fragments behind ``items`` (references fetched; fragments passed as they are), frames still packed, and
    the indices of those that were lost with their node."""
    refs = [i for i, item in enumerate(items) if not hasattr(item, "valid") and not hasattr(item, "policies")]
    if not refs:
        return list(items), []
    import ray

    fetched: dict[int, Any] = {}
    lost: list[int] = []
    try:
        fetched = dict(zip(refs, ray.get([items[i] for i in refs]), strict=True))
    except ray.exceptions.ObjectLostError:  # which ones: one at a time (rare: a node died)
        for i in refs:
            try:
                fetched[i] = ray.get(items[i])
            except ray.exceptions.ObjectLostError:
                lost.append(i)
    return [fetched[i] if i in fetched else item for i, item in enumerate(items) if i not in lost], lost
