"""Experiment trackers: MLflow and Weights & Biases, turned on as RLlib and Tune users do.

    herd train ppo --env CartPole-v1 --mlflow                  # a local store: sqlite:///results/mlflow.db
    herd train ppo --env CartPole-v1 --mlflow http://host:5000 # or MLFLOW_TRACKING_URI, a tracking server
    herd train ppo --env CartPole-v1 --wandb my-project        # WANDB_MODE=offline needs no account

Also ``mlflow: URI`` / ``wandb: PROJECT`` in an experiment file, ``run_experiment(..., mlflow=..., wandb=...)``, and
``herd tune --mlflow/--wandb`` (Tune's own logger callbacks, one tracker run per trial). Both come with
``pip install 'herdrl[tracking]'`` and are imported only when used.

Each tracker run gets the config once (as parameters; site keys' values, ``runtime_env`` credentials say,
masked), every result row as metrics at its env-step count (``num_env_steps_sampled_lifetime``), the trial folder
and, as it is written, the newest checkpoint folder. The
run's id is kept in the trial folder (``trackers.json``): ``--resume`` and the next job of a chain continue the
same run. A resumed run computes the iterations after its checkpoint again; those the killed run had logged are
not logged twice (the tracker keeps the killed run's values for them, progress.csv the new ones), so a tracker's
steps and iterations only increase. Where a tracker's data go (the URI, the
project) comes from the command only, never from a checkpoint or a trial folder.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from herdrl.errors import HerdError
from herdrl.site_keys import SITE_KEYS, mask_site_values

logger = logging.getLogger("herdrl")

#: A trial folder's file of tracker run ids and the last step each logged.
#: MLflow's limits: characters of a parameter value, entries per log_batch call.
MLFLOW_PARAM_CHARS, MLFLOW_BATCH = 6000, 100
_MLFLOW_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


class TrackerError(HerdError):
    """A tracker cannot be used (not installed, no login, its store unreachable)."""


def _import(module: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = {"mlflow": "mlflow-skinny", "wandb": "wandb"}[module]
        raise TrackerError(f"--{module} needs {package}: pip install 'herdrl[tracking]' ({exc})") from None


def check_installed(*, mlflow: str | None = None, wandb: str | None = None) -> None:
    """:class:`TrackerError` for a tracker asked for whose package is missing."""
    for module, wanted in (("mlflow", mlflow), ("wandb", wandb)):
        if wanted:
            _import(module)


def default_mlflow_uri(output: str | Path) -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a SQLite store in the results root: ``sqlite:///<output>/mlflow.db``."""
    import os

    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(output).resolve() / 'mlflow.db'}"


def _argv_sets_a_site_key() -> bool:
    """Whether this process's command line names a site key (``--config runtime_env=...``, ``--address``,
    ``--working-dir``, which sets ``runtime_env``); a false alarm only costs the run's W&B metadata."""
    names = [*SITE_KEYS, "working_dir"]
    return any(key in arg or key.replace("_", "-") in arg for arg in sys.argv[1:] for key in names)


def wandb_dir(trial_dir: str | Path) -> str:
    """Where W&B keeps a run's files (it adds ``wandb/``): ``WANDB_DIR`` if set (a scratch disk, say), else the
    trial folder."""
    import os

    return os.environ.get("WANDB_DIR") or str(trial_dir)


def _numbers(result: dict[str, Any]) -> dict[str, float]:
    """The row's numeric values (Tune's bookkeeping keys left out)."""
    from herdrl.logger import TUNE_KEYS

    return {k: float(v) for k, v in result.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in TUNE_KEYS}


