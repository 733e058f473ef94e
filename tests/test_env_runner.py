import subprocess
import sys

import gymnasium
import numpy as np
import pytest
import torch
from envs import BadShapeEnv, Countdown, DictActionEnv, NaNEnv, RaisingEnv, TextObsEnv

import herdrl
from herdrl import EnvError, PPOConfig
from herdrl.env import make_vector_env
from herdrl.models import ActorCritic
from herdrl.models.actor_critic import numpy_twin
from herdrl.models.encoders import build_encoder
from herdrl.rollout import EnvRunner, compute_gae


def runner_for(env_cls, env_config=None, num_envs=1, **training):
    herdrl.register_env("tiny", env_cls)
    config = (PPOConfig().environment("tiny", env_config=env_config or {})
              .env_runners(num_envs_per_env_runner=num_envs).training(**training).debugging(seed=0))
    config.validate()
    return EnvRunner(config)


def test_next_step_reset_step_is_masked_out_and_episodes_are_counted():
    runner = runner_for(Countdown, {"length": 3})
    frag = runner.sample(9)
    # steps: 3 real, 1 reset-only, 3 real, 1 reset-only, 1 real
    assert frag.valid[:, 0].tolist() == [True, True, True, False, True, True, True, False, True]
    assert frag.env_steps == 7
    assert frag.obs[:, 0, 0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]  # the final obs (3) precedes each reset
    assert frag.terminateds[:, 0].tolist() == [False, False, True, False, False, False, True, False, False]
    assert frag.episode_returns == [3.0, 3.0] and frag.episode_lengths == [3, 3]
    # An episode spanning two fragments is counted once, with its full length.
    runner2 = runner_for(Countdown, {"length": 3})
    first, second = runner2.sample(2), runner2.sample(2)
    assert first.episode_returns == [] and second.episode_lengths == [3]
    assert second.valid[:, 0].tolist() == [True, False]


def test_truncated_step_keeps_its_final_observation_for_bootstrapping():
    runner = runner_for(Countdown, {"length": 2, "truncate": True})
    frag = runner.sample(4)
    assert frag.truncateds[:, 0].tolist() == [False, True, False, False]
    assert not frag.terminateds.any()
    assert frag.obs[2, 0, 0] == 2.0  # the observation after the truncating step is the final one, not a reset


def test_gae_bootstraps_truncation_from_the_final_observation_and_not_termination():
    gamma, lam = 0.9, 0.8
    rewards = np.array([[1.0], [0.0], [1.0]], np.float32)  # step 1 is the reset-only step
    values = np.array([[0.5], [2.0], [0.7], [0.3]], np.float32)  # values[1] = V(final obs)
    truncated = np.array([[True], [False], [False]])
    terminated = np.zeros_like(truncated)
    adv, ret = compute_gae(rewards, values, terminated, truncated, gamma, lam)
    assert adv[0, 0] == pytest.approx(1.0 + gamma * 2.0 - 0.5)  # bootstrapped, and the chain is cut
    assert adv[2, 0] == pytest.approx(1.0 + gamma * 0.3 - 0.7)
    assert ret[0, 0] == pytest.approx(adv[0, 0] + 0.5)
    adv_term, _ = compute_gae(rewards, values, truncated, terminated, gamma, lam)  # now terminated
    assert adv_term[0, 0] == pytest.approx(1.0 - 0.5)


def test_gae_chains_within_an_episode():
    rewards = np.ones((2, 1), np.float32)
    values = np.zeros((3, 1), np.float32)
    no = np.zeros((2, 1), bool)
    adv, _ = compute_gae(rewards, values, no, no, 0.5, 0.5)
    assert adv[:, 0].tolist() == pytest.approx([1.25, 1.0])


def test_non_finite_reward_is_a_clear_error():
    runner = runner_for(NaNEnv, {"length": 5})
    with pytest.raises(EnvError, match="returned a non-finite reward"):
        runner.sample(4)


def test_wrong_observation_shape_and_raising_env_are_clear_errors():
    with pytest.raises(EnvError, match="env 'tiny' raised"):
        runner_for(BadShapeEnv).sample(4)
    with pytest.raises(EnvError, match="env 'tiny' raised RuntimeError: simulator crashed"):
        runner_for(RaisingEnv).sample(4)


@pytest.mark.parametrize("env_cls, message", [
    (TextObsEnv, r"observation space Dict\('a': Text\(1, 5, .*\)\), whose Text space 'a' .* herdrl cannot "
                 r"encode; herdrl takes Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of them"),
    (DictActionEnv, r"action space Dict\('a': Discrete\(2\)\), whose Dict space .* herdrl cannot act in; herdrl "
                    r"takes Discrete, Box \(float\), MultiDiscrete, MultiBinary and Tuple of them"),
])
def test_unsupported_spaces_fail_at_build_time_naming_the_space(env_cls, message):
    herdrl.register_env("odd", env_cls)
    with pytest.raises(EnvError, match=message):
        PPOConfig().environment("odd").build()


