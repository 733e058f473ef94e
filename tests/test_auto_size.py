"""``num_env_runners="auto"`` / ``num_envs_per_env_runner="auto"`` (issue 64): measured on the spot, chosen by the
model in both regimes, a user's number kept, the choice said, recorded in the trial folder and kept on resume."""

import json

import pytest

from herdrl import PPOConfig
from herdrl.auto_size import size_run
from herdrl.errors import ConfigError


def _auto(config):
    return config.env_runners(num_env_runners="auto", num_envs_per_env_runner="auto")


def test_auto_follows_the_model_where_the_env_or_the_learner_is_the_limit(ray_session):
    """The session's Ray offers 4 CPUs: 4 runner slots (PPO's driver waits while they sample). An env that sleeps
    10 ms a step (no CPU) and a light learner: sampling is the limit, so every slot gets a runner, and nodes that
    join may get up to what a batch of 512 holds (32 envs of 16-step fragments). A fast env (CartPole) and a learner
    that takes 10 epochs of minibatches of 16 on a wide network: learning is the limit, and runners would only add
    CPUs, so it samples in the driver. A number the user gave stays as given."""
    lines = []
    env_bound = _auto(PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.01}))
    sized, record = size_run(env_bound.training(train_batch_size=512, minibatch_size=64, num_epochs=1),
                             budget_s=3, echo=lines.append)
    assert (sized.num_env_runners, sized.num_envs_per_env_runner, record["bound"]) == (4, 1, "slots"), record
    # sampling is the limit: nodes that join later get runners too (max_env_runners), as many as pay and fit
    assert 4 < sized.max_env_runners == record["max_env_runners"] <= 32
    assert record["costs"]["env_step_s"] == pytest.approx(0.01, rel=0.5)
    assert lines == [f"herd: num_env_runners=auto, num_envs_per_env_runner=auto: {record['reason']}; measured in "
                     f"{record['measured_s']:.1f} s"]
    learner_bound = _auto(PPOConfig().environment("CartPole-v1")).training(
        train_batch_size=256, minibatch_size=16, num_epochs=10, model={"fcnet_hiddens": [512, 512]})
    sized, record = size_run(learner_bound, budget_s=3, echo=lines.append)
    assert (sized.num_env_runners, record["bound"]) == (0, "learner"), record["reason"]
    assert sized.max_env_runners is None  # (sampling in the driver: nothing to add runners to)
    assert record["costs"]["learner_s_per_env_step"] > 20 * record["costs"]["env_step_s"]
    kept = PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.01}).env_runners(
        num_env_runners="auto", num_envs_per_env_runner=8).training(train_batch_size=512, minibatch_size=64)
    sized, record = size_run(kept, budget_s=2, echo=lines.append)
    assert sized.num_envs_per_env_runner == 8 and record["auto"] == ["num_env_runners"]
    assert sized.num_env_runners == 4 and kept.num_env_runners == "auto"  # (the user's config is left as given)


def test_herd_train_auto_says_and_records_its_choice_and_a_resume_keeps_it(ray_session, tmp_path, capsys):
    from herdrl.cli import main

    args = ["train", "ppo", "--env", "CartPole-v1", "--num-env-runners", "auto", "--num-envs-per-env-runner", "auto",
            "--config", "train_batch_size=256", "minibatch_size=64", "--no-tensorboard", "--output", str(tmp_path)]
    assert main([*args, "--stop-iters", "1"]) == 0
    out = capsys.readouterr().out
    assert "herd: num_env_runners=auto, num_envs_per_env_runner=auto: env " in out
    trial, = tmp_path.glob("CartPole-v1/PPO_*")
    record = json.loads((trial / "sizing.json").read_text())
    params = json.loads((trial / "params.json").read_text())
    assert (params["num_env_runners"], params["num_envs_per_env_runner"]) == (
        record["num_env_runners"], record["num_envs_per_env_runner"])
    # a resume takes the record's counts, measuring nothing: change them, and the resumed run uses the new ones
    (trial / "sizing.json").write_text(json.dumps({**record, "num_env_runners": 1, "num_envs_per_env_runner": 3}))
    assert main([*args, "--stop-iters", "2", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "the trial's first choice, 1 runner x 3 envs (kept on resume" in out and "measured in" not in out
    params = json.loads((trial / "params.json").read_text())
    assert (params["num_env_runners"], params["num_envs_per_env_runner"]) == (1, 3)
    rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    assert rows[-1]["num_healthy_env_runners"] == 1 and [row["training_iteration"] for row in rows] == [1, 2]
    (trial / "sizing.json").write_text("{not json")
    assert main([*args, "--stop-iters", "3", "--resume"]) == 2
    assert "sizing.json is not a sizing record herdrl wrote" in capsys.readouterr().err
    for count in ("Infinity", "2.9", "true", "-1"):
        (trial / "sizing.json").write_text(f'{{"num_env_runners": {count}, "num_envs_per_env_runner": 3}}')
        assert main([*args, "--stop-iters", "3", "--resume"]) == 2
        assert "not a whole number in range; delete it" in capsys.readouterr().err


def test_measuring_fits_slow_envs_and_impala_and_records_nothing(ray_session, tmp_path):
    """IMPALA on an env of 20 ms a step: the measuring batch holds whole fragments (a batch cut to what 2 s samples
    was shorter than one) and one update an iteration. A run that records its episodes (`output`) records none of
    the measuring ones."""
    from herdrl.algorithms.impala import IMPALAConfig

    slow = _auto(IMPALAConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.02}))
    sized, record = size_run(slow, budget_s=2, echo=lambda line: None)
    assert record["costs"]["env_step_s"] == pytest.approx(0.02, rel=0.5) and sized.num_env_runners >= 1
    assert record["measured_s"] < 20
    recorded = _auto(PPOConfig().environment("CartPole-v1")).offline_data(output=str(tmp_path / "episodes"))
    size_run(recorded.training(train_batch_size=256, minibatch_size=64), budget_s=1, echo=lambda line: None)
    assert not (tmp_path / "episodes").exists() or not any((tmp_path / "episodes").iterdir())


