"""Ray Tune sweeps on the session's embedded Ray (4 CPUs)."""

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from herdrl import ConfigError, tune
from herdrl.cli import main
from herdrl.errors import HerdError

pytestmark = pytest.mark.usefixtures("ray_session")


class CpuWatcher(threading.Thread):
    """Samples how many of the cluster's CPUs are reserved, while a sweep runs."""

    def __init__(self):
        super().__init__(daemon=True)
        self.used, self.done = [], False

    def run(self):
        import ray

        total = ray.cluster_resources()["CPU"]
        while not self.done:
            self.used.append(total - ray.available_resources().get("CPU", 0.0))
            time.sleep(0.05)


def test_grid_sweep_runs_every_trial_and_picks_the_best(tmp_path):
    import ray

    watcher = CpuWatcher()
    watcher.start()
    analysis = tune.run("PPO", config={"env": "CartPole-v1", "train_batch_size": 512, "minibatch_size": 128,
                                       "lr": tune.grid_search([1e-4, 2e-3]),
                                       "num_env_runners": tune.grid_search([0, 1])},
                        stop={"training_iteration": 4}, storage_path=tmp_path, name="grid", verbose=0)
    watcher.done = True
    watcher.join()
    df = analysis.results_df
    assert len(df) == 4 and (df["training_iteration"] == 4).all()
    assert sorted(zip(df["config/lr"], df["config/num_env_runners"], strict=True)) == [
        (1e-4, 0), (1e-4, 1), (2e-3, 0), (2e-3, 1)]
    assert analysis.best_result["episode_return_mean"] == df["episode_return_mean"].max()
    assert analysis.best_checkpoint is not None and (analysis.best_checkpoint / "checkpoint.json").exists()
    # RLlib scripts' calls, with RLlib's metric names
    best = analysis.get_best_trial("episode_reward_mean", "max")
    assert best.path == analysis.best_logdir and best.config["lr"] in (1e-4, 2e-3)
    assert best.last_result["episode_reward_mean"] == best.last_result["episode_return_mean"] == df[
        "episode_return_mean"].max()
    assert analysis.get_best_checkpoint(best, metric="env_runners/episode_return_mean", mode="max") == \
        analysis.best_checkpoint
    assert analysis.best_trial.path == best.path
    assert max(watcher.used) <= ray.cluster_resources()["CPU"]
    assert max(watcher.used) >= 2  # trials ran side by side
    from herdrl import Algorithm

    restored = Algorithm.from_checkpoint(analysis.best_checkpoint, num_env_runners=0)
    assert restored.iteration == 4
    restored.stop()
    # A sweep's trial folder works with every command, as a `herd train` trial folder does.
    trial = analysis.best_logdir
    assert main(["evaluate", str(trial), "--episodes", "1"]) == 0
    assert main(["export", str(trial), "--format", "torch-export", "--out", str(tmp_path / "p.pt2")]) == 0
    assert main(["train", "ppo", "--env", "CartPole-v1", "--output", str(trial.parent.parent),
                 "--name", trial.parent.name, "--trial", trial.name, "--resume", "--stop-iters", "5",
                 "--quiet", "--no-tensorboard", "--num-env-runners", "0"]) == 0
    # Tune numbers its checkpoints by save, herd train by iteration: the newest is still the last name.
    from herdrl.checkpoint import newest_valid_checkpoint, read_meta

    names = sorted(p.name for p in trial.glob("checkpoint_*"))
    assert names[-1] == "checkpoint_000005" and len(names) >= 2
    assert read_meta(newest_valid_checkpoint(trial))["counters"]["training_iteration"] == 5


def test_trial_reserves_a_bundle_for_the_learner_and_each_runner():
    trainable = tune._trainable("PPO")
    factory = trainable.default_resource_request({"env": "CartPole-v1", "num_workers": 3})
    assert factory.bundles == [{"CPU": 1.0}] * 4
    assert factory.strategy == "SPREAD"


def test_the_seed_style_call_runs_as_written(tmp_path):
    analysis = tune.run(
        "PPO", name="seed-style", stop={"training_iteration": 2}, storage_path=tmp_path, verbose=0,
        config={"env": "CartPole-v1", "num_workers": 1, "num_gpus": 0, "ignore_worker_failures": True})
    assert analysis.best_result["training_iteration"] == 2
    assert analysis.best_config["num_workers"] == 1