def test_unknown_env_suggests_the_nearest_id():
    with pytest.raises(EnvError, match=r"unknown env 'CartPol-v1' \(did you mean 'CartPole-v1'\?\)"):
        PPOConfig().environment("CartPol-v1").build()
    # Gymnasium renames ids between versions: an old id from a script points at the current one.
    with pytest.raises(EnvError, match=r"unknown env 'Taxi-v3' \(did you mean 'Taxi-v4'\?\)"):
        make_vector_env("Taxi-v3")


def test_register_env_passes_env_config_and_rejects_non_envs():
    seen = []

    def creator(cfg):
        seen.append(cfg)
        return Countdown(cfg)

    herdrl.register_env("counted", creator)
    venv = make_vector_env("counted", {"length": 7}, num_envs=2)
    assert venv.num_envs == 2 and seen == [{"length": 7}, {"length": 7}]
    herdrl.register_env("not_an_env", lambda cfg: object())
    with pytest.raises(EnvError, match="returned object, not a gymnasium.Env"):
        make_vector_env("not_an_env", {}, num_envs=1)


def test_vector_entry_point_is_preferred_and_sync_can_be_forced():
    import gymnasium as gym

    auto = make_vector_env("CartPole-v1", {}, num_envs=4)
    assert type(auto).__name__ == "CartPoleVectorEnv"
    sync = make_vector_env("CartPole-v1", {}, num_envs=4, mode="sync")
    assert isinstance(sync, gym.vector.SyncVectorEnv)
    assert sync.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP


@pytest.mark.parametrize("declare, says", [(None, "does not declare its autoreset mode"),
                                           ("SAME_STEP", "has autoreset mode")])
def test_a_vector_env_that_is_not_next_step_is_refused_not_assumed(declare, says):
    import gymnasium as gym

    env_id = "herdtest/SameStep-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point="envs:Countdown", vector_entry_point="envs:SameStepVectorEnv")
    with pytest.raises(EnvError, match=says) as info:
        make_vector_env(env_id, {"declare": declare} if declare else {}, num_envs=2)
    assert "\n" not in str(info.value) and "NEXT_STEP" in str(info.value)


def test_discrete_observations_are_one_hot():
    import gymnasium as gym

    encoder = build_encoder(gym.spaces.Discrete(4, start=1), {"fcnet_hiddens": [], "fcnet_activation": "tanh"})
    assert encoder(torch.tensor([1, 4])).tolist() == [[1, 0, 0, 0], [0, 0, 0, 1]]
    assert encoder.numpy_input()(np.array([1, 4])).tolist() == [[1, 0, 0, 0], [0, 0, 0, 1]]
    box = build_encoder(gym.spaces.Box(0, 1, (2, 3)), {"fcnet_hiddens": [], "fcnet_activation": "tanh"})
    assert box.out_dim == 6


@pytest.mark.parametrize("space", ["discrete", "box", "box_state_dependent_std"])
def test_numpy_policy_samples_from_the_torch_modules_distribution(space):
    import gymnasium as gym

    action_space = gym.spaces.Discrete(3) if space == "discrete" else gym.spaces.Box(-1, 1, (2,))
    model = {"fcnet_hiddens": [16, 16], "fcnet_activation": "relu", "vf_share_layers": False,
             "free_log_std": space != "box_state_dependent_std"}
    torch.manual_seed(0)
    module = ActorCritic(gym.spaces.Box(-np.inf, np.inf, (5,)), action_space, model)
    for p in module.parameters():  # move away from the near-uniform initial policy
        torch.nn.init.normal_(p, std=0.5)
    obs = np.random.default_rng(0).normal(size=(1, 5)).astype(np.float32)
    policy = numpy_twin(module, np.random.default_rng(1))
    samples = policy.act(np.repeat(obs, 20000, axis=0))
    with torch.no_grad():
        dist_inputs, _ = module(torch.from_numpy(obs))
    if space == "discrete":
        probs = torch.softmax(dist_inputs, -1)[0].detach().numpy()
        freq = np.bincount(samples, minlength=3) / len(samples)
        assert np.abs(freq - probs).max() < 0.02
        assert policy.act(obs, explore=False)[0] == probs.argmax()
    else:
        with torch.no_grad():
            logp, _ = module.log_prob_entropy(dist_inputs.expand(len(samples), -1), torch.from_numpy(samples))
        greedy = torch.from_numpy(policy.act(obs, explore=False))
        mean = module.act(torch.from_numpy(obs), explore=False)
        assert torch.allclose(greedy, mean, atol=1e-5)
        _, log_std = module._mean_log_std(dist_inputs)
        z = (samples - mean[0].numpy()) / log_std[0].exp().detach().numpy()
        assert np.abs(z.mean(0)).max() < 0.05 and np.abs(z.std(0) - 1).max() < 0.05
        # Sample log-likelihood under the torch density matches the Gaussian's negative entropy.
        with torch.no_grad():
            _, entropy = module.log_prob_entropy(dist_inputs, mean)
        assert float(logp.mean()) == pytest.approx(-float(entropy[0]), abs=0.05)


