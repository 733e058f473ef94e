"""Checkpoints written by herdrl before issue 63's split (tests/reference_checkpoints, commit a40fc24) restore with
the public calls and act as they did: the same greedy actions, and the same raw outputs (logits, Q values, Gaussian
means and log stds, recurrent states) within 1e-6, on the inputs recorded beside each. Nothing here trains; the
cases and how to write them again are in tests/reference_checkpoints/make.py."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from reference_checkpoints import make

from herdrl import Algorithm
from herdrl.policy import Policy

SOURCE = Path(__file__).parent / "reference_checkpoints"


def _recorded(case: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The probe inputs and the outputs the checkpoint's writer recorded on them."""
    with np.load(SOURCE / case / "expected.npz") as saved:
        inputs = {key.removeprefix("input/"): saved[key] for key in saved.files if key.startswith("input/")}
        outputs = {key: saved[key] for key in saved.files if not key.startswith("input/")}
    return inputs, outputs


def _assert_acts_as_recorded(outputs: dict[str, np.ndarray], recorded: dict[str, np.ndarray], how: str) -> None:
    assert sorted(outputs) == sorted(recorded), how
    for key, value in recorded.items():
        if key.rsplit("/", 1)[-1] == "actions" and value.dtype.kind in "iu":
            np.testing.assert_array_equal(outputs[key], value, err_msg=f"{how}: {key}")
        else:
            np.testing.assert_allclose(outputs[key], value, rtol=1e-6, atol=1e-6, err_msg=f"{how}: {key}")


@pytest.fixture
def checkpoint(request, tmp_path):
    """A copy of the case's checkpoint (restoring never writes into the repository) and its envs registered."""
    make.register_envs()
    path = tmp_path / request.param
    shutil.copytree(SOURCE / request.param, path)
    return path


@pytest.mark.parametrize("checkpoint", sorted(make.CASES), indirect=True)
def test_a_reference_checkpoint_restores_and_acts_as_it_did(checkpoint, tmp_path):
    case = checkpoint.name
    kind = make.CASES[case][2]
    inputs, recorded = _recorded(case)
    pids = make.policy_ids(checkpoint)
    # Policy.from_checkpoint: inference without runners or Ray (what herd evaluate loads for one policy).
    outputs = {}
    for pid in pids:
        outputs.update(make.expected(Policy.from_checkpoint(checkpoint, pid), kind, inputs, pid))
    _assert_acts_as_recorded(outputs, recorded, "Policy.from_checkpoint")
    # Algorithm.from_checkpoint: the whole algorithm rebuilt from its config and restored (an offline run's
    # dataset named again: the one it was written from was a scratch folder's).
    overrides = {}
    if case.startswith("cql"):
        make.pendulum_dataset(tmp_path / "data")
        overrides["input_"] = str(tmp_path / "data")
    algo = Algorithm.from_checkpoint(checkpoint, num_env_runners=0, **overrides)
    try:
        assert algo.iteration == make.CASES[case][1]
        outputs = {}
        for pid in pids:
            outputs.update(make.expected(algo.get_policy(pid), kind, inputs, pid))
        _assert_acts_as_recorded(outputs, recorded, "Algorithm.from_checkpoint")
        if pids == [None] and kind != "recurrent":  # RLlib's call on the algorithm, one observation
            first = {key: value[0] for key, value in make._obs(inputs).items()} \
                if isinstance(make._obs(inputs), dict) else make._obs(inputs)[0]
            np.testing.assert_allclose(algo.compute_single_action(first), recorded["actions"][0], rtol=1e-6,
                                       atol=1e-6)
    finally:
        algo.stop()


@pytest.mark.parametrize("checkpoint", ["ppo-lstm-cartpole", "mappo-relay", "qmix-rnn-two-step"], indirect=True)
def test_herd_evaluate_plays_a_reference_checkpoint(checkpoint, capsys):
    """herd evaluate loads a reference checkpoint as a user's (a recurrent one, a multi-agent one, a team's) and
    plays it."""
    from herdrl.cli import main

    assert main(["evaluate", str(checkpoint), "--episodes", "1", "--seed", "0"]) == 0, capsys.readouterr().err
    assert "1 episode (greedy)" in capsys.readouterr().out
