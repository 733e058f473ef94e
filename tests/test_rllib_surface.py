"""What RLlib scripts touch besides config keys: result names old and new, builder calls with little to set here,
compute_actions, save() without a path."""

import csv
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from herdrl import Algorithm, ConfigError, DQNConfig, PPOConfig
from herdrl.results import Result, flat_name


def _same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_a_row_answers_rllibs_old_and_new_names_without_holding_them(tmp_path):
    from herdrl.experiment import run_experiment

    config = (PPOConfig().environment("CartPole-v1").training(train_batch_size=256, minibatch_size=128)
              .evaluation(evaluation_interval=1, evaluation_duration=2).debugging(seed=0))
    outcome = run_experiment(config, stop={"training_iteration": 1}, output=tmp_path, quiet=True, tensorboard=False)
    row = outcome.result
    assert isinstance(row, Result)
    assert _same(row["episode_reward_mean"], row["episode_return_mean"])
    steps = row["num_env_steps_sampled_lifetime"]
    assert row["timesteps_total"] == steps > 200
    assert row["episodes_total"] == row["num_episodes_lifetime"] > 0
    assert _same(row["env_runners"]["episode_return_mean"], row["episode_return_mean"])
    assert row["env_runners"]["num_env_steps_sampled_lifetime"] == steps
    evaluation = row["evaluation"]
    assert evaluation["env_runners"]["episode_return_mean"] == row["evaluation/episode_return_mean"]
    assert evaluation["episode_reward_mean"] == row["evaluation/episode_return_mean"]
    assert "episode_reward_mean" in row and "env_runners" in row and "no_such_key" not in row
    assert row.get("timesteps_total") == steps and row.get("no_such_key", 7) == 7
    with pytest.raises(KeyError):
        row["no_such_key"]
    # nothing is held twice: not in the row's items, its JSON, the CSV header or result.json
    names = {"episode_reward_mean", "timesteps_total", "env_runners", "evaluation", "episodes_total"}
    assert not names & set(dict(row)) and not names & set(json.loads(json.dumps(row)))
    trial = next(tmp_path.glob("*/*/progress.csv"))
    assert not names & set(next(csv.reader(trial.open())))
    assert not names & set(json.loads(trial.with_name("result.json").read_text().splitlines()[-1]))


def test_a_rows_groups_are_live_views_of_its_flat_keys():
    row = Result({"episode_return_mean": 1.0, "env_runners/hits": 2.0, "evaluation/episode_return_mean": 3.0})
    assert dict(row["custom_metrics"]) == {}  # exists before anything is logged; learners: RLlib's module ids
    assert {k: dict(v) for k, v in row["learners"].items()} == {"default_policy": {}, "__all_modules__": {}}
    assert "custom_metrics" in row and row.get("learners") is not None and "no_group" not in row
    assert dict(row["env_runners"]) == {"episode_return_mean": 1.0, "hits": 2.0}
    row["env_runners"]["episode_reward_mean"] = 5.0  # RLlib's name of a runner key: the flat key itself
    row["evaluation"]["env_runners"]["hits"] = 4.0
    row["learners"].setdefault("p0", {})["loss"] = 0.5  # a new group, written into after setdefault
    assert row.setdefault("custom_metrics", None) is not None  # an existing group is not replaced
    del row["env_runners"]["hits"]
    row.flatten()
    assert dict(row) == {"episode_return_mean": 5.0, "evaluation/episode_return_mean": 3.0,
                         "evaluation/env_runners/hits": 4.0, "learners/p0/loss": 0.5}
    assert row["evaluation"]["env_runners"]["episode_return_mean"] == 3.0
    assert sorted(row["learners"]) == ["__all_modules__", "default_policy", "p0"]
    with pytest.raises(KeyError):
        row["learners"]["p1"]
    # a module's view is live too, where the row keeps its learner's keys (and flat_name finds them)
    row["learners"]["default_policy"]["kl"] = 0.1
    assert row["kl"] == 0.1 == row[flat_name("learners/default_policy/kl")] == row["learners"]["__all_modules__"]["kl"]
    with pytest.raises(KeyError, match="not a learner's metric"):
        row["learners"]["default_policy"]["training_iteration"] = 7
    # a multi-agent row's modules are its policies, before any of them finished an episode
    many = Result({"p0/policy_loss": 0.5, "lr/p0": 0.01, "training_iteration": 1})
    many.module_ids = ("p0", "p1")
    assert sorted(many["learners"]) == ["p0", "p1"] and dict(many["learners"]["p0"]) == {"policy_loss": 0.5,
                                                                                        "lr": 0.01}
    many["learners"]["p1"]["extra"] = 2.0
    many["learners"]["p0"] = {"policy_loss": 0.25}
    assert many["p1/extra"] == 2.0 == many[flat_name("learners/p1/extra")] and many["p0/policy_loss"] == 0.25
    # a multi-agent row read back whose one policy is named default_policy: that policy's keys, not the row's
    shared = Result({"default_policy/policy_loss": 1.0, "lr/default_policy": 1e-3,
                     "policy_return_mean/default_policy": 5.0, "training_iteration": 1})
    assert dict(shared["learners"]["default_policy"]) == {"policy_loss": 1.0, "lr": 1e-3}
    assert shared["learners/default_policy/policy_loss"] == 1.0


