import numpy as np
import pytest
import torch

from herdrl import Algorithm, ConfigError, SACConfig
from herdrl.models.sac_networks import NumpySACPolicy

SMALL = {"model": {"fcnet_hiddens": [64, 64]}}


def test_sac_learns_pendulum_from_greedy_evaluation():
    algo = SACConfig().environment("Pendulum-v1").training(**SMALL).debugging(seed=0).build()
    results = [algo.train() for _ in range(5)]  # ~5000 env steps, one gradient step each
    best = max(r["evaluation/episode_return_mean"] for r in results)
    assert best > -600, [r["evaluation/episode_return_mean"] for r in results]  # random play: about -1200
    assert results[-1]["alpha"] < 0.5  # the entropy weight adapted
    algo.stop()


def test_sac_checkpoint_round_trip_and_export(tmp_path):
    from herdrl.export import GreedyPolicy, example_obs
    from herdrl.policy import Policy

    algo = SACConfig().environment("Pendulum-v1").training(min_sample_timesteps_per_iteration=300,
                                                           **SMALL).build()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    restored = Algorithm.from_checkpoint(path)
    assert torch.equal(restored.learner.log_alpha, algo.learner.log_alpha)
    for a, b in zip(algo.learner.target.parameters(), restored.learner.target.parameters(), strict=True):
        assert torch.equal(a, b)
    policy = Policy.from_checkpoint(path)
    (obs,) = example_obs(policy, batch=5)
    with torch.no_grad():
        exported = GreedyPolicy(policy)(obs).numpy()
    expected = np.stack([algo.compute_single_action(o) for o in obs.numpy()])
    assert np.allclose(exported, expected, atol=1e-5) and np.all(np.abs(expected) <= 2.0)


def test_numpy_actor_matches_the_torch_greedy_action_and_stays_in_bounds():
    algo = SACConfig().environment("Pendulum-v1").training(**SMALL).build()
    policy = NumpySACPolicy(algo.runners.runner.module, np.random.default_rng(0))
    algo.runners.runner.set_weights(algo.get_weights())
    obs = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)
    greedy = policy.act(obs, explore=False)
    with torch.no_grad():
        assert np.allclose(greedy, algo.module.greedy(torch.from_numpy(obs)).numpy(), atol=1e-5)
    sampled = policy.act(np.repeat(obs, 100, axis=0))
    assert sampled.shape == (800, 1) and np.all(np.abs(sampled) <= 2.0)


def test_sac_needs_box_actions():
    with pytest.raises(ConfigError, match="SAC needs Box"):
        SACConfig().environment("CartPole-v1").build()
    with pytest.raises(ConfigError, match="target_entropy"):
        SACConfig().environment("Pendulum-v1").training(target_entropy="high").validate()


@pytest.mark.parametrize("target_entropy, direction", [(10.0, +1), (-10.0, -1)])
def test_entropy_weight_moves_towards_the_target_entropy(target_entropy, direction):
    """Policy entropy below the target raises alpha (more exploration bonus); above it lowers alpha."""
    algo = SACConfig().environment("Pendulum-v1").training(
        target_entropy=target_entropy, min_sample_timesteps_per_iteration=200,
        num_steps_sampled_before_learning_starts=100, **SMALL).debugging(seed=0).build()
    before = algo.learner.log_alpha.item()
    algo.train()
    assert (algo.learner.log_alpha.item() - before) * direction > 0
    algo.stop()


def test_log_probabilities_are_those_of_the_squashed_action_in_unit_space():
    """The entropy that automatic tuning holds at -action_dim is measured in [-1, 1] (as SB3 and RLlib do), not
    in the env's units: checked against torch.distributions' tanh-transformed Gaussian on Pendulum (bounds +-2)."""
    algo = SACConfig().environment("Pendulum-v1").training(**SMALL).debugging(seed=0).build()
    module = algo.module
    obs = torch.from_numpy(np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32))
    with torch.no_grad():
        actions, logp = module.sample(obs)
        mean, log_std = module.mean_log_std(obs)
    squashed = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform(cache_size=1)])
    unit = ((actions - module.action_bias) / module.action_scale).clamp(-1 + 1e-6, 1 - 1e-6)
    assert torch.allclose(logp, squashed.log_prob(unit).sum(-1), atol=1e-3)
    assert algo.learner.target_entropy == -1.0
    algo.stop()


def test_sac_refuses_an_unbounded_action_space():
    import gymnasium as gym

    from herdrl import register_env

    class Unbounded(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

        def reset(self, *, seed=None, options=None):
            return np.zeros(2, np.float32), {}

        def step(self, action):
            return np.zeros(2, np.float32), 0.0, False, False, {}

    register_env("unbounded-actions", lambda cfg: Unbounded())
    with pytest.raises(ConfigError, match="unbounded") as info:
        SACConfig().environment("unbounded-actions").build()
    assert "\n" not in str(info.value)


def test_sac_on_a_box_bounded_at_float32_max_gives_finite_actions():
    """high - low of +-float32 max overflows in float32: the scale is taken in float64, never inf or NaN."""
    import gymnasium as gym

    from herdrl.models.sac_networks import SACModule

    wide = np.finfo(np.float32).max
    nets = SACModule(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Box(-wide, wide, (1,), np.float32),
                       {"fcnet_hiddens": [8], "fcnet_activation": "relu"})
    assert torch.isfinite(nets.action_scale).all() and torch.isfinite(nets.action_bias).all()
    action, _ = nets.sample(torch.zeros(4, 2))
    assert torch.isfinite(action).all()


def test_a_checkpoint_from_before_the_entropy_change_keeps_its_effective_target(tmp_path):
    """herdrl 0.1 held the entropy in Pendulum's units ([-2, 2]): -1 there is -1 - log 2 in [-1, 1]."""
    import json

    algo = SACConfig().environment("Pendulum-v1").training(**SMALL).build()
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    meta = json.loads((path / "checkpoint.json").read_text())
    meta["format_version"] = 1
    (path / "checkpoint.json").write_text(json.dumps(meta))
    restored = Algorithm.from_checkpoint(path)
    assert restored.learner.target_entropy == pytest.approx(-1 - np.log(2))
    restored.stop()
