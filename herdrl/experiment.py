"""Run one trial to a stop criterion, writing its result files: what ``herd train`` does.

    from herdrl import PPOConfig
    from herdrl.experiment import run_experiment
    outcome = run_experiment(PPOConfig().environment("CartPole-v1"), stop={"training_iteration": 10})
    print(outcome.logdir, outcome.result["episode_return_mean"])
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from herdrl.checkpoint import TUNE_SUBDIR, checkpoint_name
from herdrl.config import AlgorithmConfig
from herdrl.env import env_reward_threshold, imports
from herdrl.errors import STOP_AT_ENV, ConfigError, HerdError, did_you_mean, yaml_error_parts
from herdrl.logger import ConsoleReporter, Logger, format_value, write_json_atomic
from herdrl.results import Result, flat_name
from herdrl.trial_dir import TrialLock, create_trial_dir

#: Env steps after which a run with no stop criterion of the user's gives up on "solved".
DEFAULT_STEP_BUDGET = 1_000_000
#: An offline run's default budget (gradient steps) when no stop criterion is given.
DEFAULT_GRADIENT_BUDGET = 100_000

#: Stop keys (a run stops when ``result[key] >= value``) and the older names that mean them.
STOP_KEYS = ("training_iteration", "num_env_steps_sampled_lifetime", "episode_return_mean", "time_total_s",
             "evaluation/episode_return_mean", "num_gradient_updates_lifetime")
#: Stop keys that count up from 0 (iterations, steps, seconds, an offline run's gradient steps): a limit must be
#: positive.
COUNT_STOP_KEYS = ("training_iteration", "num_env_steps_sampled_lifetime", "time_total_s",
                   "num_gradient_updates_lifetime")
#: Stop names beyond RLlib's result names (herdrl.results.flat_name): RLlib's new stack stops on the per-iteration
#: count's name meaning the lifetime one.
STOP_ALIASES = {"num_env_steps_sampled": "num_env_steps_sampled_lifetime"}


def normalize_stop(stop: Mapping[str, Any] | None) -> dict[str, float]:
    """Map stop keys to herdrl's names and check their values."""
    out: dict[str, float] = {}
    for key, value in (stop or {}).items():
        name = STOP_ALIASES.get(key, flat_name(key))
        if name not in STOP_KEYS:
            raise ConfigError(f"unknown stop key '{key}'{did_you_mean(key, STOP_KEYS)}; known: {list(STOP_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ConfigError(f"stop key '{key}' got {value!r}; expected a number")
        if name in COUNT_STOP_KEYS and value <= 0:
            raise ConfigError(f"stop key '{key}' got {value!r}; expected a number > 0")
        out[name] = value
    return out


@dataclass
class Outcome:
    """How a run ended: its last result row, which criterion stopped it, and where its files are."""

    result: dict[str, Any]
    stopped_by: str  # a stop key, "solved", "budget" or "interrupted"
    solved: bool | None  # None when no reward threshold applies
    logdir: Path
    signal: int | None = None  # the signal that interrupted the run (SIGINT, SIGTERM), if one did
    already_done: bool = False  # a resumed trial whose stop criterion its checkpoint already met: nothing ran


def experiment_name(env: Any) -> str:
    """The default experiment (results folder) name of an env: its id with other characters than letters, digits,
    ``_``, ``.``, ``-`` made ``_`` (``ALE/Pong-v5`` -> ``ALE_Pong-v5``; a QMIX team's ``team:`` prefix left out)."""
    from herdrl.env.imports import plain_env

    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(plain_env(env)))


def run_subject(config: AlgorithmConfig) -> Any:
    """What a run is named after: its env; an offline run without one, its dataset's folder name."""
    if config.env is None and config.learns_offline and config.input_:
        return Path(str(config.input_)).expanduser().resolve().name
    return config.env


def trial_name(config: AlgorithmConfig) -> str:
    """``<ALGO>_<env>_<seed>_<timestamp>`` (DESIGN.md, Definitions; no seed part when no seed is set)."""
    env = experiment_name(run_subject(config))
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    seed = "" if config.seed is None else f"_{config.seed}"
    return f"{config.algo_name}_{env}{seed}_{stamp}"


