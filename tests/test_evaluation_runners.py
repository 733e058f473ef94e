"""Evaluation as RLlib does it: its own Ray runners (restarted when they fail), in parallel with training,
episodes or timesteps, evaluation_config's runner keys — checked against envs whose episodes are known."""

import pytest
from envs import Countdown

from herdrl import ConfigError, PPOConfig, register_env


def _config(**evaluation):
    register_env("Countdown", lambda cfg: Countdown(cfg))
    return (PPOConfig().environment("Countdown", env_config={"length": 3}).env_runners(num_envs_per_env_runner=2)
            .training(train_batch_size=64, minibatch_size=32, num_epochs=1).debugging(seed=0)
            .evaluation(evaluation_interval=1, **evaluation))


def test_timesteps_unit_counts_the_episodes_finished_in_those_steps():
    algo = _config(evaluation_duration_unit="timesteps", evaluation_duration=40,
                   evaluation_config={"env_config": {"length": 4}, "num_envs_per_env_runner": 4}).build()
    try:
        row = algo.train()
    finally:
        algo.stop()
    assert row["evaluation/num_env_steps_sampled"] == 40  # 10 steps on each of 4 env copies
    # length 4 in evaluation (3 in training): each copy finishes an episode every 5 steps (4 + its reset step)
    assert row["evaluation/episode_len_mean"] == 4 and row["evaluation/num_episodes"] == 4 * 2
    assert row["episode_len_mean"] == 3


@pytest.mark.usefixtures("ray_session")
def test_evaluation_runners_restart_and_the_evaluation_still_plays_its_episodes(caplog):
    import os
    import signal

    algo = _config(evaluation_num_env_runners=1, evaluation_duration=6,
                   evaluation_config={"env_config": {"length": 5}}).build()
    try:
        first = algo.train()
        (pid,) = algo._runner_evaluation.group.call("pid")
        os.kill(pid, signal.SIGKILL)
        with caplog.at_level("WARNING", logger="herdrl"):
            second = algo.train()
    finally:
        algo.stop()
    for row in (first, second):
        assert row["evaluation/num_episodes"] == 6 and row["evaluation/episode_len_mean"] == 5
        assert row["evaluation/num_episodes_cut"] == 0
    assert "evaluation runner 1 failed" in caplog.text


def test_evaluation_config_takes_runner_keys_and_refuses_others():
    with pytest.raises(ConfigError, match="'lr' does not apply to evaluation runners"):
        _config(evaluation_config={"lr": 1e-3}).validate()
    with pytest.raises(ConfigError, match="evaluation_config num_envs_per_env_runner"):
        _config(evaluation_config={"num_envs_per_env_runner": 0}).validate()
    with pytest.raises(ConfigError, match="evaluation_num_env_runners >= 1"):
        _config(evaluation_parallel_to_training=True).validate()
    config = _config(evaluation_num_workers=2, evaluation_config={"num_cpus_per_worker": 0.5})  # older names
    assert config.evaluation_num_env_runners == 2 and config.total_cpus_requested == 1
    from herdrl.experiment import run_experiment

    with pytest.raises(ConfigError, match="--keep-best with evaluation_parallel_to_training"):
        run_experiment(_config(evaluation_num_env_runners=1, evaluation_parallel_to_training=True), keep_best=True)


def test_an_evaluation_stops_at_its_timeout_with_what_finished(caplog):
    """Episodes of 200 steps at 5 ms a step: a 0.5 s timeout cuts the evaluation after its first 256-step round
    (one episode finished), with a line saying so. Played by RunnerEvaluation's runner in the driver, as a remote
    evaluation runner would play it."""
    from herdrl.rollout.evaluation import RunnerEvaluation

    config = (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.0})
              .evaluation(evaluation_interval=1, evaluation_duration=100, evaluation_sample_timeout_s=0.5,
                          evaluation_config={"env_config": {"step_latency_s": 0.005}, "num_envs_per_env_runner": 1,
                                             "rollout_fragment_length": 256}))
    config.validate()
    algo = config.build()
    evaluation = RunnerEvaluation(config)
    try:
        with caplog.at_level("WARNING", logger="herdrl"):
            metrics = evaluation.run(algo.runner_weights(), iteration=1)
    finally:
        evaluation.stop()
        algo.stop()
    assert metrics["evaluation/num_episodes"] == 1 and metrics["evaluation/num_episodes_cut"] == 99
    assert metrics["evaluation/num_env_steps_sampled"] == 255  # 256 less the reset-only step after the episode
    assert "evaluation stopped at evaluation_sample_timeout_s=0.5 with 1 episode finished" in caplog.text


