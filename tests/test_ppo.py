import math

import numpy as np
import pytest

from herdrl import PPOConfig
from herdrl.logger import TIMING_KEYS

PENDULUM = {"gamma": 0.9, "lambda_": 0.95, "lr": 1e-3, "num_epochs": 10, "train_batch_size": 2048,
            "minibatch_size": 256}


def train_until(algo, steps=None, reward=None, max_steps=200_000):
    while True:
        result = algo.train()
        done_steps = result["num_env_steps_sampled_lifetime"]
        if (reward is not None and result["episode_return_mean"] >= reward) or done_steps >= (steps or max_steps):
            return result


def test_ppo_solves_cartpole_within_a_fixed_budget():
    algo = PPOConfig().environment("CartPole-v1").debugging(seed=0).build()
    result = train_until(algo, reward=475, max_steps=150_000)
    assert result["episode_return_mean"] >= 475, result
    assert result["num_episodes_lifetime"] >= 100
    # The greedy policy balances the pole for the whole episode.
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=123)
    total, done = 0.0, False
    while not done:
        obs, reward, term, trunc, _ = env.step(algo.compute_single_action(obs))
        total, done = total + reward, term or trunc
    assert total >= 475
    algo.stop()


def test_ppo_learns_continuous_pendulum_well_above_random():
    algo = PPOConfig().environment("Pendulum-v1").training(**PENDULUM).debugging(seed=0).build()
    first = algo.train()
    result = train_until(algo, steps=61_440)
    # A random policy scores about -1200; this budget reaches about -530 on seed 0.
    assert result["episode_return_mean"] > -900, (first["episode_return_mean"], result["episode_return_mean"])
    action = algo.compute_single_action(np.zeros(3, np.float32))
    assert action.shape == (1,) and -2.0 <= action[0] <= 2.0
    algo.stop()


def test_ppo_trains_on_discrete_observations_frozenlake():
    config = (PPOConfig().environment("FrozenLake-v1", env_config={"is_slippery": False})
              .training(train_batch_size=512, minibatch_size=128, entropy_coeff=0.01).debugging(seed=0))
    algo = config.build()
    assert algo.encode.dim == 16  # one-hot observations
    result = train_until(algo, reward=0.9, max_steps=60_000)
    assert result["episode_return_mean"] >= 0.9, result
    assert algo.compute_single_action(0) in (1, 2)  # down or right from the start
    algo.stop()


def rows(seed, iterations=3):
    algo = PPOConfig().environment("CartPole-v1").debugging(seed=seed).build()
    out = [algo.train() for _ in range(iterations)]
    algo.stop()
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in out]


def test_same_seed_gives_identical_rows_except_timing_keys():
    first, second = rows(7), rows(7)
    assert first == second
    assert rows(8) != first
    assert set(TIMING_KEYS) - {"evaluation/time_s"} <= set(PPOConfig().environment("CartPole-v1").build().train())


def test_result_row_has_the_documented_keys():
    algo = PPOConfig().environment("CartPole-v1").training(train_batch_size=256, minibatch_size=64).build()
    result = algo.train()
    for key in ("training_iteration", "num_env_steps_sampled_lifetime", "episode_return_mean", "episode_len_mean",
                "num_episodes_lifetime", "time_this_iter_s", "time_total_s", "sample_time_s", "learn_time_s",
                "env_steps_per_s", "policy_loss", "vf_loss", "entropy", "kl"):
        assert key in result, key
    assert result["training_iteration"] == 1
    assert 0 < result["num_env_steps_sampled_lifetime"] <= 256
    assert math.isclose(result["sample_time_s"] + result["learn_time_s"], result["time_this_iter_s"])
    assert algo.train()["training_iteration"] == 2


@pytest.mark.parametrize("vf_clip_param, share", [(0.5, False), (None, True)])
def test_value_clipping_and_shared_layers_train(vf_clip_param, share):
    config = (PPOConfig().environment("CartPole-v1")
              .training(vf_clip_param=vf_clip_param, model={"vf_share_layers": share}, train_batch_size=256,
                        minibatch_size=64).debugging(seed=0))
    algo = config.build()
    results = [algo.train() for _ in range(3)]
    assert all(math.isfinite(r["vf_loss"]) for r in results)