def flat_params(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A config as flat ``key: text`` parameters (nested dicts as ``model.fcnet_hiddens``), texts cut to MLflow's
    limit."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flat_params(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value, default=repr)
            flat[_MLFLOW_BAD_CHARS.sub("_", name)] = text[:MLFLOW_PARAM_CHARS]
    return flat


class Tracker:
    """One tracker's run for one trial; subclasses talk to MLflow or W&B."""

    name = ""

    def __init__(self, logdir: Path) -> None:
        self.logdir = Path(logdir)
        self.run_id: str | None = None
        self.last_step = self.last_iteration = -1

    def _saved(self) -> dict[str, Any]:
        """What the trial folder remembers of this tracker's run (``run_id``, ``last_step``)."""
        from herdrl.logger import read_tracker_state

        saved = read_tracker_state(self.logdir).get(self.name)
        return saved if isinstance(saved, dict) else {}

    def state(self) -> dict[str, Any]:
        """What the trial folder keeps of this run: its id and the last row logged."""
        return {"run_id": self.run_id, "last_step": self.last_step, "last_iteration": self.last_iteration}

    def _continue(self, saved: dict[str, Any]) -> None:
        """Go on after what a run logged before (its last step and iteration)."""
        self.last_step = int(saved.get("last_step", -1))
        self.last_iteration = int(saved.get("last_iteration", -1))

    def log(self, result: dict[str, Any]) -> None:
        """Log a row at its env-step count, unless its iteration or step was logged already (a resumed run computes
        the iterations after its checkpoint again: the tracker keeps what the killed run logged of them)."""
        step = int(result.get("num_env_steps_sampled_lifetime", self.last_step + 1))
        iteration = int(result.get("training_iteration", self.last_iteration + 1))
        if step <= self.last_step or iteration <= self.last_iteration:
            return
        self._log(_numbers(result), step)
        self.last_step, self.last_iteration = step, iteration

    def _log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def checkpoint(self, path: Path) -> None:
        """Record the newest checkpoint folder."""

    def close(self, status: str = "FINISHED") -> None:
        """End the run (``FINISHED``, ``FAILED`` or ``KILLED``: stopped to be resumed)."""


class MLflowTracker(Tracker):
    """An MLflow run in experiment ``experiment`` of the store at ``uri``."""

    name = "mlflow"

    def __init__(self, uri: str, logdir: Path, experiment: str, trial: str, params: dict[str, Any]) -> None:
        super().__init__(logdir)
        _import("mlflow")
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self.uri = uri
        for name in ("mlflow.store.db.utils", "alembic"):  # a new SQLite store's set-up lines: not ours to print
            logging.getLogger(name).setLevel(logging.WARNING)
        try:
            self.client = MlflowClient(tracking_uri=uri)
            saved = self._saved()
            self.run_id = saved.get("run_id")
            if self.run_id is not None:
                try:
                    self.client.update_run(self.run_id, status="RUNNING")
                    self._continue(saved)
                except MlflowException:  # not in this store (another --mlflow URI): a new run
                    self.run_id = None
            if self.run_id is None:
                experiment_id = mlflow_experiment(self.client, experiment)
                run = self.client.create_run(experiment_id, run_name=trial,
                                             tags={"herdrl.trial_dir": str(self.logdir.resolve())})
                self.run_id = run.info.run_id
                items = [Param(k, v) for k, v in flat_params(mask_site_values(params)).items()]
                for start in range(0, len(items), MLFLOW_BATCH):
                    self.client.log_batch(self.run_id, params=items[start:start + MLFLOW_BATCH])
        except MlflowException as exc:
            raise TrackerError(f"--mlflow {uri}: {str(exc).splitlines()[0]}") from None
        logger.info("herdrl: MLflow run %s in %s", self.run_id, uri)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(_MLFLOW_BAD_CHARS.sub("_", k), v, now, step) for k, v in metrics.items()]
        for start in range(0, len(items), MLFLOW_BATCH * 10):  # (MLflow takes 1000 metrics per batch)
            self.client.log_batch(self.run_id, metrics=items[start:start + MLFLOW_BATCH * 10])

    def checkpoint(self, path: Path) -> None:
        """The ``herdrl.checkpoint`` tag: the newest checkpoint folder."""
        self.client.set_tag(self.run_id, "herdrl.checkpoint", str(Path(path).resolve()))

    def close(self, status: str = "FINISHED") -> None:
        """Set the run's end status."""
        self.client.set_terminated(self.run_id, status=status)


class WandbTracker(Tracker):
    """A Weights & Biases run in ``project`` (its files under the trial folder's ``wandb/``, or ``$WANDB_DIR/wandb/``
    when ``WANDB_DIR`` is set)."""

    name = "wandb"

    def __init__(self, project: str, logdir: Path, experiment: str, trial: str, params: dict[str, Any]) -> None:
        super().__init__(logdir)
        wandb = _import("wandb")
        saved = self._saved()
        run_id = saved.get("run_id") or uuid.uuid4().hex[:12]
        try:
            # W&B records the command line with a run's metadata: one that sets a site key (`--config
            # runtime_env=...`) would carry its values there, so that run records no metadata
            settings = wandb.Settings(x_disable_meta=True) if _argv_sets_a_site_key() else None
            self.run = wandb.init(project=project, name=trial, id=run_id, resume="allow", dir=wandb_dir(self.logdir),
                                  config=mask_site_values(params), group=experiment, job_type="train",
                                  reinit="create_new", settings=settings)
        except Exception as exc:  # noqa: BLE001 - no login, no network: one line
            raise TrackerError(f"--wandb {project}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} "
                               "(log in with `wandb login` or WANDB_API_KEY, or set WANDB_MODE=offline)") from None
        self.run_id = run_id
        if saved.get("run_id") == run_id:
            self._continue(saved)
        self.run.summary["herdrl.trial_dir"] = str(self.logdir.resolve())

    def _log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({k: (v if math.isfinite(v) else None) for k, v in metrics.items()}, step=step)

    def checkpoint(self, path: Path) -> None:
        """The ``herdrl.checkpoint`` summary key: the newest checkpoint folder."""
        self.run.summary["herdrl.checkpoint"] = str(Path(path).resolve())

    def close(self, status: str = "FINISHED") -> None:
        """Finish the run (exit code 0 unless it failed)."""
        self.run.finish(exit_code=1 if status == "FAILED" else 0)


