"""Callbacks with RLlib's hooks (new stack and old) and custom metrics: what the hooks see is checked against what
the env itself did, reductions against numpy, pooling over Ray runners against what each runner logged."""

import csv
import importlib.util
import json
import logging
import math
import sys

import gymnasium as gym
import numpy as np
import pytest

from herdrl import ConfigError, DefaultCallbacks, PPOConfig, RLlibCallback, register_env
from herdrl.callbacks import CallbackError, MetricsLogger, MetricsReducer, metric_settings
from herdrl.results import flat_name

ENDED: list[tuple[float, int]] = []  # (return, length) of each episode, as the env itself counted them
STEPPED = [0]  # env steps taken


class Scored(gym.Env):
    """Random rewards in [0, 1); ends at random lengths; reports its step count in info and its episodes in
    :data:`ENDED`."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config=None):
        self.rng = np.random.default_rng((config or {}).get("seed", 0))

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t, self.total = 0, 0.0
        self.length = int(self.rng.integers(3, 12))
        return self.rng.uniform(-1, 1, 2).astype(np.float32), {"t": 0}

    def step(self, action):
        self.t += 1
        STEPPED[0] += 1
        reward = float(self.rng.random())
        self.total += reward
        done = self.t >= self.length
        if done:
            ENDED.append((self.total, self.t))
        return self.rng.uniform(-1, 1, 2).astype(np.float32), reward, done, False, {"t": self.t}


class Seen(RLlibCallback):
    """Records what its episode hooks saw, and logs custom metrics."""

    ended: list = []
    steps = 0

    def on_episode_created(self, *, episode, env_index, **kwargs):
        assert episode.get_observations() == [] and not episode.custom_data  # before the reset, as in RLlib
        episode.custom_data["created"] = True

    def on_episode_start(self, *, episode, env_index, **kwargs):
        assert len(episode) == 0 and episode.get_infos(-1) == {"t": 0} and episode.custom_data["created"]
        episode.custom_data["infos_t"] = []

    def on_episode_step(self, *, episode, env_index, env_runner, **kwargs):
        type(self).steps += 1
        episode.custom_data["infos_t"].append(episode.get_infos(-1)["t"])

    def on_episode_end(self, *, episode, metrics_logger, env, env_index, rl_module, **kwargs):
        assert episode.is_terminated and episode.custom_data["infos_t"] == list(range(1, len(episode) + 1))
        assert episode.get_observations().shape == (len(episode) + 1, 2)
        type(self).ended.append((episode.get_return(), len(episode)))
        metrics_logger.log_value("return", episode.get_return(), reduce="mean", window=7)
        metrics_logger.log_value("longest", len(episode), reduce="max")
        metrics_logger.log_value("episodes", 1, reduce="sum")
        metrics_logger.log_value("episodes_ever", 1, reduce="lifetime_sum")


def _config(**callbacks):
    register_env("Scored", lambda cfg: Scored(cfg))
    return (PPOConfig().environment("Scored").env_runners(num_envs_per_env_runner=3)
            .training(train_batch_size=96, minibatch_size=48, num_epochs=1).debugging(seed=3).callbacks(**callbacks))


def test_episode_hooks_see_each_episode_as_the_env_played_it_and_metrics_reduce_as_rllib_says():
    ENDED.clear()
    STEPPED[0] = 0
    Seen.ended, Seen.steps = [], 0
    algo = _config(callbacks_class=Seen).build()
    try:
        rows = [algo.train() for _ in range(3)]
    finally:
        algo.stop()
    # every episode, in order, with the env's own return (rewards are stored as float32) and length
    assert [length for _, length in Seen.ended] == [length for _, length in ENDED] and len(ENDED) > 20
    assert [r for r, _ in Seen.ended] == pytest.approx([r for r, _ in ENDED], rel=1e-6)
    assert Seen.steps == STEPPED[0] > 250  # every env step, once
    done = 0
    for row in rows:
        episodes = ENDED[done:done + row["num_episodes"]]
        done += len(episodes)
        assert row["env_runners/episodes"] == len(episodes)  # sum: this iteration's
        assert row["env_runners/episodes_ever"] == done  # lifetime_sum
        assert row["env_runners/longest"] == max(length for _, length in episodes)  # max: this iteration's
        assert row["env_runners/return"] == pytest.approx(np.mean([r for r, _ in ENDED[:done][-7:]]), rel=1e-6)
        assert row["env_runners"]["return"] == row["env_runners/return"]  # RLlib's new stack reads it nested


class Plain(RLlibCallback):
    def on_train_result(self, *, result, **kwargs):
        result["seen"] = 1.0

    def on_learn_on_batch(self, *, policy, train_batch, result, **kwargs):  # RLlib's old stack: not called here
        raise AssertionError("never called")


def test_without_episode_hooks_the_runner_makes_no_per_step_call(monkeypatch, caplog):
    from herdrl import callbacks

    calls = []
    monkeypatch.setattr(callbacks.EpisodeTracker, "step", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(callbacks.EpisodeTracker, "__init__", lambda *a, **k: calls.append(1))
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        algo = _config(callbacks_class=Plain).build()
    try:
        assert algo.train()["seen"] == 1.0
    finally:
        algo.stop()
    assert calls == []
    assert "Plain.on_learn_on_batch is never called here" in caplog.text


class OldStack(DefaultCallbacks):
    """RLlib's old-stack signature, without **kwargs: it gets only what it names."""

    def on_episode_start(self, *, worker, base_env, policies, episode, env_index):
        episode.user_data["first_obs"] = episode.last_observation_for()

    def on_episode_end(self, *, worker, base_env, policies, episode, env_index):
        assert "first_obs" in episode.user_data and policies["default_policy"] is worker.policy
        episode.custom_metrics["score"] = episode.total_reward
        episode.custom_metrics["length"] = episode.length


