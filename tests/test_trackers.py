"""MLflow (a local SQLite store) and Weights & Biases (offline) runs, read back with MLflow's client and from W&B's
offline run files: the config once, every row at its env step, the checkpoint, one run continued across a resume
with steps only increasing."""

import csv
import importlib
import json
import logging
import shutil
import sys
import time
from pathlib import Path

import pytest

from herdrl import PPOConfig
from herdrl.experiment import run_experiment

pytest.importorskip("mlflow")
pytest.importorskip("wandb")


def wandb_records(path: Path) -> list:
    """The records of a W&B offline run file (``run-<id>.wandb``): its header, then LevelDB-log records of 32 KiB
    blocks (4-byte checksum, 2-byte length, 1-byte type: 1 full, 2 first, 3 middle, 4 last) holding protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunk, records = 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)  # (W&B writes some keys as a nested path)


def _wandb_history(trial: Path, rows_at_least: int = 0) -> tuple[list[dict], dict, list]:
    """Every logged row (in file order, over the run's offline folders), the last summary values, the run records.
    ``rows_at_least``: read again for up to 15 s until that many rows and a run record are there (W&B's service
    process writes the run file; on a loaded machine it was seen to lag the run's finish, or a Tune trial's)."""
    deadline = time.monotonic() + 15
    while True:
        found = _read_wandb_files(trial)
        if (len(found[0]) >= rows_at_least and (found[2] or not rows_at_least)) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _read_wandb_files(trial: Path) -> tuple[list[dict], dict, list]:
    rows, summary, runs = [], {}, []
    for run_file in sorted(trial.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                rows.append({_key(item): json.loads(item.value_json) for item in record.history.item})
            elif kind == "summary":
                summary.update({_key(item): json.loads(item.value_json) for item in record.summary.update})
            elif kind == "run":
                runs.append(record.run)
    return rows, summary, runs


SECRET = "s3cr3t-9f2b7c"  # a runtime_env credential: in no file written, on no console, in no tracker


def files_holding(root: Path, text: str) -> list[Path]:
    """Every file under ``root`` whose bytes hold ``text`` (JSON, CSV, pickles, SQLite, W&B run files alike)."""
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_mlflow_and_wandb_runs_read_back_and_continue_across_a_resume(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)  # W&B's files in the trial folder, read below
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = PPOConfig().environment("CartPole-v1").training(train_batch_size=256, minibatch_size=128, lr=7e-4) \
        .debugging(seed=0)
    common = dict(output=tmp_path, quiet=True, tensorboard=False, trial="t", mlflow=uri, wandb="herd-test",
                  checkpoint_every=2)
    first = run_experiment(config.copy(), stop={"training_iteration": 3}, **common)
    trial = first.logdir
    # the run was killed before its last checkpoint: a resume goes back to iteration 2 and computes 3 again
    shutil.rmtree(trial / "checkpoint_000003")
    run_experiment(config.copy(), stop={"training_iteration": 5}, resume=True, **common)
    rows = list(csv.DictReader((trial / "progress.csv").open()))
    assert [int(r["training_iteration"]) for r in rows] == [1, 2, 3, 4, 5]

    ids = json.loads((trial / "trackers.json").read_text())
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("CartPole-v1").experiment_id])
    assert run.info.run_id == ids["mlflow"]["run_id"] and run.info.status == "FINISHED"  # one run, continued
    assert run.data.params["lr"] == "0.0007" and run.data.params["model.fcnet_hiddens"] == "[64, 64]"
    assert run.data.tags["herdrl.checkpoint"] == str((trial / "checkpoint_000005").resolve())
    history = sorted(client.get_metric_history(run.info.run_id, "training_iteration"), key=lambda m: m.timestamp)
    steps = [m.step for m in history]
    assert [m.value for m in history] == [1, 2, 3, 4, 5] and steps == sorted(set(steps))  # steps only increase
    returns = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "episode_return_mean")}
    for row in rows[3:]:  # the resumed rows, logged at their env-step counts
        assert returns[int(row["num_env_steps_sampled_lifetime"])] == pytest.approx(float(row["episode_return_mean"]))

    history, summary, runs = _wandb_history(trial, rows_at_least=5)
    assert {r.run_id for r in runs} == {ids["wandb"]["run_id"]} and len(runs) == 2  # both jobs, one run id
    assert runs[0].project == "herd-test" and runs[0].run_group == "CartPole-v1"
    config_logged = {_key(item): json.loads(item.value_json) for item in runs[0].config.update}
    assert config_logged["lr"] == 7e-4 and config_logged["algorithm"] == "PPO"
    assert [h["training_iteration"] for h in history] == [1, 2, 3, 4, 5]
    assert [h["_step"] for h in history] == sorted({h["_step"] for h in history})
    assert [h["_step"] for h in history[3:]] == [int(r["num_env_steps_sampled_lifetime"]) for r in rows[3:]]
    assert summary["herdrl.checkpoint"] == str((trial / "checkpoint_000005").resolve())


def test_a_tracker_asked_for_but_not_installed_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    import sys

    from herdrl.trackers import TrackerError

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(TrackerError, match=r"pip install 'herdrl\[tracking\]'"):
        run_experiment(PPOConfig().environment("CartPole-v1"), output=tmp_path, quiet=True, wandb="p")
    assert not any(tmp_path.iterdir())


@pytest.mark.usefixtures("whole_ray_cluster")
def test_a_sweep_logs_each_trial_to_mlflow_and_wandb_with_tunes_callbacks(tmp_path, monkeypatch):
    """Also: the sweep's runtime_env (a credential in env_vars) reaches the driver's ray.init, and no file Tune writes
    (params.json, params.pkl, result.json, tuner.pkl, experiment state) and no tracker holds it."""
    from mlflow.tracking import MlflowClient

    import herdrl.cluster
    from herdrl import tune

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)  # W&B's files beside each trial's results, read below
    given, connect = [], herdrl.cluster.connect
    monkeypatch.setattr(herdrl.cluster, "connect", lambda config, **kw: given.append(config.runtime_env) or connect(
        config, **kw))  # (Ray is up already: the real call is a no-op here)
    uri = f"sqlite:///{tmp_path / 'sweep.db'}"
    analysis = tune.run("PPO", config={"env": "CartPole-v1", "train_batch_size": 256, "minibatch_size": 128,
                                       "lr": tune.grid_search([1e-3, 3e-3]),
                                       "runtime_env": {"env_vars": {"WANDB_API_KEY": SECRET}}},
                        stop={"training_iteration": 2}, name="sweep", storage_path=tmp_path, verbose=0, mlflow=uri,
                        wandb="herd-sweep")
    assert not analysis.errors
    written = {p.name for p in (tmp_path / "sweep").rglob("*")}
    assert {"params.json", "params.pkl", "result.json", "tuner.pkl"} <= written  # each writer wrote (no secret)
    assert files_holding(tmp_path, SECRET) == []
    assert given == [{"env_vars": {"WANDB_API_KEY": SECRET}}]  # the driver's ray.init gets it: every trial has it
    trials = [p for p in (tmp_path / "sweep").glob("PPO_*") if p.is_dir()]
    assert len(trials) == 2
    for trial in trials:  # W&B's offline runs beside each trial's results, kept
        history, _, runs = _wandb_history(trial, rows_at_least=2)
        files = sorted(str(p.relative_to(trial)) for p in trial.rglob("*"))  # (what was there, if this fails)
        assert runs and runs[0].run_group == "sweep", f"no W&B run file in {trial.name}: {files}"
        assert [h["training_iteration"] for h in history] == [1, 2], f"W&B rows of {trial.name}: {history}; {files}"
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    assert sorted(float(r.data.params["lr"]) for r in runs) == [1e-3, 3e-3]
    for r in runs:
        history = client.get_metric_history(r.info.run_id, "training_iteration")
        assert [m.value for m in history] == [1, 2]
        assert 200 < history[0].step < history[1].step <= 512  # at env steps (256 an iteration), not iterations
        assert r.data.tags["herdrl.trial_id"]


def test_a_tracker_failing_during_the_run_costs_a_warning_not_the_run(tmp_path, caplog):
    import logging

    from herdrl.logger import Logger

    class Away:
        name = "mlflow"
        closed = None

        def log(self, result):
            raise ConnectionError("server at http://host:5000 is away\nmore text")

        def checkpoint(self, path):
            raise ConnectionError("still away")

        def close(self, status):
            Away.closed = status

        def state(self):
            return {"run_id": "r1", "last_step": -1, "last_iteration": -1}

    with caplog.at_level(logging.WARNING, logger="herdrl"):
        log = Logger(tmp_path, {}, tensorboard=False, trackers=[Away()])
        for i in (1, 2):
            log.log({"training_iteration": i, "num_env_steps_sampled_lifetime": 10 * i})
        log.checkpoint(tmp_path)
        log.close()
    assert [int(r["training_iteration"]) for r in csv.DictReader((tmp_path / "progress.csv").open())] == [1, 2]
    assert caplog.text.count("mlflow failed (ConnectionError: server at http://host:5000 is away)") == 1
    assert Away.closed == "FINISHED"


def test_a_tracker_that_cannot_start_leaves_no_trial_folder(tmp_path, monkeypatch):
    """W&B without a login (as it is here when nothing else set its mode in this process) fails at its start: one
    line, and the trial folder made for the run is gone again."""
    from herdrl import trackers

    def no_login(self, project, *args, **kwargs):
        raise trackers.TrackerError(f"--wandb {project}: No API key configured (log in with `wandb login` ...)")

    monkeypatch.setattr(trackers.WandbTracker, "__init__", no_login)
    with pytest.raises(trackers.TrackerError, match="--wandb p: No API key"):
        run_experiment(PPOConfig().environment("CartPole-v1"), output=tmp_path / "out", quiet=True, wandb="p",
                       mlflow=f"sqlite:///{tmp_path / 'm.db'}", trial="t")
    assert not (tmp_path / "out" / "CartPole-v1" / "t").exists()  # (MLflow's run id was written there, then gone)


def test_runtime_env_credentials_reach_the_run_but_no_result_tracker_or_console(tmp_path, monkeypatch, capsys):
    """A key in ``runtime_env.env_vars`` (how Ray users hand workers credentials) is masked in params.json, MLflow's
    params and W&B's config, whose files go to WANDB_DIR; the run's config keeps it for ``ray.init``."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "scratch"))
    # given on the command line too: W&B records a run's argv with its metadata
    monkeypatch.setattr(sys, "argv", ["herd", "train", "ppo", "--config", f"runtime_env={{env_vars: {{K: {SECRET}}}}}"])
    seen = []
    config = PPOConfig().environment("CartPole-v1").training(train_batch_size=128, minibatch_size=64, num_epochs=1) \
        .resources(runtime_env={"env_vars": {"WANDB_API_KEY": SECRET}}) \
        .callbacks(on_algorithm_init=lambda algorithm, **kw: seen.append(algorithm.config.runtime_env))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    outcome = run_experiment(config, stop={"training_iteration": 1}, output=tmp_path / "results", trial="t",
                             tensorboard=False, mlflow=uri, wandb="herd-test", checkpoint_every=1)
    print(config)  # a config shown on the console
    assert seen == [{"env_vars": {"WANDB_API_KEY": SECRET}}]  # what connect() gives ray.init
    assert files_holding(tmp_path, SECRET) == []
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    params = json.loads((outcome.logdir / "params.json").read_text())
    assert params["runtime_env"] == {"env_vars": {"WANDB_API_KEY": "***"}}  # the name stays, for the record
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("CartPole-v1").experiment_id])
    assert run.data.params["runtime_env.env_vars.WANDB_API_KEY"] == "***"
    # W&B's files in WANDB_DIR, none in the trial folder
    assert not (outcome.logdir / "wandb").exists()
    (run_file,) = (tmp_path / "scratch").glob("wandb/offline-run-*/run-*.wandb")
    (run,) = [r.run for r in wandb_records(run_file) if r.WhichOneof("record_type") == "run"]
    config_logged = {_key(item): json.loads(item.value_json) for item in run.config.update}
    assert config_logged["runtime_env"] == {"env_vars": {"WANDB_API_KEY": "***"}} and config_logged["lr"] == 2e-3