@pytest.mark.parametrize("algorithm", ["PPO", "IMPALA", "DQN"])
def test_a_runners_round_is_measured_only_where_runners_share_a_hosts_cores(ray_session, algorithm):
    """4 nodes of 16 CPUs on this host, given 2 real cores, for an env that sleeps 2 ms: the choice differs
    between a free round and a dear one, so one round of a Ray runner is measured (each algorithm's probe builds
    its own 2-step batch) and decides; nodes with the cores they advertise measure nothing."""
    import dataclasses

    from herdrl.bench_size import ROUND_CPU_CEILING_S, this_host, with_round_cost
    from herdrl.registry import get_config_class
    from herdrl.sizing import Costs, Node, choose

    host = this_host()[0]
    costs = Costs(0.002, {1: 0.0}, 70e-6, 0.0, (Node(16, 64e9, host),) * 4, runner_cpu_s={1: 1e-4},
                  host_cores={host: 2}, train_batch=1024)
    config = get_config_class(algorithm)().environment("herd/Latency-v0", env_config={"step_latency_s": 0.002})
    config.validate()
    asked = []

    def decide(costs):
        asked.append(costs.round_cpu_s)
        return choose(costs, bounds=(64, None))

    measured, sizing = with_round_cost(config, costs, decide, seconds=1.0)
    assert asked == [0.0, ROUND_CPU_CEILING_S, measured.round_cpu_s]
    assert 0.3e-3 < measured.round_cpu_s < ROUND_CPU_CEILING_S  # (3.7-9.8 ms measured on the 2-core box)
    # the choice on the measured round: where stepping (1 / (N x 500)) meets the CPU on 2 cores ((0.1 ms + N x
    # round / 1024) / 2), solved by hand as a quadratic
    k_over_b, c = measured.round_cpu_s / 1024, 1e-4
    best = (-c + (c * c + 4 * k_over_b * 2 / 500) ** 0.5) / (2 * k_over_b)
    assert sizing.bound == "cores" and sizing.num_env_runners in (int(best), int(best) + 1)
    asked.clear()
    alone, _ = with_round_cost(config, dataclasses.replace(costs, host_cores={host: 64}), decide)
    assert alone.round_cpu_s == 0.0 and asked == [0.0]


