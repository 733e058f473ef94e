"""Algorithm: builds runners and the learner's module, runs iterations, reports one flat result row.

Subclasses implement ``setup()`` (optimizers) and ``training_step()`` (sample,
update, return the learner's metrics); everything else lives here.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.config import AlgorithmConfig
from herdrl.env import ObsEncoder, env_reward_threshold
from herdrl.errors import ConfigError
from herdrl.models import ActorCritic
from herdrl.rollout import Fragment
from herdrl.rollout.group import make_runner_group

#: Episodes the running ``episode_return_mean`` averages over (DESIGN.md, Definitions).
EPISODE_WINDOW = 100


def learner_device(num_gpus: float) -> torch.device:
    """``cuda`` when GPUs are asked for and torch sees one; a clear error when it does not."""
    if num_gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"num_gpus={num_gpus:g} but torch sees no GPU (torch {torch.__version__}); "
                          "set num_gpus=0 or install a CUDA build of torch")
    return torch.device("cuda")


class Algorithm:
    """Base of every algorithm. Build it with ``XxxConfig(...).build()``, then call ``train()``."""

    config: AlgorithmConfig

    def __init__(self, config: AlgorithmConfig, logger: Any = None) -> None:
        self.config = config
        self.logger = logger
        if config.seed is not None:
            torch.manual_seed(config.seed)
        self.rng = np.random.default_rng(config.seed)
        self.device = learner_device(config.num_gpus)
        if config.num_env_runners > 0:
            env_reward_threshold(config.env)  # an unknown env id fails here, before Ray starts
        self.runners = make_runner_group(config)
        self.observation_space: gym.Space = self.runners.observation_space
        self.action_space: gym.Space = self.runners.action_space
        self.encode = ObsEncoder(self.observation_space)
        self.module = ActorCritic(self.encode.dim, self.action_space, config.model).to(self.device)
        self.iteration = 0
        self.env_steps_lifetime = 0
        self.episodes_lifetime = 0
        self.time_total_s = 0.0
        self._returns: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self._lengths: deque[int] = deque(maxlen=EPISODE_WINDOW)
        self._iter_steps = self._iter_episodes = 0
        self._iter_sample_time = 0.0
        self.setup()

    # ------------------------------------------------------- for subclasses
    def setup(self) -> None:
        """Create optimizers and algorithm state; called at the end of ``__init__``."""

    def training_step(self) -> dict[str, float]:
        """Sample, update, and return the learner's metrics (losses, ...)."""
        raise NotImplementedError

    def sample(self) -> list[Fragment]:
        """Send the current weights to the runners and collect one fragment from each."""
        start = time.perf_counter()
        fragments = self.runners.sample(self.get_weights())
        for fragment in fragments:
            self._iter_steps += fragment.env_steps
            self._iter_episodes += len(fragment.episode_returns)
            self._returns.extend(fragment.episode_returns)
            self._lengths.extend(fragment.episode_lengths)
        self._iter_sample_time += time.perf_counter() - start
        return fragments

    # ------------------------------------------------------------- public
    def train(self) -> dict[str, Any]:
        """Run one iteration; return its result row (a flat dict) and pass it to the logger."""
        start = time.perf_counter()
        self._iter_steps = self._iter_episodes = 0
        self._iter_sample_time = 0.0
        learner_metrics = self.training_step()
        elapsed = time.perf_counter() - start
        self.iteration += 1
        self.env_steps_lifetime += self._iter_steps
        self.episodes_lifetime += self._iter_episodes
        self.time_total_s += elapsed
        result: dict[str, Any] = {
            "training_iteration": self.iteration,
            "num_env_steps_sampled_lifetime": self.env_steps_lifetime,
            "num_env_steps_sampled": self._iter_steps,
            "num_episodes_lifetime": self.episodes_lifetime,
            "num_episodes": self._iter_episodes,
            "episode_return_mean": _mean(self._returns),
            "episode_return_min": min(self._returns, default=math.nan),
            "episode_return_max": max(self._returns, default=math.nan),
            "episode_len_mean": _mean(self._lengths),
            "num_healthy_env_runners": self.runners.num_healthy,
            "num_env_runner_restarts": self.runners.num_restarts,
            **learner_metrics,
            "time_this_iter_s": elapsed,
            "time_total_s": self.time_total_s,
            "sample_time_s": self._iter_sample_time,
            "learn_time_s": elapsed - self._iter_sample_time,
            "env_steps_per_s": self._iter_steps / elapsed if elapsed > 0 else math.nan,
        }
        if self.logger is not None:
            self.logger.log(result)
        return result

    def get_weights(self) -> dict[str, np.ndarray]:
        """The learner module's weights as numpy arrays (copies: safe to ship while learning goes on)."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.module.state_dict().items()}

    @torch.no_grad()
    def compute_single_action(self, obs: Any, explore: bool = False) -> Any:
        """The action for one observation: an int (Discrete) or an array clipped to the Box bounds."""
        encoded = torch.from_numpy(self.encode(np.asarray(obs)[None])).to(self.device)
        action = self.module.act(encoded, explore=explore)[0].cpu().numpy()
        if isinstance(self.action_space, gym.spaces.Discrete):
            return int(action) + int(self.action_space.start)
        action = action.reshape(self.action_space.shape)
        return np.clip(action, self.action_space.low, self.action_space.high)

    def stop(self) -> None:
        """Release runners (and a Ray this algorithm started) and close the logger."""
        self.runners.stop()
        if self.logger is not None:
            self.logger.close()


def _mean(values: deque) -> float:
    return float(np.mean(values)) if values else math.nan
