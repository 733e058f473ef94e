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
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from herdrl.auto_size import budget_for, kept_choice, size_run, wants_sizing, write_record
from herdrl.checkpoint import TUNE_SUBDIR
from herdrl.config import AlgorithmConfig
from herdrl.env import env_reward_threshold, imports
from herdrl.errors import ConfigError, did_you_mean, yaml_error_parts
from herdrl.logger import ConsoleReporter, Logger, format_value
from herdrl.results import Result, flat_name
from herdrl.trial_dir import TrialLock, create_trial_dir
from herdrl.trial_run import (  # noqa: F401  (BEST_FILE, _EARLY_WALLTIME, catch_walltime_signal: importable here)
    _EARLY_WALLTIME,
    BEST_FILE,
    TrainingLoop,
    _stop_at,
    catch_walltime_signal,
)

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


@dataclass
class _Stops:
    """A run's stop criteria, and how its outcome is named after them."""

    criteria: dict[str, float]
    default_stop: bool  # none of the user's: "solved" at the env's reward threshold, else the budget
    metric: str  # the return "solved" is read from (off-policy: greedy evaluation returns)
    threshold: float | None  # the env's reward threshold, if it has one

    def reason(self, key: str) -> str:
        """The Outcome's ``stopped_by`` when ``key`` held."""
        return _stop_reason(key, self.default_stop, self.metric)

    def solved(self, result: dict[str, Any]) -> bool | None:
        """Whether ``result`` reaches the env's reward threshold (None when no threshold applies)."""
        if self.threshold is None or not result:
            return None
        return result.get(self.metric, -math.inf) >= self.threshold


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
    if mlflow or wandb:  # not installed: one line before anything is built or written
        from herdrl.trackers import check_installed

        check_installed(mlflow=mlflow, wandb=wandb)
    stop_at = _stop_at()
    checkpoint_every = _check_checkpoint_options(checkpoint_every, budget, keep_checkpoints_num)
    stops = _stop_criteria(config, stop, budget, keep_best)
    experiment = name or experiment_name(run_subject(config))
    console = _start_console(config, stops, quiet)
    checkpoint, lock, logdir = None, None, None
    if not resume and trial and not start_over:
        _refuse_existing(Path(output) / experiment / trial)  # before the build (Ray, runners); again under the lock
    if resume:
        logdir, lock, checkpoint, done = _lock_resume_point(output, experiment, trial, config.algo_name, stops)
        if done is not None:  # a finished trial resumed (the next job of a chain): nothing to build or train
            return _outcome_already_done(done, stops, logdir, lock, checkpoint, console)
    config, sizing = _size(config, logdir, stops, console, lock)
    algo = _build(config, lock)  # before any file is written: bad input leaves no empty trial dir
    logdir, lock = _open_trial(algo, config, logdir, lock, checkpoint, experiment=experiment, output=output,
                               trial=trial, start_over=start_over, console=console, tensorboard=tensorboard,
                               mlflow=mlflow, wandb=wandb)
    if sizing is not None:
        write_record(logdir, sizing)
    if console:
        _announce(console, config, stops, checkpoint, logdir)
    best_key = None
    if keep_best:
        best_key = "evaluation/episode_return_mean" if config.evaluation_interval else config.stop_metric
    loop = TrainingLoop(algo, logdir, stops.criteria, stop_at=stop_at, checkpoint_every=checkpoint_every,
                        keep_checkpoints_num=keep_checkpoints_num, checkpoint_score_attr=checkpoint_score_attr,
                        best_key=best_key, console=console, resumed=checkpoint is not None)
    loop.run(lock)
    return Outcome(result=loop.result, stopped_by=stops.reason(loop.stopped_by), solved=stops.solved(loop.result),
                   logdir=logdir, signal=loop.signum)


def _check_checkpoint_options(checkpoint_every: int | None, budget: int | None,
                              keep_checkpoints_num: int) -> int | None:
    """Refuse a bad checkpoint interval, budget or number of checkpoints kept; the interval, None for "only at the
    end"."""
    if checkpoint_every is not None and checkpoint_every < 0:
        raise ConfigError(f"checkpoint_every got {checkpoint_every}; expected an int >= 1, or 0 or None (only at "
                          "the end)")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ConfigError(f"budget got {budget!r}; expected an int >= 1 (env steps; offline: gradient steps)")
    if isinstance(keep_checkpoints_num, bool) or not isinstance(keep_checkpoints_num, int) or keep_checkpoints_num < 1:
        raise ConfigError(f"keep_checkpoints_num got {keep_checkpoints_num!r}; expected an int >= 1 (the newest "
                          "checkpoint is always kept)")
    return checkpoint_every or None  # 0, as `herd train --checkpoint-every 0`: only at the end


def _stop_criteria(config: AlgorithmConfig, stop: Mapping[str, Any] | None, budget: int | None,
                   keep_best: bool) -> _Stops:
    """The run's stop criteria: the user's, else the budget and the env's reward threshold ("solved"); the config
    validated with its named schedules decayed over the step budget."""
    metric = config.stop_metric  # off-policy: greedy evaluation returns
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
    return _Stops(criteria, default_stop, metric, threshold)