@pytest.mark.usefixtures("ray_session")
def test_a_ray_round_late_for_the_timeout_is_left_out_not_failed_and_not_sent_another_call(caplog):
    """A 256-step round at 5 ms a step (1.3 s) against a 0.5 s timeout: the evaluation ends with nothing finished,
    the runner is neither failed nor sent a second call while the first is running, and serves again once it
    answered."""
    import time

    from herdrl.rollout.evaluation import RunnerEvaluation

    config = (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.0})
              .evaluation(evaluation_interval=1, evaluation_duration=5, evaluation_sample_timeout_s=0.5,
                          evaluation_num_env_runners=1,
                          evaluation_config={"env_config": {"step_latency_s": 0.005}, "num_envs_per_env_runner": 1}))
    config.validate()
    algo = config.build()
    evaluation = RunnerEvaluation(config, algo.observation_space, algo.action_space)
    try:
        weights = algo.runner_weights()
        with caplog.at_level("WARNING", logger="herdrl"):
            first = evaluation.run(weights, iteration=1)
            second = evaluation.run(weights, iteration=2)  # the runner is still on the first call
        group = evaluation.group
        assert first["evaluation/num_episodes"] == second["evaluation/num_episodes"] == 0
        assert group.num_restarts == 0 and list(group._late) == [0] and group.num_healthy == 1
        deadline = time.monotonic() + 20
        while group._still_busy() and time.monotonic() < deadline:  # (1.3 s of stepping, after the actor's start)
            time.sleep(0.2)
        assert not group._late and group.num_restarts == 0  # it answered: in service again
    finally:
        evaluation.stop()
        algo.stop()
    assert caplog.text.count("evaluation stopped at evaluation_sample_timeout_s=0.5 with 0 episodes finished") == 2


@pytest.mark.usefixtures("ray_session")
def test_a_training_error_during_a_parallel_evaluation_ends_the_run_and_stop_returns():
    import time

    algo = _config(evaluation_num_env_runners=1, evaluation_parallel_to_training=True,
                   evaluation_duration=3).build()

    def broken():
        raise RuntimeError("the learner broke")

    algo.training_step = broken
    try:
        with pytest.raises(RuntimeError, match="the learner broke"):
            algo.train()
    finally:
        started = time.monotonic()
        algo.stop()  # joins the evaluation thread (its evaluation ends within its timeout) and stops its runners
    assert time.monotonic() - started < 60 and algo._evaluation_thread._shutdown
    assert not [t for t in __import__("threading").enumerate() if t.name.startswith("herd-evaluation")]


def _timed_evaluation(algo, caplog):
    """``algo.evaluate()``'s metrics and the seconds it took (clocked here), its warnings captured; algo stopped."""
    import time

    try:
        with caplog.at_level("WARNING", logger="herdrl"):
            start = time.monotonic()
            metrics = algo.evaluate()
            return metrics, time.monotonic() - start
    finally:
        algo.stop()


def test_the_driver_runners_rounds_fit_the_time_left_of_a_never_ending_evaluation(caplog):
    """Episodes that never end at ~3 ms a step, 256-step rounds (~0.8 s) against a 1 s timeout: once the first
    round shows the pace, the next is cut to the time left (two whole rounds: 512 steps, 1.5 s or more), so the
    evaluation returns within its bound plus a few steps (clocked here), with every episode cut and the line saying
    how to change the bound."""
    config = (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.003, "episode_len": 10**9})
              .evaluation(evaluation_interval=1, evaluation_duration=10**9, evaluation_duration_unit="timesteps",
                          evaluation_sample_timeout_s=1.0, evaluation_config={"num_envs_per_env_runner": 1}))
    metrics, took = _timed_evaluation(config.build(), caplog)
    assert 1.0 <= took < 1.0 + 0.4  # (slack for a loaded machine; two whole rounds take 1.5 s or more)
    assert metrics["evaluation/num_episodes"] == 0 and 256 < metrics["evaluation/num_env_steps_sampled"] < 450
    assert ("evaluation stopped at evaluation_sample_timeout_s=1 with 0 episodes finished; episodes still running "
            "were cut and left out (raise evaluation_sample_timeout_s, or set it to None, to let them finish)"
            ) in caplog.text


def test_a_multi_agent_evaluation_of_never_ending_episodes_stops_at_its_timeout(caplog):
    from herdrl.env.testing import CueRelay

    class EndlessRelay(CueRelay):
        EPISODE_LEN = 10**9

    register_env("endless_relay", lambda cfg: EndlessRelay({"together": True}))
    metrics, took = _timed_evaluation((PPOConfig().environment("endless_relay").multi_agent(policies={"shared"})
                                       .evaluation(evaluation_duration=2, evaluation_sample_timeout_s=0.3)).build(),
                                      caplog)
    assert 0.3 <= took < 0.3 + 0.7  # (slack for a loaded machine: without the bound it never returns)
    assert metrics["evaluation/num_episodes"] == 0 and metrics["evaluation/num_episodes_cut"] == 2
    assert "evaluation stopped at evaluation_sample_timeout_s=0.3 with 0 episodes finished" in caplog.text