def test_rllib_names_map_to_herdrls_keys():
    assert flat_name("episode_reward_mean") == "episode_return_mean"
    assert flat_name("env_runners/episode_return_mean") == "episode_return_mean"
    assert flat_name("evaluation/env_runners/episode_return_mean") == "evaluation/episode_return_mean"
    assert flat_name("evaluation/episode_reward_mean") == "evaluation/episode_return_mean"
    assert flat_name("policy_loss") == "policy_loss"


def test_builder_calls_with_little_to_set_are_accepted_and_say_so(caplog, monkeypatch):
    import herdrl.config_rllib

    monkeypatch.setattr(herdrl.config_rllib, "_NOTED", set())  # notes are said once per process: others said them
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        config = (PPOConfig().api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
                  .environment("CartPole-v1").reporting(min_time_s_per_iteration=1)
                  .checkpointing(export_native_model_files=True)
                  .rl_module(model_config={"fcnet_hiddens": [32], "fcnet_activation": "relu",
                                           "head_fcnet_hiddens": [8]}))
    config.validate()
    assert config.model["fcnet_hiddens"] == [32] and config.model["fcnet_activation"] == "relu"
    lines = [r.getMessage() for r in caplog.records]
    for call in (".api_stack(...)", ".reporting(min_time_s_per_iteration)",
                 ".checkpointing(export_native_model_files)", ".rl_module(head_fcnet_hiddens)"):
        assert sum(line.startswith(f"herdrl: {call} has no effect") for line in lines) == 1, lines
    dqn = DQNConfig().environment("CartPole-v1").exploration(exploration_config={
        "type": "EpsilonGreedy", "initial_epsilon": 1.0, "final_epsilon": 0.02, "epsilon_timesteps": 5000})
    dqn.validate()
    assert dqn.epsilon == [[0, 1.0], [5000, 0.02]]
    older = DQNConfig().environment("CartPole-v1").exploration(exploration_config={"epsilon_timesteps": 2000,
                                                                                    "final_epsilon": 0.1})
    assert older.epsilon == [[0, 1.0], [2000, 0.1]]  # RLlib's DQN default type is EpsilonGreedy
    # keys left out keep the current schedule's; explore=True alone changes nothing; RLlib 2.10+ spelling
    partial = DQNConfig().training(epsilon=[[0, 1.0], [5000, 0.1]]).exploration(explore=True)
    assert partial.epsilon == [[0, 1.0], [5000, 0.1]]
    partial.env_runners(exploration_config={"type": "EpsilonGreedy", "final_epsilon": 0.01, "warmup_timesteps": 500})
    assert partial.epsilon == [[0, 1.0], [500, 1.0], [5500, 0.01]]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        reported = DQNConfig().reporting(min_sample_timesteps_per_iteration=5000, metrics_num_episodes_for_smoothing=5)
    assert reported.min_sample_timesteps_per_iteration == 5000  # DQN has it: set
    assert [r.getMessage() for r in caplog.records] == [
        "herdrl: .reporting(metrics_num_episodes_for_smoothing) has no effect: an iteration here is one round of "
        "sampling and learning; episode metrics are over the last 100 episodes"]
    with pytest.raises(ConfigError, match="training samples always explore"):
        PPOConfig().exploration(explore=False)
    with pytest.raises(ConfigError, match="herdrl builds its own modules"):
        PPOConfig().rl_module(rl_module_spec=object())