def mlflow_experiment(client: Any, name: str) -> str:
    """The id of MLflow experiment ``name``, made if missing (another job of the run may make it at the same moment)
    and restored if deleted."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name)
        except MlflowException:  # made by another job meanwhile
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    return found.experiment_id


def make_trackers(logdir: Path, experiment: str, trial: str, params: dict[str, Any], *, mlflow: str | None = None,
                  wandb: str | None = None) -> list[Tracker]:
    """The trackers asked for: ``mlflow`` a tracking URI, ``wandb`` a project name."""
    trackers: list[Tracker] = []
    if mlflow:
        trackers.append(MLflowTracker(mlflow, logdir, experiment, trial, params))
    if wandb:
        try:
            trackers.append(WandbTracker(wandb, logdir, experiment, trial, params))
        except BaseException:
            for tracker in trackers:
                tracker.close("FAILED")
            raise
    from herdrl.logger import save_tracker_state

    save_tracker_state(logdir, trackers)
    return trackers


def tune_callbacks(experiment: str, *, mlflow: str | None = None, wandb: str | None = None) -> list[Any]:
    """Tune's own logger callbacks for a sweep: one MLflow or W&B run per trial."""
    callbacks: list[Any] = []
    if mlflow:
        _import("mlflow")
        callbacks.append(_sweep_mlflow_callback(mlflow, experiment))
    if wandb:
        _import("wandb")
        callbacks.append(_sweep_wandb_callback(wandb, experiment))
    return callbacks


def _sweep_wandb_callback(project: str, experiment: str) -> Any:
    """Tune's ``WandbLoggerCallback``, its runs named by the trial id (a resumed sweep continues them) and their
    files in each trial's folder under the sweep's results (Tune's default is a temporary folder of Ray's, gone
    with the session: an offline run could never be synced)."""
    from ray.air.integrations.wandb import WandbLoggerCallback

    class SweepWandb(WandbLoggerCallback):
        """One W&B run per trial, its files beside the trial's results."""

        def _start_logging_actor(self, trial: Any, exclude_results: list[str], **init_kwargs: Any) -> None:
            import os

            folder = Path(trial.path)
            # results on this machine's filesystem (not a cloud bucket): told by Tune's storage, not by whether
            # the experiment's folder exists yet when the first trial starts
            storage = getattr(getattr(trial, "storage", None), "storage_filesystem", None)
            local = type(storage).__name__ == "LocalFileSystem" if storage is not None else folder.parent.is_dir()
            if os.environ.get("WANDB_DIR"):  # the driver's, given on: the logging actors may not see it
                init_kwargs.setdefault("dir", wandb_dir(folder))
            elif local:
                folder.mkdir(parents=True, exist_ok=True)
                init_kwargs.setdefault("dir", str(folder))
            if os.environ.get("WANDB_MODE"):  # the driver's (offline, ...): Tune's logging actors may not see it
                init_kwargs.setdefault("mode", os.environ["WANDB_MODE"])
            if os.environ.get("WANDB_SILENT", "").lower() in ("1", "true"):  # the same for a quiet driver
                init_kwargs.setdefault("settings", {"silent": True})
            super()._start_logging_actor(trial, exclude_results, **init_kwargs)

    return SweepWandb(project=project, group=experiment, resume="allow")


def _sweep_mlflow_callback(uri: str, experiment: str) -> Any:
    """Tune's ``MLflowLoggerCallback``, continuing a trial's run when a sweep is resumed (found by its
    ``herdrl.trial_id`` tag) and logging each row at its env-step count, steps only increasing."""
    from mlflow.tracking import MlflowClient
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    class SweepMLflow(MLflowLoggerCallback):
        """One MLflow run per trial, continued across a resumed sweep."""

        def setup(self, *args: Any, **kwargs: Any) -> None:
            super().setup(*args, **kwargs)
            self._client = MlflowClient(tracking_uri=uri)
            self._resumed_at: dict[Any, int] = {}  # a continued run's last step: rows up to it are repeats

        def log_trial_start(self, trial: Any) -> None:
            if trial not in self._trial_runs:
                tag = {"herdrl.trial_id": str(trial.trial_id)}
                runs = self._client.search_runs([mlflow_experiment(self._client, experiment)],
                                                filter_string=f"tags.`herdrl.trial_id` = '{trial.trial_id}'")
                if runs:
                    run_id = runs[0].info.run_id
                    self._trial_runs[trial] = run_id
                    self._client.update_run(run_id, status="RUNNING")
                    steps = self._client.get_metric_history(run_id, "training_iteration")
                    self._resumed_at[trial] = max((m.step for m in steps), default=-1)
                else:
                    tags, self.tags = self.tags, {**self.tags, **tag}
                    try:
                        super().log_trial_start(trial)
                    finally:
                        self.tags = tags
                    return
            super().log_trial_start(trial)

        def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
            step = int(result.get("num_env_steps_sampled_lifetime") or result["training_iteration"])
            if step <= self._resumed_at.get(trial, -1):
                return  # a resumed trial repeating what its run has (a PBT restore later may go back: logged)
            self._resumed_at.pop(trial, None)
            self.mlflow_util.log_metrics(run_id=self._trial_runs[trial], metrics_to_log=result, step=step)

    return SweepMLflow(tracking_uri=uri, experiment_name=experiment, save_artifact=False)
