"""The issue's "done when": RLlib scripts, new stack and old, that run on herdrl with only their imports changed
(examples/rllib/). Their rows show the schedules followed, in the optimizer's own step, and custom metrics
reduced over both runners; evaluation every 2 iterations on its own runner, in parallel with training."""

import copy
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

EXAMPLES = Path(__file__).parent.parent / "examples" / "rllib"


def _script(name):
    spec = importlib.util.spec_from_file_location(f"rllib_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def adam_first_step(optimizer) -> float:
    """How far a fresh copy of ``optimizer`` moves a weight on a gradient of ones: Adam's first step is lr."""
    fresh = copy.deepcopy(optimizer)
    fresh.steps = 0
    for name in fresh.buffers:
        setattr(fresh, name, [torch.zeros_like(t) for t in getattr(fresh, name)])
    before = [p.detach().clone() for p in fresh.params]
    for p in fresh.params:
        p.grad = torch.ones_like(p)
    fresh.step()
    return max(float((b - p.detach()).abs().max()) for b, p in zip(before, fresh.params, strict=True))


@pytest.mark.usefixtures("whole_ray_cluster")
def test_new_stack_script_schedules_custom_metric_and_parallel_evaluation():
    script = _script("new_stack_ppo")
    args = script.argparse.Namespace(num_env_runners=2, decay_steps=3000, seed=0)
    algo = script.build_config(args).build()
    try:
        rows, steps_taken = [], []
        for _ in range(4):
            rows.append(algo.train())
            steps_taken.append(adam_first_step(algo.learner.optimizer))
        assert algo.runners.num_healthy == 2
    finally:
        algo.stop()
    for row, step in zip(rows, steps_taken, strict=True):
        steps = row["num_env_steps_sampled_lifetime"]
        assert step == pytest.approx(np.interp(steps, [0, 3000], [3e-3, 3e-4]), rel=1e-4)  # the optimizer's step
        assert row["entropy_coeff"] == pytest.approx(np.interp(steps, [0, 3000], [0.01, 0.0]))
        # the callback's metric over both runners' episodes: the same as herdrl's own last-100-episodes mean
        assert row["env_runners"]["episode_length"] == pytest.approx(row["episode_len_mean"])
    assert rows[-1]["num_env_steps_sampled_lifetime"] > 3000 and steps_taken[-1] == pytest.approx(3e-4, rel=1e-4)
    # runner indices 1 and 2 both logged (a sum of 1s and 2s: more than the episodes when runner 2 took part)
    assert all(r["num_episodes"] < r["env_runners/episodes_per_runner"] < 2 * r["num_episodes"] for r in rows)
    evaluated = [r["training_iteration"] for r in rows if "evaluation/episode_return_mean" in r]
    assert evaluated == [2, 4] and all(rows[i - 1]["evaluation/num_episodes"] == 5 for i in evaluated)
    assert rows[1]["evaluation"]["env_runners"]["episode_return_mean"] == rows[1]["evaluation/episode_return_mean"]
    assert rows[1]["evaluation/num_healthy_env_runners"] == 1


@pytest.mark.usefixtures("whole_ray_cluster")
def test_old_stack_script_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # tune.run writes results/ here
    _script("old_stack_ppo").main(["--stop-iters", "2"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("iter ")]
    assert len(lines) == 2 and "timesteps_total 1" in lines[1] and "max_pole_angle_mean 0." in lines[1]
    assert "best lr 0.00" in out
