import pytest
import torch

from herdrl import A2CConfig, Algorithm, ConfigError


def test_a2c_solves_cartpole_within_a_fixed_budget():
    algo = A2CConfig().environment("CartPole-v1").debugging(seed=1).build()
    result = algo.train()
    assert result["num_gradient_updates"] == 50  # 2000 steps / (8 envs x 5 steps)
    while result["episode_return_mean"] < 475 and result["num_env_steps_sampled_lifetime"] < 250_000:
        result = algo.train()
    assert result["episode_return_mean"] >= 475, result
    algo.stop()


def test_a2c_checkpoint_round_trip_keeps_the_rmsprop_state(tmp_path):
    algo = A2CConfig().environment("CartPole-v1").debugging(seed=0).build()
    algo.train()
    restored = Algorithm.from_checkpoint(algo.save(tmp_path / "ckpt"))
    assert type(restored).__name__ == "A2C"
    for mine, theirs in zip(algo.learner.optimizer.square_avg, restored.learner.optimizer.square_avg, strict=True):
        assert torch.equal(mine, theirs)


def test_a2c_config_rules():
    with pytest.raises(ConfigError, match="expected >= one update's steps"):
        A2CConfig().environment("CartPole-v1").training(train_batch_size=10).validate()
    with pytest.raises(ConfigError, match="unknown config key 'minibatch_size' for A2C"):
        A2CConfig().training(minibatch_size=64)


def test_a2c_loss_weighs_the_plain_mse_computed_by_hand():
    from test_ppo import _hand_made_batch, raw_policy_and_values

    algo = A2CConfig().environment("CartPole-v1").training(vf_loss_coeff=0.5, entropy_coeff=0.01).debugging(seed=0) \
        .build()
    batch = _hand_made_batch(algo)
    loss, _ = algo.learner.loss(batch)
    dist, values = raw_policy_and_values(algo.module, batch["obs"])
    expected = (-(dist.log_prob(batch["actions"]) * batch["advantages"]).mean()
                + 0.5 * ((values - batch["returns"]) ** 2).mean() - 0.01 * dist.entropy().mean())
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    algo.stop()