def _rllib_epsilon(settings, step):
    """RLlib's EpsilonGreedy epsilon at ``step``, from its documented settings (initial until the warmup ends, then a
    straight line to final over epsilon_timesteps, final after)."""
    start, end = settings["initial_epsilon"], settings["final_epsilon"]
    warmup, steps = settings.get("warmup_timesteps", 0), settings["epsilon_timesteps"]
    if step <= warmup:
        return start
    return start + (end - start) * min(1.0, (step - warmup) / steps)


@pytest.mark.parametrize("second", [{"epsilon_timesteps": 20_000},
                                    {"type": "EpsilonGreedy", "initial_epsilon": 0.5},
                                    {"type": "SoftQ"}, {}])
def test_a_second_exploration_config_merges_into_the_first_as_rllibs_deep_update(second, monkeypatch):
    import herdrl.config_rllib
    from herdrl.schedules import schedule_of

    monkeypatch.setattr(herdrl.config_rllib, "_NOTED", set())
    first = {"type": "EpsilonGreedy", "final_epsilon": 0.05, "warmup_timesteps": 1000}
    config = DQNConfig().env_runners(exploration_config=first)
    config.exploration(exploration_config=second)
    # RLlib's deep update written out: the same type merges key by key into what is in force (DQN's default here)
    (_, start), (steps, end) = DQNConfig().epsilon
    expected = {"initial_epsilon": start, "final_epsilon": end, "epsilon_timesteps": steps}
    expected.update({k: v for k, v in first.items() if k != "type"})
    expected.update({k: v for k, v in second.items() if k != "type"})
    schedule = schedule_of("epsilon", config.epsilon)
    if second.get("type") == "SoftQ":  # another kind: DQN's epsilon as the first call left it
        expected = {k: v for k, v in expected.items() if k not in second}
    for step in (0, 500, 1000, 1500, 6000, 11_000, 15_000, 21_000, 40_000):
        assert schedule(step) == pytest.approx(_rllib_epsilon(expected, step)), (step, config.epsilon)
    # a changed type replaces the whole dict: keys left out take EpsilonGreedy's own defaults
    config.exploration(exploration_config={"type": "StochasticSampling"})
    config.exploration(exploration_config={"type": "EpsilonGreedy", "epsilon_timesteps": 3000})
    defaults = {"initial_epsilon": 1.0, "final_epsilon": 0.05, "warmup_timesteps": 0, "epsilon_timesteps": 3000}
    assert [schedule_of("epsilon", config.epsilon)(t) for t in (0, 1500, 3000)] == pytest.approx(
        [_rllib_epsilon(defaults, t) for t in (0, 1500, 3000)])
    assert config.copy().epsilon == config.epsilon
    # a schedule given as tuples is the one in force too
    tupled = DQNConfig().training(epsilon=((0, 0.5), (100, 0.1)))
    tupled.exploration(exploration_config={"final_epsilon": 0.01})
    assert [schedule_of("epsilon", tupled.epsilon)(t) for t in (0, 50, 100)] == pytest.approx(
        [_rllib_epsilon({"initial_epsilon": 0.5, "final_epsilon": 0.01, "epsilon_timesteps": 100}, t)
         for t in (0, 50, 100)])


