import numpy as np
import pytest
import torch

from herdrl import Algorithm, ConfigError, DDPGConfig, TD3Config

SMALL = {"model": {"fcnet_hiddens": [64, 64]}}


def test_td3_learns_pendulum_from_greedy_evaluation():
    algo = TD3Config().environment("Pendulum-v1").training(**SMALL).debugging(seed=0).build()
    results = []
    for _ in range(6):  # at most ~6000 env steps, one gradient step each; seed 0 shows it at the 5th
        results.append(algo.train())
        best = max(r["evaluation/episode_return_mean"] for r in results)
        if best > -400:
            break
    assert best > -400, [r["evaluation/episode_return_mean"] for r in results]  # random play: about -1200
    algo.stop()


def test_actor_and_targets_move_every_policy_delay_critic_steps_only():
    algo = TD3Config().environment("Pendulum-v1").training(policy_delay=3, **SMALL).debugging(seed=0).build()
    learner = algo.learner
    fragment = algo.sample()[0].data
    from herdrl.buffers import fragment_transitions

    algo.buffer.add(fragment_transitions(fragment, 0.99))
    actor = lambda: [p.detach().clone() for p in learner.module.actor_parameters()]  # noqa: E731
    target = lambda: [p.detach().clone() for p in learner.target.parameters()]  # noqa: E731
    moved = []
    for _ in range(6):
        before_actor, before_target = actor(), target()
        data, _, weights = algo.buffer.sample(8)
        algo.learners.update(data, weights, 1)
        moved.append((any(not torch.equal(a, b) for a, b in zip(before_actor, actor(), strict=True)),
                      any(not torch.equal(a, b) for a, b in zip(before_target, target(), strict=True))))
    assert moved == [(False, False), (False, False), (True, True)] * 2
    algo.stop()


def test_ddpg_is_td3_without_its_tricks_and_checkpoints_round_trip(tmp_path):
    config = DDPGConfig().environment("Pendulum-v1").training(min_sample_timesteps_per_iteration=300, **SMALL)
    assert (config.twin_q, config.policy_delay, config.target_noise) == (False, 1, 0.0)
    algo = config.build()
    assert algo.module.q2 is None
    result = algo.train()
    assert result["num_gradient_updates"] > 0 and "actor_loss" in result
    path = algo.save(tmp_path / "ckpt")
    restored = Algorithm.from_checkpoint(path)
    assert restored.config.algo_name == "DDPG" and restored.learner.critic_steps == algo.learner.critic_steps
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    np.testing.assert_allclose(restored.policy.compute_actions(obs), algo.policy.compute_actions(obs))
    restored.stop()
    algo.stop()
    with pytest.raises(ConfigError, match="TD3 needs Box"):
        TD3Config().environment("CartPole-v1").build()


def test_runner_explores_with_clipped_noise_and_at_random_before_learning():
    algo = TD3Config().environment("Pendulum-v1").training(exploration_noise=0.2, **SMALL).debugging(seed=0).build()
    policy = algo.runners.runner.policy
    obs = np.zeros((2000, 3), np.float32)
    greedy = algo.policy.compute_actions(obs[:1])[0, 0]
    policy.random_actions = False
    noisy = policy.act(obs)[:, 0]
    assert np.all(np.abs(noisy) <= 2.0)
    # Noise of std 0.2 half-ranges (= 0.4 here) around the greedy action, clipped at the bounds (5 std away).
    inside = np.abs(noisy) < 2.0
    assert abs(np.std(noisy[inside] - greedy) - 0.4) < 0.03
    explored = algo.policy.compute_actions(obs, explore=True)[:, 0]  # Policy and evaluation explore the same way
    assert abs(np.std(explored - greedy) - 0.4) < 0.03
    policy.random_actions = True
    uniform = policy.act(obs)[:, 0]
    assert abs(uniform.mean()) < 0.1 and abs(uniform.var() - 4.0 / 3.0) < 0.15  # U(-2, 2)
    algo.stop()


def test_critic_target_is_the_smaller_target_q_of_the_smoothed_target_action():
    from herdrl.algorithms.td3 import TD3Learner

    config = TD3Config().environment("Pendulum-v1").training(target_noise=0.0, **SMALL)
    algo = config.build()
    learner: TD3Learner = algo.learner
    with torch.no_grad():  # targets unlike the online networks, so min/max and online/target mix-ups show
        for p in learner.target.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    rng = np.random.default_rng(0)
    batch = {"obs": torch.as_tensor(rng.normal(size=(16, 3)), dtype=torch.float32),
             "next_obs": torch.as_tensor(rng.normal(size=(16, 3)), dtype=torch.float32),
             "actions": torch.as_tensor(rng.uniform(-2, 2, (16, 1)), dtype=torch.float32),
             "rewards": torch.as_tensor(rng.normal(size=16), dtype=torch.float32),
             "discounts": torch.full((16,), 0.99), "weights": torch.ones(16)}
    with torch.no_grad():
        # The critics see actions in [-1, 1]: Pendulum's [-2, 2] halved (the target action before scaling).
        next_action = torch.tanh(learner.target.pi_head(learner.target.pi_encoder(batch["next_obs"])))
        q1 = learner.target.q1(batch["next_obs"], next_action)
        q2 = learner.target.q2(batch["next_obs"], next_action)
        expected = batch["rewards"] + 0.99 * torch.minimum(q1, q2)
        online = learner.module.q1(batch["obs"], batch["actions"] / 2.0)
    _, parts = learner._critic_loss(batch)
    assert (q1 != q2).all()
    torch.testing.assert_close(parts["td_error"], expected - online)
    learner.config.target_noise = 0.5  # smoothing moves the target action, so the target
    _, smoothed = learner._critic_loss(batch)
    assert not torch.allclose(smoothed["td_error"], parts["td_error"])
    algo.stop()
