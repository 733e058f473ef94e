"""Schedules (lr, entropy_coeff, epsilon over env steps sampled): the values, the optimizer's real steps, resume,
data-parallel learners, YAML decays over --stop-timesteps, and RLlib's older keys."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from herdrl import (
    A2CConfig,
    Algorithm,
    APPOConfig,
    ConfigError,
    DQNConfig,
    IMPALAConfig,
    PPOConfig,
    SACConfig,
    TD3Config,
)
from herdrl.algorithms.ppo import PPOLearner
from herdrl.cli import main
from herdrl.schedules import schedule_of


def test_schedule_values_match_the_formulas():
    piecewise = schedule_of("lr", [[0, 1.0], [100, 0.5], [300, 0.0]])
    assert [piecewise(t) for t in (0, 50, 100, 200, 300, 1000)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    late_start = schedule_of("lr", [[100, 2.0], [200, 1.0]])
    assert late_start(0) == 2.0 and late_start(150) == 1.5  # the first value before the first point (RLlib)
    cosine = schedule_of("lr", {"schedule": "cosine", "start": 1.0, "end": 0.2, "steps": 1000})
    for t in (0, 250, 500, 999, 5000):
        want = 0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * min(t, 1000) / 1000))
        assert cosine(t) == pytest.approx(want, abs=1e-12)
    linear = schedule_of("lr", {"schedule": "linear", "start": 3e-4, "end": 0.0, "steps": 1000})
    assert linear(250) == pytest.approx(2.25e-4) and linear(2000) == 0.0
    assert schedule_of("lr", 5e-4)(10**9) == 5e-4


@pytest.mark.parametrize("key, value, message", [
    ("lr", [[100, 1e-3], [0, 0.0]], r"'lr' got env steps \[100, 0\]; they must start at >= 0 and increase"),
    ("lr", [[0, -1e-3]], r"'lr' got -0.001; expected float >= 0"),
    ("lr", {"schedule": "step", "start": 1, "end": 0}, r"a named schedule is \{schedule: linear\|cosine"),
    ("lr", [[0]], r"a schedule is \[\[env_step, value\], ...\]"),
    ("lr", {"schedule": "linear", "start": 1e-3, "end": 0.0}, r"a 'linear' schedule needs steps:"),
    ("entropy_coeff", {"schedule": "linear", "start": 0.01, "end": 0.0, "steps": -5}, r"steps got -5"),
])
def test_bad_schedules_are_one_line(key, value, message):
    with pytest.raises(ConfigError, match=message):
        PPOConfig().environment("CartPole-v1").training(**{key: value}).validate()


def test_rllibs_older_schedule_keys_win_over_the_plain_value_in_any_order():
    points = [[0, 1e-3], [1000, 0.0]]
    for kwargs in ({"lr": 5e-4, "lr_schedule": points}, {"lr_schedule": points, "lr": 5e-4}):
        config = PPOConfig().environment("CartPole-v1").training(**kwargs)
        config.validate()
        assert config.lr == points
    config = PPOConfig.from_dict({"env": "CartPole-v1", "lr": 5e-4, "lr_schedule": None,
                                  "entropy_coeff_schedule": [[0, 0.01], [100, 0.0]]})
    config.validate()
    assert config.lr == 5e-4 and config.entropy_coeff == [[0, 0.01], [100, 0.0]]
    DQNConfig().environment("CartPole-v1").training(epsilon=0.05).validate()  # a constant epsilon too
    later = PPOConfig().training(lr_schedule=points).training(lr=1e-4)  # a later plain lr: the schedule stays
    assert later.lr == points and later.lr_schedule == points and PPOConfig().lr_schedule is None
    with pytest.raises(ConfigError, match="unknown config key 'entropy_coeff_schedule' for DQN"):
        DQNConfig().training(entropy_coeff_schedule=[[0, 0.01]])


def test_the_optimizer_steps_by_the_scheduled_lr_down_to_zero():
    """Adam's first step on a gradient of ones moves every weight by lr (its normalised step is 1): the move is the
    schedule's value at the step given, read from the weights themselves; at lr 0 nothing moves."""
    config = PPOConfig().environment("CartPole-v1").training(lr=[[0, 1e-2], [1000, 0.0]])
    config.validate()
    space, actions = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)

    def moved(step):
        learner = PPOLearner(config, space, actions)
        learner.at_step(step)
        before = [p.detach().clone() for p in learner.module.parameters()]

        def loss(batch):
            return sum(p.sum() for p in learner.module.parameters()), {}

        learner.gradient_step(learner.optimizer, loss, {"actions": torch.zeros(1)})
        after = list(learner.module.parameters())
        return max(float((b - p.detach()).abs().max()) for b, p in zip(before, after, strict=True))

    assert moved(0) == pytest.approx(1e-2, rel=1e-5)
    assert moved(250) == pytest.approx(7.5e-3, rel=1e-5)
    assert moved(1000) == 0.0 and moved(5000) == 0.0


