"""Replay of episode sequences for recurrent Q-learning (QMIX's GRU agents; R2D2's recipe, zero start state).

A recurrent Q network learns from sequences, not single transitions: its state at a step depends on the steps
before it. :class:`EpisodeSequencer` follows each runner env's episode across fragments and cuts it into
*segments* of ``seq_len`` steps (the last one shorter); each segment is stored as a *window*: up to ``burn_in``
steps of the same episode before it, then the segment. The learner unrolls a window from a zero state: exact for
a window that begins at its episode's first step, and for the others the burn-in steps rebuild the state (no loss
on them: R2D2, Kapturowski et al. 2019, zero start state with burn-in). A window never crosses an episode end.

A window of ``W = burn_in + seq_len`` steps holds ``obs`` ``(W+1, ...)`` (each step's observation, then the one
after its last step: a truncated episode bootstraps from it), ``actions`` ``(W, ...)``, ``rewards`` ``(W,)``,
``discounts`` ``(W,)`` (``gamma``, 0 where the episode terminated), ``train`` ``(W,)`` (the segment's steps: the
loss's) and ``valid`` ``(W,)`` (burn-in and segment steps); windows are left-aligned and zero-padded. A window
also holds ``prev_actions``, the action taken just before its first step (-1 in each entry where the window
begins its episode): agents that read their last action read that one at the window's first step.

A fragment says which of its envs begin an episode at its first step (``Fragment.begins``: a runner's new envs,
or after a reset-only step); a piece that continues an episode joins it only if it begins where the episode left
off: an episode whose next fragment was lost (or whose runner was replaced) is dropped, the rest of it too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from herdrl.obs import ObsArray, ObsSpec, obs_map
from herdrl.rollout.runner import Fragment

#: A window's per-step fields besides its observations.
STEP_FIELDS = ("actions", "rewards", "discounts", "train", "valid")
#: ``prev_actions`` where there is no action before a window (its episode's first step).
NO_ACTION = -1


class EpisodeSequencer:
    """Cuts each runner env's episodes into windows as their steps arrive (see the module doc)."""

    def __init__(self, seq_len: int, burn_in: int, gamma: float) -> None:
        self.seq_len, self.burn_in, self.gamma = seq_len, burn_in, gamma
        # (worker index, env) -> its open episode: the steps a window may still need (obs n+1, actions, rewards,
        # terminated: n), ``offset`` (the episode step the first of them is), ``before`` (the action of step
        # offset - 1, None at offset 0) and ``emitted`` (steps cut so far)
        self._open: dict[tuple[int, int], dict[str, Any]] = {}

    @property
    def window(self) -> int:
        """Steps per window (burn-in and segment)."""
        return self.burn_in + self.seq_len

    def add(self, fragment: Fragment) -> list[dict[str, Any]]:
        """The windows whose segments ``fragment`` completed, one dict each (fields of the module doc)."""
        begins = fragment.begins if fragment.begins is not None else np.zeros(fragment.rewards.shape[1], bool)
        done = fragment.terminateds | fragment.truncateds
        windows = []
        for env in range(fragment.rewards.shape[1]):
            # Runs of real steps, each ending at an episode end or at the fragment's end.
            steps = np.nonzero(fragment.valid[:, env])[0]
            if not len(steps):
                continue
            ends = np.nonzero(done[steps, env])[0]
            bounds = [0, *(ends + 1).tolist()]
            if bounds[-1] != len(steps):
                bounds.append(len(steps))
            key = (fragment.worker_index, env)
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
                first, last = int(steps[lo]), int(steps[hi - 1])
                windows += self._extend(key, fragment, env, first, last + 1, bool(done[last, env]),
                                        continues=first == 0 and not begins[env])
        return windows

    def _extend(self, key: tuple[int, int], fragment: Fragment, env: int, start: int, stop: int,
                ended: bool, continues: bool) -> list[dict[str, Any]]:
        """Steps ``start..stop-1`` of ``env`` (consecutive, one episode's) join its open episode; ``ended``: the
        last of them ends it; ``continues``: they continue an episode begun in an earlier fragment (else they
        begin one). Returns the windows this completes."""
        piece = {"obs": obs_map(lambda o: o[start:stop + 1, env], fragment.obs),
                 "actions": fragment.actions[start:stop, env], "rewards": fragment.rewards[start:stop, env],
                 "terminated": fragment.terminateds[start:stop, env]}
        episode = self._open.pop(key, None)  # (put back below while the episode goes on)
        if not continues:
            episode = None  # a new episode (one left open, whose end was lost, is dropped)
        elif episode is None or not _same(obs_map(lambda a: a[-1], episode["obs"]),
                                          obs_map(lambda a: a[0], piece["obs"])):
            return []  # its episode began unseen (a fragment between was lost): no window could start right
        if episode is None:
            episode = {**piece, "offset": 0, "before": None, "emitted": 0}
        else:  # the piece's first observation is the open episode's last (the one after its newest step)
            episode.update({
                "obs": obs_map(lambda a, b: np.concatenate([a[:-1], b]), episode["obs"], piece["obs"]),
                **{name: np.concatenate([episode[name], piece[name]]) for name in ("actions", "rewards",
                                                                                    "terminated")}})
        windows = []
        length = episode["offset"] + len(episode["rewards"])  # the episode's steps so far
        while episode["emitted"] + self.seq_len <= length or (ended and episode["emitted"] < length):
            begin = episode["emitted"]
            end = min(begin + self.seq_len, length)
            windows.append(self._window(episode, max(0, begin - self.burn_in), begin, end))
            episode["emitted"] = end
        if ended:
            return windows
        keep = max(0, episode["emitted"] - self.burn_in) - episode["offset"]  # steps no window will need again
        if keep > 0:
            episode["before"] = episode["actions"][keep - 1].copy()  # (not a view pinning its fragment)
            for name in ("actions", "rewards", "terminated"):
                episode[name] = episode[name][keep:]
            episode["obs"] = obs_map(lambda a: a[keep:], episode["obs"])
            episode["offset"] += keep
        self._open[key] = episode
        return windows

    def _window(self, episode: dict[str, Any], first: int, begin: int, end: int) -> dict[str, Any]:
        """Episode steps ``first..end-1`` (burn-in ``first..begin-1``), padded to :attr:`window` steps."""
        a, b = first - episode["offset"], end - episode["offset"]
        steps, width = b - a, self.window

        def pad(array: np.ndarray, rows: int) -> np.ndarray:
            out = np.zeros((rows, *array.shape[1:]), array.dtype)
            out[:len(array)] = array
            return out

        valid = np.zeros(width, bool)
        valid[:steps] = True
        train = np.zeros(width, bool)
        train[begin - first:steps] = True
        discounts = self.gamma * (1.0 - episode["terminated"][a:b].astype(np.float32))
        actions = episode["actions"]
        previous = actions[a - 1] if a else episode["before"]
        if previous is None:  # (the window begins its episode)
            previous = np.full(actions.shape[1:], NO_ACTION, actions.dtype)
        return {"obs": obs_map(lambda o: pad(o[a:b + 1], width + 1), episode["obs"]),
                "actions": pad(actions[a:b], width), "rewards": pad(episode["rewards"][a:b], width),
                "discounts": pad(discounts.astype(np.float32), width), "train": train, "valid": valid,
                "prev_actions": np.asarray(previous).copy()}


