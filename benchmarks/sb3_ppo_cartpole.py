"""Stable-Baselines3 PPO on CartPole-v1 with the rl-baselines3-zoo hyperparameters, stopping when solved.

Run by time_to_solve.py in its own process. Prints ``SOLVED <unix time> <env steps>`` as soon as the mean
return of the last 100 finished training episodes reaches the target (checked whenever an episode ends,
like ../shared/peers/sb3_ppo_cartpole.py), then exits. zoo: n_envs 8, n_steps 32, batch 256, gae_lambda 0.8,
gamma 0.98, 20 epochs, ent 0, lr lin 1e-3, clip lin 0.2, 1e5 steps.
"""

import sys
import time

import numpy as np
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env


class StopWhenSolved(BaseCallback):
    def __init__(self, target: float) -> None:
        super().__init__()
        self.target = target

    def _on_step(self) -> bool:
        buffer = self.model.ep_info_buffer
        if any(self.locals["dones"]) and len(buffer) >= 100:
            if np.mean([e["r"] for e in buffer]) >= self.target:
                print(f"SOLVED {time.time():.3f} {self.num_timesteps}", flush=True)
                return False
        return True


def main() -> None:
    seed = int(sys.argv[1])
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                ent_coef=0.0, learning_rate=lambda p: p * 1e-3, clip_range=lambda p: p * 0.2, seed=seed,
                verbose=0, device="cpu")
    model.learn(total_timesteps=100_000, callback=StopWhenSolved(475.0))


if __name__ == "__main__":
    main()