def test_training_follows_the_schedule_and_a_resumed_run_continues_it(tmp_path):
    """lr falls linearly to 0 at 1,000 env steps, entropy_coeff along its own points: each row's values are the
    formulas at its env-step count, the weights stop changing once lr is 0, and a run restored from a checkpoint
    at 512 steps takes up the schedule there (not at 0) — in the optimizer itself."""
    config = (PPOConfig().environment("CartPole-v1")
              .training(train_batch_size=256, minibatch_size=128, num_epochs=1, lr=[[0, 1e-3], [1000, 0.0]],
                        entropy_coeff=[[0, 0.02], [512, 0.0]]).debugging(seed=0))
    algo = config.build()
    rows = [algo.train() for _ in range(2)]
    for row in rows:
        steps = row["num_env_steps_sampled_lifetime"]
        assert row["lr"] == pytest.approx(1e-3 * max(0.0, 1 - steps / 1000))
        assert row["entropy_coeff"] == pytest.approx(0.02 * max(0.0, 1 - steps / 512))
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    resumed = Algorithm.from_checkpoint(path)
    assert resumed.env_steps_lifetime == rows[-1]["num_env_steps_sampled_lifetime"]
    row = resumed.train()
    steps = row["num_env_steps_sampled_lifetime"]
    assert resumed.learner.optimizer.lr == pytest.approx(1e-3 * (1 - steps / 1000)) and steps > 600
    while row["num_env_steps_sampled_lifetime"] < 1000:
        row = resumed.train()
    before = resumed.get_weights()
    resumed.train()  # lr 0 from here: nothing moves
    after = resumed.get_weights()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    resumed.stop()


@pytest.mark.usefixtures("ray_session")
def test_data_parallel_learners_take_the_same_scheduled_lr():
    import ray

    algo = (PPOConfig().environment("CartPole-v1").training(train_batch_size=256, minibatch_size=128, num_epochs=1,
                                                            lr=[[0, 1e-3], [1024, 0.0]])
            .learners(num_learners=2).debugging(seed=0).build())
    steps = algo.train()["num_env_steps_sampled_lifetime"]
    rates = ray.get([actor.__ray_call__.remote(lambda self: self.learner.optimizer.lr)
                     for actor in algo.learners.actors])
    algo.stop()
    assert rates[0] == rates[1] == pytest.approx(1e-3 * (1 - steps / 1024))


def test_a_yaml_decay_without_steps_runs_over_the_stop_timesteps(tmp_path):
    spec = tmp_path / "annealed.yaml"
    spec.write_text("algorithm: PPO\nenv: CartPole-v1\nstop: {timesteps_total: 1024}\nconfig:\n"
                    "  train_batch_size: 256\n  minibatch_size: 128\n  num_epochs: 1\n"
                    "  lr: {schedule: linear, start: 1.0e-3, end: 0}\n")
    assert main(["train", "-f", str(spec), "--output", str(tmp_path / "out"), "--quiet", "--no-tensorboard"]) == 0
    rows = [json.loads(line) for line in next((tmp_path / "out").glob("*/*/result.json")).read_text().splitlines()]
    assert len(rows) >= 4
    for row in rows:
        assert row["lr"] == pytest.approx(1e-3 * max(0.0, 1 - row["num_env_steps_sampled_lifetime"] / 1024))