def test_a_trial_the_cluster_can_never_hold_fails_at_once(tmp_path):
    """The seed call with more workers than the cluster has CPUs: Tune alone would wait forever."""
    start = time.time()
    with pytest.raises(ConfigError, match=r"each trial asks for 5 CPUs \(1 for the driver \+ 4 env runner\(s\) x 1 "
                                          r"CPU\) but the Ray cluster has 4: set num_env_runners \(num_workers\) to 3"):
        tune.run("PPO", name="too-big", stop={"training_iteration": 1}, storage_path=tmp_path, verbose=0,
                 config={"env": "CartPole-v1", "num_workers": tune.grid_search([1, 4]), "num_gpus": 0})
    assert time.time() - start < 10



def test_a_runner_no_node_can_hold_fails_at_once_naming_the_key(tmp_path, monkeypatch):
    """A runner's bundle is placed on one node: asking for more CPUs than the largest has fails at once with the
    key, the value and the node's CPUs (not the totals' advice of 0 runners; Tune alone would wait forever)."""
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    node_cpus = ray.cluster_resources()["CPU"]  # the session's Ray: one node
    start = time.time()
    with pytest.raises(HerdError, match=rf"^num_cpus_per_env_runner={node_cpus + 1:g} is more than the largest node "
                                        rf"of this machine's private Ray offers \({node_cpus:g} CPU\).*; set "
                                        rf"num_cpus_per_env_runner to {node_cpus:g} or less"):
        tune.run("PPO", name="too-wide", stop={"training_iteration": 1}, storage_path=tmp_path, verbose=0,
                 config={"env": "CartPole-v1", "num_workers": 1, "num_cpus_per_worker": node_cpus + 1})
    assert time.time() - start < 10

def test_asha_stops_a_bad_trial_early(tmp_path):
    analysis = tune.run(
        "PPO", config={"env": "CartPole-v1", "train_batch_size": 512, "minibatch_size": 128, "seed": 0,
                       "lr": tune.grid_search([3e-3, 1e-9])},
        stop={"training_iteration": 8}, scheduler={"type": "asha", "grace_period": 2, "max_t": 8,
                                                    "reduction_factor": 2},
        max_concurrent_trials=1, storage_path=tmp_path, name="asha", verbose=0)
    df = analysis.results_df.set_index("config/lr")
    assert df.loc[3e-3, "training_iteration"] == 8
    assert df.loc[1e-9, "training_iteration"] < 8


def test_unknown_keys_fail_before_any_trial(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'lrr' for PPO"):
        tune.run("PPO", config={"env": "CartPole-v1", "lrr": tune.grid_search([1, 2])}, storage_path=tmp_path)
    with pytest.raises(ConfigError, match="unknown scheduler 'hyperband'"):
        tune.make_scheduler("hyperband")


def test_yaml_sweep_through_the_cli_and_plot(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: small\nalgorithm: PPO\nenv: CartPole-v1\nstop: {training_iteration: 3}\n"
                     "config:\n  train_batch_size: 512\n  minibatch_size: 128\n"
                     "  lr: {grid_search: [1e-3, 3e-3]}\n  num_epochs: {choice: [2, 4]}\n")
    assert main(["tune", "-f", str(sweep), "--output", str(tmp_path / "out"), "--verbose", "0"]) == 0
    out = capsys.readouterr().out
    assert "best trial:" in out and "config: lr=" in out
    trials = list((tmp_path / "out" / "small").glob("PPO_*"))
    assert len(trials) == 2
    # TensorBoard: herd train's tags (the result keys), env steps on the x axis; none of Tune's ray/tune/... tags.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trials[0])).Reload()
    tags = events.Tags()["scalars"]
    assert "episode_return_mean" in tags and "policy_loss" in tags and not [t for t in tags if t.startswith("ray/")]
    rows = [json.loads(line) for line in (trials[0] / "result.json").read_text().splitlines()]
    assert [e.step for e in events.Scalars("policy_loss")] == [r["num_env_steps_sampled_lifetime"] for r in rows]
    png, svg = tmp_path / "curves.png", tmp_path / "curves.svg"
    assert main(["plot", str(tmp_path / "out" / "small"), "--out", str(png)]) == 0
    assert main(["plot", *map(str, trials), "--x", "time_total_s", "--out", str(svg)]) == 0
    assert png.stat().st_size > 10_000 and svg.read_text().startswith("<?xml")
    import matplotlib.image

    pixels = matplotlib.image.imread(png)
    assert pixels.std() > 0.05  # not blank
    # A sweep file given to `herd train` points to `herd tune`.
    assert main(["train", "-f", str(sweep)]) == 2
    assert "run the file with `herd tune -f" in capsys.readouterr().err


def test_plot_errors(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "none")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["plot", str(tmp_path)]) == 2
    assert "no progress.csv" in capsys.readouterr().err
    assert main(["plot", str(tmp_path), "--out", "x.jpg"]) == 2


