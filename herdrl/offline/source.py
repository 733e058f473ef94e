"""An offline algorithm's stand-in for env runners (:class:`DatasetSource`): its dataset and its spaces."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from herdrl.errors import HerdError
from herdrl.offline.dataset import DatasetError, open_dataset
from herdrl.offline.recorder import EpisodeRecorder
from herdrl.rollout.group import make_runner_group


def _same_space(a: gym.Space, b: gym.Space, bounds: bool = False) -> bool:
    """Same kind, shape, dtype and size; with ``bounds``, Box bounds too (an action Box: CQL's and IQL's actors
    scale actions to the dataset's bounds, and the env must take them in the same units). Observation bounds may
    differ between a dataset's metadata and its env."""
    if type(a) is not type(b):
        return False
    if isinstance(a, gym.spaces.Dict):
        return a.spaces.keys() == b.spaces.keys() and all(_same_space(a[k], b[k], bounds) for k in a.spaces)
    if isinstance(a, gym.spaces.Tuple):
        return len(a.spaces) == len(b.spaces) and all(_same_space(x, y, bounds) for x, y in zip(a.spaces, b.spaces,
                                                                                                  strict=True))
    if isinstance(a, gym.spaces.Discrete):
        return a.n == b.n and a.start == b.start
    if bounds and isinstance(a, gym.spaces.Box) and a.shape == b.shape and not (
            np.allclose(a.low, b.low, rtol=1e-6, atol=0) and np.allclose(a.high, b.high, rtol=1e-6, atol=0)):
        return False
    if isinstance(a, gym.spaces.MultiDiscrete):
        return a == b  # (gymnasium's own: nvec, start, shape and dtype)
    return a.shape == b.shape and a.dtype == b.dtype


def check_spaces(dataset: Any, env_id: Any, env_config: dict | None) -> None:
    """Refuse (:class:`DatasetError`, one line) a dataset whose spaces are not those of the env ``env_id``."""
    from herdrl.env import make_single_env

    env = make_single_env(env_id, env_config or {})
    try:
        for kind, ours, theirs in (("observation", dataset.observation_space, env.observation_space),
                                   ("action", dataset.action_space, env.action_space)):
            if not _same_space(ours, theirs, bounds=kind == "action"):
                raise DatasetError(f"the dataset's {kind} space {ours} is not the env's ({theirs}): record it on "
                                   f"{env_id}, or evaluate on the env it was recorded on")
    finally:
        env.close()


class DatasetSource:
    """An offline algorithm's stand-in for env runners: the dataset's spaces (checked against the env's, when one
    is given), and nothing to sample."""

    num_restarts = num_healthy = num_waiting = num_target = 0
    in_fixed_group = False

    def __init__(self, config: Any) -> None:
        self.dataset = open_dataset(config.input_)
        self.observation_space: gym.Space = self.dataset.observation_space
        self.action_space: gym.Space = self.dataset.action_space
        if config.env is not None:
            check_spaces(self.dataset, config.env, config.env_config)

    def sample(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Offline algorithms read their dataset: there is nothing to sample."""
        raise HerdError("an offline algorithm does not sample env steps")

    def reseed(self, epoch: int) -> None:
        """Nothing to reseed (batches are drawn from the algorithm's own seeded stream)."""

    def stop(self) -> None:
        """Nothing to stop."""


def sample_source(config: Any) -> Any:
    """Where an algorithm's samples come from: an offline algorithm's dataset (:class:`DatasetSource`), else its
    env runners (``herdrl.rollout.group``), recording the episodes they play where ``output`` says."""
    if config.learns_offline:
        return DatasetSource(config)
    return make_runner_group(config, recorder=EpisodeRecorder if config.output else None)
