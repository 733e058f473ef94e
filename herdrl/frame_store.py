"""Frames stored once: the image leaves of a replay buffer's observations.

A transition's ``obs`` and ``next_obs`` of a 4-frame stack hold 8 frames, but consecutive transitions share all
but one: ``next_obs`` of step t is ``obs`` of step t+1, and a stack at t+1 is the stack at t shifted by one frame.
:class:`FrameStore` keeps each distinct frame once in a ring and each transition as indices into it, so 1M Atari
transitions (84 x 84, 4-frame stacks) take ~8 GB instead of 56 GB.

Which frames are the same is found from their contents, not from assumptions about the env: every frame of a
batch is hashed, and frames with equal hashes are compared byte for byte before one is stored for both (a hash
collision costs a stored frame, never a wrong one). The last 32 batches' frames are looked up too, so a stack
that spans two fragments shares their frames, also with several runners' fragments interleaved. The unit of
storage is one frame of a stack (the first axis of a channels-first or stacked leaf: ale-py's and Gymnasium's
frame stacks), else the whole observation (HWC images, MinAtar): then ``obs`` and ``next_obs`` of neighbouring
steps still share it.

The ring holds an eighth more frames than the buffer holds transitions (Pong needs 0.92 per transition); a
transition whose frames were overwritten is dropped with the oldest (:meth:`FrameStore.lost_before`), which
only happens when episodes or fragments are so short that transitions rarely share frames.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

#: Batches whose frames a new batch is matched against: with several runners their fragments alternate, and a
#: fragment's first stack continues that runner's previous fragment.
RECENT_BATCHES = 32
#: Frames compared per vectorised step (bounds the temporary memory of hashing to a few MB per chunk).
CHUNK = 512


def frame_units(shape: tuple[int, ...], layout: str) -> int:
    """How many stored frames one observation of ``shape`` is (its first axis for stacks and channels-first
    images, else 1: the whole observation)."""
    return shape[0] if layout in ("CHW", "SCHW", "SHWC") and shape[0] > 1 else 1


def _hashes(rows: np.ndarray, multipliers: np.ndarray) -> np.ndarray:
    """A 64-bit key per row of bytes: a multilinear hash of its 8-byte words and tail bytes (``multipliers``:
    one random odd number per word and per tail byte)."""
    words = rows.shape[1] // 8
    keys = np.zeros(len(rows), np.uint64)
    for start in range(0, len(rows), CHUNK):
        part = rows[start:start + CHUNK]
        if words:
            body = np.ascontiguousarray(part[:, :words * 8]).view(np.uint64)
            keys[start:start + CHUNK] = (body * multipliers[:words]).sum(axis=1, dtype=np.uint64)
        tail = part[:, words * 8:].astype(np.uint64)
        if tail.size:
            keys[start:start + CHUNK] += (tail * multipliers[words:]).sum(axis=1, dtype=np.uint64)
    return keys


def _equal_rows(rows: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Row-wise byte equality of two (n, L) uint8 arrays, in chunks."""
    out = np.empty(len(rows), bool)
    for start in range(0, len(rows), CHUNK):
        out[start:start + CHUNK] = (rows[start:start + CHUNK] == others[start:start + CHUNK]).all(axis=1)
    return out


