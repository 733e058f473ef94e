import logging
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from herdrl import PPOConfig
from herdrl.cli import main

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A CartPole policy trained to solve, saved once for every test here."""
    root = tmp_path_factory.mktemp("trained")
    assert main(["train", "ppo", "--env", "CartPole-v1", "--seed", "0", "--quiet", "--no-tensorboard",
                 "--output", str(root), "--trial", "t"]) == 0
    return root / "CartPole-v1" / "t"


# the tests of the trained policy on one xdist worker, which trains it once
SHARES_CHECKPOINT = pytest.mark.xdist_group("trained_cartpole")


@SHARES_CHECKPOINT
def test_evaluate_prints_return_statistics_of_the_solved_policy(checkpoint, capsys):
    assert main(["evaluate", str(checkpoint), "--episodes", "5", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "CartPole-v1: 5 episodes (greedy)" in out
    mean = float(out.split("return mean")[1].split()[0])
    assert mean >= 475


@SHARES_CHECKPOINT
def test_evaluate_records_video(checkpoint, tmp_path, capsys):
    for name in ("run.mp4", "run.gif"):
        assert main(["evaluate", str(checkpoint), "--episodes", "1", "--video", str(tmp_path / name)]) == 0
        assert (tmp_path / name).stat().st_size > 1000
        err = capsys.readouterr().err  # progress while it plays and writes: never silent for long
        assert "episode 1/1: return" in err and f"frames to {tmp_path / name} ..." in err and "wrote" in err
    assert main(["evaluate", str(checkpoint), "--video", str(tmp_path / "x.avi")]) == 2
    assert "use a .mp4 or .gif" in capsys.readouterr().err


@SHARES_CHECKPOINT
def test_long_episodes_show_progress_while_they_play(checkpoint, tmp_path, capsys, monkeypatch):
    """A Pong episode takes minutes: lines come every PROGRESS_EVERY_S seconds (here: every step), not only at its
    end, with and without --video."""
    monkeypatch.setattr("herdrl.evaluation.PROGRESS_EVERY_S", 0.0)
    assert main(["evaluate", str(checkpoint), "--episodes", "1", "--video", str(tmp_path / "v.gif")]) == 0
    err = capsys.readouterr().err
    assert "episode 1/1: 100 steps so far" in err and err.index("100 steps so far") < err.index("episode 1/1: return")
    assert main(["evaluate", str(checkpoint), "--episodes", "2"]) == 0
    assert "0/2 episodes done, 100 steps so far" in capsys.readouterr().err


def test_evaluate_on_an_env_that_cannot_render_is_a_clear_error(tmp_path, capsys):
    algo = PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.0}).build()
    algo.train()
    path = algo.save(tmp_path / "ckpt")
    assert main(["evaluate", str(path), "--episodes", "1", "--video", str(tmp_path / "v.mp4")]) == 2
    assert "env 'herd/Latency-v0' cannot render" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore")
@SHARES_CHECKPOINT
@pytest.mark.parametrize("fmt, file", [("torch-export", "policy.pt2"), ("onnx", "policy.onnx")])
def test_exported_policy_runs_without_herdrl_and_matches(checkpoint, tmp_path, fmt, file):
    out = tmp_path / file
    assert main(["export", str(checkpoint), "--format", fmt, "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [file]  # one standalone file
    obs = np.random.default_rng(1).normal(scale=0.5, size=(32, 4)).astype(np.float32)
    np.save(tmp_path / "obs.npy", obs)
    if fmt == "torch-export":
        code = ("import numpy as np, torch; p = torch.export.load(%r).module(); "
                "print(p(torch.from_numpy(np.load(%r))).tolist())")
    else:
        code = ("import numpy as np, onnxruntime as ort; s = ort.InferenceSession(%r); "
                "print(s.run(None, {'obs': np.load(%r)})[0].tolist())")
    guard = "import sys; sys.modules['herdrl'] = None; "  # importing herdrl would fail
    result = subprocess.run([sys.executable, "-c", guard + code % (str(out), str(tmp_path / "obs.npy"))],
                            capture_output=True, text=True, check=True)
    from herdrl.policy import Policy

    expected = [Policy.from_checkpoint(checkpoint).compute_single_action(o) for o in obs]
    assert eval(result.stdout) == expected


@pytest.mark.filterwarnings("ignore")
def test_export_of_continuous_and_discrete_observation_policies(tmp_path):
    from herdrl.export import GreedyPolicy, example_obs
    from herdrl.policy import Policy

    for env, env_config in (("Pendulum-v1", {}), ("FrozenLake-v1", {"is_slippery": False})):
        algo = PPOConfig().environment(env, env_config=env_config).training(train_batch_size=256,
                                                                           minibatch_size=64).build()
        algo.train()
        path = algo.save(tmp_path / env)
        policy = Policy.from_checkpoint(path)
        (obs,) = example_obs(policy, batch=6)
        program = torch.export.export(GreedyPolicy(policy).eval(), (obs,))
        with torch.no_grad():
            got = program.module()(obs).numpy()
        expected = np.stack([np.asarray(algo.compute_single_action(o)) for o in obs.numpy()])
        assert np.allclose(got, expected, atol=1e-5)


def test_bad_export_and_evaluate_input(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "--format", "onnx", "--out", str(tmp_path / "x")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "nope")]) == 2
    assert "not found" in capsys.readouterr().err


def test_periodic_evaluation_reports_greedy_episodes():
    config = (PPOConfig().environment("CartPole-v1").evaluation(evaluation_interval=2, evaluation_duration=4)
              .training(train_batch_size=256, minibatch_size=64).debugging(seed=0))
    algo = config.build()
    first, second = algo.train(), algo.train()
    assert "evaluation/episode_return_mean" not in first
    assert second["evaluation/num_episodes"] == 4 and second["evaluation/episode_return_mean"] > 0
    with pytest.raises(Exception, match="evaluation_config key 'epsilon' is not a config key"):
        PPOConfig().environment("CartPole-v1").evaluation(evaluation_config={"epsilon": 0.1}).build()


@pytest.mark.filterwarnings("ignore")
def test_onnx_export_of_an_image_policy_takes_uint8_frames_and_matches_torch(tmp_path):
    """A CNN policy exports with uint8 frames as its input (scaling inside the graph); ONNX Runtime's actions
    equal the torch policy's. A Dict-observation policy takes one input per leaf, named by its path."""
    import onnxruntime as ort
    from envs import DictCue, MovingDot

    import herdrl
    from herdrl.export import export_policy
    from herdrl.policy import Policy

    herdrl.register_env("moving_dot", MovingDot)
    algo = PPOConfig().environment("moving_dot").training(train_batch_size=64, minibatch_size=32).build()
    algo.train()
    path = algo.save(tmp_path / "dot")
    out = export_policy(path, "onnx", tmp_path / "dot.onnx")
    session = ort.InferenceSession(str(out))
    assert session.get_inputs()[0].type == "tensor(uint8)"
    env = MovingDot()
    env.reset(seed=0)
    frames = np.stack([env.step(0)[0] for _ in range(16)])
    got = session.run(None, {"obs": frames})[0]
    policy = Policy.from_checkpoint(path)
    assert got.tolist() == [policy.compute_single_action(f) for f in frames]
    algo.stop()
    herdrl.register_env("dict_cue", DictCue)
    algo = PPOConfig().environment("dict_cue").training(train_batch_size=256, minibatch_size=64).build()
    for _ in range(3):
        algo.train()
    path = algo.save(tmp_path / "cue")
    session = ort.InferenceSession(str(export_policy(path, "onnx", tmp_path / "cue.onnx")))
    env = DictCue()
    observations = [env.reset(seed=s)[0] for s in range(32)]
    policy = Policy.from_checkpoint(path)
    expected = [policy.compute_single_action(o) for o in observations]
    leaves = {"obs/cue": np.array([o["cue"] for o in observations], np.int64),
              "obs/signal/0": np.stack([o["signal"][0] for o in observations]).astype(np.float32),
              "obs/signal/1": np.stack([o["signal"][1] for o in observations]).astype(np.int8)}
    assert [i.name for i in session.get_inputs()] == list(leaves)
    assert session.run(None, leaves)[0].tolist() == expected
    assert len(set(expected)) > 1  # the cue decides the action: a constant policy would not test the wiring
    algo.stop()


