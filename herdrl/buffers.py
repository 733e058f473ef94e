"""Replay buffers for off-policy algorithms: uniform and prioritized (proportional, Schaul et al. 2016).

Transitions are stored as numpy rings: ``obs``, ``actions``, ``rewards`` (the n-step discounted sum),
``next_obs`` and ``discounts`` (gamma**k for a k-step transition, 0 when the episode terminated inside it,
so a truncated episode still bootstraps from its final observation). Observations keep their stored dtypes
(``herdrl.obs``: uint8 frames stay uint8, 4x less memory than float32); a Dict/Tuple observation is one ring
per leaf. Each transition holds its own ``obs`` and ``next_obs``: twice the frames a shared ring of
observations would need, in exchange for transitions that never depend on their neighbours (n-step, episode
ends, several runners' fragments interleaved in one ring).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from herdrl.obs import ObsArray, ObsSpec, obs_map
from herdrl.rollout.runner import Fragment

REPLAY_DEFAULTS = {"type": "uniform", "capacity": 100_000, "alpha": 0.6, "beta": 0.4}
#: What one stored transition is made of.
FIELDS = ("obs", "next_obs", "actions", "rewards", "discounts")


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


def _flat(fields: dict[str, ObsArray]) -> dict[str, np.ndarray]:
    """Fields as plain arrays: a Dict/Tuple observation's leaves under ``<field>/<leaf>``."""
    out: dict[str, np.ndarray] = {}
    for key, value in fields.items():
        if isinstance(value, dict):
            out.update({f"{key}/{leaf}": array for leaf, array in value.items()})
        else:
            out[key] = value
    return out


def _unflat(state: dict[str, np.ndarray], like: dict[str, ObsArray], rows: slice) -> dict[str, ObsArray]:
    """Inverse of :func:`_flat`: ``rows`` of ``state``, arranged as the fields ``like`` are."""
    return {key: {leaf: state[f"{key}/{leaf}"][rows] for leaf in value} if isinstance(value, dict)
            else state[key][rows] for key, value in like.items()}


class ReplayBuffer:
    """Uniform replay over the last ``capacity`` transitions."""

    def __init__(self, capacity: int, obs: ObsSpec | int, rng: np.random.Generator,
                 action_dim: int | None = None) -> None:
        """``obs``: the observations' stored form (an int n: float32 vectors of size n); ``action_dim=None``:
        Discrete actions (int64 indices), else float32 vectors of that size."""
        self.capacity, self.rng = capacity, rng
        spec = ObsSpec(gym.spaces.Box(-np.inf, np.inf, (obs,), np.float32)) if isinstance(obs, int) else obs
        # np.zeros commits memory page by page as transitions arrive: a large, part-filled buffer costs what it holds.
        self.obs: ObsArray = spec.zeros((capacity,))
        self.next_obs: ObsArray = spec.zeros((capacity,))
        self.actions = np.zeros(capacity, np.int64) if action_dim is None else np.zeros((capacity, action_dim),
                                                                                        np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.discounts = np.zeros(capacity, np.float32)
        self.size = self.cursor = 0

    def __len__(self) -> int:
        return self.size

    def add(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Store transitions (oldest overwritten); return the slots they went to."""
        n = len(batch["rewards"])
        slots = (self.cursor + np.arange(n)) % self.capacity
        for key in FIELDS:
            obs_map(lambda own, new: own.__setitem__(slots, new), getattr(self, key), batch[key])
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        return slots

    def sample(self, batch_size: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """(transitions, slots, importance weights) of ``batch_size`` transitions drawn uniformly."""
        slots = self.rng.integers(0, self.size, batch_size)
        return self._gather(slots), slots, np.ones(batch_size, np.float32)

    def update_priorities(self, slots: np.ndarray, td_errors: np.ndarray) -> None:
        """Uniform replay ignores priorities."""

    def _gather(self, slots: np.ndarray) -> dict[str, ObsArray]:
        return {key: obs_map(lambda own: own[slots], getattr(self, key)) for key in FIELDS}

    def _stored_slots(self) -> np.ndarray:
        """Slots holding transitions, oldest first."""
        start = self.cursor if self.size == self.capacity else 0
        return (start + np.arange(self.size)) % self.capacity

    def state(self) -> dict[str, np.ndarray]:
        """The stored transitions as plain arrays, oldest first (what a checkpoint saves); a Dict/Tuple
        observation's leaves as ``obs/<leaf>`` and ``next_obs/<leaf>``."""
        return _flat(self._gather(self._stored_slots()))

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Replace the contents with :meth:`state`'s arrays (the newest ``capacity`` of them if there are more).

        Raises ValueError when the arrays do not fit this buffer's shapes.
        """
        n = len(state["rewards"])
        own = _flat({key: getattr(self, key) for key in FIELDS})
        for key, array in own.items():
            if key not in state:
                raise ValueError(f"replay field '{key}' is missing")
            if state[key].shape[1:] != array.shape[1:] or len(state[key]) != n:
                raise ValueError(f"replay field '{key}' has shape {state[key].shape}, this buffer "
                                 f"{('N', *array.shape[1:])}")
        self.size = self.cursor = 0
        keep = slice(max(0, n - self.capacity), n)
        self.add(_unflat(state, {key: getattr(self, key) for key in FIELDS}, keep))


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
        if len(slots):
            self._set(slots, np.full(len(slots), self.max_priority ** self.alpha))
        return slots

    def sample(self, batch_size: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Draw proportionally to priority (stratified); return importance weights too."""
        total = self.tree[1]
        targets = (np.arange(batch_size) + self.rng.random(batch_size)) * (total / batch_size)
        nodes = np.ones(batch_size, np.int64)
        while nodes[0] < self.tree_size:  # walk down: left if the target fits in the left subtree
            left = 2 * nodes
            go_right = targets > self.tree[left]
            targets = np.where(go_right, targets - self.tree[left], targets)
            nodes = np.where(go_right, left + 1, left)
        slots = np.minimum(nodes - self.tree_size, self.size - 1)
        probs = self.tree[slots + self.tree_size] / total
        weights = (self.size * np.maximum(probs, 1e-12)) ** -self.beta
        return self._gather(slots), slots, (weights / weights.max()).astype(np.float32)

    def state(self) -> dict[str, np.ndarray]:
        """The transitions with their priorities, oldest first."""
        slots = self._stored_slots()
        return {**_flat(self._gather(slots)), "priorities": self.tree[slots + self.tree_size],
                "max_priority": np.array(self.max_priority)}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Transitions and priorities from :meth:`state` (a uniform buffer's state gets the top priority)."""
        self.tree[:] = 0.0  # no stale leaves beyond the new contents
        super().load_state(state)
        n = len(state["rewards"])
        if "priorities" in state and n:
            self.max_priority = float(state["max_priority"])
            self._set(self._stored_slots(), state["priorities"][max(0, n - self.capacity):])

    def update_priorities(self, slots: np.ndarray, td_errors: np.ndarray) -> None:
        """Set priorities to |TD error| + eps."""
        priorities = np.abs(td_errors) + self.eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self._set(slots, priorities ** self.alpha)