def test_compute_actions_acts_for_every_key_as_compute_single_action_does():
    algo = PPOConfig().environment("CartPole-v1").debugging(seed=0).build()
    rng = np.random.default_rng(0)
    observations = {f"agent_{i}": rng.uniform(-0.2, 0.2, 4).astype(np.float32) for i in range(5)}
    actions = algo.compute_actions(observations)
    assert set(actions) == set(observations)
    assert all(actions[k] == algo.compute_single_action(obs) for k, obs in observations.items())
    with pytest.raises(ConfigError, match="takes a dict"):
        algo.compute_actions(np.zeros((2, 4), np.float32))
    algo.stop()


def test_save_without_a_path_writes_into_a_new_trial_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    algo = PPOConfig().environment("CartPole-v1").training(train_batch_size=256, minibatch_size=128) \
        .debugging(seed=3).build()
    algo.train()
    first = algo.save()
    algo.train()
    second = algo.save()
    algo.stop()
    assert first.parent == second.parent and first.parent.parent == tmp_path / "results" / "CartPole-v1"
    assert first.parent.name.startswith("PPO_CartPole-v1_3_") and second.name == "checkpoint_000002"
    restored = Algorithm.from_checkpoint(second)
    assert restored.iteration == 2
    restored.stop()


def test_keep_best_checkpoints_each_new_best_evaluation_and_keeps_the_best(tmp_path):
    """SB3's EvalCallback habit: with evaluation every iteration, the checkpoint named in best_checkpoint.json is
    the iteration whose evaluation return the rows show as the (first) maximum, it exists, and it survives pruning
    to one newest checkpoint."""
    from herdrl.cli import main

    assert main(["train", "ppo", "--env", "CartPole-v1", "--stop-iters", "6", "--seed", "0", "--keep-best",
                 "--checkpoint-every", "0", "--keep-checkpoints-num", "1", "--quiet", "--no-tensorboard",
                 "--output", str(tmp_path), "--config", "train_batch_size=256", "minibatch_size=128",
                 "evaluation_interval=1", "evaluation_duration=3"]) == 0
    trial = next(tmp_path.glob("*/PPO_*"))
    rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
    returns = [r["evaluation/episode_return_mean"] for r in rows]
    first_best = returns.index(max(returns)) + 1
    best = json.loads((trial / "best_checkpoint.json").read_text())
    assert best["metric"] == "evaluation/episode_return_mean" and best["value"] == max(returns)
    assert best["checkpoint"] == f"checkpoint_{first_best:06d}" and (trial / best["checkpoint"]).is_dir()
    assert {p.name for p in trial.glob("checkpoint_*")} == {best["checkpoint"], "checkpoint_000006"}


def _tiny_ppo(seed=0, **evaluation):
    return (PPOConfig().environment("CartPole-v1").training(train_batch_size_per_learner=256, minibatch_size=128)
            .evaluation(**evaluation).debugging(seed=seed))


def test_learners_nest_the_learners_own_metrics_by_module():
    algo = _tiny_ppo().build()
    returned = {}
    step = algo.training_step

    def spy():
        returned.update(step())
        return returned

    algo.training_step = spy
    row = algo.train()
    algo.stop()
    learners = row["learners"]
    assert set(learners) == {"default_policy", "__all_modules__"}
    # exactly what the learner's update returned, plus the scheduled hyperparameters it took (RLlib reports both)
    assert dict(learners["default_policy"]) == {**{k: returned[k] for k in returned}, "lr": row["lr"],
                                                "entropy_coeff": row["entropy_coeff"]}
    assert learners["__all_modules__"]["vf_loss"] == row["vf_loss"]
    assert flat_name("learners/default_policy/policy_loss") == "policy_loss"
    assert flat_name("learners/p1/policy_loss") == "p1/policy_loss"


