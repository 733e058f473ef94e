"""Environment creation: vector envs for runners, observation encoding, space checks."""

from herdrl.env import testing
from herdrl.env.vector import (
    check_spaces,
    env_reward_threshold,
    make_single_env,
    make_vector_env,
)

testing.register()  # herd/Latency-v0, herd/Faulty-v0

__all__ = ["check_spaces", "env_reward_threshold", "make_single_env", "make_vector_env"]