NEVER_ENDING = {"step_latency_s": 0.0, "episode_len": 10**9}  # herd/Latency-v0 episodes that never end


def test_an_in_driver_evaluation_of_never_ending_episodes_stops_at_its_timeout(caplog):
    """Episodes that never end (an Atari game waiting for FIRE): evaluation_sample_timeout_s bounds the driver's
    evaluation (clocked here, not by its own report), cutting every episode with a line naming the bound."""
    import time

    algo = (PPOConfig().environment("herd/Latency-v0", env_config=NEVER_ENDING)
            .evaluation(evaluation_duration=3, evaluation_sample_timeout_s=0.3).debugging(seed=0)).build()
    try:
        with caplog.at_level("WARNING", logger="herdrl"):
            start = time.monotonic()
            metrics = algo.evaluate()
            took = time.monotonic() - start
    finally:
        algo.stop()
    assert 0.3 <= took < 0.3 + 1.0  # (the slack: the env copies' making, a step, the summary, a loaded machine)
    assert metrics["evaluation/num_episodes"] == 0 and metrics["evaluation/num_episodes_cut"] == 3
    assert ("evaluation stopped at evaluation_sample_timeout_s=0.3 with 0 episodes finished; episodes still running "
            "were cut and left out (raise evaluation_sample_timeout_s, or set it to None, to let them finish)"
            ) in caplog.text


