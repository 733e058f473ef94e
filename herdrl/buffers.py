"""Replay buffers for off-policy algorithms: uniform and prioritized (proportional, Schaul et al. 2016).

Transitions are stored as numpy rings: ``obs``, ``actions``, ``rewards`` (the n-step discounted sum),
``next_obs`` and ``discounts`` (gamma**k for a k-step transition, 0 when the episode terminated inside it,
so a truncated episode still bootstraps from its final observation). Observations keep their stored dtypes
(``herdrl.obs``: uint8 frames stay uint8, 4x less memory than float32); a Dict/Tuple observation is one ring
per leaf. Image leaves keep each distinct frame once (``herdrl.frame_store``: a 4-frame stack's transition
costs one frame, not eight); every other leaf holds each transition's own ``obs`` and ``next_obs``, so
transitions never depend on their neighbours (n-step, episode ends, several runners' fragments interleaved).
"""

from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np

from herdrl.frame_store import FrameStore, frame_units
from herdrl.models.encoders import image_layout
from herdrl.obs import ObsArray, ObsSpec, obs_map
from herdrl.rollout.runner import Fragment

logger = logging.getLogger(__name__)
#: Transitions re-added per step when a saved buffer is loaded (bounds the memory of rebuilding frames).
LOAD_CHUNK = 4096
REPLAY_DEFAULTS = {"type": "uniform", "capacity": 100_000, "alpha": 0.6, "beta": 0.4}
#: A transition's fields besides its observations, one array each.
SCALARS = ("actions", "rewards", "discounts")


def check_replay_config(replay_config: dict, batch_size: int) -> None:
    """Raise ConfigError for unknown keys, a wrong type, or a capacity below one batch."""
    from herdrl.errors import ConfigError

    unknown = set(replay_config) - set(REPLAY_DEFAULTS)
    if unknown:
        raise ConfigError(f"replay_buffer_config key '{sorted(unknown)[0]}' is unknown; "
                          f"known: {sorted(REPLAY_DEFAULTS)}")
    replay = {**REPLAY_DEFAULTS, **replay_config}
    if replay["type"] not in ("uniform", "prioritized"):
        raise ConfigError(f"replay_buffer_config type got {replay['type']!r}; expected uniform or prioritized")
    if not (isinstance(replay["capacity"], int) and replay["capacity"] >= batch_size):
        raise ConfigError(f"replay_buffer_config capacity got {replay['capacity']!r}; expected an int >= "
                          f"train_batch_size ({batch_size})")


def make_buffer(replay_config: dict, obs: ObsSpec | int, rng: np.random.Generator,
                action_dim: int | None = None) -> ReplayBuffer:
    """The buffer a ``replay_buffer_config`` describes (``type`` uniform or prioritized)."""
    replay = {**REPLAY_DEFAULTS, **replay_config}
    if replay["type"] == "prioritized":
        return PrioritizedReplayBuffer(replay["capacity"], obs, rng, alpha=replay["alpha"], beta=replay["beta"],
                                       action_dim=action_dim)
    return ReplayBuffer(replay["capacity"], obs, rng, action_dim)


def fragment_transitions(fragment: Fragment, gamma: float, n_step: int = 1) -> dict[str, np.ndarray]:
    """The real steps of a fragment as (n-step) transitions; n-step sums are cut at episode and fragment ends."""
    steps, envs = fragment.rewards.shape
    rewards = np.zeros((steps, envs), np.float32)
    discounts = np.ones((steps, envs), np.float32)
    next_index = np.tile(np.arange(steps)[:, None], (1, envs))
    alive = np.ones((steps, envs), bool)  # still adding rewards to each transition
    for k in range(n_step):
        t_k = np.arange(steps)[:, None] + k
        inside = (t_k < steps) & alive
        t_k = np.minimum(t_k, steps - 1)
        cols = np.arange(envs)[None, :]
        r = fragment.rewards[t_k, cols]
        rewards += np.where(inside, discounts * r, 0.0)
        discounts = np.where(inside, discounts * gamma, discounts)
        next_index = np.where(inside, t_k, next_index)
        ended = fragment.terminateds[t_k, cols] | fragment.truncateds[t_k, cols]
        discounts = np.where(inside & fragment.terminateds[t_k, cols], 0.0, discounts)
        alive = inside & ~ended
    valid = fragment.valid
    cols = np.broadcast_to(np.arange(envs)[None, :], (steps, envs))
    return {
        "obs": obs_map(lambda o: o[:-1][valid], fragment.obs),
        "actions": fragment.actions[valid],
        "rewards": rewards[valid],
        "next_obs": obs_map(lambda o: o[next_index[valid] + 1, cols[valid]], fragment.obs),
        "discounts": discounts[valid],
    }


