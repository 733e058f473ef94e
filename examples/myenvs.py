"""A module that registers envs, for the command line: run from this folder

    herd train ppo --env corridor --import myenvs --stop-iters 20      # a herdrl.register_env name
    herd train ppo --env myenvs:Corridor-v0 --stop-iters 20            # a Gymnasium id (MODULE:ID imports MODULE)
    herd evaluate results/corridor/PPO_corridor_* --import myenvs      # loading names the flag it needs
"""

import gymnasium as gym
from custom_env import Corridor

import herdrl

herdrl.register_env("corridor", lambda cfg: gym.wrappers.TimeLimit(Corridor(**cfg), 100))
gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=100)