def test_old_stack_callbacks_and_custom_metrics_over_the_last_100_episodes():
    ENDED.clear()
    algo = _config(callbacks_class=OldStack).build()
    try:
        for _ in range(4):
            row = algo.train()
    finally:
        algo.stop()
    scores = [r for r, _ in ENDED][-100:]
    assert len(ENDED) > 100 or row["num_episodes_lifetime"] == len(ENDED)
    assert row["custom_metrics/score_mean"] == pytest.approx(np.mean(scores), rel=1e-6)
    assert row["custom_metrics"]["score_max"] == pytest.approx(max(scores), rel=1e-6)
    assert row["custom_metrics"]["length_min"] == min(length for _, length in ENDED[-100:])


def test_reductions_follow_rllibs_rules():
    logger, reducer = MetricsLogger(), MetricsReducer()
    rng = np.random.default_rng(0)
    first, second = rng.random(5), rng.random(3)
    for values in (first, second):
        for v in values:
            logger.log_value("w", v, window=4)  # no reduce, a window: mean
            logger.log_value("e", v)  # neither: EMA 0.01
            logger.log_value("old_ema", v, reduce="mean", ema_coeff=0.5)  # RLlib < 2.50's EMA spelling
            logger.log_value("it", v, reduce="mean")  # this iteration's
            logger.log_value("s", v, reduce="sum")
            logger.log_value("life", v, reduce="sum", clear_on_reduce=False)
            logger.log_value(("nested", "lo"), v, reduce="min")
        reducer.add(logger.take())
        row = reducer.reduce()
    both = np.concatenate([first, second])
    ema = both[0]
    ema_half = both[0]
    for v in both[1:]:
        ema = 0.99 * ema + 0.01 * v
        ema_half = 0.5 * ema_half + 0.5 * v
    assert row["w"] == pytest.approx(both[-4:].mean())
    assert row["e"] == pytest.approx(ema) and row["old_ema"] == pytest.approx(ema_half)
    assert row["it"] == pytest.approx(second.mean()) and row["s"] == pytest.approx(second.sum())
    assert row["life"] == pytest.approx(both.sum()) and row["nested/lo"] == pytest.approx(second.min())
    row = reducer.reduce()  # an iteration that logged nothing
    assert math.isnan(row["it"]) and row["s"] == 0.0 and row["w"] == pytest.approx(both[-4:].mean())
    assert metric_settings("sum", None, None, None) == ("sum", None, None)
    for bad in ({"reduce": "median"}, {"window": 0}, {"reduce": "ema", "window": 3}, {"reduce": "ema",
                                                                                      "ema_coeff": 2}):
        with pytest.raises(ConfigError):
            MetricsLogger().log_value("x", 1.0, **bad)
    with pytest.raises(ConfigError, match="only numbers"):
        MetricsLogger().log_value("x", "high")


class Driver(RLlibCallback):
    events: list = []

    def on_algorithm_init(self, *, algorithm, metrics_logger, **kwargs):
        type(self).events.append("init")

    def on_evaluate_start(self, *, algorithm, **kwargs):
        type(self).events.append("evaluate_start")

    def on_evaluate_end(self, *, algorithm, evaluation_metrics, **kwargs):
        type(self).events.append(("evaluate_end", evaluation_metrics["env_runners"]["episode_return_mean"]))

    def on_train_result(self, *, algorithm, result, metrics_logger, **kwargs):
        type(self).events.append(("result", result["training_iteration"]))
        metrics_logger.log_value("driver_count", 1, reduce="lifetime_sum")

    def on_checkpoint_loaded(self, *, algorithm, **kwargs):
        type(self).events.append(("loaded", algorithm.iteration))