class ReplayBuffer:
    """Uniform replay over the last ``capacity`` transitions."""

    def __init__(self, capacity: int, obs: ObsSpec | int, rng: np.random.Generator,
                 action_dim: int | None = None) -> None:
        """``obs``: the observations' stored form (an int n: float32 vectors of size n); ``action_dim=None``:
        Discrete actions (int64 indices), else float32 vectors of that size."""
        self.capacity, self.rng = capacity, rng
        self.spec = ObsSpec(gym.spaces.Box(-np.inf, np.inf, (obs,), np.float32)) if isinstance(obs, int) else obs
        self.frames = self._frame_stores()
        # np.zeros commits memory page by page as transitions arrive: a large, part-filled buffer costs what it holds.
        plain = lambda: {name: np.zeros((capacity, *self.spec.shapes[name]), self.spec.dtypes[name])  # noqa: E731
                         for name in self.spec.leaves if name not in self.frames}
        self._plain = {"obs": plain(), "next_obs": plain()}
        self.actions = np.zeros(capacity, np.int64) if action_dim is None else np.zeros((capacity, action_dim),
                                                                                        np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.discounts = np.zeros(capacity, np.float32)
        self.size = self.cursor = 0
        self._warned = False

    def _frame_stores(self) -> dict[str, FrameStore]:
        """A :class:`FrameStore` per image leaf with integer pixels (frames stored once)."""
        stores = {}
        for name, space in self.spec.leaves.items():
            image = image_layout(space)
            if image is not None and not np.issubdtype(self.spec.dtypes[name], np.floating):
                shape = self.spec.shapes[name]
                stores[name] = FrameStore(self.capacity, shape, self.spec.dtypes[name], frame_units(shape, image[3]))
        return stores

    @property
    def obs(self) -> ObsArray | None:
        """Stored observations of the leaves kept as arrays (all but image leaves, see :attr:`frames`): an array
        for a one-leaf space, else leaf -> array; None when the only leaf is an image."""
        return self._plain_view("obs")

    @property
    def next_obs(self) -> ObsArray | None:
        """Like :attr:`obs`, for the next observations."""
        return self._plain_view("next_obs")

    def _plain_view(self, field: str) -> ObsArray | None:
        arrays = self._plain[field]
        return arrays.get("") if self.spec.single else arrays

    def __len__(self) -> int:
        return self.size

    def add(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Store transitions (oldest overwritten); return the slots they went to."""
        if len(batch["rewards"]) > self.capacity:  # only the newest would stay
            batch = {key: obs_map(lambda a: a[-self.capacity:], value) for key, value in batch.items()}
        n = len(batch["rewards"])
        slots = (self.cursor + np.arange(n)) % self.capacity
        for key in SCALARS:
            getattr(self, key)[slots] = batch[key]
        leaf = (lambda obs, name: obs) if self.spec.single else (lambda obs, name: obs[name])  # noqa: E731
        for field in ("obs", "next_obs"):
            for name, array in self._plain[field].items():
                array[slots] = leaf(batch[field], name)
        for name, store in self.frames.items():
            store.put(slots, leaf(batch["obs"], name), leaf(batch["next_obs"], name))
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        if self.frames:
            self._drop_lost_frames()
        return slots

    def _drop_lost_frames(self) -> None:
        """Drop the oldest transitions up to the newest one whose frames the ring overwrote."""
        stores = [store for store in self.frames.values() if store.may_have_lost()]
        if not stores:
            return
        stored = self._stored_slots()
        lost = max(store.lost_before(stored) for store in stores)
        if lost:
            self._forget(stored[:lost])
            self.size -= lost
            if not self._warned:
                self._warned = True
                logger.info("herdrl: the replay buffer's frame ring is full before its %d transitions are: it "
                            "holds %d (episodes or fragments this short share few frames)", self.capacity, self.size)

    def _forget(self, slots: np.ndarray) -> None:
        """Transitions at ``slots`` left the buffer early (their frames were overwritten)."""

    def sample(self, batch_size: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """(transitions, slots, importance weights) of ``batch_size`` transitions drawn uniformly."""
        # The stored window (its start moves when transitions leave early); full, the slots themselves, as before.
        start = 0 if self.size == self.capacity else (self.cursor - self.size) % self.capacity
        slots = (start + self.rng.integers(0, self.size, batch_size)) % self.capacity
        return self._gather(slots), slots, np.ones(batch_size, np.float32)

    def update_priorities(self, slots: np.ndarray, td_errors: np.ndarray) -> None:
        """Uniform replay ignores priorities."""

    def _gather(self, slots: np.ndarray) -> dict[str, ObsArray]:
        out: dict[str, ObsArray] = {key: getattr(self, key)[slots] for key in SCALARS}
        for field in ("obs", "next_obs"):
            leaves = {name: array[slots] for name, array in self._plain[field].items()}
            leaves.update({name: store.get(slots, field == "next_obs") for name, store in self.frames.items()})
            out[field] = leaves[""] if self.spec.single else {name: leaves[name] for name in self.spec.leaves}
        return out

    def _stored_slots(self) -> np.ndarray:
        """Slots holding transitions, oldest first."""
        return (self.cursor - self.size + np.arange(self.size)) % self.capacity

    def _key(self, field: str, name: str) -> str:
        """A leaf's key in :meth:`state`: ``field`` for a one-leaf space, else ``field/<leaf>``."""
        return field if self.spec.single else f"{field}/{name}"

    def state(self) -> dict[str, np.ndarray]:
        """The stored transitions as plain arrays, oldest first (what a checkpoint saves).

        Leaves under ``obs`` and ``next_obs`` (``obs/<leaf>`` for Dict/Tuple observations); image leaves as
        ``frames`` (each stored frame once) with ``obs_frames`` and ``next_obs_frames``, each transition's
        indices into them.
        """
        slots = self._stored_slots()
        out = {key: getattr(self, key)[slots] for key in SCALARS}
        for field in ("obs", "next_obs"):
            out.update({self._key(field, name): array[slots] for name, array in self._plain[field].items()})
        for name, store in self.frames.items():
            first = int(store.oldest[slots].min()) if len(slots) else store.written
            out[self._key("frames", name)] = store.units[np.arange(first, store.written) % store.size]
            out[self._key("obs_frames", name)] = store.obs_ids[slots] - first
            out[self._key("next_obs_frames", name)] = store.next_ids[slots] - first
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Replace the contents with :meth:`state`'s arrays (the newest ``capacity`` of them if there are more),
        also from a checkpoint that saved image leaves as whole observations (before frames were stored once).

        Raises ValueError, before changing anything, when the arrays do not fit this buffer.
        """
        self._check_state(state)
        self._fill(state)

    def _check_state(self, state: dict[str, np.ndarray]) -> None:
        """Raise ValueError unless ``state`` holds arrays this buffer can load (shapes, kinds, frame indices)."""
        if np.ndim(state.get("rewards")) != 1:
            raise ValueError("replay field 'rewards' is missing or not one value per transition")
        n = len(state["rewards"])
        expected = {key: (n, *getattr(self, key).shape[1:]) for key in SCALARS}
        for name in self.spec.leaves:
            shape = (n, *self.spec.shapes[name])
            store = self.frames.get(name)
            if store is not None and self._key("frames", name) in state:
                frames = state[self._key("frames", name)]
                if frames.shape[1:] != store.unit_shape or frames.dtype != store.dtype:
                    raise ValueError(f"replay field '{self._key('frames', name)}' has frames of {frames.dtype} "
                                     f"{frames.shape[1:]}, this buffer {store.dtype} {store.unit_shape}")
                for field in ("obs_frames", "next_obs_frames"):
                    key = self._key(field, name)
                    ids = state.get(key)
                    expected[key] = (n, store.per_obs)
                    if ids is not None and not (ids.dtype.kind in "iu" and (not ids.size or (
                            0 <= ids.min() and ids.max() < len(frames)))):
                        raise ValueError(f"replay field '{key}' is not indices into its frames")
            else:
                expected.update({self._key(field, name): shape for field in ("obs", "next_obs")})
        for key, shape in expected.items():
            if key not in state:
                raise ValueError(f"replay field '{key}' is missing")
            if state[key].shape != shape:
                raise ValueError(f"replay field '{key}' has shape {state[key].shape}, this buffer "
                                 f"{('N', *shape[1:])}")
        for key in SCALARS:  # numbers of the kind stored: integer actions for Discrete, finite floats
            array, own = state[key], getattr(self, key)
            if array.dtype.kind not in ("iu" if own.dtype.kind == "i" else "fiu") or (
                    array.dtype.kind == "f" and not np.isfinite(array).all()):
                raise ValueError(f"replay field '{key}' holds {array.dtype} values, this buffer {own.dtype}")
        if self.actions.dtype.kind == "i" and state["actions"].size and state["actions"].min() < 0:
            raise ValueError("replay field 'actions' holds negative action indices")

    def _fill(self, state: dict[str, np.ndarray]) -> None:
        """Load a checked ``state``."""
        n = len(state["rewards"])
        self.size = self.cursor = 0
        self.frames = self._frame_stores()  # empty rings
        chunk = max(1, min(LOAD_CHUNK, self.capacity // 8))  # a chunk's frames always fit in the rings
        for start in range(max(0, n - self.capacity), n, chunk):
            self.add(self._saved_rows(state, slice(start, min(start + chunk, n))))

    def _saved_rows(self, state: dict[str, np.ndarray], rows: slice) -> dict[str, ObsArray]:
        """Rows ``rows`` of a saved state as a batch for :meth:`add` (image leaves rebuilt from their frames)."""
        batch: dict[str, ObsArray] = {key: state[key][rows] for key in SCALARS}
        for field in ("obs", "next_obs"):
            leaves = {}
            for name in self.spec.leaves:
                frames = state.get(self._key("frames", name)) if name in self.frames else None
                if frames is None:
                    leaves[name] = state[self._key(field, name)][rows]
                else:
                    ids = state[self._key(f"{field}_frames", name)][rows]
                    leaves[name] = frames[ids].reshape(len(ids), *self.spec.shapes[name])
            batch[field] = leaves[""] if self.spec.single else leaves
        return batch


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay: P(i) ~ p_i**alpha, importance weights (N P(i))**-beta / max."""

    def __init__(self, capacity: int, obs: ObsSpec | int, rng: np.random.Generator, alpha: float = 0.6,
                 beta: float = 0.4, eps: float = 1e-6, action_dim: int | None = None) -> None:
        super().__init__(capacity, obs, rng, action_dim)
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.tree_size = 1
        while self.tree_size < capacity:
            self.tree_size *= 2
        self.tree = np.zeros(2 * self.tree_size)  # sum tree; leaves hold p_i**alpha
        self.max_priority = 1.0

    def _set(self, slots: np.ndarray, values: np.ndarray) -> None:
        if not len(slots):
            return
        nodes = slots + self.tree_size
        self.tree[nodes] = values
        nodes //= 2
        while nodes[0] >= 1:
            nodes = np.unique(nodes)
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            nodes //= 2
            if nodes[0] == 0:
                break

    def add(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Store transitions with the highest priority seen so far (each is replayed at least once soon)."""
        slots = super().add(batch)
        stored = slots[max(0, len(slots) - self.size):]  # not those dropped at once (their frames are gone)
        self._set(stored, np.full(len(stored), self.max_priority ** self.alpha))
        return slots

    def sample(self, batch_size: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Draw proportionally to priority (stratified); return importance weights too."""
        if not self.size:
            raise ValueError("the replay buffer is empty")
        total = self.tree[1]
        targets = (np.arange(batch_size) + self.rng.random(batch_size)) * (total / batch_size)
        nodes = np.ones(batch_size, np.int64)
        while nodes[0] < self.tree_size:  # walk down: left if the target fits in the left subtree
            left = 2 * nodes
            go_right = targets > self.tree[left]
            targets = np.where(go_right, targets - self.tree[left], targets)
            nodes = np.where(go_right, left + 1, left)
        slots = nodes - self.tree_size
        slots[self.tree[nodes] <= 0] = (self.cursor - 1) % self.capacity  # rounding past the last stored one
        probs = self.tree[slots + self.tree_size] / total
        weights = (self.size * np.maximum(probs, 1e-12)) ** -self.beta
        return self._gather(slots), slots, (weights / weights.max()).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        """The transitions with their priorities, oldest first."""
        slots = self._stored_slots()
        return {**super().state(), "priorities": self.tree[slots + self.tree_size],
                "max_priority": np.array(self.max_priority)}

    def _check_state(self, state: dict[str, np.ndarray]) -> None:
        """Also priorities, when saved: one finite, non-negative number per transition, and their maximum."""
        super()._check_state(state)
        if "priorities" not in state:
            return  # a uniform buffer's state: every transition gets the top priority
        priorities, top = state["priorities"], state.get("max_priority")
        if not (priorities.shape == state["rewards"].shape and priorities.dtype.kind == "f"
                and np.isfinite(priorities).all() and (priorities >= 0).all()):
            raise ValueError("replay field 'priorities' is not one finite, non-negative number per transition")
        if top is None or top.shape != () or top.dtype.kind != "f" or not (np.isfinite(top) and top > 0):
            raise ValueError("replay field 'max_priority' is not one finite, positive number")

    def _fill(self, state: dict[str, np.ndarray]) -> None:
        """Transitions and priorities from :meth:`state` (a uniform buffer's state gets the top priority)."""
        self.tree[:] = 0.0  # no stale leaves beyond the new contents
        super()._fill(state)
        n = len(state["rewards"])
        if "priorities" in state and n:
            self.max_priority = float(state["max_priority"])
            self._set(self._stored_slots(), state["priorities"][n - self.size:])

    def _forget(self, slots: np.ndarray) -> None:
        """Transitions that left early are never drawn again."""
        self._set(slots, np.zeros(len(slots)))

    def update_priorities(self, slots: np.ndarray, td_errors: np.ndarray) -> None:
        """Set priorities to |TD error| + eps."""
        priorities = np.abs(td_errors) + self.eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self._set(slots, priorities ** self.alpha)