def test_numpy_policy_follows_load_state_dict():
    import gymnasium as gym

    module = ActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
                         {"fcnet_hiddens": [4], "fcnet_activation": "tanh", "vf_share_layers": False,
                          "free_log_std": True})
    policy = numpy_twin(module, np.random.default_rng(0))
    state = {k: torch.zeros_like(v) for k, v in module.state_dict().items()}
    state["pi_head.bias"] = torch.tensor([0.0, 5.0])
    module.load_state_dict(state)
    assert policy.act(np.zeros((3, 2), np.float32), explore=False).tolist() == [1, 1, 1]


@pytest.mark.parametrize("algorithm,env,training", [
    ("PPO", "CartPole-v1", {}),
    ("PPO", "Pendulum-v1", {"model": {"free_log_std": True}}),
    ("PPO", "Pendulum-v1", {"model": {"fcnet_activation": "relu"}}),  # state-dependent log std
    ("APPO", "CartPole-v1", {}),  # behaviour log-probabilities too
    ("DQN", "CartPole-v1", {"dueling": True}),
    ("SAC", "Pendulum-v1", {}),
    ("TD3", "Pendulum-v1", {}),
    ("SAC", "Pendulum-v1", {"normalize": True}),  # replay stores raw rewards: the config class says so
    ("PPO", "Pendulum-v1", {"normalize": True}),  # on-policy fragments carry scaled ones
])
def test_a_light_runner_samples_exactly_what_the_torch_runner_samples(algorithm, env, training):
    """A runner given its policy as a blueprint (no torch module: what a light Ray runner gets) and loaded with the
    learner's weights by name samples, from the same seed, the very fragment of a runner with the torch module."""
    import pickle

    from herdrl.filters import model_observation_space
    from herdrl.registry import get_config_class
    from herdrl.rollout.light import RunnerConfig

    training = dict(training)
    normalize = {"observation_filter": "MeanStdFilter", "norm_reward": True} if training.pop("normalize", False) else {}
    config = get_config_class(algorithm)().environment(env).env_runners(num_envs_per_env_runner=3, **normalize) \
        .training(**training).debugging(seed=5)
    config.validate()
    reference = EnvRunner(config)
    torch.manual_seed(0)
    module = config.build_module(model_observation_space(reference.observation_space, config), reference.action_space)
    for p in module.parameters():  # away from the initial near-uniform policy
        torch.nn.init.normal_(p, std=0.2)
    weights = {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}
    blueprint = config.runner_blueprint(module)
    assert blueprint is not None
    light = EnvRunner(RunnerConfig(config, pickle.dumps(config), policy=blueprint))
    assert light.module is None and reference.module is not None
    exploration = {"epsilon": 0.3} if algorithm == "DQN" else {}
    for runner in (reference, light):
        runner.set_weights(weights)
        runner.set_exploration(exploration)
    for _ in range(2):
        expected, got = reference.sample(20), light.sample(20)
        for name in ("obs", "actions", "rewards", "terminateds", "valid", "logp"):
            want, have = getattr(expected, name), getattr(got, name)
            assert (want is None) == (have is None), name
            if want is not None:
                np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.unique(expected.actions).size > 1  # not a constant policy


@pytest.mark.parametrize("algorithm,env,training", [
    ("DQN", "CartPole-v1", {"dueling": True}), ("TD3", "Pendulum-v1", {}), ("SAC", "Pendulum-v1", {})])