def find_resume_trial(output: str | Path, experiment: str, trial: str | None = None,
                      algorithm: str | None = None) -> Path:
    """The trial to resume: ``trial``, else the newest of ``algorithm``'s trials in the experiment."""
    exp_dir = Path(output) / experiment
    if trial is not None:
        if not (exp_dir / trial).is_dir():
            raise ConfigError(f"--resume: no trial '{trial}' in {exp_dir}")
        return exp_dir / trial
    trials = [p for p in exp_dir.glob("*") if p.is_dir() and (p / "params.json").exists()]
    if algorithm is not None:
        trials = [p for p in trials if trial_algorithm(p) == algorithm.upper()]
    if not trials:
        what = f"{algorithm.upper()} trial" if algorithm else "trial"
        raise ConfigError(f"--resume: no {what} to resume in {exp_dir}; run without --resume first")
    return max(trials, key=lambda p: (p / "params.json").stat().st_mtime)


def resume_checkpoint(trial_dir: Path) -> Path:
    """A trial's newest valid checkpoint; ConfigError when it has none."""
    from herdrl.checkpoint import newest_valid_checkpoint

    checkpoint = newest_valid_checkpoint(trial_dir)
    if checkpoint is None:
        raise ConfigError(f"--resume: trial {trial_dir} has no valid checkpoint; start it again without --resume")
    return checkpoint


def find_resume_point(output: str | Path, experiment: str, trial: str | None = None,
                      algorithm: str | None = None) -> tuple[Path, Path]:
    """The trial to resume (see :func:`find_resume_trial`) and its newest valid checkpoint; :class:`TrialBusy`
    when a live run holds the trial (one that has not checkpointed yet included: it is in use, not abandoned)."""
    trial_dir = find_resume_trial(output, experiment, trial, algorithm)
    TrialLock(trial_dir).check_free()
    return trial_dir, resume_checkpoint(trial_dir)


def _remove_if_unused(trial_dir: Path) -> None:
    """Remove a trial folder this run made and wrote nothing of its own into (its lock, a tracker's run ids)."""
    try:
        if {p.name for p in trial_dir.iterdir()} <= {".herd.lock", "trackers.json"}:
            for name in (".herd.lock", "trackers.json"):
                (trial_dir / name).unlink(missing_ok=True)
            trial_dir.rmdir()
    except OSError:
        pass  # in use, or not ours to remove: leave it


def _refuse_existing(trial_dir: Path, locked: bool = False) -> None:
    """A named trial that already has results is never written into again without --resume (``locked``: we
    hold its lock, so no live run can be the reason)."""
    if (trial_dir / "result.json").exists():
        if not locked:
            TrialLock(trial_dir).check_free()  # a live run's trial: say that first
        raise ConfigError(f"trial {trial_dir} exists: add --resume to continue it, or choose another --trial")


def trial_algorithm(trial_dir: Path, params: dict[str, Any] | None = None) -> str | None:
    """The algorithm of a trial: its ``params.json`` says it (herd train), else its folder name (a Tune trial:
    ``PPO_CartPole-v1_...``); None when neither names a known one. ``params``: the file's contents, if read."""
    import json

    from herdrl.registry import ALGORITHMS

    if params is None:
        try:
            params = json.loads((trial_dir / "params.json").read_text())
        except (OSError, ValueError):
            params = {}
    name = params.get("algorithm") if isinstance(params, dict) else None
    name = str(name or trial_dir.name.split("_")[0]).upper()
    return name if name in ALGORITHMS else None


_EARLY_WALLTIME: list[int] = []  # SIGUSR1 received before a run's loop began (catch_walltime_signal)


