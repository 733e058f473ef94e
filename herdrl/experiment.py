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

from herdrl.config import AlgorithmConfig
from herdrl.env import env_reward_threshold
from herdrl.errors import ConfigError, did_you_mean
from herdrl.logger import ConsoleReporter, Logger

#: Env steps after which a run with no stop criterion of the user's gives up on "solved".
DEFAULT_STEP_BUDGET = 1_000_000

#: Stop keys (a run stops when ``result[key] >= value``) and the older names that mean them.
STOP_KEYS = ("training_iteration", "num_env_steps_sampled_lifetime", "episode_return_mean", "time_total_s")
STOP_ALIASES = {
    "timesteps_total": "num_env_steps_sampled_lifetime",
    "num_env_steps_sampled": "num_env_steps_sampled_lifetime",
    "episode_reward_mean": "episode_return_mean",
    "env_runners/episode_return_mean": "episode_return_mean",
}


def normalize_stop(stop: Mapping[str, Any] | None) -> dict[str, float]:
    """Map stop keys to herdrl's names and check their values."""
    out: dict[str, float] = {}
    for key, value in (stop or {}).items():
        name = STOP_ALIASES.get(key, key)
        if name not in STOP_KEYS:
            raise ConfigError(f"unknown stop key '{key}'{did_you_mean(key, STOP_KEYS)}; known: {list(STOP_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ConfigError(f"stop key '{key}' got {value!r}; expected a number")
        out[name] = value
    return out


@dataclass
class Outcome:
    """How a run ended: its last result row, which criterion stopped it, and where its files are."""

    result: dict[str, Any]
    stopped_by: str  # a stop key, "solved", "budget" or "interrupted"
    solved: bool | None  # None when no reward threshold applies
    logdir: Path


def trial_name(config: AlgorithmConfig) -> str:
    """``<ALGO>_<env>_<seed>_<timestamp>`` (DESIGN.md, Definitions)."""
    env = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(config.env))
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    return f"{config.algo_name}_{env}_{config.seed}_{stamp}"


def _unique_dir(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}_{n}")
    return candidate


def run_experiment(config: AlgorithmConfig, *, stop: Mapping[str, Any] | None = None,
                   output: str | Path = "results", name: str | None = None, trial: str | None = None,
                   quiet: bool = False, tensorboard: bool = True, budget: int | None = None) -> Outcome:
    """Build the algorithm, train until a stop criterion holds, and return the outcome.

    With no ``stop``, the run stops when ``episode_return_mean`` reaches the env's
    ``reward_threshold`` ("solved") or after ``budget`` env steps (default ``DEFAULT_STEP_BUDGET``).
    """
    config.validate()
    criteria = normalize_stop(stop)
    threshold = env_reward_threshold(config.env) if not callable(config.env) else None
    default_stop = not criteria
    if default_stop:
        if threshold is not None:
            criteria["episode_return_mean"] = threshold
        criteria["num_env_steps_sampled_lifetime"] = budget or DEFAULT_STEP_BUDGET
    experiment = name or re.sub(r"[^A-Za-z0-9_.-]+", "_", str(config.env))
    logdir = Path(output) / experiment / (trial or trial_name(config))
    if trial is None:
        logdir = _unique_dir(logdir)
    console = None if quiet else ConsoleReporter(target=criteria.get("episode_return_mean"))
    if console and config.num_env_runners > 0:
        where = config.address or os.environ.get("RAY_ADDRESS") or "a private Ray on this machine"
        console.message(f"starting {config.num_env_runners} env runner(s) on {where} ...")
    algo = config.build()  # before any file is written: bad input leaves no empty trial dir
    params = {"algorithm": config.algo_name, **config.to_dict()}
    algo.logger = Logger(logdir, params, console=console, tensorboard=tensorboard)
    if console:
        stops = ", ".join(f"{k} >= {v:g}" for k, v in criteria.items())
        console.message(f"{config.algo_name} on {config.env}: results in {logdir}; stops at {stops}")
    result: dict[str, Any] = {}
    stopped_by = "interrupted"
    try:
        while True:
            result = algo.train()
            met = [k for k, v in criteria.items() if result.get(k, -math.inf) >= v]
            if met:
                stopped_by = met[0]
                break
    except KeyboardInterrupt:
        if console:
            console.message("interrupted: stopping")
    finally:
        algo.stop()
    solved = None
    if threshold is not None and result:
        solved = result["episode_return_mean"] >= threshold
    if default_stop and stopped_by == "episode_return_mean":
        stopped_by = "solved"
    elif default_stop and stopped_by == "num_env_steps_sampled_lifetime":
        stopped_by = "budget"
    return Outcome(result=result, stopped_by=stopped_by, solved=solved, logdir=logdir)


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
        raise ConfigError(f"{source}: invalid YAML: {str(exc).splitlines()[0]}") from None


EXPERIMENT_KEYS = ("run", "algorithm", "env", "stop", "config", "name")


def load_experiment_file(path: str | Path) -> dict[str, Any]:
    """Read an experiment YAML in RLlib's tuned-example shape or with the same keys at top level.

    Returns a dict with ``algorithm``, ``env``, ``stop``, ``config`` and ``name`` (any may be None)::

        cartpole-ppo:              # or the same keys without this level
          run: PPO                 # `algorithm:` is an alias
          env: CartPole-v1
          stop: {episode_return_mean: 475}
          config: {lr: 1e-3, num_env_runners: 0}
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
    unknown = [k for k in data if k not in EXPERIMENT_KEYS]
    if unknown:
        key = unknown[0]
        raise ConfigError(f"{path}: unknown key '{key}'{did_you_mean(key, EXPERIMENT_KEYS)}; "
                          f"known: {list(EXPERIMENT_KEYS)}")
    if "run" in data and "algorithm" in data and data["run"] != data["algorithm"]:
        raise ConfigError(f"{path}: 'run' and 'algorithm' disagree ({data['run']} vs {data['algorithm']})")
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: 'config' must be a mapping")
    stop = data.get("stop") or {}
    if not isinstance(stop, dict):
        raise ConfigError(f"{path}: 'stop' must be a mapping")
    return {"algorithm": data.get("algorithm", data.get("run")), "env": data.get("env"),
            "stop": stop, "config": dict(config), "name": data.get("name", name)}