def test_evaluate_save_debugging_and_evaluation_interval_0_as_rllib_scripts_use_them(tmp_path, caplog, monkeypatch):
    import herdrl.config_rllib

    monkeypatch.setattr(herdrl.config_rllib, "_NOTED", set())
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        config = _tiny_ppo(evaluation_interval=0, evaluation_duration=3).debugging(log_level="WARN")
    assert [r.getMessage().split(" has no effect")[0] for r in caplog.records] == ["herdrl: .debugging(log_level)"]
    algo = config.build()  # evaluation_interval=0: RLlib's "off"
    rows = [algo.train(), algo.train()]
    assert not any("evaluation" in row for row in rows)
    evaluation = algo.evaluate()
    assert evaluation["env_runners"]["episode_return_mean"] == evaluation["evaluation/episode_return_mean"]
    assert evaluation["env_runners"]["num_episodes"] == 3 and evaluation["episode_reward_mean"] > 0
    saved = algo.save(tmp_path / "ckpt")
    assert isinstance(saved, Path) and saved.checkpoint.path == str(tmp_path / "ckpt")
    assert (Path(saved.checkpoint.path) / "checkpoint.json").is_file()
    assert saved.metrics["training_iteration"] == 2 and saved.metrics["timesteps_total"] == algo.env_steps_lifetime
    weights = algo.get_weights()
    algo.stop()
    for source in (saved, saved.checkpoint, saved.checkpoint.path):
        restored = Algorithm.from_checkpoint(source)
        assert restored.iteration == 2
        assert all(np.array_equal(restored.get_weights()[k], v) for k, v in weights.items())
        restored.stop()


def test_get_module_and_a_weights_round_trip_change_what_another_algorithm_computes():
    trained, other = _tiny_ppo(seed=0).build(), _tiny_ppo(seed=1).build()
    trained.train()
    module = trained.get_module()
    assert isinstance(module, torch.nn.Module) and trained.get_module("no_such_module") is None
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 4)).astype(np.float32)
    logits = module.forward_inference({"obs": torch.from_numpy(obs)})["action_dist_inputs"]
    greedy = [trained.compute_single_action(o) for o in obs]  # through herdrl's Policy, not the module call
    assert logits.argmax(-1).tolist() == greedy

    def differing():
        return sum(other.compute_single_action(o) != a for o, a in zip(obs, greedy, strict=True))

    assert differing() > 0
    other.set_weights(trained.get_weights())
    assert differing() == 0
    other.set_weights(_tiny_ppo(seed=2).build().get_weights(["default_policy"]))  # RLlib's nesting by module
    assert differing() > 0
    other.set_weights({"default_policy": trained.get_weights()["default_policy"]})
    assert differing() == 0
    other.train()  # the runners sample with what was set; learning goes on from it
    with pytest.raises(ConfigError, match="missing weights"):
        other.set_weights({k: v for k, v in list(trained.get_weights().items())[1:]})
    with pytest.raises(ConfigError, match="unknown weights nope"):
        other.set_weights({**trained.get_weights(), "nope": np.zeros(1)})
    trained.stop()
    other.stop()


def test_a_multi_agent_run_answers_by_policy_id():
    import herdrl
    from herdrl.env.testing import CueRelay

    herdrl.register_env("relay", lambda cfg: CueRelay(cfg))

    def build(seed):
        return (PPOConfig().environment("relay").env_runners(num_envs_per_env_runner=2)
                .training(train_batch_size=128, minibatch_size=64)
                .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda agent, episode, **kw: "p" + agent[1])
                .debugging(seed=seed).build())

    algo, other = build(0), build(1)
    row = algo.train()
    assert set(row["learners"]) == {"p0", "p1"}
    assert row["learners"]["p1"]["policy_loss"] == row["p1/policy_loss"] and row["learners"]["p0"]["lr"] == row["lr/p0"]
    assert isinstance(algo.get_module("p0"), torch.nn.Module) and algo.get_module("default_policy") is None
    mine, theirs = algo.get_weights(["p0", "p1"]), other.get_weights(["p0", "p1"])
    other.set_weights({"p0": mine["p0"]})  # one policy's: the other keeps its own
    now = other.get_weights(["p0", "p1"])
    assert all(np.array_equal(now["p0"][k], v) for k, v in mine["p0"].items())
    assert all(np.array_equal(now["p1"][k], v) for k, v in theirs["p1"].items())
    assert any(not np.array_equal(now["p1"][k], v) for k, v in mine["p1"].items())
    algo.stop()
    other.stop()