def test_herd_evaluate_timeout_bounds_never_ending_episodes(tmp_path, capsys, caplog):
    import time

    algo = PPOConfig().environment("herd/Latency-v0", env_config=NEVER_ENDING).build()
    path = algo.save(tmp_path / "ckpt")
    algo.stop()
    start = time.monotonic()
    with caplog.at_level("WARNING", logger="herdrl"):
        assert main(["evaluate", str(path), "--episodes", "2", "--timeout-s", "0.3"]) == 0
    assert time.monotonic() - start < 0.3 + 1.0  # (and the policy's loading)
    assert "herd/Latency-v0: 0 episodes (greedy)" in capsys.readouterr().out
    assert "evaluation stopped at --timeout-s=0.3 with 0 episodes finished" in caplog.text
    assert "(raise --timeout-s, or set it to None, to let them finish)" in caplog.text
    assert main(["evaluate", str(path), "--timeout-s", "0"]) == 2
    assert capsys.readouterr().err.strip() == "herd evaluate: error: --timeout-s got 0; expected > 0"


@pytest.mark.parametrize("env", ["Acrobot-v1", "MountainCar-v0", "Pendulum-v1", "herd/StatelessCartPole-v1"])
def test_evaluate_on_an_env_with_other_spaces_is_one_line(env, tmp_path_factory, capsys):
    """A CartPole policy evaluated on an env of other spaces: one line naming both pairs and exit 2, from the CLI,
    with and without --video, and from an algorithm whose evaluation env differs (not torch's shape error)."""
    from herdrl import EnvError

    root = tmp_path_factory.getbasetemp() / "cartpole_untrained"
    if not (root / "ckpt").exists():
        algo = PPOConfig().environment("CartPole-v1").build()
        algo.save(root / "ckpt")
        algo.stop()
    for video in ([], ["--video", str(root / "v.gif")]):
        assert main(["evaluate", str(root / "ckpt"), "--env", env, "--episodes", "1", *video]) == 2
        captured = capsys.readouterr()
        lines = (captured.out + captured.err).strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"herd evaluate: error: env '{env}' has observation space ")
        assert "the policy was trained on Box((4,), float32) and Discrete(2)" in lines[0]
    algo = PPOConfig().environment("CartPole-v1").evaluation(evaluation_config={"env": env}).build()
    try:
        with pytest.raises(EnvError, match=f"env '{env}' has observation space .* the policy was trained on Box"):
            algo.evaluate()
    finally:
        algo.stop()


def test_an_env_whose_boxes_differ_only_in_bounds_is_evaluated_with_a_note(caplog):
    """An env like Pendulum but for a faster top speed has other observation bounds, the same shapes: evaluated (it
    was before the space check), with a note; another shape, dtype, size or kind is refused."""
    from types import SimpleNamespace

    from gymnasium.spaces import Box, Dict, Discrete

    from herdrl import EnvError
    from herdrl.evaluation import check_spaces

    trained = gym.make("Pendulum-v1")
    high = trained.observation_space.high * np.array([1, 1, 2], np.float32)  # max_speed 16, not 8
    faster = Box(-high, high, dtype=np.float32)
    policy = SimpleNamespace(observation_space=trained.observation_space, action_space=trained.action_space)
    assert trained.observation_space != faster  # (bounds only)
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        for _ in range(3):  # (evaluations repeat: said once)
            check_spaces(policy, "Pendulum-v1-faster", faster, trained.action_space)
    assert caplog.text.count("has Box bounds other than the policy's (same shapes)") == 1
    for obs, act in [(Box(-1, 1, (4,)), trained.action_space), (Box(-1, 1, (3,), np.float64), trained.action_space),
                     (trained.observation_space, Discrete(3)),
                     (Dict({"x": trained.observation_space}), trained.action_space)]:
        with pytest.raises(EnvError, match="the policy was trained on"):
            check_spaces(policy, "other", obs, act)


def test_stop_releases_learners_runners_and_recording_before_closing_evaluation_envs():
    """An evaluation env whose ``close`` fails must not leave the learners or Ray runners running: they stop
    first, as before the Algorithm was split into mixins."""
    from types import SimpleNamespace

    from herdrl.algorithms.ppo import PPO

    calls = []

    def record(name, fails=False):
        def call():
            calls.append(name)
            if fails:
                raise RuntimeError("close failed")
        return call

    algo = object.__new__(PPO)
    algo.config = SimpleNamespace(output=None)
    algo.multi_agent = False
    algo.learners = SimpleNamespace(stop=record("learners"))
    algo.runners = SimpleNamespace(stop=record("runners"))
    algo._evaluator = SimpleNamespace(close=record("evaluation envs", fails=True))
    algo.logger = None
    with pytest.raises(RuntimeError):
        algo.stop()
    assert calls == ["learners", "runners", "evaluation envs"]