@pytest.mark.parametrize("make", [
    lambda: A2CConfig().environment("CartPole-v1").training(train_batch_size=200),
    lambda: IMPALAConfig().environment("CartPole-v1").training(train_batch_size=400),
    lambda: APPOConfig().environment("CartPole-v1").training(train_batch_size=400),
    lambda: DQNConfig().environment("CartPole-v1").training(num_steps_sampled_before_learning_starts=64),
    lambda: SACConfig().environment("Pendulum-v1").training(num_steps_sampled_before_learning_starts=64)
    .reporting(min_sample_timesteps_per_iteration=100),
    lambda: TD3Config().environment("Pendulum-v1").training(num_steps_sampled_before_learning_starts=64)
    .reporting(min_sample_timesteps_per_iteration=100),
], ids=["A2C", "IMPALA", "APPO", "DQN", "SAC", "TD3"])
def test_every_algorithms_optimizers_follow_the_schedule_to_zero(make):
    """lr 1e-3 at step 0, 0 from step 1 on: every update comes after the first step, so the weights never move —
    unless an optimizer kept the lr it was built with (1e-3). Updates did happen (counted in the rows)."""
    algo = make().training(lr=[[0, 1e-3], [1, 0.0]]).debugging(seed=0).build()
    before = algo.get_weights()
    updates = 0
    for _ in range(3):
        row = algo.train()
        updates += row.get("num_gradient_updates", 0) or row.get("num_sgd_steps", 0) or int("policy_loss" in row
                                                                                           or "vf_loss" in row)
    after = algo.get_weights()
    algo.stop()
    assert updates > 0
    assert all(np.array_equal(before[k], after[k]) for k in before)


@pytest.mark.usefixtures("ray_session")
def test_a_sweeps_named_decay_without_steps_takes_its_timesteps_stop(tmp_path):
    from herdrl import tune

    analysis = tune.run("PPO", config={"env": "CartPole-v1", "train_batch_size": 256, "minibatch_size": 128,
                                       "num_epochs": 1, "lr": {"schedule": "linear", "start": 1e-3, "end": 0.0}},
                        stop={"timesteps_total": 768}, storage_path=tmp_path, name="decay", verbose=0)
    assert not analysis.errors
    rows = [json.loads(line) for line in next((tmp_path / "decay").glob("PPO_*/result.json")).read_text()
            .splitlines()]
    assert rows and all(r["lr"] == pytest.approx(1e-3 * max(0.0, 1 - r["num_env_steps_sampled_lifetime"] / 768))
                        for r in rows)


def test_each_policy_of_a_multi_agent_run_follows_the_schedule_by_its_own_agent_steps(tmp_path):
    """CueRelay's a1 decides 3 times an episode, a0 8 times: with a policy each, their lr schedules move at their
    own pace, counted from the rows each policy was shipped; the optimizers take those values, and a resumed run
    continues each count."""
    from test_multi_agent import SEPARATE, relay_config

    from herdrl import register_env
    from herdrl.env.testing import CueRelay

    register_env("relay", lambda cfg: CueRelay(cfg))  # (registered by test_multi_agent's import, maybe gone since)
    config = relay_config(**SEPARATE).training(lr=[[0, 1e-2], [4000, 0.0]])
    algo = config.build()
    rows, shipped = [], {"p0": 0, "p1": 0}
    record = algo.record

    def counting(sampled):  # the rows of each policy as shipped, counted from the fragments themselves
        for item in sampled:
            for pid, part in item.data.policies.items():
                shipped[pid] += int(part.valid.sum())
        record(sampled)

    algo.record = counting
    for _ in range(2):
        rows.append(algo.train())
        for pid in ("p0", "p1"):
            expected = 1e-2 * max(0.0, 1 - shipped[pid] / 4000)
            assert algo.learner.learners[pid].optimizer.lr == pytest.approx(expected)
            assert rows[-1][f"lr/{pid}"] == pytest.approx(expected)
    assert shipped["p1"] / shipped["p0"] == pytest.approx(3 / 8, abs=0.1) and "lr" not in dict(rows[-1])
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    resumed = Algorithm.from_checkpoint(path, policy_mapping_fn=SEPARATE["policy_mapping_fn"])
    try:
        assert resumed.policy_steps_lifetime == shipped
    finally:
        resumed.stop()