def test_auto_gives_an_impala_run_held_back_by_its_learners_intake_an_aggregator_and_a_resume_keeps_it(
        monkeypatch, tmp_path):
    """Costs where the model picks an aggregator (an intake twice the update, learning beside sampling): the sized
    config has one learner actor with one aggregator and validates, the record says so, a resume keeps them; a run
    that set num_learners itself, or one that samples then learns, gets none."""
    from herdrl import bench_size
    from herdrl.algorithms.impala import IMPALAConfig
    from herdrl.auto_size import kept_choice, write_record
    from herdrl.sizing import Costs, Node

    costs = Costs(0.001, {1: 0.0}, 50e-6, 0.0, (Node(32, 64e9, "elsewhere"),), intake_s_per_step=100e-6)
    monkeypatch.setattr(bench_size, "measure_costs", lambda *args, **kwargs: costs)
    monkeypatch.setattr("herdrl.auto_size._nodes_for", lambda config: costs.nodes)
    impala = _auto(IMPALAConfig().environment("CartPole-v1").resources(num_gpus=1))
    sized, record = size_run(impala, echo=lambda line: None)
    sized.validate()
    assert (sized.num_learners, sized.num_aggregator_actors_per_learner, sized.num_env_runners) == (1, 1, 10)
    assert (sized.num_gpus, sized.num_gpus_per_learner) == (0, 1)  # (the driver's learner GPU is the actor's now)
    assert (record["num_learners"], record["num_aggregator_actors_per_learner"]) == (1, 1)
    assert "1 learner actor with 1 aggregator" in record["reason"]
    write_record(tmp_path, record)
    kept = kept_choice(impala, tmp_path, echo=lambda line: None)
    assert (kept.num_learners, kept.num_aggregator_actors_per_learner, kept.num_env_runners) == (1, 1, 10)
    assert (kept.num_gpus, kept.num_gpus_per_learner) == (0, 1)
    for config in (impala.copy().learners(num_learners=0), _auto(PPOConfig().environment("CartPole-v1"))):
        sized, _ = size_run(config, echo=lambda line: None)
        assert sized.num_aggregator_actors_per_learner == 0 and sized.num_learners == 0
    sized, _ = size_run(impala, echo=lambda line: None, aggregators=False)  # (herd tune's trials)
    assert sized.num_aggregator_actors_per_learner == 0 and sized.num_gpus == 1


def test_auto_is_one_line_where_it_cannot_size_and_the_flag_takes_auto_or_a_number(capsys):
    from herdrl.algorithms.marwil import MARWILConfig
    from herdrl.cli import main

    with pytest.raises(ConfigError, match="num_env_runners='auto' cannot size this MARWIL run: it learns from a "
                                          "dataset"):
        MARWILConfig().environment("CartPole-v1").env_runners(num_env_runners="auto").offline_data(
            input_="x.jsonl").build()
    with pytest.raises(ConfigError, match="config key 'num_env_runners' got str 'many'"):
        PPOConfig().environment("CartPole-v1").env_runners(num_env_runners="many").validate()
    _auto(PPOConfig().environment("CartPole-v1")).validate()  # (checked with the fewest it may choose)
    _auto(PPOConfig().environment("CartPole-v1")).env_runners(max_env_runners=4).validate()
    for runners, most, why in ((4, 2, "it is less than num_env_runners=4"), (0, 2, "set num_env_runners >= 1")):
        with pytest.raises(ConfigError, match=f"max_env_runners={most}: .*{why}"):
            PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=runners,
                                                               max_env_runners=most).validate()
    with pytest.raises(SystemExit):
        main(["train", "ppo", "--env", "CartPole-v1", "--num-env-runners", "many"])
    assert "expected a whole number or 'auto', got 'many'" in capsys.readouterr().err


def test_tune_trials_each_size_to_their_share_of_the_cluster(ray_session, tmp_path):
    """Two trials at once on the session's 4 CPUs: each gets 2, one for its driver, so one runner slot; a runner
    that would only sample as fast as the driver does on its own is not started."""
    from herdrl.tune import _size_trials, grid_search

    config = {"env": "herd/Latency-v0", "env_config": {"step_latency_s": 0.01}, "num_workers": "auto",
              "train_batch_size": 512, "minibatch_size": 64, "lr": grid_search([1e-3, 2e-3])}
    sized = _size_trials(PPOConfig, config, tmp_path / "sweep", num_samples=1, max_concurrent=None, verbose=0)
    record = json.loads((tmp_path / "sweep" / "sizing.json").read_text())
    assert record["trials_at_once"] == 2 and record["share"] == 0.5
    assert record["max_runners"] == 1 and sized["num_workers"] == 0 and sized["lr"] == config["lr"]


def test_latency_env_has_pong_shaped_frames_for_sizing_image_runs():
    """``pixels=True``: uint8 84x84x4 frames (what a Pong runner carries), so a runner builds a CNN policy; the
    vector form is unchanged."""
    import gymnasium as gym
    import numpy as np
    import torch

    from herdrl.rollout import EnvRunner

    env = gym.make("herd/Latency-v0", step_latency_s=0.0, pixels=True)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8 and obs.shape == (84, 84, 4) and env.observation_space.contains(obs)
    assert obs.std() > 50  # (random frames: a policy cannot read anything from them, nor should it)
    runner = EnvRunner(PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.0, "pixels": True}))
    fragment = runner.sample(4)
    assert any(isinstance(layer, torch.nn.Conv2d) for layer in runner.module.modules())
    assert fragment.obs.dtype == np.uint8 and fragment.obs.shape[-3:] == (84, 84, 4)
    runner.stop()
    with pytest.raises(ValueError, match="pixels true or false"):
        gym.make("herd/Latency-v0", pixels="yes")
