"""Running normalisation of observations and rewards, merged across runners (RLlib's ``MeanStdFilter``, SB3's
``VecNormalize``).

**Observations** (``observation_filter="MeanStdFilter"``): every Box leaf that is not an image (floats, and integer
vectors such as Atari RAM) becomes ``clip((x - mean) / sqrt(var + 1e-8), -clip_obs, clip_obs)`` in float32; image
leaves, Discrete, MultiDiscrete and MultiBinary leaves pass through. **Rewards** (``norm_reward=True``): divided by
the running std of each env's discounted return, clipped to ``clip_reward``; reported episode returns stay raw.

Statistics are counts, means and sums of squared deviations (:class:`RunningStats`), merged with the parallel
formula of Chan, Golub and LeVeque (1979), so merging is exact: merged statistics equal those of all samples pooled.
Each runner normalises with the run's merged statistics plus its own samples since (``local``) and keeps apart
what it added (``delta``); each fragment carries the delta, the driver merges every runner's delta into the run's
statistics (:class:`Normalizer`) and sends them back with the next weights (restarted runners get them with their
first weights). The run's statistics are saved in checkpoints and held by ``Policy``, evaluation (frozen) and the
exported graph (baked in: it takes raw observations).

On-policy algorithms train on fragments as sampled (normalised with the statistics the runner had then). Off-policy
algorithms store raw observations and rewards in the replay buffer and normalise each replayed batch with the
current statistics (as SB3 does): a transition stored a million steps ago is read the way the networks read a new
one, and the buffer stays valid when the statistics move.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.obs import ObsArray, image_layout, leaf_spaces, map_leaf_spaces

EPSILON = 1e-8
FILTERS = ("NoFilter", "MeanStdFilter")
#: Weights-dict keys that carry the statistics to runners start with this.
PREFIX = "filter:"


class RunningStats:
    """Count, mean and sum of squared deviations (``m2``) of samples of one shape, in float64."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.count = 0.0
        self.mean = np.zeros(shape)
        self.m2 = np.zeros(shape)

    def update(self, batch: np.ndarray) -> None:
        """Add a batch of samples (``(n, *shape)``)."""
        n = batch.shape[0]
        if n:
            batch = batch.astype(np.float64, copy=False)
            mean = batch.mean(axis=0)
            self.merge_parts(float(n), mean, np.square(batch - mean).sum(axis=0))

    def merge_parts(self, count: float, mean: np.ndarray, m2: np.ndarray) -> None:
        """Merge statistics of other samples (Chan et al.: exact, in any order)."""
        if count <= 0:
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean = self.mean + delta * (count / total)
        self.m2 = self.m2 + m2 + np.square(delta) * (self.count * count / total)
        self.count = total

    @property
    def var(self) -> np.ndarray:
        """The population variance (1 before any sample)."""
        return self.m2 / self.count if self.count > 0 else np.ones_like(self.mean)

    def state(self) -> dict[str, np.ndarray]:
        """As plain arrays."""
        return {"count": np.array(self.count), "mean": self.mean.copy(), "m2": self.m2.copy()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state` (numpy arrays or tensors)."""
        self.count = float(_array(state["count"]))
        self.mean = _array(state["mean"]).reshape(self.mean.shape)
        self.m2 = _array(state["m2"]).reshape(self.m2.shape)


def _array(value: Any) -> np.ndarray:
    """A float64 copy of an array or a (CPU) tensor."""
    # (a duck-typed test for a tensor: this module is imported by runners that never import torch)
    return np.array(value.numpy() if hasattr(value, "detach") else value, dtype=np.float64)


def _obs_key(leaf: str) -> str:
    return f"obs/{leaf}" if leaf else "obs"


def filtered_leaves(space: gym.Space) -> list[str]:
    """The leaves ``MeanStdFilter`` normalises: Box leaves that are not images (nor an ``action_mask``)."""
    return [name for name, leaf in leaf_spaces(space).items()
            if isinstance(leaf, gym.spaces.Box) and image_layout(leaf) is None and name != "action_mask"]


def model_observation_space(space: gym.Space | dict[str, gym.Space], config: Any) -> Any:
    """What the model sees: ``space`` with each filtered leaf a float32 Box of [-clip_obs, clip_obs] (multi-agent
    runs: a dict policy id -> space, each mapped)."""
    if config.observation_filter != "MeanStdFilter":
        return space
    if isinstance(space, dict):
        return {pid: model_observation_space(sub, config) for pid, sub in space.items()}
    names = set(filtered_leaves(space))
    clip = float(config.clip_obs)
    return map_leaf_spaces(space, lambda name, leaf: gym.spaces.Box(-clip, clip, leaf.shape, np.float32)
                           if name in names else leaf)


class Normalizer:
    """Statistics of the filtered observation leaves (``obs``, or ``obs/<leaf>`` for Dict/Tuple spaces) and of
    discounted returns (``reward``)."""

    def __init__(self, space: gym.Space, config: Any) -> None:
        self.clip_obs, self.clip_reward = float(config.clip_obs), float(config.clip_reward)
        leaves = leaf_spaces(space)
        self.single = len(leaves) == 1 and "" in leaves
        self.obs_names = filtered_leaves(space) if config.observation_filter == "MeanStdFilter" else []
        self.observations = bool(self.obs_names)  # an all-image observation has nothing to filter
        self.rewards = bool(config.norm_reward)
        self.stats: dict[str, RunningStats] = {_obs_key(name): RunningStats(tuple(leaves[name].shape))
                                               for name in self.obs_names}
        if self.rewards:
            self.stats["reward"] = RunningStats(())
        self._scales: dict[str, tuple[np.ndarray, np.ndarray]] | None = None

    @property
    def active(self) -> bool:
        """Whether anything is normalised."""
        return bool(self.stats)

    # -------------------------------------------------------------------------- state
    def state(self) -> dict[str, np.ndarray]:
        """Flat ``<key>/count|mean|m2`` arrays (what checkpoints, deltas and broadcasts carry)."""
        return {f"{key}/{part}": array for key, stats in self.stats.items() for part, array in stats.state().items()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state`; a key missing from ``state`` (a checkpoint of a run without it) starts empty."""
        for key, stats in self.stats.items():
            if f"{key}/count" in state:
                stats.load_state({part: state[f"{key}/{part}"] for part in ("count", "mean", "m2")})
            else:
                stats.__init__(stats.mean.shape)
        self._scales = None

    def merge(self, delta: dict[str, Any]) -> None:
        """Merge another set of statistics (a runner's delta) into these."""
        for key, stats in self.stats.items():
            if f"{key}/count" in delta:
                stats.merge_parts(float(_array(delta[f"{key}/count"])), _array(delta[f"{key}/mean"]),
                                  _array(delta[f"{key}/m2"]))
        self._scales = None

    def reset(self) -> None:
        """Forget every sample."""
        self.load_state({})

    # -------------------------------------------------------------------------- applying
    def _obs_scales(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """(mean, 1/std) per filtered leaf in float32, cached until the statistics change."""
        if self._scales is None:
            self._scales = {name: (s.mean.astype(np.float32), (1.0 / np.sqrt(s.var + EPSILON)).astype(np.float32))
                            for name, s in ((name, self.stats[_obs_key(name)]) for name in self.obs_names)}
        return self._scales

    def observe(self, obs: ObsArray) -> None:
        """Add a batch of raw observations (leading dim: rows) to the observation statistics."""
        for name in self.obs_names:
            leaf = obs if self.single else obs[name]
            stats = self.stats[_obs_key(name)]
            stats.update(leaf.reshape(-1, *stats.mean.shape))
        self._scales = None

    def normalize(self, obs: ObsArray, out: ObsArray | None = None) -> ObsArray:
        """Raw observations (any leading dims) -> what the model sees; into ``out`` (same structure) if given.
        Unfiltered leaves are passed through (or copied into ``out``)."""
        if not self.observations:
            return obs
        scales = self._obs_scales()
        if self.single:
            return self._leaf(obs, *scales[""], None if out is None else out)
        result = {} if out is None else out
        for name, value in obs.items():
            if name in scales:
                result[name] = self._leaf(value, *scales[name], None if out is None else out[name])
            elif out is None:
                result[name] = value
            elif not np.may_share_memory(out[name], value):
                np.copyto(out[name], value)
        return result

    def _leaf(self, x: np.ndarray, mean: np.ndarray, inv_std: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        if out is None:
            out = np.empty(x.shape, np.float32)
        np.subtract(x, mean, out=out, casting="unsafe")
        np.multiply(out, inv_std, out=out)
        return np.clip(out, -self.clip_obs, self.clip_obs, out=out)

    def reward_scale(self) -> float:
        """What rewards are multiplied by: 1 / std of the discounted return (1 without reward scaling)."""
        if not self.rewards:
            return 1.0
        return float(1.0 / np.sqrt(self.stats["reward"].var + EPSILON))

    def scale_rewards(self, rewards: np.ndarray) -> np.ndarray:
        """``rewards`` (any shape) scaled and clipped as the learner sees them (an off-policy n-step reward is
        scaled and clipped as one sum)."""
        if not self.rewards:
            return rewards
        return np.clip(rewards * self.reward_scale(), -self.clip_reward, self.clip_reward).astype(np.float32)

    # -------------------------------------------------------------------------- shipping
    def to_weights(self) -> dict[str, np.ndarray]:
        """The statistics as entries of a weights dict (``filter:<key>/<part>``), sent to runners with the weights."""
        return {PREFIX + key: value for key, value in self.state().items()}


def policy_slice(state: dict[str, Any], pid: str) -> dict[str, Any]:
    """Policy ``pid``'s entries of a :class:`PolicyNormalizers` state (``<pid>.<key>``), keys without the prefix."""
    prefix = pid + "."
    return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}


class PolicyNormalizers:
    """A multi-agent run's statistics: one :class:`Normalizer` per policy (its agents' observations, their
    discounted returns), with :class:`Normalizer`'s interface; entries are named ``<policy id>.<key>/<part>``
    (policy ids have no '.')."""

    def __init__(self, spaces: dict[str, gym.Space], configs: dict[str, Any]) -> None:
        self.parts = {pid: Normalizer(space, configs[pid]) for pid, space in spaces.items()}

    @property
    def active(self) -> bool:
        """Whether any policy normalises anything."""
        return any(part.active for part in self.parts.values())

    @property
    def observations(self) -> bool:
        """Whether any policy's observations are filtered."""
        return any(part.observations for part in self.parts.values())

    def state(self) -> dict[str, np.ndarray]:
        """Every policy's :meth:`Normalizer.state`, prefixed with its id."""
        return {f"{pid}.{key}": value for pid, part in self.parts.items() for key, value in part.state().items()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state` (a policy missing from it starts empty)."""
        for pid, part in self.parts.items():
            part.load_state(policy_slice(state, pid))

    def merge(self, delta: dict[str, Any]) -> None:
        """Merge a runner's delta (prefixed as :meth:`state`) into each policy's statistics."""
        for pid, part in self.parts.items():
            part.merge(policy_slice(delta, pid))

    def reset(self) -> None:
        """Forget every sample."""
        self.load_state({})

    def copy(self, source: str, target: str) -> None:
        """Give policy ``target`` the statistics of ``source`` (a self-play snapshot of it)."""
        self.parts[target].load_state(self.parts[source].state())

    def to_weights(self) -> dict[str, np.ndarray]:
        """The statistics as entries of a weights dict, sent to runners with the weights."""
        return {PREFIX + key: value for key, value in self.state().items()}


def split_weights(weights: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(module weights, the normalisation statistics sent along, or None)."""
    if not any(key.startswith(PREFIX) for key in weights):
        return weights, None
    stats = {key[len(PREFIX):]: value for key, value in weights.items() if key.startswith(PREFIX)}
    return {key: value for key, value in weights.items() if not key.startswith(PREFIX)}, stats


class RunnerNormalizer:
    """A runner's side: ``local`` (what it normalises with: the run's statistics plus its own samples since),
    ``delta`` (its own samples since it last shipped them) and the running discounted return of each env."""

    def __init__(self, space: gym.Space, config: Any, num_envs: int) -> None:
        self.local = Normalizer(space, config)
        self.delta = Normalizer(space, config)
        self.base: dict[str, Any] = {}  # the run's statistics as last received
        self.gamma = float(config.gamma)
        self.returns = np.zeros(num_envs)
        self.scale_fragments = not getattr(config, "stores_raw_transitions", False)

    def load(self, merged: dict[str, Any]) -> None:
        """Take the run's merged statistics (the samples of this runner's shipped deltas are in them)."""
        self.base = merged
        self.local.load_state(merged)
        self.local.merge(self.delta.state())  # samples not shipped yet (none, between fragments)

    def restart(self) -> None:
        """A new timeline (reseed, resume): forget the samples not shipped and the running returns."""
        self.delta.reset()
        self.local.load_state(self.base)
        self.returns[:] = 0.0

    def observe(self, obs: ObsArray) -> None:
        """Count new raw observations in what the runner normalises with (step by step, as they arrive)."""
        self.local.observe(obs)

    def count(self, obs: ObsArray) -> None:
        """Count the same observations in the delta (a fragment's at once: cheaper than step by step)."""
        self.delta.observe(obs)

    def rewards(self, rewards: np.ndarray, terminateds: np.ndarray, truncateds: np.ndarray,
                valid: np.ndarray) -> np.ndarray:
        """Count a fragment's discounted returns (``(T, B)`` arrays) and return its rewards as the learner takes
        them: scaled by the updated statistics (on-policy), or raw (off-policy scales replayed batches)."""
        if not self.local.rewards:
            return rewards
        seen = []
        for t in range(rewards.shape[0]):  # VecNormalize's running return: discounted, reset at episode ends
            self.returns = np.where(valid[t], self.returns * self.gamma + rewards[t], self.returns)
            seen.append(self.returns[valid[t]])
            self.returns[terminateds[t] | truncateds[t]] = 0.0
        self.count_returns(np.concatenate(seen))
        return self.local.scale_rewards(rewards) if self.scale_fragments else rewards

    def count_returns(self, returns: np.ndarray) -> None:
        """Count running discounted returns in the reward statistics (what this runner scales with, and its
        delta); the multi-agent runner keeps them per agent and counts them here too."""
        self.local.stats["reward"].update(returns)
        self.delta.stats["reward"].update(returns)

    def take_delta(self) -> dict[str, np.ndarray]:
        """The samples since the last call, as a state to merge; forgets them."""
        state = self.delta.state()
        self.delta.reset()
        return state
