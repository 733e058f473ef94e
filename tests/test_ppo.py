import math

import numpy as np
import pytest

from herdrl import PPOConfig
from herdrl.logger import GAUGE_KEYS, TIMING_KEYS

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
    assert algo.module.pi_encoder.out_dim == 64 and algo.module.pi_encoder.mlp[0].in_features == 16  # one-hot
    result = train_until(algo, reward=0.9, max_steps=60_000)
    assert result["episode_return_mean"] >= 0.9, result
    assert algo.compute_single_action(0) in (1, 2)  # down or right from the start
    algo.stop()


def rows(seed, iterations=3):
    algo = PPOConfig().environment("CartPole-v1").debugging(seed=seed).build()
    out = [algo.train() for _ in range(iterations)]
    algo.stop()
    # (the object store's gauges measure the Ray this process shares with earlier tests, not the seeded run)
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS + GAUGE_KEYS} for r in out]


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


def _hand_made_batch(algo):
    """A fixed batch from the policy, then the policy moved a little (so ratios differ from 1)."""
    import torch

    from herdrl.rollout.batch import on_policy_batch

    batch = on_policy_batch(algo.module, [item.data for item in algo.sample()], 0.99, 0.95, algo.device)
    with torch.no_grad():
        for p in algo.module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return batch


def raw_policy_and_values(module, obs):
    """A CartPole actor-critic's action distribution and values, built from its raw layers."""
    import torch

    with torch.no_grad():
        dist = torch.distributions.Categorical(logits=module.pi_head(module.pi_encoder(obs)))
        return dist, module.vf_head(module.vf_encoder(obs)).squeeze(-1)


def test_ppo_loss_is_rllibs_formula_computed_by_hand():
    """vf_loss_coeff weighs the plain MSE (RLlib's PPO), checked against a loss built from the raw layers."""
    import torch

    algo = PPOConfig().environment("CartPole-v1").training(vf_loss_coeff=0.7, entropy_coeff=0.01, clip_param=0.2) \
        .debugging(seed=0).build()
    batch = _hand_made_batch(algo)
    loss, stats = algo.learner.loss(batch)
    dist, values = raw_policy_and_values(algo.module, batch["obs"])
    with torch.no_grad():
        ratio = torch.exp(dist.log_prob(batch["actions"]) - batch["old_logp"])
        adv = batch["advantages"]
        surrogate = torch.min(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv).mean()
        expected = -surrogate + 0.7 * ((values - batch["returns"]) ** 2).mean() - 0.01 * dist.entropy().mean()
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert float(stats["vf_loss"]) == pytest.approx(float(((values - batch["returns"]) ** 2).mean()), rel=1e-5)
    assert PPOConfig().vf_loss_coeff == 0.25  # today's default keeps the old effective weight (0.5 x 0.5 MSE)
    algo.stop()


def test_a_checkpoint_from_before_the_formula_change_keeps_its_effective_value_weight(tmp_path):
    import json

    from herdrl import A2CConfig, Algorithm
    from herdrl.policy import Policy

    for config, coeff in ((PPOConfig(), 0.5), (A2CConfig(), 1.0)):
        algo = config.environment("CartPole-v1").training(vf_loss_coeff=coeff).build()
        path = algo.save(tmp_path / algo.config.algo_name)
        algo.stop()
        meta = json.loads((path / "checkpoint.json").read_text())
        meta["format_version"] = 1  # written by herdrl 0.1, where the loss was vf_loss_coeff * 0.5 * MSE
        (path / "checkpoint.json").write_text(json.dumps(meta))
        restored = Algorithm.from_checkpoint(path)
        assert restored.config.vf_loss_coeff == coeff / 2
        restored.stop()
        Policy.from_checkpoint(path)