class FrameStore:
    """One image leaf (observations of ``shape`` and ``dtype``) of a ``capacity``-transition replay buffer."""

    def __init__(self, capacity: int, shape: tuple[int, ...], dtype: np.dtype, units_per_obs: int) -> None:
        self.shape, self.dtype, self.per_obs = tuple(shape), np.dtype(dtype), units_per_obs
        self.unit_shape = self.shape[1:] if units_per_obs > 1 else self.shape
        self.unit_bytes = math.prod(self.unit_shape) * self.dtype.itemsize
        self.size = capacity + capacity // 8 + 256  # frames the ring holds
        words, tail = divmod(self.unit_bytes, 8)
        self._multipliers = np.random.default_rng(0).integers(1, 2**63, words + tail, dtype=np.uint64) | np.uint64(1)
        # np.zeros commits memory as frames arrive: a part-filled buffer costs what it holds.
        self.units = np.zeros((self.size, *self.unit_shape), self.dtype)
        self.written = 0  # frames stored so far: the id of the next one (frame i lives at units[i % size])
        self.obs_ids = np.zeros((capacity, units_per_obs), np.int64)  # per transition slot
        self.next_ids = np.zeros((capacity, units_per_obs), np.int64)
        self.oldest = np.zeros(capacity, np.int64)  # the oldest frame id each slot's transition needs
        self._floor = 0  # at most the oldest frame id any stored transition needs: overwrites below it lose none
        self._recent: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=RECENT_BATCHES)  # (keys, ids)
        self._recent_keys = np.zeros(0, np.uint64)  # those batches' frames: hash keys (sorted) and ids
        self._recent_ids = np.zeros(0, np.int64)

    def put(self, slots: np.ndarray, obs: np.ndarray, next_obs: np.ndarray) -> None:
        """Store the transitions at ``slots``: (n, *shape) observations and next observations."""
        n, k = len(slots), self.per_obs
        if n == 0:  # a fragment holding only a reset step has no transition
            return
        pairs = np.stack([np.asarray(obs).astype(self.dtype, copy=False).reshape(n, k, -1),
                          np.asarray(next_obs).astype(self.dtype, copy=False).reshape(n, k, -1)], axis=1)
        # Row order is transition order: if a batch has more new frames than the ring, the newest keep theirs.
        ids = self._intern(pairs.view(np.uint8).reshape(2 * n * k, self.unit_bytes)).reshape(n, 2, k)
        self.obs_ids[slots], self.next_ids[slots] = ids[:, 0], ids[:, 1]
        self.oldest[slots] = ids.reshape(n, 2 * k).min(axis=1)
        self._floor = min(self._floor, int(self.oldest[slots].min()))

    def get(self, slots: np.ndarray, next_obs: bool = False) -> np.ndarray:
        """The (n, *shape) observations (or next observations) of the transitions at ``slots``."""
        ids = (self.next_ids if next_obs else self.obs_ids)[slots]
        return self.units[ids % self.size].reshape(len(slots), *self.shape)

    def may_have_lost(self) -> bool:
        """Whether the ring may have overwritten a frame a stored transition needs (if not, :meth:`lost_before`
        is 0 and need not scan the slots: in a steady state it scans once every ~1/8 of the capacity's frames)."""
        return self.written - self.size > self._floor

    def lost_before(self, stored: np.ndarray) -> int:
        """How many of the ``stored`` slots (oldest first) must go because frames they need were overwritten:
        all up to the newest such one."""
        oldest = self.oldest[stored]
        lost = np.flatnonzero(oldest < self.written - self.size)
        count = int(lost[-1]) + 1 if len(lost) else 0
        self._floor = int(oldest[count:].min()) if count < len(oldest) else self.written
        return count

    def _intern(self, rows: np.ndarray) -> np.ndarray:
        """Frame ids for ``rows`` (m frames as bytes): equal frames get one id, new ones are stored."""
        m = len(rows)
        keys = _hashes(rows, self._multipliers)
        # Each key's last row stands for the others (row order is transition order: if the ring cannot hold all
        # of a batch's new frames, those the newest transitions need are kept).
        _, last, inverse = np.unique(keys[::-1], return_index=True, return_inverse=True)
        same = (m - 1 - last)[inverse.reshape(-1)[::-1]]  # the last row with the same key...
        mismatch = (same != np.arange(m))
        mismatch[mismatch] = ~_equal_rows(rows[mismatch], rows[same[mismatch]])
        same[mismatch] = np.flatnonzero(mismatch)  # ...unless the bytes differ: then its own
        own = same == np.arange(m)  # rows that are their own representative
        ids = np.full(m, -1, np.int64)
        candidates = np.flatnonzero(own)
        if len(self._recent_ids):  # frames of recent batches that stay in the ring after this batch's
            survive = self.written + len(candidates) - self.size
            # The newest frame with each key (equal keys keep batch order): the likeliest still in the ring.
            at = np.maximum(np.searchsorted(self._recent_keys, keys[candidates], side="right") - 1, 0)
            hit = (self._recent_keys[at] == keys[candidates]) & (self._recent_ids[at] >= survive)
            found, old = candidates[hit], self._recent_ids[at[hit]]
            stored = self.units[old % self.size].view(np.uint8).reshape(len(found), self.unit_bytes)
            match = _equal_rows(rows[found], stored)
            ids[found[match]] = old[match]
        new = np.flatnonzero(own & (ids < 0))
        ids[new] = self.written + np.arange(len(new))
        keep = new[-self.size:]  # a batch larger than the ring keeps its newest frames
        self.units[ids[keep] % self.size] = rows[keep].view(self.dtype).reshape(len(keep), *self.unit_shape)
        self.written += len(new)
        ids = ids[same]
        self._recent.append((keys[own], ids[own]))
        recent_keys = np.concatenate([batch_keys for batch_keys, _ in self._recent])
        order = np.argsort(recent_keys, kind="stable")
        self._recent_keys = recent_keys[order]
        self._recent_ids = np.concatenate([batch_ids for _, batch_ids in self._recent])[order]
        return ids
