import numpy as np
import pytest
import torch

from herdrl import Algorithm, ConfigError, SACConfig
from herdrl.config import MODEL_DEFAULTS
from herdrl.models.sac_networks import NumpySACPolicy

SMALL = {"model": {"fcnet_hiddens": [64, 64]}}


def test_sac_learns_pendulum_from_greedy_evaluation():
    algo = SACConfig().environment("Pendulum-v1").training(**SMALL).debugging(seed=0).build()
    results = []
    for _ in range(5):  # at most ~5000 env steps, one gradient step each; seed 0 shows both at the 3rd
        results.append(algo.train())
        best = max(r["evaluation/episode_return_mean"] for r in results)
        if best > -600 and results[-1]["alpha"] < 0.5:
            break
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
                     {**MODEL_DEFAULTS, "fcnet_hiddens": [8], "fcnet_activation": "relu"})
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


@pytest.mark.parametrize("algo_name", ["SAC", "TD3", "CQL", "IQL"])
def test_critics_learn_alike_in_any_units_of_the_action_box(algo_name):
    """The critics see actions mapped into [-1, 1] (model critic_unit_actions, the default): the same gradient
    steps on the same batch, its actions recorded in a Box of [-2, 2] x [0, 10] or in [-1, 1]^2, end with the same
    weights. With the env's units (critic_unit_actions=False, checkpoints written before the key) they differ."""
    import gymnasium as gym

    from herdrl.registry import get_config_class

    obs_space = gym.spaces.Box(-5, 5, (3,), np.float32)
    rng = np.random.default_rng(0)
    unit_actions = rng.uniform(-1, 1, (32, 2))
    batch = {key: torch.as_tensor(value, dtype=torch.float32) for key, value in {
        "obs": rng.normal(size=(32, 3)), "next_obs": rng.normal(size=(32, 3)), "rewards": rng.normal(size=32),
        "discounts": np.full(32, 0.99), "weights": np.ones(32)}.items()}
    config_class = get_config_class(algo_name)
    for unit, alike in ((True, True), (False, False)):
        weights = []
        for low, high in (([-2.0, 0.0], [2.0, 10.0]), ([-1.0, -1.0], [1.0, 1.0])):
            low, high = np.array(low), np.array(high)
            config = config_class().training(model={"fcnet_hiddens": [16], "critic_unit_actions": unit})
            torch.manual_seed(0)
            action_space = gym.spaces.Box(np.float32(low), np.float32(high))
            learner = config.algo_class().learner_class(config, obs_space, action_space)
            actions = torch.as_tensor(unit_actions * (high - low) / 2 + (high + low) / 2, dtype=torch.float32)
            torch.manual_seed(1)
            for _ in range(3):
                learner.replay_step({**batch, "actions": actions})
            weights.append(torch.cat([p.detach().flatten() for p in learner.module.parameters()]))
        difference = float((weights[0] - weights[1]).abs().max())
        assert (difference < 1e-6) == alike, (unit, difference)


def test_checkpoints_from_before_critic_unit_actions_keep_their_critics_units(tmp_path):
    """herdrl 0.2.0's SAC (tests/checkpoints_v2) fed its critics Pendulum's actions in [-2, 2]: loaded, its critics
    still do; restored into a run (or started from by init_from) whose critics see [-1, 1], it is refused in one
    line that names the key, and accepted with critic_unit_actions=False."""
    import shutil
    from pathlib import Path

    from herdrl.checkpoint import CheckpointError

    path = tmp_path / "old"
    shutil.copytree(Path(__file__).parent / "checkpoints_v2" / "sac-pendulum", path)
    algo = Algorithm.from_checkpoint(path)
    module = algo.learner.module
    obs, actions = torch.randn(8, 3), torch.rand(8, 1) * 4 - 2
    with torch.no_grad():
        torch.testing.assert_close(module.q_values(obs, actions)[0], module.q1(obs, actions))
    algo.stop()
    model = {"fcnet_hiddens": [8], "fcnet_activation": "relu"}
    today = SACConfig().environment("Pendulum-v1").training(model=model).build()
    with pytest.raises(CheckpointError, match=r"critics saw actions in the env's units.* critic_unit_actions=False"
                       ) as info:
        today.restore(path)
    assert "\n" not in str(info.value)
    today.stop()
    restored = SACConfig().environment("Pendulum-v1").training(model={**model, "critic_unit_actions": False}).build()
    restored.restore(path)
    restored.save(tmp_path / "resaved")  # (init_from reads today's weight names; 0.2.0's were older)
    restored.stop()
    for unit in (True, False):  # init_from: the critics read either unit with the same Q values
        started = SACConfig().environment("Pendulum-v1").training(
            model={**model, "critic_unit_actions": unit}, init_from=str(tmp_path / "resaved")).build()
        with torch.no_grad():
            q1, q2 = started.learner.module.q_values(obs, actions)
            torch.testing.assert_close(q1, module.q1(obs, actions))
            torch.testing.assert_close(q2, module.q2(obs, actions))
        started.stop()


