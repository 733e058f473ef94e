"""Every shipped example config (examples/**/*.yaml) goes the way a user takes it: `herd train -f` (with tiny
overrides), `herd evaluate` of its trial (one episode, capped to a few steps by the env's own options) and
``Algorithm.from_checkpoint``, which must bring back the weights the checkpoint holds."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from herdrl.algorithms.base import Algorithm
from herdrl.checkpoint import newest_valid_checkpoint, read_meta, read_tensors
from herdrl.cli import main
from herdrl.experiment import load_experiment_file
from herdrl.registry import get_config_class

EXAMPLES = Path(__file__).parent.parent / "examples"
PATHS = sorted(p for p in EXAMPLES.rglob("*.yaml") if p.parent.name != "cluster")  # (cluster/: a hosts file)
assert len(PATHS) >= 26, PATHS
CAP = 8  # env steps an evaluation episode may last

#: Small enough for a second's work per example; each config takes the keys its algorithm knows.
TINY = {"num_env_runners": 0, "num_learners": 0, "num_envs_per_env_runner": 1, "train_batch_size": 32,
        "minibatch_size": 16, "num_epochs": 1, "rollout_fragment_length": 16, "evaluation_interval": None,
        "evaluation_duration": 1, "num_steps_sampled_before_learning_starts": 16,
        "min_sample_timesteps_per_iteration": 16, "training_intensity": 2.0, "replay_buffer_config": {"capacity": 256},
        "updates_per_iteration": 2, "num_critic_updates": 1, "vf_minibatch_size": 16,
        "circular_buffer_iterations_per_batch": 1, "target_network_update_freq": 16, "num_cpus_for_main_process": 1}
#: The module each extra's envs need: (env prefix, module, extra).
EXTRAS = (("ALE/", "ale_py", "atari"), ("mpe2.", "mpe2", "multiagent"), ("pettingzoo", "pettingzoo", "multiagent"))
MUJOCO = ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid")


def skip_without_extra(env: str) -> None:
    """Skip (saying which extra to install) where the env's package is not installed."""
    for prefix, module, extra in (*EXTRAS, *((name, "mujoco", "mujoco") for name in MUJOCO)):
        if env.startswith(prefix):
            pytest.importorskip(module, reason=f"env {env} needs 'herdrl[{extra}]'")


def tiny_config(spec: dict, tmp_path: Path) -> dict:
    """The example's config with :data:`TINY` and an env capped at :data:`CAP` steps per episode."""
    config_class = get_config_class(spec["algorithm"])
    fields = config_class.fields()
    config = {**spec["config"], **{key: value for key, value in TINY.items() if key in fields}}
    config = {key: _first_choice(value) for key, value in config.items()}  # a sweep: its first trial
    env, env_config = spec["env"], dict(config.get("env_config") or {})
    if env.startswith("ALE/"):
        env_config["max_num_frames_per_episode"] = 4 * CAP  # (ale-py counts raw frames: 4 per step)
    elif env.startswith("mpe2."):
        env_config["max_cycles"] = CAP
    elif "pettingzoo" not in env:  # (tic-tac-toe ends within 9 moves)
        env_config["max_episode_steps"] = CAP
    config["env_config"] = env_config
    if config_class.learns_offline:  # one episode of a hand-written CartPole controller, recorded here
        from herdrl.offline.record import record_controller

        record_controller(lambda obs: int(obs[2] + 0.5 * obs[3] > 0), "CartPole-v1", tmp_path / "expert", 1, 0)
        config["input_"] = str(tmp_path / "expert")
    if spec["algorithm"] == "QMIX":  # (whole episodes per replayed sequence: a few of them)
        config["train_batch_size"] = 2
    return config


def _first_choice(value):
    return value["grid_search"][0] if isinstance(value, dict) and "grid_search" in value else value


def stored_weights(checkpoint: Path) -> dict[str, np.ndarray]:
    """The module weights in a checkpoint's tensors file, named as ``Algorithm.get_weights`` names them."""
    learner = read_tensors(checkpoint)["learner"]
    if "policies" in learner:
        return {f"{pid}.{key}": value.numpy() for pid, state in learner["policies"].items()
                for key, value in state["module"].items()}
    return {key: value.numpy() for key, value in learner["module"].items()}


@pytest.mark.parametrize("path", PATHS, ids=[str(p.relative_to(EXAMPLES)) for p in PATHS])
def test_every_example_trains_evaluates_and_restores(path, tmp_path, capsys):
    spec = load_experiment_file(path, sweep=True)
    skip_without_extra(spec["env"])
    file = tmp_path / "example.yaml"
    file.write_text(yaml.safe_dump({"algorithm": spec["algorithm"], "env": spec["env"], "stop": spec["stop"],
                                    "config": tiny_config(spec, tmp_path)}))
    out = tmp_path / "out"
    assert main(["train", "-f", str(file), "--stop-iters", "1", "--quiet", "--no-tensorboard",
                 "--output", str(out), "--trial", "t"]) == 0, capsys.readouterr().err
    (trial,) = out.glob("*/t")
    checkpoint = newest_valid_checkpoint(trial)
    capsys.readouterr()

    assert main(["evaluate", str(trial), "--episodes", "1", "--seed", "0"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "1 episode (greedy)" in printed
    length = float(re.search(r"length mean\s+(\S+)", printed).group(1))
    assert 1 <= length <= CAP and math.isfinite(float(re.search(r"return mean\s+(\S+)", printed).group(1)))

    algo = Algorithm.from_checkpoint(checkpoint)
    try:
        restored, stored = algo.get_weights(), stored_weights(checkpoint)
        assert set(restored) == set(stored) and stored
        for key, value in stored.items():
            np.testing.assert_array_equal(restored[key], value, err_msg=key)
        assert read_meta(checkpoint)["counters"]["training_iteration"] == 1
    finally:
        algo.stop()