def test_driver_hooks_order_and_a_resumed_run_continues_its_metrics(tmp_path, caplog):
    from herdrl import Algorithm

    Driver.events = []
    config = _config(callbacks_class=[Driver, Seen]).evaluation(evaluation_interval=2, evaluation_duration=2)
    algo = config.build()
    try:
        algo.train()
        row = algo.train()
        path = algo.save(tmp_path / "ckpt")
    finally:
        algo.stop()
    assert Driver.events == ["init", ("result", 1), "evaluate_start",
                             ("evaluate_end", row["evaluation/episode_return_mean"]), ("result", 2)]
    assert row["driver_count"] == 2
    import json

    saved = json.loads((path / "checkpoint.json").read_text())["config"]
    assert saved["callbacks_class"] is None and saved["callbacks_hooks"] == {}  # code is never saved
    algo = Algorithm.from_checkpoint(path)  # without callbacks: none run
    try:
        assert algo.callbacks is None and "env_runners/episodes_ever" not in algo.train()
    finally:
        algo.stop()
    Driver.events = []
    algo = Algorithm.from_checkpoint(path, callbacks_class=[Driver, Seen], lr=1e-4)  # given again: continued
    try:
        resumed = algo.train()
    finally:
        algo.stop()
    assert Driver.events[:2] == ["init", ("loaded", 2)] and resumed["driver_count"] == 3
    assert resumed["env_runners/episodes_ever"] == row["env_runners/episodes_ever"] + resumed["num_episodes"]
    # a checkpoint file that names callbacks is not obeyed
    meta = json.loads((path / "checkpoint.json").read_text())
    meta["config"]["callbacks_class"] = "os:system"
    meta["config"]["evaluation_config"] = {"env": "os:Anything-v0", "explore": True}  # would import os
    (path / "checkpoint.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        algo = Algorithm.from_checkpoint(path)
    algo.stop()
    assert algo.config.callbacks_class is None and algo.config.evaluation_config == {"explore": True}
    assert "callbacks_class='os:system'; ignored" in caplog.text and "env='os:Anything-v0'; ignored" in caplog.text


class Writes(RLlibCallback):
    """Writes into the row's nested groups as RLlib scripts do, old stack and new, before any custom metric exists."""

    def on_train_result(self, *, result, **kwargs):
        it = result["training_iteration"]
        result["custom_metrics"]["x"] = 3.5 * it  # RLlib's old stack
        result["env_runners"]["y"] = result["num_env_steps_sampled"] + 0.5  # the new stack
        result["learners"]["default_policy"] = {"z": -it}  # RLlib's new stack: metrics by module
        result["learners"]["default_policy"]["q"] = 0.25 * it  # ...written in place
        result["learners"].setdefault("shared", {})["w"] = 2.0 * it
        result.setdefault("custom_metrics", {})["v"] = 1.0
        result["mine"] = {"deep": {"u": 10.0 * it}}


def test_writes_into_nested_result_keys_reach_the_row_csv_json_tensorboard_and_trackers(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from herdrl.experiment import run_experiment

    wandb = importlib.util.find_spec("wandb") is not None  # (an optional extra: the files are checked without it)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = (PPOConfig().environment("CartPole-v1").training(train_batch_size=64, minibatch_size=32, num_epochs=1)
              .debugging(seed=0).callbacks(Writes))
    outcome = run_experiment(config, stop={"training_iteration": 2}, output=tmp_path, quiet=True,
                             checkpoint_every=None, wandb="herd-test" if wandb else None)
    csv_rows = list(csv.DictReader((outcome.logdir / "progress.csv").open()))
    json_rows = [json.loads(line) for line in (outcome.logdir / "result.json").read_text().splitlines()]
    events = EventAccumulator(str(outcome.logdir))
    events.Reload()
    assert len(csv_rows) == len(json_rows) == 2
    for it, (csv_row, json_row) in enumerate(zip(csv_rows, json_rows, strict=True), 1):
        steps = int(csv_row["num_env_steps_sampled"])  # 64 a row, as the config asked
        # a module's keys where the row keeps its learner's (and Tune's learners/default_policy/z finds them)
        expected = {"custom_metrics/x": 3.5 * it, "env_runners/y": steps + 0.5, "z": -it, "q": 0.25 * it,
                    "learners/shared/w": 2.0 * it, "custom_metrics/v": 1.0, "mine/deep/u": 10.0 * it}
        assert steps == 64 and {k: float(csv_row[k]) for k in expected} == expected
        assert {k: json_row[k] for k in expected} == expected
        for key, value in expected.items():
            assert events.Scalars(key)[it - 1].value == value
    assert not {"custom_metrics", "env_runners", "learners", "mine"} & set(json_rows[-1])  # flat keys only
    if wandb:
        from test_trackers import _wandb_history

        history = _wandb_history(outcome.logdir, rows_at_least=2)[0]
        assert [{k: h[k] for k in ("custom_metrics/x", "learners/shared/w", "mine/deep/u")} for h in history] == [
            {"custom_metrics/x": 3.5 * it, "learners/shared/w": 2.0 * it, "mine/deep/u": 10.0 * it} for it in (1, 2)]
    assert outcome.result["learners"]["shared"]["w"] == 4.0 and outcome.result["mine"]["deep"]["u"] == 20.0
    assert outcome.result["learners"]["default_policy"]["q"] == 0.5 == outcome.result[flat_name(
        "learners/default_policy/q")]


class Shadows(RLlibCallback):
    key = ""

    def on_train_result(self, *, result, metrics_logger, **kwargs):
        result["mine"] = 1.0
        metrics_logger.log_value(type(self).key, 2.0)


@pytest.mark.parametrize("key", ["episode_return_mean", "mine", "episode_reward_mean",
                                 "evaluation/episode_return_mean", "policy_frozen",
                                 "evaluation"])
def test_a_driver_metric_named_like_a_key_of_the_row_is_refused(key):
    Shadows.key = key
    algo = _config(callbacks_class=Shadows).build()
    try:
        with pytest.raises(CallbackError, match=rf"log_value\('{key}'\) in the driver: .* 'custom/{key}'"):
            algo.train()
    finally:
        algo.stop()


def test_callbacks_by_name_need_their_module_imported_and_errors_are_one_line(tmp_path, monkeypatch):
    (tmp_path / "my_callbacks_mod.py").write_text(
        "from herdrl import RLlibCallback\n"
        "class Broken(RLlibCallback):\n"
        "    def on_sample_end(self, *, samples, **kwargs):\n"
        "        raise KeyError('oops')\n")
    monkeypatch.chdir(tmp_path)
    config = _config().callbacks("my_callbacks_mod:Broken")
    with pytest.raises(ConfigError, match="--import my_callbacks_mod"):
        config.validate()
    assert "my_callbacks_mod" not in sys.modules
    from herdrl import import_envs

    import_envs("my_callbacks_mod")
    config.validate()
    algo = config.build()
    try:
        with pytest.raises(CallbackError, match=r"Broken.on_sample_end raised KeyError: 'oops'"):
            algo.train()
    finally:
        algo.stop()
    with pytest.raises(ConfigError, match="on_episode_end"):
        _config(on_episode_ends=print)
    with pytest.raises(ConfigError, match="RLlibCallback"):
        _config(callbacks_class=[3]).validate()


def test_functions_per_hook():
    seen = []
    algo = _config(on_train_result=lambda algorithm, result: seen.append(result["training_iteration"]),
                   on_episode_end=lambda episode, metrics_logger: metrics_logger.log_value("n", 1,
                                                                                           reduce="sum")).build()
    try:
        row = algo.train()
    finally:
        algo.stop()
    assert seen == [1] and row["env_runners/n"] == row["num_episodes"]


class PerRunner(RLlibCallback):
    def on_sample_end(self, *, env_runner, metrics_logger, samples, **kwargs):
        for _ in range(env_runner.worker_index):  # runner i logs its index i times
            metrics_logger.log_value("index_mean", env_runner.worker_index, reduce="mean")
        metrics_logger.log_value("index_sum", env_runner.worker_index, reduce="sum")
        metrics_logger.log_value("steps", samples[0].env_steps, reduce="sum")

    def on_episode_end(self, *, metrics_logger, **kwargs):
        metrics_logger.log_value("episodes", 1, reduce="sum")


@pytest.mark.usefixtures("ray_session")
def test_metrics_logged_on_ray_runners_are_pooled_in_the_driver():
    config = _config(callbacks_class=PerRunner).env_runners(num_env_runners=2)
    algo = config.build()
    try:
        row = algo.train()
        assert sorted(algo.runners.call("pid")) and row["env_runners/index_sum"] == 1 + 2
    finally:
        algo.stop()
    # both runners' values, pooled: (1 + 2 + 2) / 3, where a mean of each runner's mean would give 1.5
    assert row["env_runners/index_mean"] == pytest.approx(5 / 3)
    assert row["env_runners/steps"] == row["num_env_steps_sampled"]
    assert row["env_runners/episodes"] == row["num_episodes"]


class FailsOnRunner(RLlibCallback):
    def on_sample_end(self, *, metrics_logger, **kwargs):
        metrics_logger.log_value("x", "high")  # a ConfigError of herdrl's: still the callback's, no restart


@pytest.mark.usefixtures("ray_session")
def test_a_failing_callback_on_a_ray_runner_ends_the_run_without_restarts():
    algo = _config(callbacks_class=FailsOnRunner).env_runners(num_env_runners=1).build()
    try:
        with pytest.raises(CallbackError, match="FailsOnRunner.on_sample_end raised ConfigError: .*only numbers"):
            algo.train()
        assert algo.runners.num_restarts == 0
    finally:
        algo.stop()


def test_herd_train_takes_callbacks_by_flag_and_from_a_file_only_with_its_module_imported(tmp_path, monkeypatch,
                                                                                             capsys):
    from herdrl.cli import main

    (tmp_path / "angle_callbacks.py").write_text(
        "from herdrl import RLlibCallback\n"
        "class Count(RLlibCallback):\n"
        "    def on_episode_end(self, *, metrics_logger, **kwargs):\n"
        "        metrics_logger.log_value('ended', 1, reduce='sum')\n")
    monkeypatch.chdir(tmp_path)
    common = ["--stop-iters", "1", "--quiet", "--no-tensorboard", "--config", "train_batch_size=512",
              "minibatch_size=256"]
    experiment = "exp:\n  env: CartPole-v1\n  run: PPO\n  config:\n    callbacks: angle_callbacks:Count\n"
    (tmp_path / "no_import.yaml").write_text(experiment)
    assert main(["train", "-f", "no_import.yaml", "--output", "a", *common]) == 2
    assert "--import angle_callbacks" in capsys.readouterr().err
    (tmp_path / "imported.yaml").write_text(experiment + "  imports: [angle_callbacks]\n")
    assert main(["train", "-f", "imported.yaml", "--output", "b", *common]) == 0
    assert main(["train", "ppo", "--env", "CartPole-v1", "--callbacks", "angle_callbacks:Count", "--output", "c",
                 *common]) == 0
    for folder in ("b", "c"):
        import csv

        row = list(csv.DictReader(next((tmp_path / folder).glob("*/*/progress.csv")).open()))[-1]
        assert float(row["env_runners/ended"]) == float(row["num_episodes"]) > 0


class RelayEpisodes(RLlibCallback):
    """Checks each multi-agent episode against CueRelay's rules (8 env steps; a0 decides 8 times, a1 3 times; the
    reward of a decision computed from its observation and action alone) and logs a1's return."""

    ended = 0

    def on_episode_end(self, *, episode, metrics_logger, env, env_index, **kwargs):
        from test_multi_agent import _paid

        assert len(episode) == 8 and episode.agent_ids == ["a0", "a1"] and episode.is_truncated
        actions, observations = episode.get_actions(), episode.get_observations()
        assert {a: len(v) for a, v in actions.items()} == {"a0": 8, "a1": 3}
        for agent in ("a0", "a1"):
            paid = _paid(observations[agent][:len(actions[agent])], actions[agent])
            assert float(paid.sum()) == sum(episode.get_rewards()[agent])
            assert episode.module_for(agent) == "p" + agent[1]
        assert episode.agent_rewards[("a1", "p1")] == sum(episode.get_rewards()["a1"])
        assert episode.get_return() == sum(sum(r) for r in episode.get_rewards().values())
        type(self).ended += 1
        metrics_logger.log_value("a1_return", sum(episode.get_rewards()["a1"]), reduce="mean", window=100)


def test_multi_agent_episode_hooks_see_each_agents_own_decisions():
    from test_multi_agent import SEPARATE, relay_config

    from herdrl.env.testing import CueRelay

    register_env("relay", lambda cfg: CueRelay(cfg))  # (registered by test_multi_agent's import, maybe gone since)
    RelayEpisodes.ended = 0
    algo = relay_config(**SEPARATE).callbacks(RelayEpisodes).build()
    try:
        rows = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    assert RelayEpisodes.ended == sum(row["num_episodes"] for row in rows) > 0
    assert rows[-1]["env_runners/a1_return"] == pytest.approx(rows[-1]["agent_return_mean/a1"])
