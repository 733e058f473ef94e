"""Environment creation: vector envs for runners, observation encoding, space checks."""

from herdrl.env.vector import (
    ObsEncoder,
    check_spaces,
    env_reward_threshold,
    make_single_env,
    make_vector_env,
)

__all__ = ["ObsEncoder", "check_spaces", "env_reward_threshold", "make_single_env", "make_vector_env"]