def catch_walltime_signal() -> None:
    """From now on SIGUSR1 (a batch job's walltime is near) is remembered until a run's loop takes over, instead of
    ending the process (its default action) while the run starts: the run then stops after its first iteration,
    with a checkpoint."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, lambda signum, frame: _EARLY_WALLTIME.append(signum))


class _GracefulStop:
    """First Ctrl-C (or SIGTERM, as a scheduler sends at preemption or cancellation, or SIGUSR1, as a Slurm job
    launched with ``--time`` gets before its walltime): finish the iteration, checkpoint, stop. A second Ctrl-C
    aborts at once. ``signum``: the first signal received."""

    def __init__(self, console: ConsoleReporter | None) -> None:
        self.requested = False
        self.signum: int | None = None
        self.console = console
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
                self._old[sig] = signal.signal(sig, self._handle)
        if _EARLY_WALLTIME:
            _EARLY_WALLTIME.clear()
            self.walltime("SIGUSR1 while the run started (the job's walltime is near)")
        return self

    def walltime(self, why: str) -> None:
        """Stop as SIGUSR1 does (the walltime is near), for ``why``."""
        if not self.requested:
            self.requested, self.signum = True, signal.SIGUSR1
            if self.console:
                self.console.message(f"{why}: stopping with a checkpoint")

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signum = self.signum or signum
        if self.console:
            again = " (Ctrl-C again to abort now)" if signum == signal.SIGINT else ""
            why = " (the job's walltime is near)" if signum == signal.SIGUSR1 else ""
            self.console.message(f"{signal.Signals(signum).name}{why}: stopping after this iteration with a "
                                 f"checkpoint{again}")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def run_experiment(config: AlgorithmConfig, *, stop: Mapping[str, Any] | None = None,
                   output: str | Path = "results", name: str | None = None, trial: str | None = None,
                   quiet: bool = False, tensorboard: bool = True, budget: int | None = None,
                   checkpoint_every: int | None = 10, keep_checkpoints_num: int = 5,
                   checkpoint_score_attr: str | None = "episode_return_mean", resume: bool = False,
                   start_over: bool = False, keep_best: bool = False, mlflow: str | None = None,
                   wandb: str | None = None) -> Outcome:
    """Build the algorithm, train until a stop criterion holds, and return the outcome.

    With no ``stop``, the run stops when ``episode_return_mean`` reaches the env's
    ``reward_threshold`` ("solved") or after ``budget`` env steps (default ``DEFAULT_STEP_BUDGET``; an offline run:
    gradient steps, default ``DEFAULT_GRADIENT_BUDGET``).
    Checkpoints go to ``<trial>/checkpoint_<iteration>`` every ``checkpoint_every`` iterations (0 or None:
    only at the end) and when the run ends or is interrupted; the ``keep_checkpoints_num`` newest and the best
    by ``checkpoint_score_attr`` are kept. ``resume``: continue the trial (``trial``, else the newest of
    the experiment) from its newest valid checkpoint. ``start_over``: the named ``trial`` may hold rows of a run
    that wrote no checkpoint (a batch job requeued early): start it again in place, dropping them. ``keep_best``
    (SB3's ``EvalCallback`` habit): a checkpoint at every new best of the algorithm's metric (its evaluation
    return when evaluation runs), kept with the newest, and named in the trial's ``best_checkpoint.json``.
    ``mlflow`` (a tracking URI) and ``wandb`` (a project): experiment trackers given the config, every row and the
    checkpoints (:mod:`herdrl.trackers`); a resumed trial continues their runs.
    """
    from herdrl.checkpoint import prune

    if mlflow or wandb:  # not installed: one line before anything is built or written
        from herdrl.trackers import check_installed

        check_installed(mlflow=mlflow, wandb=wandb)
    stop_at = _stop_at()
    metric = config.stop_metric  # off-policy: greedy evaluation returns
    if checkpoint_every is not None and checkpoint_every < 0:
        raise ConfigError(f"checkpoint_every got {checkpoint_every}; expected an int >= 1, or 0 or None (only at "
                          "the end)")
    checkpoint_every = checkpoint_every or None  # 0, as `herd train --checkpoint-every 0`: only at the end
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ConfigError(f"budget got {budget!r}; expected an int >= 1 (env steps; offline: gradient steps)")
    if isinstance(keep_checkpoints_num, bool) or not isinstance(keep_checkpoints_num, int) or keep_checkpoints_num < 1:
        raise ConfigError(f"keep_checkpoints_num got {keep_checkpoints_num!r}; expected an int >= 1 (the newest "
                          "checkpoint is always kept)")
    criteria = normalize_stop(stop)
    default_stop = not criteria
    if default_stop and config.learns_offline:  # no env steps: the budget counts gradient steps
        criteria["num_gradient_updates_lifetime"] = budget or DEFAULT_GRADIENT_BUDGET
    elif default_stop:
        criteria["num_env_steps_sampled_lifetime"] = budget or DEFAULT_STEP_BUDGET
    if "num_env_steps_sampled_lifetime" in criteria:  # named schedules without steps: over the run's step budget
        config.decay_over(int(criteria["num_env_steps_sampled_lifetime"]))
    config.validate()
    if keep_best and config.evaluation_parallel_to_training:
        raise ConfigError("--keep-best with evaluation_parallel_to_training: each evaluation scores the weights its "
                          "iteration began with, not those its checkpoint holds; evaluate after training instead")
    threshold = env_reward_threshold(config.env) if not callable(config.env) and config.env is not None else None
    if default_stop and threshold is not None:
        criteria = {metric: threshold, **criteria}
    experiment = name or experiment_name(run_subject(config))
    console = None if quiet else ConsoleReporter(target=criteria.get(metric), metric=metric, limits=criteria)
    if console and (config.num_env_runners > 0 or config.num_learners > 0):
        where = config.address or os.environ.get("RAY_ADDRESS") or "a private Ray on this machine"
        actors = [f"{n} {what}" for n, what in ((config.num_env_runners, "env runner(s)"),
                                                  (config.num_learners, "learner(s)")) if n]
        console.message(f"starting {' and '.join(actors)} on {where} ...")
    checkpoint, lock, logdir = None, None, None
    if not resume and trial and not start_over:
        _refuse_existing(Path(output) / experiment / trial)  # before the build (Ray, runners); again under the lock
    if resume:
        logdir = find_resume_trial(output, experiment, trial, config.algo_name)
        lock = TrialLock(logdir)
        lock.acquire()  # a live run's trial is never resumed under it
        try:
            checkpoint = resume_checkpoint(logdir)  # under the lock: no run is writing a newer one
            done = _already_done(checkpoint, criteria)
        except BaseException:
            lock.release()
            raise
        if done is not None:  # a finished trial resumed (the next job of a chain): nothing to build or train
            lock.release()
            key, result = done
            if console:
                console.message(f"already done: {key} {format_value(result.get(key))} >= {criteria[key]:g} at "
                                f"{checkpoint.name}; nothing to train")
            return Outcome(result=Result(result), stopped_by=_stop_reason(key, default_stop, metric), logdir=logdir,
                           solved=None if threshold is None else result.get(metric, -math.inf) >= threshold,
                           already_done=True)
    try:
        algo = config.build()  # before any file is written: bad input leaves no empty trial dir
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    try:
        if resume:
            algo.restore(checkpoint)
        else:
            logdir = create_trial_dir(Path(output) / experiment / (trial or trial_name(config)), exact=bool(trial))
            lock = TrialLock(logdir)
            lock.acquire()
            if not start_over:
                _refuse_existing(logdir, locked=True)
        params = {"algorithm": config.algo_name, **config.to_dict(), "imports": list(imports.IMPORTED)}
        resume_after = (algo.iteration, algo.env_steps_lifetime) if checkpoint is not None else (
            (0, 0) if start_over else None)  # (0, 0): every row of the run that saved nothing is dropped
        trackers = []
        if mlflow or wandb:
            from herdrl.trackers import make_trackers

            trackers = make_trackers(logdir, experiment, logdir.name, params, mlflow=mlflow, wandb=wandb)
        algo.logger = Logger(logdir, params, console=console, tensorboard=tensorboard, resume_after=resume_after,
                             trackers=trackers)
    except BaseException:
        try:
            algo.stop()
        finally:
            if lock is not None:
                lock.release()
            if not resume and logdir is not None:
                _remove_if_unused(logdir)  # (a tracker that could not start: no empty trial folder left behind)
        raise
    if console:
        stops = ", ".join(f"{k} >= {v:g}" for k, v in criteria.items())
        shown = checkpoint.parent if checkpoint is not None and checkpoint.name == TUNE_SUBDIR else checkpoint
        action = f"resuming from {shown.name}" if shown is not None else "results"
        source = config.env if config.env is not None else f"the dataset {config.to_dict().get('input_')}"
        console.message(f"{config.algo_name} on {source}: {action} in {logdir}; stops at {stops}")
    saved_at = algo.iteration if checkpoint is not None else -1
    best_key = ("evaluation/episode_return_mean" if config.evaluation_interval else config.stop_metric)
    if keep_best:
        checkpoint_score_attr = best_key  # the best checkpoint kept is the best by that metric
    best = _best_so_far(logdir, best_key) if keep_best else None

    def save() -> None:
        nonlocal saved_at
        if algo.iteration > 0 and algo.iteration != saved_at:
            algo.save()
            saved_at = algo.iteration
            prune(logdir, keep_checkpoints_num, checkpoint_score_attr)

    def save_if_best(result: dict[str, Any]) -> None:
        nonlocal best
        value = result.get(best_key)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or (best is not None and value <= best):
            return
        best = value
        save()
        name = checkpoint_name(algo.iteration)
        write_json_atomic(logdir / BEST_FILE, {"checkpoint": name, "metric": best_key, "value": value,
                                               "training_iteration": algo.iteration})
        if console:
            console.message(f"new best {best_key} {format_value(value)}: {name}")

    result: dict[str, Any] = dict(algo.last_result)
    stopped_by = "interrupted"
    graceful = None
    try:
        with _GracefulStop(console) as graceful:
            try:
                while True:
                    result = algo.train()
                    if stop_at is not None and time.time() + result.get("time_this_iter_s", 0.0) >= stop_at:
                        graceful.walltime(f"{STOP_AT_ENV}: no time left for another iteration")
                    if checkpoint_every and algo.iteration % checkpoint_every == 0:
                        save()
                    if keep_best:
                        save_if_best(result)
                    met = [k for k, v in criteria.items() if result.get(k, -math.inf) >= v]
                    if met:
                        stopped_by = met[0]
                        break
                    if graceful.requested:
                        break
            except HerdError:
                algo.logger.end_status = "FAILED"
                save()  # the last completed iteration is consistent: keep it, then report the error
                raise
            if stopped_by == "interrupted":
                algo.logger.end_status = "KILLED"  # stopped to be resumed (a signal, the walltime)
            save()
    except KeyboardInterrupt:  # the second Ctrl-C: mid-iteration state is not saved
        algo.logger.end_status = "KILLED"
        if console:
            console.message("aborted: the newest checkpoint is from before this iteration")
    except BaseException:
        algo.logger.end_status = "FAILED"
        raise
    finally:
        try:
            algo.stop()
        finally:
            lock.release()
    solved = None
    if threshold is not None and result:
        solved = result.get(metric, -math.inf) >= threshold
    return Outcome(result=result, stopped_by=_stop_reason(stopped_by, default_stop, metric), solved=solved,
                   logdir=logdir, signal=graceful.signum if graceful is not None else None)


#: The file in a trial folder naming its best checkpoint (``--keep-best``).
BEST_FILE = "best_checkpoint.json"


def _best_so_far(logdir: Path, key: str) -> float | None:
    """The best ``key`` a resumed trial's ``--keep-best`` reached before, from its best_checkpoint.json."""
    import json

    try:
        value = json.loads((logdir / BEST_FILE).read_text()).get("value")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _stop_at() -> float | None:
    """The time (seconds since the epoch) in ``HERD_STOP_AT`` by which a run stops with a checkpoint, as at SIGUSR1:
    a batch system's walltime less a lead, for schedulers that send no signal before it (PBS)."""
    text = os.environ.get(STOP_AT_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{STOP_AT_ENV}={text!r} is not a time: give seconds since the epoch, e.g. "
                          "$(( $(date +%s) + 3600 ))") from None
    if not math.isfinite(value):
        raise ConfigError(f"{STOP_AT_ENV}={text!r} is not a time: give seconds since the epoch")
    return value


def _already_done(checkpoint: Path, criteria: dict[str, float]) -> tuple[str, dict[str, Any]] | None:
    """The stop key a checkpoint's last result row already meets, and that row; None if training must go on. The
    counts come from its counters (what a restore continues from); a value that is not a finite number is a
    damaged checkpoint, never "done"."""
    from herdrl.checkpoint import CheckpointError, read_meta

    meta = read_meta(checkpoint)
    metrics, counters = meta.get("metrics", {}), meta.get("counters", {})
    if not isinstance(metrics, dict) or not isinstance(counters, dict):
        raise CheckpointError(f"checkpoint '{meta['path']}' is damaged: its metrics or counters are not a mapping")
    result = {**metrics, **{key: counters[key] for key in COUNT_STOP_KEYS if key in counters}}
    met = []
    for key, limit in criteria.items():
        value = result.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise CheckpointError(f"checkpoint '{meta['path']}' is damaged: its {key} is {value!r}, not a number")
        if value >= limit:
            met.append(key)
    return (met[0], result) if met else None


def _stop_reason(key: str, default_stop: bool, metric: str) -> str:
    """The stop key that held, named "solved" or "budget" when it was the default criterion's."""
    if default_stop and key == metric:
        return "solved"
    if default_stop and key in ("num_env_steps_sampled_lifetime", "num_gradient_updates_lifetime"):
        return "budget"
    return key


# ------------------------------------------------------------------ YAML files
def _yaml_loader() -> type:
    """A SafeLoader that reads ``1e-5`` as a float (plain PyYAML reads it as a string)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    float_re = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""", re.X)
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", float_re, list("-+0123456789."))
    return Loader


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML text with numbers read as numbers; syntax errors become ConfigError."""
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        where, problem = yaml_error_parts(exc, source)
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None


EXPERIMENT_KEYS = ("run", "algorithm", "env", "stop", "config", "name", "imports", "mlflow", "wandb")
#: Keys only a sweep file (`herd tune -f`) has.
SWEEP_KEYS = ("num_samples", "scheduler", "metric", "mode", "max_concurrent_trials", "checkpoint_freq")
SEARCH_TAGS = ("grid_search", "choice", "uniform", "loguniform")


def has_search_space(config: Any) -> bool:
    """Whether a config (from YAML) holds search-space tags such as ``{grid_search: [...]}``."""
    if isinstance(config, dict):
        if len(config) == 1 and next(iter(config)) in SEARCH_TAGS:
            return True
        return any(has_search_space(v) for v in config.values())
    return False


def load_experiment_file(path: str | Path, sweep: bool = False) -> dict[str, Any]:
    """Read an experiment YAML in RLlib's tuned-example shape or with the same keys at top level.

    Returns a dict with ``algorithm``, ``env``, ``stop``, ``config`` and ``name`` (any may be None)::

        cartpole-ppo:              # or the same keys without this level
          run: PPO                 # `algorithm:` is an alias
          env: CartPole-v1
          stop: {episode_return_mean: 475}
          config: {lr: 1e-3, num_env_runners: 0}
          imports: [myenvs]        # modules that register envs (as --import)
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file '{path}' not found")
    data = parse_yaml(path.read_text(), str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at top level, got {type(data).__name__}")
    name = None
    if len(data) == 1:
        (only_key, inner), = data.items()
        if isinstance(inner, dict) and only_key not in EXPERIMENT_KEYS:
            name, data = only_key, inner
    known = EXPERIMENT_KEYS + (SWEEP_KEYS if sweep else ())
    unknown = [k for k in data if k not in known]
    if unknown:
        key = unknown[0]
        if key in SWEEP_KEYS:
            raise ConfigError(f"{path}: '{key}' belongs to a sweep: run the file with `herd tune -f {path}`")
        raise ConfigError(f"{path}: unknown key '{key}'{did_you_mean(key, known)}; known: {list(known)}")
    if "run" in data and "algorithm" in data and data["run"] != data["algorithm"]:
        raise ConfigError(f"{path}: 'run' and 'algorithm' disagree ({data['run']} vs {data['algorithm']})")
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: 'config' must be a mapping")
    stop = data.get("stop") or {}
    if not isinstance(stop, dict):
        raise ConfigError(f"{path}: 'stop' must be a mapping")
    if not sweep and has_search_space(config):
        raise ConfigError(f"{path}: the config holds a search space: run the file with `herd tune -f {path}`")
    imports = data.get("imports") or []
    if isinstance(imports, str):
        imports = [imports]
    if not (isinstance(imports, list) and all(isinstance(m, str) for m in imports)):
        raise ConfigError(f"{path}: 'imports' must be a list of module names")
    for key, kinds in (("mlflow", (str, bool)), ("wandb", (str,))):
        if data.get(key) is not None and not isinstance(data[key], kinds):
            raise ConfigError(f"{path}: '{key}' must be {'a tracking URI or true' if key == 'mlflow' else 'a project'}")
    out = {"algorithm": data.get("algorithm", data.get("run")), "env": data.get("env"),
           "stop": stop, "config": dict(config), "name": data.get("name", name), "imports": imports,
           "mlflow": data.get("mlflow"), "wandb": data.get("wandb")}
    if sweep:
        out.update({k: data[k] for k in SWEEP_KEYS if k in data})
    return out