def _same(a: ObsArray, b: ObsArray) -> bool:
    """Whether two observations are equal, leaf by leaf."""
    if isinstance(a, dict):
        return all(np.array_equal(a[name], b[name]) for name in a)
    return bool(np.array_equal(a, b))


class SequenceReplayBuffer:
    """Uniform replay over the newest ``capacity`` windows (:class:`EpisodeSequencer`)."""

    def __init__(self, capacity: int, obs: ObsSpec, window: int, action_shape: tuple[int, ...],
                 action_dtype: Any, rng: np.random.Generator) -> None:
        """``capacity`` in windows of ``window`` steps; ``obs``: the observations' stored form."""
        self.capacity, self.window, self.spec, self.rng = capacity, window, obs, rng
        self.obs = {name: np.zeros((capacity, window + 1, *obs.shapes[name]), obs.dtypes[name])
                    for name in obs.leaves}
        self.steps = {
            "actions": np.zeros((capacity, window, *action_shape), action_dtype),
            "rewards": np.zeros((capacity, window), np.float32),
            "discounts": np.zeros((capacity, window), np.float32),
            "train": np.zeros((capacity, window), bool),
            "valid": np.zeros((capacity, window), bool),
            "prev_actions": np.full((capacity, *action_shape), NO_ACTION, action_dtype),  # (one per window)
        }
        self.size = self.cursor = 0
        self.transitions = 0  # steps held that the loss learns from (each segment's, burn-in not counted)

    def __len__(self) -> int:
        """Windows held."""
        return self.size

    @property
    def segment_steps(self) -> float:
        """Trained steps per held window, on average (a replayed batch of windows replays this many each)."""
        return max(1.0, self.transitions / self.size) if self.size else float(self.window)

    def add(self, windows: list[dict[str, Any]]) -> np.ndarray:
        """Store windows (the oldest overwritten); return their slots."""
        windows = windows[-self.capacity:]
        slots = (self.cursor + np.arange(len(windows))) % self.capacity
        self.transitions -= int(self.steps["train"][slots].sum())  # (the windows these overwrite)
        for slot, window in zip(slots, windows, strict=True):
            leaf = window["obs"] if not self.spec.single else {"": window["obs"]}
            for name, array in self.obs.items():
                array[slot] = leaf[name]
            for name, array in self.steps.items():
                array[slot] = window[name]
        self.transitions += int(self.steps["train"][slots].sum())
        self.cursor = (self.cursor + len(windows)) % self.capacity
        self.size = min(self.size + len(windows), self.capacity)
        return slots

    def sample(self, batch_size: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
        """(windows, slots, importance weights (ones)) of ``batch_size`` windows drawn uniformly."""
        start = 0 if self.size == self.capacity else (self.cursor - self.size) % self.capacity
        slots = (start + self.rng.integers(0, self.size, batch_size)) % self.capacity
        return self._gather(slots), slots, np.ones(batch_size, np.float32)

    def _gather(self, slots: np.ndarray) -> dict[str, Any]:
        obs: ObsArray = {name: array[slots] for name, array in self.obs.items()}
        return {"obs": obs[""] if self.spec.single else obs, **{name: a[slots] for name, a in self.steps.items()}}

    def update_priorities(self, slots: np.ndarray, td_errors: np.ndarray) -> None:
        """Uniform replay ignores priorities."""

    def state(self) -> dict[str, np.ndarray]:
        """The stored windows as plain arrays, oldest first (what a checkpoint saves): ``obs`` (``obs/<leaf>``
        for Dict observations) and each per-step field."""
        slots = (self.cursor - self.size + np.arange(self.size)) % self.capacity
        out = {("obs" if self.spec.single else f"obs/{name}"): array[slots] for name, array in self.obs.items()}
        return {**out, **{name: array[slots] for name, array in self.steps.items()}}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Replace the contents with :meth:`state`'s arrays; ValueError, before changing anything, when they do
        not fit this buffer (shapes, dtypes, non-finite numbers). A state saved before windows held
        ``prev_actions`` loads with none (what its windows were learned with: a zero last action)."""
        n = len(state.get("rewards", ()))
        if "prev_actions" not in state and "rewards" in state:
            own = self.steps["prev_actions"]
            state = {**state, "prev_actions": np.full((n, *own.shape[1:]), NO_ACTION, own.dtype)}
        expected = {("obs" if self.spec.single else f"obs/{name}"): array for name, array in self.obs.items()}
        expected.update(self.steps)
        for key, own in expected.items():
            got = state.get(key)
            if got is None:
                raise ValueError(f"replay field '{key}' is missing")
            if got.shape != (n, *own.shape[1:]) or got.dtype != own.dtype:
                raise ValueError(f"replay field '{key}' is {got.dtype} {got.shape}, this buffer {own.dtype} "
                                 f"{('N', *own.shape[1:])}")
            if got.dtype.kind == "f" and not np.isfinite(got).all():
                raise ValueError(f"replay field '{key}' holds non-finite numbers")
        self.size = self.cursor = self.transitions = 0
        self.steps["train"][:] = False  # (nothing held: no trained steps left to overwrite)
        rows = range(max(0, n - self.capacity), n)
        windows = [{"obs": state["obs"][i] if self.spec.single else {name: state[f"obs/{name}"][i]
                                                                      for name in self.obs},
                    **{name: state[name][i] for name in (*STEP_FIELDS, "prev_actions")}} for i in rows]
        self.add(windows)
