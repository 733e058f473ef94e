"""Envs for benchmarks and tests, registered with Gymnasium on ``import herdrl.env``.

* ``herd/Latency-v0`` (:class:`LatencyEnv`): each step *sleeps* ``step_latency_s``, like a simulator
  waiting on I/O or another process. Sampling it is latency-bound, so runners scale on a small machine.
* ``herd/Faulty-v0`` (:class:`FaultyEnv`): raises on its Nth step, to exercise runner fault tolerance.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np


class LatencyEnv(gym.Env):
    """A CartPole-sized env whose step costs ``step_latency_s`` of wall-clock time, not CPU.

    ``env_config``: ``step_latency_s`` (default 0.002), ``episode_len`` (default 200). Reward 1 per step
    for action 1, 0 for action 0, so a policy can learn something.
    """

    metadata: dict = {"render_modes": []}

    def __init__(self, step_latency_s: float = 0.002, episode_len: int = 200) -> None:
        if step_latency_s < 0 or episode_len < 1:
            raise ValueError("LatencyEnv needs step_latency_s >= 0 and episode_len >= 1")
        self.step_latency_s = float(step_latency_s)
        self.episode_len = int(episode_len)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start an episode with a random observation."""
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        """Sleep for the step latency, then return a random observation and reward ``action``."""
        if self.step_latency_s:
            time.sleep(self.step_latency_s)
        self._t += 1
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, float(action), False, self._t >= self.episode_len, {}


class FaultyEnv(LatencyEnv):
    """Raises ``RuntimeError`` on step ``fail_at_step`` (counted over the env's lifetime).

    With ``fail_once_file``, only the first env to get there fails (it creates the file); the rest and
    any restarted runners run normally — so a test sees exactly one failure.
    """

    def __init__(self, fail_at_step: int = 100, fail_once_file: str | None = None, **kwargs) -> None:
        kwargs.setdefault("step_latency_s", 0.0)
        super().__init__(**kwargs)
        self.fail_at_step = int(fail_at_step)
        self.fail_once_file = fail_once_file
        self._lifetime_steps = 0

    def step(self, action):
        """Fail on the configured step, else step as LatencyEnv."""
        self._lifetime_steps += 1
        if self._lifetime_steps == self.fail_at_step and self._claim_failure():
            raise RuntimeError(f"FaultyEnv: injected failure at step {self.fail_at_step} (pid {os.getpid()})")
        return super().step(action)

    def _claim_failure(self) -> bool:
        if self.fail_once_file is None:
            return True
        try:
            os.close(os.open(self.fail_once_file, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


def register() -> None:
    """Register the testing envs with Gymnasium (idempotent)."""
    for env_id, entry_point in (("herd/Latency-v0", "herdrl.env.testing:LatencyEnv"),
                                ("herd/Faulty-v0", "herdrl.env.testing:FaultyEnv")):
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point)