def test_the_off_policy_numpy_twins_act_as_their_torch_networks(algorithm, env, training):
    """DQN's, TD3's and SAC's runner policies (numpy on views of the weights) choose what the torch networks
    choose: DQN the argmax of Q (dueling: V + A - mean A), TD3 and SAC their deterministic action."""
    import gymnasium as gym

    from herdrl.registry import get_config_class

    config = get_config_class(algorithm)().environment(env).training(**training)
    config.validate()
    probe = gym.make(env)
    module = config.build_module(probe.observation_space, probe.action_space)
    torch.manual_seed(0)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.3)
    policy = config.runner_policy(module, np.random.default_rng(0))
    obs = np.random.default_rng(1).normal(size=(256, *probe.observation_space.shape)).astype(np.float32)
    with torch.no_grad():
        expected = module.act(torch.from_numpy(obs), explore=False).numpy()
    got = policy.act(obs, explore=False)
    if algorithm == "DQN":
        assert np.array_equal(got, expected) and np.unique(got).size > 1
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_import_herdrl_does_not_import_ray_or_torch():
    code = "import sys, herdrl; print('ray' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_light_runners_modules_do_not_import_torch():
    """What a Ray runner whose policy runs in numpy imports (herdrl.rollout.light): none of it may pull in torch."""
    code = ("import sys, herdrl.rollout.remote, herdrl.rollout.runner, herdrl.models.numpy_policy, herdrl.filters, "
            "herdrl.callbacks; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_in_process_training_never_imports_ray():
    code = ("import sys; from herdrl import PPOConfig; "
            "a = PPOConfig().environment('CartPole-v1').training(train_batch_size=64, minibatch_size=32).build(); "
            "a.train(); a.stop(); print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_episode_returns_and_lengths_across_many_envs_and_fragments():
    from envs import RandomLength

    runner = runner_for(RandomLength, num_envs=5)
    carry_return, carry_length = [0.0] * 5, [0] * 5
    for _ in range(6):
        frag = runner.sample(7)
        expected = []
        for t in range(7):  # the plain, step-by-step bookkeeping the runner vectorises
            for b in range(5):
                if frag.valid[t, b]:
                    carry_return[b] += float(frag.rewards[t, b])
                    carry_length[b] += 1
                if frag.terminateds[t, b] or frag.truncateds[t, b]:
                    expected.append((carry_return[b], carry_length[b]))
                    carry_return[b], carry_length[b] = 0.0, 0
        assert frag.episode_lengths == [length for _, length in expected]
        assert frag.episode_returns == pytest.approx([ret for ret, _ in expected], abs=1e-6)
        assert all(1 <= length <= 5 for length in frag.episode_lengths)


class _Counting(gymnasium.Env):
    """Observations [step, last action] (float64, as many envs give), episodes of 3 + seed steps (terminated) or
    truncated at 4 for odd seeds, an info on odd steps only."""

    def __init__(self, box_actions: bool) -> None:
        self.observation_space = gymnasium.spaces.Box(-100, 100, (2,), np.float32)
        self.action_space = gymnasium.spaces.Box(-1, 1, (1,), np.float32) if box_actions else \
            gymnasium.spaces.Discrete(3)
        self.length, self.t = 3, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.length = 3 + (seed or 0) % 3
        self.t = 0
        return np.array([0.0, 0.0]), {"start": 1}

    def step(self, action):
        self.t += 1
        taken = float(np.asarray(action).reshape(-1)[0])
        info = {"t": self.t} if self.t % 2 else {}
        return np.array([self.t, taken]), taken, self.t == self.length, self.t == 4 and self.length > 4, info


@pytest.mark.parametrize("box_actions", [False, True])
def test_the_lean_vector_env_steps_as_gymnasiums_sync_vector_env(box_actions):
    """Step for step (through episode ends, resets and infos on some steps only): the same observations, rewards,
    ends and infos as Gymnasium's SyncVectorEnv in NEXT_STEP mode."""
    from herdrl.env.vector import LeanSyncVectorEnv

    def make():
        return gymnasium.vector.SyncVectorEnv([lambda b=box_actions: _Counting(b) for _ in range(3)],
                                              autoreset_mode=gymnasium.vector.AutoresetMode.NEXT_STEP)

    reference, lean = make(), make()
    assert LeanSyncVectorEnv.fits(lean)
    lean = LeanSyncVectorEnv.adopt(lean)
    for env in (reference, lean):
        env.reset(seed=[0, 1, 2])
    rng = np.random.default_rng(0)
    for _ in range(14):
        actions = rng.uniform(-1, 1, (3, 1)).astype(np.float32) if box_actions else rng.integers(0, 3, 3)
        expected, got = reference.step(actions), lean.step(actions)
        for a, b in zip(expected[:4], got[:4], strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
        assert expected[4].keys() == got[4].keys()
        for key in expected[4]:
            np.testing.assert_array_equal(expected[4][key], got[4][key])
    assert not LeanSyncVectorEnv.fits(gymnasium.vector.SyncVectorEnv(
        [lambda: _Counting(False)], autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP))
