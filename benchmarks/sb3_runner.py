"""Stable-Baselines3 with rl-baselines3-zoo hyperparameters, stopping when the 100-episode mean reaches a target.

Run by algorithms.py in its own process: ``python sb3_runner.py ALGO ENV SEED TARGET MAX_STEPS``. Prints
``SOLVED <unix time> <env steps>`` the moment the mean return of the last 100 finished training episodes
reaches TARGET (checked whenever an episode ends), then exits; prints ``UNSOLVED <steps>`` at MAX_STEPS.
"""

import sys
import time

import numpy as np
from sb3_contrib import TRPO
from stable_baselines3 import A2C, DQN, PPO, SAC
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback
from stable_baselines3.common.env_util import make_vec_env


def linear(value: float):
    return lambda progress_remaining: progress_remaining * value


# rl-baselines3-zoo hyperparams (ppo.yml, a2c.yml, trpo.yml, dqn.yml, sac.yml): n_envs and model keyword arguments.
ZOO = {
    ("PPO", "CartPole-v1"): (8, PPO, dict(n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                                          ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2))),
    ("PPO", "Pendulum-v1"): (4, PPO, dict(n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0,
                                          learning_rate=1e-3, clip_range=0.2, use_sde=True, sde_sample_freq=4)),
    ("A2C", "CartPole-v1"): (8, A2C, dict(ent_coef=0.0)),
    ("DQN", "CartPole-v1"): (1, DQN, dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                                          learning_starts=1000, gamma=0.99, target_update_interval=10,
                                          train_freq=256, gradient_steps=128, exploration_fraction=0.16,
                                          exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]))),
    ("DQN", "Acrobot-v1"): (1, DQN, dict(learning_rate=6.3e-4, batch_size=128, buffer_size=50_000,
                                         learning_starts=0, gamma=0.99, target_update_interval=250, train_freq=4,
                                         gradient_steps=-1, exploration_fraction=0.12, exploration_final_eps=0.1,
                                         policy_kwargs=dict(net_arch=[256, 256]))),
    ("SAC", "Pendulum-v1"): (1, SAC, dict(learning_rate=1e-3)),
    ("TRPO", "CartPole-v1"): (2, TRPO, dict(n_steps=512, batch_size=512, cg_damping=1e-3, gae_lambda=0.98,
                                            gamma=0.99, learning_rate=1e-3, n_critic_updates=20)),
    ("TRPO", "Pendulum-v1"): (2, TRPO, dict(n_steps=1024, gamma=0.9, n_critic_updates=15, use_sde=True,
                                            sde_sample_freq=4)),
}


#: Off-policy algorithms explore while training: judge them on greedy evaluation episodes.
EVALUATED = {"DQN", "SAC"}


class SolvedOnEvaluation(BaseCallback):
    """Called by EvalCallback after each evaluation (10 greedy episodes every 1000 env steps)."""

    def __init__(self, target: float) -> None:
        super().__init__()
        self.target = target

    def _on_step(self) -> bool:
        if self.parent.last_mean_reward >= self.target:
            print(f"SOLVED {time.time():.3f} {self.num_timesteps}", flush=True)
            return False
        return True


class StopWhenSolved(BaseCallback):
    def __init__(self, target: float) -> None:
        super().__init__()
        self.target = target

    def _on_step(self) -> bool:
        buffer = self.model.ep_info_buffer
        if any(self.locals["dones"]) and len(buffer) >= 100 and np.mean([e["r"] for e in buffer]) >= self.target:
            print(f"SOLVED {time.time():.3f} {self.num_timesteps}", flush=True)
            return False
        return True


def main() -> None:
    algo, env_id, seed, target, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), \
        int(float(sys.argv[5]))
    n_envs, cls, kwargs = ZOO[(algo, env_id)]
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    model = cls("MlpPolicy", env, seed=seed, verbose=0, device="cpu", **kwargs)
    if algo in EVALUATED:
        callback = EvalCallback(make_vec_env(env_id, n_envs=1, seed=seed + 1000), eval_freq=1000,
                                n_eval_episodes=10, deterministic=True, verbose=0,
                                callback_after_eval=SolvedOnEvaluation(target))
    else:
        callback = StopWhenSolved(target)
    model.learn(total_timesteps=max_steps, callback=callback)
    if model.num_timesteps >= max_steps:
        print(f"UNSOLVED {model.num_timesteps}", flush=True)


if __name__ == "__main__":
    main()