def test_a_sweep_cannot_search_over_a_site_key():
    from herdrl import ConfigError, tune

    with pytest.raises(ConfigError, match="'runtime_env' cannot be searched"):
        tune.run("PPO", config={"env": "CartPole-v1", "runtime_env": tune.grid_search([{}, {"env_vars": {}}])})


def test_a_sweeps_wandb_runs_go_to_the_drivers_wandb_dir(tmp_path, monkeypatch):
    """Tune's logging actors may not see the driver's environment: WANDB_DIR is handed to wandb.init."""
    from types import SimpleNamespace

    from ray.air.integrations.wandb import WandbLoggerCallback

    from herdrl.trackers import tune_callbacks

    given = []
    monkeypatch.setattr(WandbLoggerCallback, "_start_logging_actor",
                        lambda self, trial, exclude, **init: given.append(init["dir"]))
    (callback,) = tune_callbacks("sweep", wandb="p")
    (tmp_path / "sweep").mkdir()  # results on this machine: W&B's files would go beside them
    trial = SimpleNamespace(path=str(tmp_path / "sweep" / "PPO_1"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "scratch"))
    callback._start_logging_actor(trial, [])
    monkeypatch.delenv("WANDB_DIR")
    callback._start_logging_actor(trial, [])
    assert given == [str(tmp_path / "scratch"), trial.path]


def test_a_runtime_env_given_after_ray_started_is_said_not_applied(monkeypatch, caplog):
    """Ray takes a job's runtime_env at ray.init only: a script's own ray.init before herdrl's connect means the
    runtime_env (credentials for the workers) never reaches them; one line says so instead of nothing."""
    import ray

    connect_module = importlib.import_module("herdrl.cluster.connect")  # (the package names its function so)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(connect_module, "_connected_here", False)  # (a Ray herdrl did not start)
    config = PPOConfig()
    config.runtime_env = {"env_vars": {"TOKEN": "x"}}
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        assert connect_module.connect(config) is False
    assert [r.getMessage() for r in caplog.records] == [
        "herdrl: runtime_env is not applied: Ray was started in this process before herdrl connected (a ray.init of "
        "your own); give runtime_env to that ray.init instead"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        assert connect_module.connect(PPOConfig()) is False  # nothing to apply: nothing said
        # herdrl's own Ray (runners started it; learners and evaluation runners connect again): it was applied
        monkeypatch.setattr(connect_module, "_connected_here", True)
        assert connect_module.connect(config) is False
    assert not caplog.records
