"""The issue's "done when": RLlib scripts, new stack and old, that run on herdrl with only their imports changed
(examples/rllib/). Their rows show the schedules followed, in the optimizer's own step, and custom metrics
reduced over both runners; evaluation every 2 iterations on its own runner, in parallel with training."""

import copy
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from herdrl import HerdError

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
        # RLlib's env_runner_group: the function runs in each runner's own process, numbered from 1
        group = algo.env_runner_group
        answers = group.foreach_env_runner(lambda runner: (runner.worker_index, runner.num_envs, os.getpid()))
        assert [a[:2] for a in answers] == [(1, 4), (2, 4)] and len({a[2] for a in answers} | {os.getpid()}) == 3
        assert group.foreach_env_runner(lambda runner: runner.worker_index, remote_worker_ids=[2]) == [2]
        assert group.num_healthy_remote_workers() == 2 and group.local_env_runner is None
        with pytest.raises(HerdError, match="ZeroDivisionError"):
            group.foreach_env_runner(lambda runner: 1 / 0)
        assert algo.runners.num_healthy == 2 and algo.runners.num_restarts == 0  # the script's error, not theirs
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


@pytest.mark.usefixtures("whole_ray_cluster")
def test_tuner_script_picks_the_best_trial_by_its_own_rows_and_continues_from_its_checkpoint(tmp_path, capsys):
    """tune.Tuner(...).fit() as RLlib's docs write it: get_best_result names the trial whose last row is best
    (read back from each trial's own result.json), its .checkpoint restores that trial, and the script goes on."""
    from herdrl import Algorithm

    script = _script("tuner_ppo")
    args = script.argparse.Namespace(stop_iters=2, lrs=[1e-4, 3e-3], storage_path=str(tmp_path), seed=0)
    results, best = script.sweep(args)
    assert len(results) == 2 and not results.errors
    last_rows = {}
    for trial in results:
        rows = [json.loads(line) for line in (Path(trial.path) / "result.json").read_text().splitlines()]
        last_rows[Path(trial.path)] = rows[-1]
    best_path = max(last_rows, key=lambda p: last_rows[p]["episode_return_mean"])
    assert {row["episode_return_mean"] for row in last_rows.values()} != {last_rows[best_path]["episode_return_mean"]}
    assert Path(best.path) == best_path and best.config["lr"] == last_rows[best_path]["config"]["lr"]
    assert best.metrics["env_runners"]["episode_return_mean"] == last_rows[best_path]["episode_return_mean"]
    assert Path(best.checkpoint.path).is_relative_to(best_path)
    restored = Algorithm.from_checkpoint(best.checkpoint)
    try:
        assert restored.iteration == 2 and restored.config.lr == best.config["lr"]
    finally:
        restored.stop()
    script.continue_best(args, best)
    out = capsys.readouterr().out
    assert "iter 3: policy_loss" in out and "evaluation return" in out and "envs per env runner: [4]" in out