def test_search_space_tags():
    space = tune.search_space({"lr": {"loguniform": [1e-4, 1e-2]}, "model": {"fcnet_hiddens": {"choice": [[32], [64]]}},
                               "gamma": 0.99})
    assert space["gamma"] == 0.99
    assert 1e-4 <= space["lr"].sample() <= 1e-2
    assert space["model"]["fcnet_hiddens"].sample() in ([32], [64])
    with pytest.raises(ConfigError, match="'uniform' expects \\[low, high\\]"):
        tune.search_space({"lr": {"uniform": [1]}})
    assert np.isfinite(space["lr"].sample())


def test_population_based_training_runs_with_herdrl_checkpoints_and_mutations_take_effect(tmp_path):
    """PBT restores a donor's checkpoint into a trial with a mutated lr: the trial's optimizer must step with the
    mutated lr, not the donor's (read from the optimizer state the trial saved at its end, not from its config)."""
    from herdrl.checkpoint import read_tensors

    mutated = 7e-4  # neither trial's own lr: only an exploited trial can have it

    def explore(config):
        return {**config, "lr": mutated}

    analysis = tune.run(
        "PPO", config={"env": "CartPole-v1", "train_batch_size": 256, "minibatch_size": 64,
                       "lr": tune.grid_search([1e-3, 3e-3])},
        stop={"training_iteration": 4}, storage_path=tmp_path, name="pbt", verbose=0,
        scheduler={"type": "pbt", "perturbation_interval": 2, "hyperparam_mutations": {"lr": [1e-3, 3e-3]},
                   "custom_explore_fn": explore, "synch": True},  # synch: both trials have a score at the perturbation
        checkpoint_freq=2)
    assert not analysis.errors
    assert (analysis.results_df["training_iteration"] == 4).all()
    used = []
    for result in analysis.result_grid:
        final = sorted(Path(result.path).glob("checkpoint_*"))[-1] / "herd"
        used.append((result.config["lr"], read_tensors(final)["learner"]["optimizer"]["lr"]))
    assert any(config_lr == mutated for config_lr, _ in used), used  # one trial was exploited
    assert all(config_lr == optimizer_lr for config_lr, optimizer_lr in used), used


