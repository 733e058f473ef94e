"""Action spaces beyond Discrete and Box: MultiDiscrete, MultiBinary and Tuple of them (PPO, A2C, TRPO)."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import MatchTheCode

import herdrl
from herdrl import A2CConfig, ConfigError, DQNConfig, Policy, PPOConfig, SACConfig, TRPOConfig
from herdrl.models.distributions import ActionDistribution

TUPLE = gym.spaces.Tuple((gym.spaces.Discrete(3, start=2), gym.spaces.MultiDiscrete([2, 4]), gym.spaces.MultiBinary(2),
                          gym.spaces.Tuple((gym.spaces.Box(-1, 1, (2,), np.float32),))))


def _reference(dist_inputs: torch.Tensor) -> list[torch.distributions.Distribution]:
    """TUPLE's parts as torch.distributions, read from the documented layout (logits, means, then log stds)."""
    logits = [dist_inputs[:, 0:3], dist_inputs[:, 3:5], dist_inputs[:, 5:9], dist_inputs[:, 9:11],
              dist_inputs[:, 11:13]]
    mean, log_std = dist_inputs[:, 13:15], dist_inputs[:, 15:17]
    categoricals = [torch.distributions.Categorical(logits=x) for x in logits]
    return categoricals + [torch.distributions.Normal(mean, log_std.exp())]


def test_tuple_distribution_matches_torch_distributions():
    """Log-probabilities, entropies and KL of a Tuple(Discrete, MultiDiscrete, MultiBinary, Box) against
    torch.distributions built independently from the layout; sampled frequencies against the softmax."""
    dist = ActionDistribution(TUPLE)
    assert (dist.num_inputs, dist.action_width) == (17, 7)
    torch.manual_seed(0)
    old, new = torch.randn(6, 17), torch.randn(6, 17)
    actions = torch.tensor([[r.integers(3), r.integers(2), r.integers(4), *r.integers(0, 2, 2), *r.normal(size=2)]
                            for r in [np.random.default_rng(i) for i in range(6)]], dtype=torch.float32)
    log_prob, entropy = dist.log_prob_entropy(old, actions)
    parts = _reference(old)
    expected_logp = sum(p.log_prob(actions[:, i].long()) for i, p in enumerate(parts[:5])) \
        + parts[5].log_prob(actions[:, 5:7]).sum(-1)
    assert torch.allclose(log_prob, expected_logp, atol=1e-5)
    expected_entropy = sum(p.entropy() for p in parts[:5]) + parts[5].entropy().sum(-1)
    assert torch.allclose(entropy, expected_entropy, atol=1e-5)
    kls = [torch.distributions.kl_divergence(p, q) for p, q in zip(parts, _reference(new), strict=True)]
    expected_kl = sum(kls[:5]) + kls[5].sum(-1)
    assert torch.allclose(dist.kl(old, new), expected_kl, atol=1e-5)
    # Sampling with runner-drawn noise follows the distribution: the Discrete part's frequencies.
    noise = torch.from_numpy(dist.draw_noise(np.random.default_rng(0), 20000, 1)[:, 0])
    samples = dist.act_with_noise(old[:1].expand(20000, -1), noise)
    freq = np.bincount(samples[:, 0].long().numpy(), minlength=3) / 20000
    assert np.abs(freq - torch.softmax(old[0, :3], -1).numpy()).max() < 0.015
    gaussian = (samples[:, 5:7] - old[0, 13:15]) / old[0, 15:17].exp()
    assert gaussian.mean(0).abs().max() < 0.03 and (gaussian.std(0) - 1).abs().max() < 0.03
    # Env form: nested tuples, Discrete/MultiDiscrete shifted by start, MultiBinary int8, Box clipped.
    env_actions = dist.to_env(np.array([[0, 1, 3, 1, 0, 5.0, -0.5]], np.float32))
    assert env_actions[0].tolist() == [2] and env_actions[1].tolist() == [[1, 3]]
    assert env_actions[2].dtype == np.int8 and env_actions[3][0].tolist() == [[1.0, -0.5]]
    assert TUPLE.contains(tuple(p[0] if not isinstance(p, tuple) else (p[0][0],) for p in env_actions))