@pytest.mark.parametrize("hiddens", [[16], []])
def test_init_from_rewrites_the_critics_first_layer_for_the_other_action_units(hiddens):
    """Critics of env-unit actions given to critics of [-1, 1] actions, and back (on a Box of [-2, 2] x [0, 10],
    its bias nonzero): each gives the Q values the source's critics gave the same env actions."""
    import gymnasium as gym

    from herdrl.init_from import critics_in_our_units
    from herdrl.models.sac_networks import SACModule

    obs_space, action_space = gym.spaces.Box(-5, 5, (3,), np.float32), gym.spaces.Box(
        np.array([-2, 0], np.float32), np.array([2, 10], np.float32))
    obs = torch.randn(64, 3)
    actions = torch.as_tensor(action_space.low + np.random.default_rng(0).random((64, 2)) * 4 * [1, 2.5],
                              dtype=torch.float32)
    for source_unit in (False, True):
        torch.manual_seed(0)
        source = SACModule(obs_space, action_space, {**MODEL_DEFAULTS, "fcnet_hiddens": hiddens,
                                                     "critic_unit_actions": source_unit})
        target = SACModule(obs_space, action_space, {**MODEL_DEFAULTS, "fcnet_hiddens": hiddens,
                                                     "critic_unit_actions": not source_unit})
        target.load_state_dict(critics_in_our_units(source.state_dict(), target))
        with torch.no_grad():
            expected = source.q1(obs, actions if not source_unit else (actions - torch.tensor([0.0, 5.0])) /
                                 torch.tensor([2.0, 5.0]))
            torch.testing.assert_close(target.q_values(obs, actions)[0], expected)
            torch.testing.assert_close(target.q_values(obs, actions)[1], source.q_values(obs, actions)[1])


def test_which_checkpoints_critics_clash_with_a_runs_and_a_box_dimension_of_one_value():
    """A checkpoint's critics clash with a run's when they read actions in other units, on a Box that is not
    [-1, 1] already (any policy's, multi-agent); the message names the key and the value to set; checkpoints of
    algorithms without Box critics are not given the key. A Box dimension with low == high leaves learning finite."""
    from pathlib import Path

    import gymnasium as gym

    from herdrl.algorithms.sac import SACLearner
    from herdrl.checkpoint import checkpoint_config, critic_units_clash, read_meta

    before = {"algorithm": "SAC", "config": {"model": {}}}
    today = {"algorithm": "SAC", "config": {"model": {"critic_unit_actions": True}}}
    wide, unit = gym.spaces.Box(-2, 2, (1,), np.float32), gym.spaces.Box(-1, 1, (1,), np.float32)
    assert critic_units_clash(before, "SAC", {"critic_unit_actions": True}, wide) == (
        "its critics saw actions in the env's units, this run's see them in [-1, 1]: set model "
        "critic_unit_actions=False")
    assert critic_units_clash(today, "TD3", {"critic_unit_actions": False}, wide).endswith("=True")
    assert critic_units_clash(before, "SAC", {"critic_unit_actions": True}, {"a": unit, "b": wide}) is not None
    for meta, algo, model, space in ((before, "SAC", {"critic_unit_actions": True}, unit),
                                     (before, "SAC", {"critic_unit_actions": False}, wide),
                                     (today, "SAC", {"critic_unit_actions": True}, wide),
                                     ({**before, "algorithm": "PPO"}, "SAC", {"critic_unit_actions": True}, wide)):
        assert critic_units_clash(meta, algo, model, space) is None
    source = Path(__file__).parent / "checkpoints_v2"
    assert "critic_unit_actions" not in checkpoint_config(read_meta(source / "ppo-cartpole"))["model"]
    assert checkpoint_config(read_meta(source / "sac-pendulum"))["model"]["critic_unit_actions"] is False
    config = SACConfig().training(model={"fcnet_hiddens": [16]})
    learner = SACLearner(config, gym.spaces.Box(-1, 1, (3,), np.float32),
                         gym.spaces.Box(np.array([-1, 0], np.float32), np.array([1, 0], np.float32)))
    rng = np.random.default_rng(0)
    batch = {key: torch.as_tensor(value, dtype=torch.float32) for key, value in {
        "obs": rng.normal(size=(8, 3)), "next_obs": rng.normal(size=(8, 3)), "rewards": rng.normal(size=8),
        "discounts": np.full(8, 0.99), "weights": np.ones(8), "actions": np.c_[rng.uniform(-1, 1, 8), np.zeros(8)]
    }.items()}
    metrics, _ = learner.replay_step(batch)
    assert np.isfinite([metrics["critic_loss"], metrics["actor_loss"]]).all(), metrics