def test_a_restored_trial_does_not_repeat_its_tensorboard_curve(tmp_path):
    """A sweep restored from a checkpoint repeats the steps the interrupted run logged after it: TensorBoard
    shows each step once (purge_step), as for `herd train --resume`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    class Trial:  # what the callback reads of a Tune trial
        local_path = str(tmp_path)

    trial = Trial()
    for steps in ([100, 200, 300], [200, 300, 400]):  # the second run resumes from the checkpoint at 100
        # (event files sort by name, where this process's writer counter sorts 10 before 9 within one second: the
        # second run starts in a later second, as a restored run would)
        time.sleep(1.01 - time.time() % 1)
        callback = tune._tensorboard_callback()
        for step in steps:
            callback.on_trial_result(0, [], trial, {"num_env_steps_sampled_lifetime": step, "x": float(step)})
        callback.on_experiment_end([])
    events = EventAccumulator(str(tmp_path)).Reload()
    assert [e.step for e in events.Scalars("x")] == [100, 200, 300, 400]


def test_a_trial_reserves_and_uses_bundles_for_its_learner_actors(tmp_path, whole_ray_cluster):
    """A trial with 1 runner and 2 learner actors asks Tune for 4 bundles (driver, runner, 2 learners) and places
    its learners in them: no placement group of their own (PACK, as outside Tune) is made."""
    import ray

    def own_learner_groups():
        return sum(pg["strategy"] == "PACK" for pg in ray.util.placement_group_table().values())

    before = own_learner_groups()
    watcher = CpuWatcher()
    watcher.start()
    analysis = tune.run("PPO", config={"env": "CartPole-v1", "train_batch_size": 512, "minibatch_size": 128,
                                       "num_env_runners": 1, "num_learners": 2},
                        stop={"training_iteration": 2}, storage_path=tmp_path, name="learners", verbose=0)
    watcher.done = True
    watcher.join()
    assert not analysis.errors and analysis.results_df["training_iteration"].tolist() == [2]
    assert max(watcher.used) == ray.cluster_resources()["CPU"] == 4  # the trial's 4 bundles
    assert own_learner_groups() == before


def test_a_trial_repeating_an_earlier_ones_config_and_seed_is_warned_about(capsys):
    class Trial:
        def __init__(self, name, config):
            self.name, self.config = name, config

        def __str__(self):
            return self.name

    callback = tune._repeat_warning_callback()
    for name, config in (("t1", {"lr": 1e-3, "seed": 1}), ("t2", {"lr": 1e-3, "seed": 2}),
                         ("t3", {"lr": 1e-3}), ("t4", {"lr": 1e-3}),  # no seed: two random runs, not repeats
                         ("t5", {"seed": 2, "lr": 1e-3})):
        callback.on_trial_start(0, [], Trial(name, config))
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "trial t5 has the same config as t2, seed 2 included" in err


def test_the_example_sweep_runs_distinct_trials():
    from ray.tune.search.variant_generator import generate_variants

    from herdrl.experiment import load_experiment_file

    spec = load_experiment_file(Path(__file__).parent.parent / "examples" / "cartpole-ppo-sweep.yaml", sweep=True)
    space = tune.search_space(spec["config"])
    trials = [json.dumps(config, sort_keys=True) for _ in range(spec.get("num_samples", 1))
              for _, config in generate_variants(space)]
    assert len(trials) == 8 and len(set(trials)) == len(trials)


def test_a_sweeps_console_output_is_plain_text_and_ends_with_its_summary(tmp_path):
    """Piped into a log file: no raw colour escapes, and no "Checkpoint successfully created" lines (one per save,
    forwarded from the trials) after the summary."""
    import subprocess
    import sys

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: plain\nalgorithm: PPO\nenv: CartPole-v1\nstop: {training_iteration: 2}\n"
                     "checkpoint_freq: 1\nconfig:\n  train_batch_size: 256\n  minibatch_size: 64\n"
                     "  lr: {grid_search: [1e-3]}\n")
    herd = str(Path(sys.executable).parent / "herd")
    out = subprocess.run([herd, "tune", "-f", str(sweep), "--output", str(tmp_path / "out")], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert "\x1b[" not in text and "Checkpoint successfully created" not in text
    assert out.stdout.rstrip().splitlines()[-1].startswith("  checkpoint: ")


def test_a_sweep_stopped_for_the_walltime_checkpoints_every_trial_and_resumes_contiguous(tmp_path):
    """SIGUSR1 (as Slurm sends before the walltime) mid-sweep: every running trial checkpoints its last result
    (checkpoint_freq alone would save none), the sweep stops with both trials unfinished; the resumed sweep finishes
    each from there, its rows 1..8 once each and its env steps never going back; a third call has nothing to do."""
    import os
    import signal

    sent = []

    def stop(trial_id, result):  # in the driver, for every result: the walltime signal at the first 3rd iteration
        if result["training_iteration"] == 3 and not sent:
            sent.append(trial_id)
            os.kill(os.getpid(), signal.SIGUSR1)
        return result["training_iteration"] >= 8

    config = {"env": "herd/Latency-v0", "env_config": {"step_latency_s": 0.002}, "train_batch_size": 200,
              "minibatch_size": 100, "num_epochs": 1, "lr": tune.grid_search([1e-3, 3e-3])}
    options = dict(stop=stop, storage_path=tmp_path, name="chained", checkpoint_freq=100, verbose=0)
    with pytest.raises(ConfigError, match="no sweep to resume in .*chained"):
        tune.run("PPO", config=config, resume=True, **options)
    handlers = [signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)]
    first = tune.run("PPO", config=config, **options)
    assert sent and first.num_unfinished == 2 and first.stop_reason.startswith("SIGUSR1")
    trials = sorted((tmp_path / "chained").glob("PPO_*"))

    def rows(trial):
        return [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]

    for trial in trials:  # nothing since the newest checkpoint: its counters are the last row's
        newest = max(trial.glob("checkpoint_*"))
        counters = json.loads((newest / "herd" / "checkpoint.json").read_text())["counters"]
        last = rows(trial)[-1]
        assert 1 <= last["training_iteration"] < 8
        assert counters["training_iteration"] == last["training_iteration"]
        assert counters["num_env_steps_sampled_lifetime"] == last["num_env_steps_sampled_lifetime"]
    second = tune.run("PPO", config=config, resume="if_any", **options)
    assert second.num_unfinished == 0 and second.stop_reason is None and not second.errors
    for trial in trials:
        got = rows(trial)
        assert [r["training_iteration"] for r in got] == list(range(1, 9))
        steps = [r["num_env_steps_sampled_lifetime"] for r in got]
        assert steps == sorted(set(steps))
    third = tune.run("PPO", config=config, resume=True, **options)  # a chain's next job after the sweep finished
    assert third.num_unfinished == 0 and all(len(rows(trial)) == 8 for trial in trials)
    assert [signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)] == handlers  # given back


def test_the_walltime_stop_waits_for_each_running_trials_save_and_a_repeated_signal_changes_nothing(monkeypatch):
    """The callback alone, driven as Tune drives it: after SIGTERM (Slurm sends it to every process of the job, and
    the batch script forwards its own: twice) the sweep is interrupted only once every trial running then has saved
    its last result, with no save in flight; a trial that ends without one is not waited for. HERD_STOP_AT in the
    past stops at Tune's first step."""
    import os
    import signal
    import time
    from types import SimpleNamespace

    from herdrl import tune_stop

    interrupts = []
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        signal.signal(signal.SIGUSR1, lambda signum, frame: interrupts.append(signum))  # as Tune's interrupt
        stopper = tune_stop.WalltimeStop()
        stopper.setup()
        a, b = SimpleNamespace(trial_id="a", status="RUNNING"), SimpleNamespace(trial_id="b", status="RUNNING")
        stopper.on_step_end(0, [a, b])
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stopper.signum == signal.SIGTERM and "preempted" in stopper.reason
        stopper.on_step_end(1, [a, b])
        result = {"training_iteration": 4}
        stopper.on_trial_result(2, [a, b], a, result)
        assert result["should_checkpoint"] is True
        stopper.on_checkpoint(2, [a, b], a, None)
        stopper.on_trial_result(3, [a, b], a, {})  # a goes on: its next result is saved too
        stopper.on_step_end(3, [a, b])
        b.status = "TERMINATED"  # b finishes without a save: nothing to wait for
        stopper.on_step_end(4, [a, b])
        assert interrupts == []  # a's second save is in flight
        stopper.on_checkpoint(5, [a, b], a, None)
        stopper.on_step_end(5, [a, b])
        stopper.on_step_end(6, [a, b])
        assert interrupts == [signal.SIGUSR1] and stopper.unfinished == ["a"]

        monkeypatch.setenv("HERD_STOP_AT", str(time.time() - 1))
        signal.signal(signal.SIGUSR1, lambda signum, frame: interrupts.append(signum))  # Tune's, as each sweep sets
        early = tune_stop.WalltimeStop()
        early.setup()
        assert early.unfinished is None  # no step yet
        early.on_step_end(0, [])
        assert early.signum == signal.SIGUSR1 and early.reason.startswith("HERD_STOP_AT")
        assert interrupts == [signal.SIGUSR1] * 2
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