@pytest.mark.parametrize("kind, target", [("multidiscrete", 2.8), ("multibinary", 3.8), ("tuple", 3.5)])
def test_ppo_learns_multidiscrete_multibinary_and_tuple_actions(kind, target, tmp_path):
    herdrl.register_env("code", MatchTheCode)
    algo = (PPOConfig().environment("code", env_config={"kind": kind}).env_runners(num_envs_per_env_runner=8)
            .training(train_batch_size=256, minibatch_size=64, lr=3e-3).debugging(seed=0).build())
    results = [algo.train()["episode_return_mean"] for _ in range(20)]
    assert results[-1] >= target, results
    policy = Policy.from_checkpoint(algo.save(tmp_path))
    action = policy.compute_single_action(np.zeros(4, np.float32))
    assert MatchTheCode({"kind": kind}).action_space.contains(
        action if kind != "tuple" else (np.int64(action[0]), action[1], action[2]))
    from herdrl.export import GreedyPolicy  # an exported program gives the same env actions (Tuple: one per part)

    obs = torch.as_tensor(np.random.default_rng(0).uniform(-1, 1, (5, 4)).astype(np.float32))
    program = torch.export.export(GreedyPolicy(policy).eval(), (obs,)).module()
    got, expected = program(obs), policy.compute_actions(obs.numpy())
    if kind != "tuple":
        got, expected = (got,), (expected,)
    assert all(np.array_equal(g.detach().numpy(), e) for g, e in zip(got, expected, strict=True))
    algo.stop()


@pytest.mark.parametrize("config_class", [A2CConfig, TRPOConfig])
def test_a2c_and_trpo_learn_tuple_actions(config_class):
    herdrl.register_env("code", MatchTheCode)
    algo = (config_class().environment("code", env_config={"kind": "tuple"}).env_runners(num_envs_per_env_runner=8)
            .training(train_batch_size=256).debugging(seed=0).build())
    results = [algo.train()["episode_return_mean"] for _ in range(15)]
    assert results[-1] >= results[0] + 0.8, results  # random play earns ~1.6 of 4
    algo.stop()


def test_dqn_and_sac_refuse_what_they_cannot_act_in():
    herdrl.register_env("code", MatchTheCode)
    with pytest.raises(ConfigError, match=r"DQN needs Discrete actions; this env has MultiDiscrete\(\[3 3 3\]"):
        DQNConfig().environment("code").build()
    with pytest.raises(ConfigError, match=r"SAC needs Box \(continuous\) actions; this env has Tuple"):
        SACConfig().environment("code", env_config={"kind": "tuple"}).build()


def test_blackjack_trains_with_ppo_and_beats_random(tmp_path):
    """Blackjack-v1: Tuple(Discrete(32), Discrete(11), Discrete(2)) observations. Over the same 3000 deals, the
    trained greedy policy loses far less than random play (random: about -0.4 per game; good play: about -0.05)."""
    algo = (PPOConfig().environment("Blackjack-v1").env_runners(num_envs_per_env_runner=8)
            .training(train_batch_size=2048, minibatch_size=256, lr=1e-3).debugging(seed=0).build())
    for _ in range(8):
        algo.train()
    policy = Policy.from_checkpoint(algo.save(tmp_path))
    env = gym.make("Blackjack-v1")
    rng = np.random.default_rng(0)

    def play(choose):
        total = 0.0
        for seed in range(3000):
            obs, _ = env.reset(seed=seed)
            done = False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(choose(obs))
                done = terminated or truncated
            total += reward
        return total / 3000

    trained, random = play(policy.compute_single_action), play(lambda obs: int(rng.integers(2)))
    assert trained > random + 0.2 and trained > -0.15, (trained, random)
    algo.stop()