def _start_console(config: AlgorithmConfig, stops: _Stops, quiet: bool) -> ConsoleReporter | None:
    """The console's reporter (None when ``quiet``), which says first where the run's Ray actors start."""
    if quiet:
        return None
    console = ConsoleReporter(target=stops.criteria.get(stops.metric), metric=stops.metric, limits=stops.criteria)
    if not wants_sizing(config):  # (else once the counts are chosen: _size)
        _say_where_actors_start(console, config)
    return console


def _say_where_actors_start(console: ConsoleReporter, config: AlgorithmConfig) -> None:
    if config.num_env_runners > 0 or config.num_learners > 0:
        where = config.address or os.environ.get("RAY_ADDRESS") or "a private Ray on this machine"
        actors = [f"{n} {what}" for n, what in ((config.num_env_runners, "env runner(s)"),
                                                  (config.num_learners, "learner(s)")) if n]
        console.message(f"starting {' and '.join(actors)} on {where} ...")


def _lock_resume_point(output: str | Path, experiment: str, trial: str | None, algorithm: str,
                       stops: _Stops) -> tuple[Path, TrialLock, Path, tuple[str, dict[str, Any]] | None]:
    """The trial to resume, locked (a live run's trial is never resumed under it), its newest valid checkpoint and,
    when that checkpoint already meets a stop criterion, the key and its row (see :func:`_already_done`)."""
    logdir = find_resume_trial(output, experiment, trial, algorithm)
    lock = TrialLock(logdir)
    lock.acquire()
    try:
        checkpoint = resume_checkpoint(logdir)  # under the lock: no run is writing a newer one
        return logdir, lock, checkpoint, _already_done(checkpoint, stops.criteria)
    except BaseException:
        lock.release()
        raise


def _outcome_already_done(done: tuple[str, dict[str, Any]], stops: _Stops, logdir: Path, lock: TrialLock,
                          checkpoint: Path, console: ConsoleReporter | None) -> Outcome:
    """A resumed trial whose checkpoint already met a stop criterion: its lock released, nothing built."""
    lock.release()
    key, result = done
    if console:
        console.message(f"already done: {key} {format_value(result.get(key))} >= {stops.criteria[key]:g} at "
                        f"{checkpoint.name}; nothing to train")
    return Outcome(result=Result(result), stopped_by=stops.reason(key), logdir=logdir, solved=stops.solved(result),
                   already_done=True)


def _size(config: AlgorithmConfig, resumed: Path | None, stops: _Stops, console: ConsoleReporter | None,
          lock: TrialLock | None) -> tuple[AlgorithmConfig, dict[str, Any] | None]:
    """``config`` with its ``"auto"`` runner and env counts chosen (measured, or a resumed trial's first choice),
    and the record to keep in the trial folder (None: nothing measured). Says the choice, then where the actors
    start; ``lock`` (a resumed trial's) released if measuring fails."""
    if not wants_sizing(config):
        return config, None
    echo = console.message if console else (lambda line: None)
    try:
        kept = kept_choice(config, resumed, echo) if resumed is not None else None
        sized, record = (kept, None) if kept is not None else size_run(
            config, budget_for(stops.criteria), echo=echo)
        sized.validate()
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    if console:
        _say_where_actors_start(console, sized)
    return sized, record


def _build(config: AlgorithmConfig, lock: TrialLock | None) -> Any:
    """The algorithm, built; ``lock`` (a resumed trial's) released if the build fails."""
    try:
        return config.build()
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _open_trial(algo: Any, config: AlgorithmConfig, logdir: Path | None, lock: TrialLock | None,
                checkpoint: Path | None, *, experiment: str, output: str | Path, trial: str | None,
                start_over: bool, console: ConsoleReporter | None, tensorboard: bool, mlflow: str | None,
                wandb: str | None) -> tuple[Path, TrialLock]:
    """The trial folder and its lock: a resumed trial's (``logdir``, ``lock``), ``algo`` restored from
    ``checkpoint``, or a new one made and locked; then ``algo``'s logger with the trackers. On failure ``algo`` is
    stopped, the lock released and a new folder this run wrote nothing into removed."""
    try:
        if checkpoint is not None:
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
            if checkpoint is None and logdir is not None:
                _remove_if_unused(logdir)  # (a tracker that could not start: no empty trial folder left behind)
        raise
    return logdir, lock


def _announce(console: ConsoleReporter, config: AlgorithmConfig, stops: _Stops, checkpoint: Path | None,
              logdir: Path) -> None:
    """One line: what trains on what, where its results go (or which checkpoint it resumes), when it stops."""
    limits = ", ".join(f"{k} >= {v:g}" for k, v in stops.criteria.items())
    shown = checkpoint.parent if checkpoint is not None and checkpoint.name == TUNE_SUBDIR else checkpoint
    action = f"resuming from {shown.name}" if shown is not None else "results"
    source = config.env if config.env is not None else f"the dataset {config.to_dict().get('input_')}"
    console.message(f"{config.algo_name} on {source}: {action} in {logdir}; stops at {limits}")


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