def test_each_policy_takes_its_own_learning_rate_and_schedule_through_a_checkpoint(tmp_path):
    """RLlib's per-policy config: p0 learns at a constant 3e-3, p1 along its own schedule; each optimizer steps with
    its policy's value at its own agent steps, and a checkpoint brings both back. Keys every policy shares are
    refused in one line."""
    from test_multi_agent import SEPARATE

    from herdrl import register_env
    from herdrl.env.testing import CueRelay
    from herdrl.multi_agent import PolicySpec

    register_env("relay", lambda cfg: CueRelay(cfg))
    policies = {"p0": PolicySpec(config={"lr": 3e-3}), "p1": {"config": {"lr": [[0, 1e-2], [1000, 0.0]]}}}
    config = (PPOConfig().environment("relay").env_runners(num_envs_per_env_runner=4)
              .training(train_batch_size=256, minibatch_size=64, lr=1e-4)
              .multi_agent(policies=policies, policy_mapping_fn=SEPARATE["policy_mapping_fn"]).debugging(seed=3))
    algo = config.build()
    row = algo.train()
    p1_steps = algo.policy_steps_lifetime["p1"]
    assert algo.learner.learners["p0"].optimizer.lr == 3e-3 and row["lr/p0"] == 3e-3
    assert algo.learner.learners["p1"].optimizer.lr == pytest.approx(1e-2 * (1 - p1_steps / 1000))
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    resumed = Algorithm.from_checkpoint(path, policy_mapping_fn=SEPARATE["policy_mapping_fn"])
    try:
        row = resumed.train()
        p1_steps = resumed.policy_steps_lifetime["p1"]
        assert resumed.learner.learners["p0"].optimizer.lr == 3e-3
        assert row["lr/p1"] == pytest.approx(1e-2 * max(0.0, 1 - p1_steps / 1000))
    finally:
        resumed.stop()
    for bad, message in (({"minibatch_size": 32}, "shared by every policy"), ({"num_envs_per_env_runner": 2},
                                                                               "shared by every policy"),
                         ({"lrr": 1e-3}, "is not a config key"), ({"lr": -1.0}, "policy 'p0' lr")):
        config = relay_config_with({"p0": {"config": bad}, "p1": None})
        with pytest.raises(ConfigError, match=message):
            config.validate()


def relay_config_with(policies):
    from test_multi_agent import SEPARATE

    return (PPOConfig().environment("relay")
            .multi_agent(policies=policies, policy_mapping_fn=SEPARATE["policy_mapping_fn"]))


def test_a_multi_agent_decay_needs_its_steps_and_batch_sizes_must_agree():
    from herdrl import register_env
    from herdrl.env.testing import CueRelay

    register_env("relay", lambda cfg: CueRelay(cfg))
    config = relay_config_with({"p0": None, "p1": None}).training(lr={"schedule": "linear", "start": 1e-3, "end": 0})
    with pytest.raises(ConfigError, match="each policy's own agent steps, not env steps: give the decay its steps"):
        config.decay_over(10_000)
    config = PPOConfig().environment("CartPole-v1").training(train_batch_size_per_learner=500)
    config.validate()
    assert config.train_batch_size == 500
    config.training(train_batch_size=1000)
    with pytest.raises(ConfigError, match="disagree: give one of them"):
        config.validate()
