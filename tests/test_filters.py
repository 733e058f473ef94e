"""Observation and reward normalisation (herdrl.filters): merged statistics, runners, checkpoints, Policy, export."""

import os
import signal

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import Countdown, DictCue, RecordingPendulum, recorded_observations

import herdrl
from herdrl import PPOConfig, SACConfig
from herdrl.filters import EPSILON, RunningStats, model_observation_space
from herdrl.policy import Policy
from herdrl.rollout.runner import EnvRunner


def pooled_stats(observations):
    """Mean and population variance of every observation, computed by numpy at once."""
    return observations.mean(axis=0), observations.var(axis=0)


def test_merged_statistics_equal_the_statistics_of_all_samples_pooled():
    rng = np.random.default_rng(0)
    # Four runners with very different counts (one with none, one with a single sample) and scales.
    parts = [rng.normal(5.0, 3.0, (n, 3)) * scale for n, scale in ((1, 1.0), (0, 1.0), (17, 10.0), (500, 0.1))]
    merged = RunningStats((3,))
    for part in (parts[2], parts[0], parts[3], parts[1]):  # any order
        runner = RunningStats((3,))
        for chunk in np.array_split(part, 3):  # a runner counts step by step
            runner.update(chunk)
        merged.merge_parts(runner.count, runner.mean, runner.m2)
    mean, var = pooled_stats(np.concatenate(parts))
    assert merged.count == 518
    np.testing.assert_allclose(merged.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(merged.var, var, rtol=1e-10)


def test_model_space_filters_box_leaves_that_are_not_images():
    space = gym.spaces.Dict({"frame": gym.spaces.Box(0, 255, (84, 84, 3), np.uint8),
                             "ram": gym.spaces.Box(0, 255, (128,), np.uint8),
                             "pos": gym.spaces.Box(-np.inf, np.inf, (3,), np.float64),
                             "id": gym.spaces.Discrete(4)})
    config = PPOConfig().env_runners(observation_filter="MeanStdFilter", clip_obs=5.0)
    model = model_observation_space(space, config)
    assert model["frame"] == space["frame"] and model["id"] == space["id"]
    for leaf in ("ram", "pos"):  # RAM bytes too (the seed's Pong-ram with --filter 1)
        assert model[leaf].dtype == np.float32 and model[leaf].low.min() == -5.0 and model[leaf].high.max() == 5.0
    assert model_observation_space(space, PPOConfig()) is space


def filtered_ppo(env="recording_pendulum", **env_runners):
    return (PPOConfig().environment(env, env_config={"log_dir": env_runners.pop("log_dir", "")})
            .env_runners(observation_filter="MeanStdFilter", num_envs_per_env_runner=2, **env_runners)
            .training(train_batch_size=256, minibatch_size=64).debugging(seed=3))


def test_in_process_statistics_policy_checkpoint_and_export_use_every_raw_observation(tmp_path):
    herdrl.register_env("recording_pendulum", RecordingPendulum)
    (tmp_path / "log").mkdir()
    algo = filtered_ppo(log_dir=str(tmp_path / "log")).build()
    for _ in range(2):
        algo.train()
    raw = recorded_observations(tmp_path / "log")
    mean, var = pooled_stats(raw)
    stats = algo.normalizer.stats["obs"]
    assert stats.count == len(raw) == 2 * 256 + 2  # every step's observation and the two first resets
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(stats.var, var, rtol=1e-9)

    # The policy takes raw observations and normalises them as computed here, independently of herdrl.
    obs = np.random.default_rng(1).uniform([-1, -1, -8], [1, 1, 8], (64, 3)).astype(np.float32)
    expected_input = np.clip((obs - mean) / np.sqrt(var + EPSILON), -10, 10).astype(np.float32)
    with torch.no_grad():
        expected = algo.module.greedy(torch.as_tensor(expected_input)).clamp(-2, 2).numpy()
    np.testing.assert_allclose(algo.policy.compute_actions(obs), expected, atol=1e-5)
    unfiltered = algo.module.greedy(torch.as_tensor(obs)).clamp(-2, 2).detach().numpy()
    assert np.abs(unfiltered - expected).max() > 1e-3  # the filter changes actions: the check above can fail

    # Checkpoint -> Policy and torch.export program: the same actions on raw observations.
    path = algo.save(tmp_path / "ckpt")
    np.testing.assert_allclose(Policy.from_checkpoint(path).compute_actions(obs), expected, atol=1e-5)
    from herdrl.export import export_policy

    program = torch.export.load(str(export_policy(path, "torch-export", tmp_path / "p.pt2"))).module()
    np.testing.assert_allclose(program(torch.as_tensor(obs)).numpy(), expected, atol=1e-5)

    # Resume: the statistics come back and go on merging from there.
    count = stats.count
    algo.stop()
    resumed = herdrl.Algorithm.from_checkpoint(path)
    assert resumed.normalizer.stats["obs"].count == count
    np.testing.assert_array_equal(resumed.normalizer.stats["obs"].mean, mean_of(algo))
    resumed.train()
    assert resumed.normalizer.stats["obs"].count == count + 256 + 2  # the resumed runner starts fresh episodes
    resumed.stop()


def mean_of(algo):
    return algo.normalizer.stats["obs"].mean


def test_reward_scaling_divides_by_the_std_of_the_discounted_return_and_reports_raw_returns():
    herdrl.register_env("countdown", Countdown)
    gamma = 0.99
    config = (PPOConfig().environment("countdown", env_config={"length": 10})
              .env_runners(norm_reward=True, num_envs_per_env_runner=2, rollout_fragment_length=24)
              .training(gamma=gamma, train_batch_size=48, minibatch_size=24))
    runner = EnvRunner(config)
    fragment = runner.sample()
    # Independently: each env's discounted return after each real step (1, 1.99, 2.97, ... reset every 10 steps).
    returns = []
    for env in range(2):
        ret = 0.0
        for t in range(24):
            if fragment.valid[t, env]:
                ret = ret * gamma + 1.0
                returns.append(ret)
            if fragment.terminateds[t, env]:
                ret = 0.0
    scale = 1.0 / np.sqrt(np.var(returns) + EPSILON)
    np.testing.assert_allclose(fragment.rewards[fragment.valid], scale, rtol=1e-6)
    assert abs(scale - 1.0) > 0.3
    assert fragment.episode_returns == [10.0] * 4  # reported returns stay raw
    algo = config.build()
    assert algo.train()["episode_return_mean"] == 10.0
    algo.stop()


def test_off_policy_replay_holds_raw_observations_and_normalises_each_batch(tmp_path):
    herdrl.register_env("recording_pendulum", RecordingPendulum)
    (tmp_path / "log").mkdir()
    algo = (SACConfig().environment("recording_pendulum", env_config={"log_dir": str(tmp_path / "log")})
            .env_runners(observation_filter="MeanStdFilter", norm_reward=True)
            .training(num_steps_sampled_before_learning_starts=64, min_sample_timesteps_per_iteration=128,
                      training_intensity=16.0)
            .evaluation(evaluation_interval=None).debugging(seed=0)).build()
    # What the learner is given: each replayed batch and the run's statistics at that moment.
    replayed, given = [], []
    sample, update = algo.buffer.sample, algo.learners.update
    algo.buffer.sample = lambda n: replayed.append(sample(n)) or replayed[-1]
    algo.learners.update = lambda data, *rest: given.append((data, algo.normalizer.state())) or update(data, *rest)
    result = algo.train()
    assert result["num_gradient_updates"] == len(given) > 0
    raw = recorded_observations(tmp_path / "log")
    stored = algo.buffer.obs[: len(algo.buffer)]
    assert np.isin(stored[:, 2], raw[:, 2]).all() and np.abs(stored).max() > 1.5  # raw (|thetadot| up to 8)
    for (data, _, _), (batch, stats) in zip(replayed, given, strict=True):
        mean, std = stats["obs/mean"], np.sqrt(stats["obs/m2"] / stats["obs/count"] + EPSILON)
        for key in ("obs", "next_obs"):
            np.testing.assert_allclose(batch[key], np.clip((data[key] - mean) / std, -10, 10), rtol=1e-5, atol=1e-6)
        reward_std = np.sqrt(stats["reward/m2"] / stats["reward/count"] + EPSILON)
        np.testing.assert_allclose(batch["rewards"], np.clip(data["rewards"] / reward_std, -10, 10), rtol=1e-5)
    assert reward_std < 0.5 or reward_std > 2  # the scaling is not close to 1: the check above can fail
    algo.stop()


@pytest.mark.parametrize("algo_name", ["A2C", "TRPO", "APPO", "IMPALA", "DQN"])
def test_every_algorithm_trains_with_normalisation(algo_name):
    from herdrl.registry import get_config_class

    herdrl.register_env("dict_cue", DictCue)
    env = "CartPole-v1" if algo_name == "DQN" else "dict_cue"  # a Dict observation: its Box leaf is filtered
    config = get_config_class(algo_name)().environment(env).env_runners(
        observation_filter="MeanStdFilter", norm_reward=True, num_envs_per_env_runner=2,
        rollout_fragment_length=32).training(train_batch_size=64)
    if algo_name == "DQN":
        config.training(num_steps_sampled_before_learning_starts=32, min_sample_timesteps_per_iteration=64)
    algo = config.build()
    runner, rows = algo.runners.runner, []
    sample = runner.sample
    runner.sample = lambda *args: rows.append(sample(*args)) or rows[-1]
    result = algo.train()
    key = "obs" if env == "CartPole-v1" else "obs/signal/0"
    assert set(algo.normalizer.stats) == {key, "reward"}
    # Each observation once (every step's, reset-only steps' too, and the two first resets), each real step's
    # reward once; what the runner normalises with is the run's statistics (plus nothing unshipped).
    assert algo.normalizer.stats[key].count == sum(f.rewards.size for f in rows) + 2
    assert algo.normalizer.stats["reward"].count == result["num_env_steps_sampled"]
    runner = algo.runners.runner.normalizer.local.stats
    assert runner[key].count == algo.normalizer.stats[key].count
    # The same samples merged in another order: equal to float rounding (a mean near 0 needs an absolute bound).
    np.testing.assert_allclose(runner[key].mean, algo.normalizer.stats[key].mean, atol=1e-12)
    algo.stop()


@pytest.mark.usefixtures("ray_session")
def test_ray_runners_merge_statistics_exactly_and_a_restarted_runner_gets_them(tmp_path):
    herdrl.register_env("recording_pendulum", RecordingPendulum)
    (tmp_path / "log").mkdir()
    algo = filtered_ppo(log_dir=str(tmp_path / "log"), num_env_runners=2).build()
    for _ in range(2):
        algo.train()
    raw = recorded_observations(tmp_path / "log")
    mean, var = pooled_stats(raw)
    stats = algo.normalizer.stats["obs"]
    assert stats.count == len(raw) == 2 * 256 + 4
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(stats.var, var, rtol=1e-9)
    # Kill runner 1: its replacement starts from the run's statistics, not from nothing.
    os.kill(algo.runners.call("pid")[0], signal.SIGKILL)
    algo.train()  # runner 1 fails and is replaced
    algo.train()  # the replacement samples with the weights and statistics it was sent
    fragment_rows = 64 * 2  # the other runner's last fragment: in the run's statistics, not in runner 1's
    assert algo.runners.num_restarts == 1
    assert float(algo.runners.call("normalizer_state")[0]["obs/count"]) == stats.count - fragment_rows
    algo.stop()


def test_onnx_of_a_filtered_dict_policy_takes_raw_leaves_and_matches_policy(tmp_path):
    import onnxruntime as ort

    from herdrl.export import export_policy

    herdrl.register_env("dict_cue", DictCue)
    algo = (PPOConfig().environment("dict_cue").env_runners(observation_filter="MeanStdFilter")
            .training(train_batch_size=256, minibatch_size=64).debugging(seed=0)).build()
    for _ in range(3):
        algo.train()
    path = algo.save(tmp_path / "cue")
    algo.stop()
    policy = Policy.from_checkpoint(path)
    assert policy.normalizer.stats["obs/signal/0"].count > 0
    env = DictCue()
    observations = [env.reset(seed=s)[0] for s in range(32)]
    expected = [policy.compute_single_action(o) for o in observations]
    session = ort.InferenceSession(str(export_policy(path, "onnx", tmp_path / "cue.onnx")))
    leaves = {"obs/cue": np.array([o["cue"] for o in observations], np.int64),
              "obs/signal/0": np.stack([o["signal"][0] for o in observations]).astype(np.float32),
              "obs/signal/1": np.stack([o["signal"][1] for o in observations]).astype(np.int8)}
    assert session.run(None, leaves)[0].tolist() == expected
    assert len(set(expected)) > 1


def test_the_seeds_pong_ram_trpo_with_filter_standardises_the_ram_bytes():
    """The seed's `run_pg.py --env Pong-ram-v0 ... --filter 1`: RAM bytes are standardised, not divided by 255."""
    pytest.importorskip("ale_py", reason="needs the atari extra")
    from herdrl import TRPOConfig

    algo = (TRPOConfig().environment("Pong-ram-v0")
            .env_runners(observation_filter="MeanStdFilter", num_envs_per_env_runner=2)
            .training(train_batch_size=200).debugging(seed=0)).build()
    algo.train()
    stats = algo.normalizer.stats["obs"]
    assert stats.mean.shape == (128,) and stats.count == 202
    ram = np.random.default_rng(0).integers(0, 256, (3, 128), dtype=np.uint8)
    expected = np.clip((ram - stats.mean) / np.sqrt(stats.var + EPSILON), -10, 10).astype(np.float32)
    with torch.no_grad():
        greedy = algo.module.greedy(torch.as_tensor(expected)).numpy()
    assert algo.policy.compute_actions(ram).tolist() == greedy.tolist()
    algo.stop()


def test_a_resumed_asynchronous_run_samples_with_the_checkpoints_statistics_and_a_changed_filter_is_refused(
        tmp_path):
    from herdrl import APPOConfig
    from herdrl.checkpoint import CheckpointError

    herdrl.register_env("recording_pendulum", RecordingPendulum)
    (tmp_path / "log").mkdir()
    algo = (APPOConfig().environment("recording_pendulum", env_config={"log_dir": str(tmp_path / "log")})
            .env_runners(observation_filter="MeanStdFilter", num_envs_per_env_runner=2, rollout_fragment_length=32)
            .training(train_batch_size=64).debugging(seed=0)).build()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    saved = algo.normalizer.stats["obs"].count
    algo.stop()
    resumed = herdrl.Algorithm.from_checkpoint(path)
    # Before any new sample: the runner has the checkpoint's statistics plus its own two fresh resets.
    assert resumed.runners.runner.normalizer.local.stats["obs"].count == saved + 2
    resumed.stop()
    with pytest.raises(CheckpointError, match="observation_filter='MeanStdFilter', this config has 'NoFilter'"):
        herdrl.Algorithm.from_checkpoint(path, observation_filter="NoFilter")
