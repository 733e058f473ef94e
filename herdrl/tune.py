"""Hyperparameter sweeps and many-trial experiments on Ray Tune.

    from herdrl import tune
    analysis = tune.run("PPO", config={"env": "CartPole-v1", "lr": tune.grid_search([1e-3, 3e-3])},
                        stop={"training_iteration": 20})
    print(analysis.best_config, analysis.best_checkpoint)

The seed scripts' call works as written, with only the import changed::

    tune.run("PPO", name="cartpole", stop={"training_iteration": 100},
             config={"env": "CartPole-v1", "num_workers": 2, "num_gpus": 0, "ignore_worker_failures": True})

RLlib 2.x's Tuner API works too, with ``from herdrl import tune`` in place of ``from ray import tune``::

    tuner = tune.Tuner("PPO", param_space=config,   # a PPOConfig (search spaces inside) or its dict form
                       tune_config=tune.TuneConfig(metric="env_runners/episode_return_mean", mode="max"),
                       run_config=tune.RunConfig(stop={"training_iteration": 20},
                                                 checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True)))
    best = tuner.fit().get_best_result()
    algo = Algorithm.from_checkpoint(best.checkpoint)

Importing this module does not import Ray; the first call does. Each trial is one Ray actor running one
herdrl Algorithm; it reserves a placement group of one bundle for the learner plus one per env runner, so
trials never oversubscribe a node and a cluster runs as many trials at once as it has room for.
Trial checkpoints are herdrl's own (pickle-free) format. ``resume=True`` uses Tune's experiment restore,
which unpickles Tune's own state files in the experiment directory: only resume experiments you trust.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from herdrl.checkpoint import TUNE_SUBDIR, CheckpointPath
from herdrl.errors import ConfigError, HerdError
from herdrl.results import Result, flat_name


# ------------------------------------------------------------------ search spaces (Ray Tune's own)
def grid_search(values: list) -> Any:
    """Try every value (Ray Tune's ``grid_search``)."""
    from ray import tune

    return tune.grid_search(list(values))


def choice(values: list) -> Any:
    """Sample one of the values (Ray Tune's ``choice``)."""
    from ray import tune

    return tune.choice(list(values))


def uniform(low: float, high: float) -> Any:
    """Sample uniformly in [low, high] (Ray Tune's ``uniform``)."""
    from ray import tune

    return tune.uniform(low, high)


def loguniform(low: float, high: float) -> Any:
    """Sample log-uniformly in [low, high] (Ray Tune's ``loguniform``)."""
    from ray import tune

    return tune.loguniform(low, high)


# ------------------------------------------------------------------ the trainable
def _trainable(algorithm: str) -> type:
    """A Ray Tune class trainable that runs one herdrl algorithm per trial."""
    from ray import tune
    from ray.tune import PlacementGroupFactory

    from herdrl.cluster import shipping
    from herdrl.env.imports import IMPORTED
    from herdrl.registry import ENV_CREATORS, get_config_class

    config_class = get_config_class(algorithm)
    # What registers the driver's envs, shipped with the class: each trial imports / registers them again.
    env_modules, env_creators = tuple(IMPORTED), dict(ENV_CREATORS)
    shipping.ship_by_value(env_creators.values())  # their code travels with the trials (see shipping)

    class HerdTrainable(tune.Trainable):
        """One trial: build the algorithm from the trial's config, ``train()`` per step."""

        @classmethod
        def default_resource_request(cls, config: dict) -> PlacementGroupFactory:
            """The driver's bundle (with its learner's GPU), one per env runner, one per learner actor, then one per
            evaluation runner (SPREAD: runners and learners may sit on other nodes)."""
            from herdrl.rollout.group import runner_bundle

            resolved = config_class.from_dict(config)
            # The driver holds the default learner, and with no runner actors the runner too.
            gpus = float(resolved.learner_gpus) + (
                float(resolved.num_gpus_per_env_runner) if resolved.num_env_runners == 0 else 0.0)
            driver = {"CPU": 1.0, **({"GPU": gpus} if gpus else {})}
            runners = [runner_bundle(resolved)] * resolved.num_env_runners
            learner_gpus = float(resolved.num_gpus_per_learner)
            learners = [{"CPU": float(resolved.num_cpus_per_learner),
                         **({"GPU": learner_gpus} if learner_gpus else {})}] * resolved.num_learners
            evaluation = [runner_bundle(resolved.evaluation_runner_config())] * resolved.evaluation_num_env_runners
            return PlacementGroupFactory([driver, *runners, *learners, *evaluation], strategy="SPREAD")

        def setup(self, config: dict) -> None:
            import importlib
            import logging

            # Each save logs "Checkpoint successfully created at: ..." (Ray Train, INFO), forwarded to the
            # driver's console: after the sweep's summary, where it buries the summary.
            logging.getLogger("ray.train").setLevel(logging.WARNING)

            importlib.import_module("herdrl.env.imports").adopt_driver_envs(env_modules, env_creators)
            self.algo = config_class.from_dict(config).build()

        def step(self) -> dict:
            # A plain dict: Tune would count RLlib's timesteps_this_iter (a name the row answers to) into a
            # timesteps_total column of its own, a second copy of num_env_steps_sampled_lifetime.
            return dict(self.algo.train())

        def save_checkpoint(self, checkpoint_dir: str) -> None:
            self.algo.save(Path(checkpoint_dir) / TUNE_SUBDIR)

        def load_checkpoint(self, checkpoint: str | dict) -> None:
            self.algo.restore(Path(checkpoint) / TUNE_SUBDIR)

        def cleanup(self) -> None:
            self.algo.stop()

    HerdTrainable.__name__ = HerdTrainable.__qualname__ = config_class.algo_name
    return HerdTrainable


def _tensorboard_callback() -> Any:
    """A Tune callback writing each trial's TensorBoard files as `herd train` does (same tags, env steps on the
    x axis) into the trial folder, in place of Tune's own (``ray/tune/...`` tags over iterations)."""
    from ray.tune import Callback

    from herdrl.logger import write_tensorboard

    class HerdTensorBoard(Callback):
        """TensorBoard files of every trial, with `herd train`'s tags."""

        def __init__(self) -> None:
            self._writers: dict[Any, Any] = {}

        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            if trial not in self._writers:
                from torch.utils.tensorboard import SummaryWriter

                # A restored trial's first result follows its checkpoint: purge_step hides what the interrupted
                # run wrote after that point (a fresh trial has nothing there to hide).
                first_step = result.get("num_env_steps_sampled_lifetime", result.get("training_iteration", 0))
                self._writers[trial] = SummaryWriter(log_dir=trial.local_path, flush_secs=10, purge_step=first_step)
            write_tensorboard(self._writers[trial], result)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            writer = self._writers.pop(trial, None)
            if writer is not None:
                writer.close()

        on_trial_error = on_trial_complete
        on_trial_recover = on_trial_complete  # a recovered trial restarts from its checkpoint: a new, purging writer

        def on_experiment_end(self, trials: list, **info: Any) -> None:
            for writer in self._writers.values():  # e.g. after Ctrl-C: flush what was written
                writer.close()
            self._writers.clear()

    return HerdTensorBoard()


def _repeat_warning_callback() -> Any:
    """A Tune callback that warns when a trial starts with the config of an earlier one, seed included: a fixed
    seed makes it the same run again (``choice`` over seeds with ``num_samples > 1`` draws repeats)."""
    from ray.tune import Callback

    class RepeatWarning(Callback):
        """Warns once per repeated config."""

        def __init__(self) -> None:
            self._seen: dict[str, str] = {}
            self._started: set[str] = set()  # a trial restarts (after a failure, a PBT exploit): not a repeat

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            trial_id = str(getattr(trial, "trial_id", trial))
            if trial_id in self._started:
                return
            self._started.add(trial_id)
            config = dict(trial.config)
            key = json.dumps(config, sort_keys=True, default=repr)
            if key not in self._seen:
                self._seen[key] = str(trial)
            elif config.get("seed") is not None:
                print(f"herd tune: warning: trial {trial} has the same config as {self._seen[key]}, seed "
                      f"{config['seed']} included: it repeats that run (sample seeds with grid_search, not choice)",
                      file=sys.stderr, flush=True)

    return RepeatWarning()


# ------------------------------------------------------------------ schedulers
def make_scheduler(spec: str | Mapping[str, Any] | None) -> Any:
    """``"asha"``, ``{"type": "asha", "grace_period": 2, ...}``, ``"pbt"`` (with ``hyperparam_mutations``), or a
    scheduler object (passed through). The metric and mode come from :func:`run` (Tune hands them on)."""
    if spec is None or not isinstance(spec, (str, Mapping)):
        return spec
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    options = {"type": spec} if isinstance(spec, str) else dict(spec)
    kind = str(options.pop("type", options.pop("name", ""))).lower()
    options.setdefault("time_attr", "training_iteration")
    try:
        if kind == "asha":
            return ASHAScheduler(**options)
        if kind == "pbt":
            mutations = {k: _search_value(v) for k, v in options.pop("hyperparam_mutations", {}).items()}
            return PopulationBasedTraining(hyperparam_mutations=mutations, **options)
    except TypeError as exc:
        raise ConfigError(f"scheduler '{kind}': {exc}") from None
    raise ConfigError(f"unknown scheduler '{kind}'; known: asha, pbt")


# ------------------------------------------------------------------ results
@dataclass
class TuneAnalysis:
    """What a sweep produced: every trial's last result, and the best trial by ``metric``."""

    result_grid: Any
    metric: str
    mode: str
    #: Why the sweep stopped before its trials finished (the walltime, preemption), or None.
    stop_reason: str | None = None
    #: The signal that stopped it: SIGUSR1 (the walltime, ``HERD_STOP_AT`` too) or SIGTERM (preemption), or None.
    stop_signal: int | None = None
    #: Trials neither finished nor failed when the sweep stopped: ``resume=True`` continues them.
    num_unfinished: int = 0

    @property
    def best_result(self) -> dict[str, Any]:
        """The last result row of the best trial."""
        return BestTrial(self._best).last_result

    @property
    def best_config(self) -> dict[str, Any]:
        """The (resolved) config of the best trial."""
        return BestTrial(self._best).config

    @property
    def best_checkpoint(self) -> Path | None:
        """The best trial's latest herdrl checkpoint (load it with ``Algorithm.from_checkpoint``)."""
        return BestTrial(self._best).checkpoint

    @property
    def best_trial(self) -> BestTrial:
        """The best trial by the sweep's metric (:meth:`get_best_trial`)."""
        return self.get_best_trial()

    @property
    def best_logdir(self) -> Path:
        """The best trial's result directory."""
        return Path(self._best.path)

    @property
    def has_best(self) -> bool:
        """Whether some trial's last result has a finite ``metric`` (else there is no best trial to name)."""
        frame = self.results_df
        return self.metric in frame and bool(frame[self.metric].map(
            lambda v: isinstance(v, (int, float)) and math.isfinite(v)).any())

    @property
    def _best(self) -> Any:
        if not self.has_best:
            raise ConfigError(f"no trial reported a finite '{self.metric}' in its last result: no best trial "
                              "(give metric: a key the trials report)")
        return self.result_grid.get_best_result(metric=self.metric, mode=self.mode, scope="last")

    def get_best_trial(self, metric: str | None = None, mode: str | None = None, scope: str = "last") -> BestTrial:
        """The best trial by ``metric`` (default: the sweep's; RLlib's names such as ``episode_reward_mean`` work)
        over ``scope``: ``last``, ``avg``, ``last-5-avg``, ``last-10-avg`` or ``all`` (Ray Tune's meanings)."""
        metric, mode = flat_name(metric or self.metric), mode or self.mode
        try:
            best = self.result_grid.get_best_result(metric=metric, mode=mode, scope=scope)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ConfigError(f"no best trial by '{metric}' ({mode}, scope {scope}): {str(exc).splitlines()[0]}") \
                from None
        return BestTrial(best)

    def get_best_checkpoint(self, trial: BestTrial | None = None, metric: str | None = None,
                            mode: str | None = None) -> Path | None:
        """The herdrl checkpoint of ``trial`` (default: :meth:`get_best_trial`) with the best ``metric`` when it was
        written, among those kept (load it with ``Algorithm.from_checkpoint``); None if it has none."""
        metric, mode = flat_name(metric or self.metric), mode or self.mode
        trial = trial or self.get_best_trial(metric, mode)
        scored = [(metrics.get(metric), checkpoint) for checkpoint, metrics in (trial.result.best_checkpoints or [])
                  if isinstance(metrics.get(metric), (int, float)) and math.isfinite(metrics.get(metric))]
        if not scored:
            return trial.checkpoint
        pick = max if mode == "max" else min
        return Path(pick(scored, key=lambda pair: pair[0])[1].path) / TUNE_SUBDIR

    @property
    def results_df(self) -> Any:
        """A pandas DataFrame with one row per trial (its last result)."""
        return self.result_grid.get_dataframe()

    @property
    def errors(self) -> list[BaseException]:
        """Errors of trials that failed."""
        return list(self.result_grid.errors)


@dataclass
class BestTrial:
    """What RLlib scripts read of ``get_best_trial``: ``config``, ``last_result``, ``checkpoint`` (herdrl's),
    ``path`` (also ``logdir``) and ``trial_id``."""

    result: Any  # Ray Tune's Result of the trial

    @property
    def config(self) -> dict[str, Any]:
        """The trial's resolved config."""
        return dict(self.result.config)

    @property
    def last_result(self) -> Result:
        """The trial's last result row (RLlib's names work on it too)."""
        return Result(self.result.metrics)

    #: Ray Tune's ``Result.metrics``: the trial's last result row.
    metrics = last_result

    @property
    def checkpoint(self) -> CheckpointPath | None:
        """The trial's latest herdrl checkpoint (also ``.path``, as Ray's ``Checkpoint``); None if it wrote none."""
        checkpoint = self.result.checkpoint
        return CheckpointPath(Path(checkpoint.path) / TUNE_SUBDIR) if checkpoint is not None else None

    @property
    def error(self) -> BaseException | None:
        """Why the trial failed, or None."""
        return self.result.error

    @property
    def metrics_dataframe(self) -> Any:
        """Every row the trial reported, as a pandas DataFrame."""
        return self.result.metrics_dataframe

    @property
    def path(self) -> Path:
        """The trial's folder."""
        return Path(self.result.path)

    logdir = path

    @property
    def trial_id(self) -> str:
        """Ray Tune's id of the trial."""
        return str(self.result.metrics.get("trial_id", self.path.name))


class ResultGrid:
    """What :meth:`Tuner.fit` returns, read as Ray Tune's ``ResultGrid``: one :class:`BestTrial` per trial
    (``metrics``, ``checkpoint``, ``path``, ``config``), ``get_best_result``, ``errors``, ``get_dataframe``.
    RLlib's metric names work; checkpoints are herdrl's (``Algorithm.from_checkpoint(result.checkpoint)``)."""

    def __init__(self, analysis: TuneAnalysis) -> None:
        #: herdrl's own view of the sweep (``best_config``, ``stop_reason``, ...).
        self.analysis = analysis
        self._grid = analysis.result_grid

    def get_best_result(self, metric: str | None = None, mode: str | None = None, scope: str = "last",
                        filter_nan_and_inf: bool = True) -> BestTrial:
        """The trial with the best ``metric`` (default: ``TuneConfig``'s) in ``mode`` over ``scope`` (``last``,
        ``avg``, ``last-5-avg``, ``last-10-avg``, ``all``: Ray Tune's meanings)."""
        metric, mode = flat_name(metric or self.analysis.metric), mode or self.analysis.mode
        try:
            best = self._grid.get_best_result(metric=metric, mode=mode, scope=scope,
                                              filter_nan_and_inf=filter_nan_and_inf)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise ConfigError(f"no best trial by '{metric}' ({mode}, scope {scope}): {str(exc).splitlines()[0]}") \
                from None
        return BestTrial(best)

    def __len__(self) -> int:
        return len(self._grid)

    def __getitem__(self, index: int) -> BestTrial:
        return BestTrial(self._grid[index])

    def __iter__(self) -> Any:
        return (BestTrial(result) for result in self._grid)

    @property
    def errors(self) -> list[BaseException]:
        """Errors of trials that failed."""
        return list(self._grid.errors)

    @property
    def num_errors(self) -> int:
        """How many trials failed."""
        return self._grid.num_errors

    @property
    def num_terminated(self) -> int:
        """How many trials finished without an error."""
        return self._grid.num_terminated

    @property
    def experiment_path(self) -> str:
        """The sweep's folder."""
        return self._grid.experiment_path

    def get_dataframe(self, filter_metric: str | None = None, filter_mode: str | None = None) -> Any:
        """A pandas DataFrame, one row per trial: its last row, or with ``filter_metric`` its best by it."""
        return self._grid.get_dataframe(filter_metric=flat_name(filter_metric) if filter_metric else None,
                                        filter_mode=filter_mode)


def __getattr__(name: str) -> Any:
    """Ray Tune's ``TuneConfig``, ``RunConfig``, ``CheckpointConfig`` and ``FailureConfig``, for :class:`Tuner`
    (imported on first use: importing this module does not import Ray)."""
    if name in ("TuneConfig", "RunConfig", "CheckpointConfig", "FailureConfig"):
        from ray import tune

        return getattr(tune, name)
    raise AttributeError(f"module 'herdrl.tune' has no attribute '{name}'")


class Tuner:
    """RLlib 2.x's ``tune.Tuner(...).fit()`` for herdrl algorithms: ``trainable`` is the algorithm (``"PPO"``, the
    algorithm class, ``config.algo_class``), ``param_space`` its config (an ``AlgorithmConfig`` whose values may
    be search spaces, or the dict form), ``tune_config`` / ``run_config`` Ray Tune's own
    (:data:`TuneConfig`, :data:`RunConfig`, :data:`CheckpointConfig` here).

    It runs as :func:`run` does (a trial per Ray actor, placement groups, herdrl's checkpoints, TensorBoard and
    walltime handling); RLlib's metric and stop names work. Where herdrl differs: results go to ``results/<name>``
    unless ``RunConfig(storage_path=...)`` says otherwise (Ray's default is ``~/ray_results``), and the metric
    is ``episode_return_mean`` (max) unless ``TuneConfig`` names one."""

    def __init__(self, trainable: Any = None, *, param_space: Any = None, tune_config: Any = None,
                 run_config: Any = None) -> None:
        from herdrl.config import AlgorithmConfig

        if isinstance(param_space, AlgorithmConfig):
            self.algorithm = param_space.algo_name
            # The keys set, in the dict form each trial rebuilds its config from (defaults stay defaults there).
            self.config = {k: v for k, v in param_space.to_dict().items() if param_space.is_explicit(k)}
        else:
            self.algorithm = None
            self.config = dict(param_space or {})
        if trainable is not None:
            name = trainable if isinstance(trainable, str) else getattr(trainable, "__name__", None)
            if not isinstance(name, str):
                raise ConfigError(f"Tuner takes an algorithm name ('PPO') or class, got {trainable!r}")
            self.algorithm = name
        if self.algorithm is None:
            raise ConfigError("Tuner needs the algorithm: Tuner('PPO', param_space=...) (or a PPOConfig as "
                              "param_space)")
        self.tune_config, self.run_config = tune_config, run_config

    def fit(self) -> ResultGrid:
        """Run the sweep; every trial's result, the best by ``get_best_result``."""
        from ray import tune
        from ray.train.constants import DEFAULT_STORAGE_PATH

        tune_config = self.tune_config or tune.TuneConfig()
        run_config = self.run_config or tune.RunConfig()
        checkpoints = run_config.checkpoint_config or tune.CheckpointConfig()
        # RunConfig fills in Ray's default folder when none is given: herdrl's (results/) then, as `herd tune`'s.
        storage = None if run_config.storage_path == DEFAULT_STORAGE_PATH else run_config.storage_path
        analysis = run(self.algorithm, config=self.config, stop=run_config.stop, name=run_config.name,
                       num_samples=tune_config.num_samples, storage_path=storage,
                       checkpoint_freq=checkpoints.checkpoint_frequency,
                       checkpoint_at_end=bool(checkpoints.checkpoint_at_end),
                       keep_checkpoints_num=checkpoints.num_to_keep,
                       metric=tune_config.metric or "episode_return_mean", mode=tune_config.mode or "max",
                       scheduler=tune_config.scheduler, max_concurrent_trials=tune_config.max_concurrent_trials,
                       verbose=1 if run_config.verbose is None else run_config.verbose,
                       _ray_configs=(tune_config, run_config))
        return ResultGrid(analysis)


# ------------------------------------------------------------------ run
def _check_fits(trainable: type, config_class: type, config: Mapping[str, Any]) -> None:
    """Fail at once when the largest trial of the sweep can never be placed on the cluster (Tune itself would
    wait forever, repeating a warning): one line with what was asked, what exists and what to change."""
    import ray

    if os.environ.get("HERD_CLUSTER_AUTOSCALES", "0") == "1":
        return  # the cluster grows on demand: Tune waits for it
    resources = {"num_env_runners": None, "num_cpus_per_env_runner": None, "num_gpus": None, "num_learners": None,
                 "num_cpus_per_learner": None, "num_gpus_per_learner": None, "num_gpus_per_env_runner": None,
                 "evaluation_num_env_runners": None, "evaluation_config": None}
    fixed = {}
    for key, value in config.items():
        name = config_class.canonical_key(key) if key != "framework" else key
        if name == "evaluation_config" and isinstance(value, Mapping) and "grid_search" not in value:
            fixed[name] = {k: v for k, v in value.items() if k == "num_cpus_per_env_runner" and isinstance(
                v, (int, float))}  # what the evaluation runners reserve
        elif name in resources:
            if isinstance(value, Mapping) and "grid_search" in value:
                numbers = [v for v in value["grid_search"] if isinstance(v, (int, float)) and not isinstance(v, bool)]
                if not numbers:
                    continue
                value = max(numbers)  # the largest point of the grid
            elif not isinstance(value, (int, float)):
                continue  # sampled: unknown before the trial; Ray checks it then
            fixed[name] = value
    resolved = config_class.from_dict(fixed)
    runners, cpus = resolved.num_env_runners, resolved.num_cpus_per_env_runner
    if runners:  # before the totals: their advice (fewer runners) cannot help a runner no node can hold
        from herdrl.cluster.connect import check_fits_one_node
        from herdrl.rollout.group import runner_keys

        address = os.environ.get("RAY_ADDRESS")  # connect() set it when it joined a cluster
        check_fits_one_node(runner_keys(resolved),
                            f"the Ray cluster at {address}" if address else "this machine's private Ray")
    bundles = trainable.default_resource_request(fixed).bundles  # what Tune will ask the cluster for
    need_cpu, need_gpu = (sum(b.get(k, 0.0) for b in bundles) for k in ("CPU", "GPU"))
    have_cpu, have_gpu = (ray.cluster_resources().get(k, 0.0) for k in ("CPU", "GPU"))
    if need_cpu > have_cpu:
        learner = bundles[0].get("CPU", 0.0)
        fit = max(0, math.floor((have_cpu - learner) / cpus)) if cpus else 0
        actors = (f" + {resolved.num_learners} learner(s) x {resolved.num_cpus_per_learner:g} CPU"
                  if resolved.num_learners else "") + (
            f" + {resolved.evaluation_num_env_runners} evaluation runner(s)" if resolved.evaluation_num_env_runners
            else "")
        raise ConfigError(f"each trial asks for {need_cpu:g} CPUs ({learner:g} for the driver + {runners} env "
                          f"runner(s) x {cpus:g} CPU{actors}) but the Ray cluster has {have_cpu:g}: set "
                          f"num_env_runners (num_workers) to {fit} or fewer, or run on a larger cluster (one that "
                          "autoscales: set HERD_CLUSTER_AUTOSCALES=1)")
    if need_gpu > have_gpu:
        raise ConfigError(f"each trial asks for {need_gpu:g} GPU(s) (num_gpus, num_gpus_per_learner, "
                          f"num_gpus_per_env_runner) but the Ray "
                          f"cluster has {have_gpu:g}: ask for {have_gpu:g} or fewer")


def _take_site_keys(config_class: type, config: dict[str, Any]) -> dict[str, Any]:
    """Take the site keys (:data:`~herdrl.site_keys.SITE_KEYS`: ``address``, ``runtime_env``, ...) out of a sweep's
    config and return them. They are the whole sweep's, for the driver's ``ray.init``, not a trial's parameters:
    kept out of the param space, Tune never writes them (``params.json``, ``params.pkl``, ``result.json``, its
    experiment state) nor hands them to its logger callbacks (MLflow, W&B)."""
    from ray.tune.search.sample import Domain

    from herdrl.site_keys import SITE_KEYS

    site = {}
    for key in [k for k in config if k != "framework" and config_class.canonical_key(k) in SITE_KEYS]:
        value = config.pop(key)
        if isinstance(value, Domain) or (isinstance(value, Mapping) and "grid_search" in value):
            raise ConfigError(f"'{key}' cannot be searched: it is the whole sweep's (where and how Ray runs), not "
                              "a trial's; give one value")
        site[config_class.canonical_key(key)] = value
    return site


def _check_keys(config_class: type, config: Mapping[str, Any]) -> None:
    """Fail before any trial starts on keys the algorithm does not have."""
    for key, value in config.items():
        if key == "framework":
            config_class().framework(value)
        else:
            config_class.canonical_key(key)


def run(algorithm: str, *, config: Mapping[str, Any], stop: Mapping[str, Any] | Callable | None = None,
        name: str | None = None, num_samples: int = 1, storage_path: str | os.PathLike | None = None,
        checkpoint_freq: int = 10, checkpoint_at_end: bool = True, keep_checkpoints_num: int | None = None,
        metric: str = "episode_return_mean", mode: str = "max", scheduler: Any = None, resume: bool | str = False,
        verbose: int = 1, max_concurrent_trials: int | None = None, address: str | None = None,
        mlflow: str | None = None, wandb: str | None = None, _ray_configs: tuple[Any, Any] | None = None
        ) -> TuneAnalysis:
    """Run ``num_samples`` trials of ``algorithm`` per point of ``config``'s search space on Ray Tune.

    ``stop``: a dict of result keys (``training_iteration``, ``num_env_steps_sampled_lifetime``,
    ``episode_return_mean``, ``time_total_s``; older names such as ``timesteps_total`` work) or a callable
    ``(trial_id, result) -> bool``. ``scheduler``: ``"asha"``, ``"pbt"``, a dict with ``type`` and options,
    or a Ray Tune scheduler. Results go to ``<storage_path>/<name>/<trial>/`` (default ``results/<name>``).
    ``resume``: True continues the sweep ``name`` (Tune's restore); ``"if_any"`` continues it if it exists, else
    starts it (a batch job that may run again).

    At SIGUSR1 (a batch job's walltime is near), ``HERD_STOP_AT`` or SIGTERM, every running trial checkpoints its
    last result and the sweep stops (:mod:`herdrl.tune_stop`); the returned analysis then names why
    (``stop_reason``) and how many trials ``resume=True`` will continue (``num_unfinished``).

    The site keys of ``config`` (``runtime_env``, ``address``, ...) go to this driver's ``ray.init`` (a runtime_env then
    reaches every trial), never into Tune's param space: no file of the sweep and no tracker holds them.

    ``mlflow`` (a tracking URI) and ``wandb`` (a project): Tune's own logger callbacks, one tracker run per trial in
    an experiment (W&B: a group) named as the sweep.

    ``_ray_configs``: :class:`Tuner`'s ``(TuneConfig, RunConfig)``, whose other settings (``search_alg``,
    ``time_budget_s``, ``failure_config``, callbacks, checkpoint scores, ...) the sweep keeps.
    """
    from ray import tune

    from herdrl.experiment import normalize_stop
    from herdrl.registry import get_config_class

    if mlflow or wandb:
        from herdrl.trackers import check_installed

        check_installed(mlflow=mlflow, wandb=wandb)
    if resume not in (True, False, "if_any"):
        raise ConfigError(f"resume got {resume!r}; expected True, False or 'if_any'")
    config_class = get_config_class(algorithm)
    config = dict(config)
    _check_keys(config_class, config)
    site = _take_site_keys(config_class, config)  # the driver's: Tune never holds them (nor writes them to disk)
    metric = flat_name(metric)  # RLlib's names (episode_reward_mean, env_runners/episode_return_mean) work
    if num_samples < 1:
        raise ConfigError(f"num_samples got {num_samples}; expected >= 1")
    stop_criteria = stop if callable(stop) else normalize_stop(stop)
    config = _decay_over_step_limit(config_class, config, stop_criteria)
    env = config.get("env")
    name = name or (str(env).replace("/", "_") if isinstance(env, str) else config_class.algo_name)
    storage = Path(storage_path or "results").resolve()
    owns, trainable = _connect(config_class, config, site, address)
    resume = _resumes(storage / name, resume, owns)
    if not resume:  # (a resumed sweep's param space holds the counts chosen when it began)
        try:
            config = _size_trials(config_class, config, storage / name, num_samples, max_concurrent_trials, verbose)
        except BaseException:
            if owns:
                from herdrl.cluster import disconnect

                disconnect()
            raise
    if resume:
        tuner = tune.Tuner.restore(str(storage / name), trainable, resume_errored=True)
    else:
        tuner = _new_tuner(trainable, config, storage, name, stop_criteria, ray_configs=_ray_configs,
                           checkpoint_freq=checkpoint_freq, checkpoint_at_end=checkpoint_at_end,
                           keep_checkpoints_num=keep_checkpoints_num, num_samples=num_samples, scheduler=scheduler,
                           metric=metric, mode=mode, max_concurrent_trials=max_concurrent_trials, verbose=verbose,
                           mlflow=mlflow, wandb=wandb)
    if verbose:
        print(f"Results, checkpoints and TensorBoard files: {storage / name} (tensorboard --logdir {storage / name})")
    return _fit(tuner, resume, metric, mode)


def _decay_over_step_limit(config_class: type, config: dict[str, Any], stop: Mapping[str, Any] | Callable
                           ) -> dict[str, Any]:
    """``config`` with its named schedules without steps decaying over the sweep's step limit, as in `herd train`
    (unchanged without one)."""
    steps = None if callable(stop) else stop.get("num_env_steps_sampled_lifetime")
    if not steps:
        return config
    from herdrl.env.multi_agent import is_pettingzoo_id

    multi_agent = config_class.supports_multi_agent and (config.get("policies") is not None
                                                         or is_pettingzoo_id(config.get("env")))
    return config_class.decay_values_over(config, int(steps), multi_agent=multi_agent)


def _connect(config_class: type, config: Mapping[str, Any], site: dict[str, Any], address: str | None
             ) -> tuple[bool, type]:
    """Connect to Ray (a private one sized to this machine's CPUs, or the cluster named) and check the sweep's
    largest trial fits it; whether this call started Ray (to stop it on failure), and the Tune trainable."""
    from herdrl.cluster import connect, disconnect

    # The job's runtime_env reaches every trial (Ray gives it to all the job's actors): its env_vars, credentials
    # included, never pass through Tune's param space, trial configs or experiment files.
    where = config_class().resources(**{**site, "address": address or site.get("address")})
    if not sys.stdout.isatty():  # a log file or CI: Ray's colour codes would stay in it as raw escapes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    owns = connect(where)
    trainable = _trainable(config_class.algo_name)
    try:
        _check_fits(trainable, config_class, config)
    except HerdError:  # (ClusterError too: a runner no node can hold)
        if owns:
            disconnect()
        raise
    return owns, trainable


def _size_trials(config_class: type, config: dict[str, Any], sweep_dir: Path, num_samples: int,
                 max_concurrent: int | None, verbose: int) -> dict[str, Any]:
    """``config`` with ``"auto"`` runner and env counts chosen for every trial, each sized to its share of the
    cluster (1 / the trials that run at once), from costs measured once on the sweep's first point (a search over
    learning rates does not change what a step costs); the record kept as ``sizing.json`` in the sweep's folder."""
    import ray

    from herdrl.auto_size import AUTO_KEYS, size_run, write_record

    keys = {config_class.canonical_key(key): key for key in config}
    auto = [key for key in AUTO_KEYS if config.get(keys.get(key, key)) == "auto"]
    if not auto:
        return config
    grids = [len(value["grid_search"]) for value in _walk_values(config)
             if isinstance(value, Mapping) and "grid_search" in value]
    trials = num_samples * math.prod(grids)
    # the trials that run at once: all of them, or max_concurrent_trials, but no more than have a CPU for their
    # driver and one for a runner each (a share smaller than that sizes nothing)
    fit = max(1, int(ray.cluster_resources().get("CPU", 1.0) // 2))
    share = 1.0 / max(1, min(trials, max_concurrent or trials, fit))
    first = config_class.from_dict(_first_point(config))
    echo = print if verbose else (lambda line: None)
    # (no aggregators: the trials take the chosen runner and env counts only)
    sized, record = size_run(first, share=share, echo=echo, aggregators=False)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    write_record(sweep_dir, {**record, "trials_at_once": round(1 / share)})
    return {**config, **{keys.get(key, key): getattr(sized, key) for key in auto}}


def _walk_values(value: Any) -> list[Any]:
    """Every value of a (nested) config, search-space entries included."""
    if isinstance(value, Mapping) and "grid_search" not in value:
        return [inner for item in value.values() for inner in [item, *_walk_values(item)]]
    return []


def _first_point(value: Any) -> Any:
    """A search space's first grid point, a sampled value where it samples."""
    if isinstance(value, Mapping):
        return value["grid_search"][0] if "grid_search" in value else {k: _first_point(v) for k, v in value.items()}
    sample = getattr(value, "sample", None)
    return sample() if callable(sample) else value


def _resumes(path: Path, resume: bool | str, owns: bool) -> bool:
    """Whether the sweep at ``path`` is continued (``"if_any"``: when it exists); a ConfigError (Ray stopped first
    if this call started it) when ``resume`` asks for one that does not exist."""
    from ray import tune

    from herdrl.cluster import disconnect

    exists = tune.Tuner.can_restore(str(path))
    if resume == "if_any":
        resume = exists
    if resume and not exists:
        if owns:
            disconnect()
        raise ConfigError(f"no sweep to resume in {path}: start it without --resume (or check --name and --output)")
    return bool(resume)


def _new_tuner(trainable: type, config: dict[str, Any], storage: Path, name: str, stop: Any, *,
               ray_configs: tuple[Any, Any] | None, checkpoint_freq: int, checkpoint_at_end: bool,
               keep_checkpoints_num: int | None, num_samples: int, scheduler: Any, metric: str, mode: str,
               max_concurrent_trials: int | None, verbose: int, mlflow: str | None, wandb: str | None) -> Any:
    """A new sweep's Tuner (results in ``storage/name``): :func:`run`'s settings over those of :class:`Tuner`'s
    own configs (``ray_configs``), with herdrl's logger callbacks (CSV, JSON, TensorBoard, trackers) and its
    walltime stop."""
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    from herdrl import tune_stop
    from herdrl.trackers import tune_callbacks

    own_tune, own_run = ray_configs or (tune.TuneConfig(), tune.RunConfig())
    checkpoints = dataclasses.replace(
        own_run.checkpoint_config or tune.CheckpointConfig(), checkpoint_frequency=checkpoint_freq,
        checkpoint_at_end=checkpoint_at_end, num_to_keep=keep_checkpoints_num)
    if checkpoints.checkpoint_score_attribute:  # RLlib's names: the key the rows hold
        checkpoints.checkpoint_score_attribute = flat_name(checkpoints.checkpoint_score_attribute)
    callbacks = [CSVLoggerCallback(), JsonLoggerCallback(), _tensorboard_callback(), _repeat_warning_callback(),
                 tune_stop.WalltimeStop(), *tune_callbacks(name, mlflow=mlflow, wandb=wandb),
                 *(own_run.callbacks or [])]
    return tune.Tuner(
        trainable, param_space=config,
        tune_config=dataclasses.replace(own_tune, num_samples=num_samples, scheduler=make_scheduler(scheduler),
                                        metric=metric, mode=mode, max_concurrent_trials=max_concurrent_trials),
        run_config=dataclasses.replace(own_run, name=name, storage_path=str(storage), stop=stop,
                                       checkpoint_config=checkpoints, verbose=verbose, callbacks=callbacks),
    )


def _fit(tuner: Any, resumed: bool, metric: str, mode: str) -> TuneAnalysis:
    """Run the sweep, its signal handlers, Tune's log level and its logger setting put back after; the analysis
    says why a stopped sweep stopped and how many trials a resume will continue."""
    from herdrl import tune_stop

    # Our TensorBoard callback replaces Tune's, which Tune would add back (and point its hint into Ray's
    # temporary folder); CSV and JSON are given explicitly in _new_tuner.
    previous = os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS")
    if not resumed:  # a restored experiment keeps the loggers it was started with (older ones: Tune's)
        os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    tune_stop.CURRENT = None
    handlers = _signal_handlers()
    tune_log = logging.getLogger("ray.tune.tune")
    tune_log_level = tune_log.level
    try:
        grid = tuner.fit()
        stopper = tune_stop.CURRENT  # None for a sweep started before herdrl 0.4: Tune's own interrupt only
        if stopper is None:
            return TuneAnalysis(grid, metric, mode)
        unfinished = stopper.unfinished
        if unfinished is None:  # stopped before Tune's first step: every trial is still to run
            unfinished = list(range(len(grid))) if stopper.reason else []
        return TuneAnalysis(grid, metric, mode, stop_reason=stopper.reason, stop_signal=stopper.signum,
                            num_unfinished=len(unfinished))
    finally:
        _restore_signal_handlers(handlers)
        tune_log.setLevel(tune_log_level)
        if previous is None:
            os.environ.pop("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", None)
        else:
            os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = previous


def _signal_handlers() -> dict[int, Any]:
    """The handlers of the signals a sweep takes over (Tune: SIGINT, SIGUSR1; :mod:`herdrl.tune_stop`: SIGTERM)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}


def _restore_signal_handlers(handlers: dict[int, Any]) -> None:
    """Put back what :func:`_signal_handlers` saw."""
    import signal

    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


def _search_value(value: Any) -> Any:
    """A YAML search-space tag (``{grid_search: [...]}``, ``{choice: [...]}``, ``{uniform: [a, b]}``,
    ``{loguniform: [a, b]}``) -> the Ray Tune object; other values unchanged (nested dicts walked)."""
    if isinstance(value, Mapping):
        if len(value) == 1:
            (tag, arg), = value.items()
            makers = {"grid_search": grid_search, "choice": choice, "uniform": uniform, "loguniform": loguniform}
            if tag in makers:
                if tag in ("uniform", "loguniform"):
                    if not (isinstance(arg, list) and len(arg) == 2):
                        raise ConfigError(f"'{tag}' expects [low, high], got {arg!r}")
                    return makers[tag](*arg)
                if not isinstance(arg, list) or not arg:
                    raise ConfigError(f"'{tag}' expects a non-empty list, got {arg!r}")
                return makers[tag](arg)
        return {k: _search_value(v) for k, v in value.items()}
    return value


def search_space(config: Mapping[str, Any]) -> dict[str, Any]:
    """Turn a YAML config with search-space tags into a Ray Tune ``param_space``."""
    return {k: _search_value(v) for k, v in config.items()}
