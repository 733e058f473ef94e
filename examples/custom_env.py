"""Train PPO on your own Gymnasium env registered under a name: python examples/custom_env.py"""

import gymnasium as gym
import numpy as np

import herdrl
from herdrl import PPOConfig


class Corridor(gym.Env):
    """Walk right to the end of a corridor."""

    def __init__(self, length: int = 5):
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, length, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([self.pos], np.float32), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos >= self.length
        return np.array([self.pos], np.float32), 1.0 if done else -0.1, done, False, {}


if __name__ == "__main__":
    herdrl.register_env("corridor", lambda cfg: gym.wrappers.TimeLimit(Corridor(**cfg), 100))
    algo = PPOConfig().environment("corridor", env_config={"length": 8}).debugging(seed=0).build()
    for _ in range(10):
        result = algo.train()
        print(result["training_iteration"], round(result["episode_return_mean"], 2))
    algo.stop()
