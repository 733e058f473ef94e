"""Callbacks: your code at points of a run, with RLlib's class and hook names (new stack and old).

    from herdrl import RLlibCallback

    class LoggingCallback(RLlibCallback):
        def on_episode_end(self, *, episode, metrics_logger, **kwargs):
            metrics_logger.log_value("pole_angle_end", episode.get_observations(-1)[2], reduce="mean", window=100)

    config = PPOConfig().environment("CartPole-v1").callbacks(LoggingCallback)

Set with ``config.callbacks(MyCallbacks)`` (a class, or a list of them), ``config.callbacks(on_train_result=fn)``
(functions per hook), or in a YAML file ``callbacks: mymodule:MyCallbacks`` (``mymodule`` must be imported with
``--import`` or the file's ``imports:`` list: a file never decides what code runs otherwise). Callbacks are never
saved in or read from a checkpoint: a resumed run takes the ones its command gives.

Where each hook runs: ``on_algorithm_init``, ``on_train_result`` (add keys to the row there), ``on_evaluate_start``,
``on_evaluate_end`` and ``on_checkpoint_loaded`` in the driver; ``on_environment_created``, ``on_sample_end`` and the
episode hooks (``on_episode_created``, ``on_episode_start``, ``on_episode_step``, ``on_episode_end``) in the runner
that steps the env, a Ray actor too (multi-agent runs: with a :class:`MultiAgentEpisode`). A hook takes keyword
arguments; both stacks' names are given (``env_runner`` and ``worker``, ``env`` and ``base_env``, ``rl_module`` and
``policies``), and a hook without ``**kwargs`` gets only the ones it names. Episode hooks cost a Python call per env
step, so the runner tracks episodes only when one of them is set. Episode hooks do not run in evaluation episodes.

Custom metrics: ``metrics_logger.log_value(key, value, reduce=..., window=...)`` from any hook (see
:class:`MetricsLogger`); the old stack's ``episode.custom_metrics[key] = value`` at episode end gives
``custom_metrics/<key>_mean``, ``_min`` and ``_max`` over the last 100 episodes, as RLlib's old stack reports them.
"""

from __future__ import annotations

import inspect
import math
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from herdrl.errors import ConfigError, HerdError

ALGORITHM_HOOKS = ("on_algorithm_init", "on_train_result", "on_evaluate_start", "on_evaluate_end",
                   "on_checkpoint_loaded")
RUNNER_HOOKS = ("on_environment_created", "on_sample_end")
EPISODE_HOOKS = ("on_episode_created", "on_episode_start", "on_episode_step", "on_episode_end")
HOOKS = ALGORITHM_HOOKS + RUNNER_HOOKS + EPISODE_HOOKS
#: Episodes RLlib's old stack reduces ``episode.custom_metrics`` over (its ``metrics_num_episodes_for_smoothing``).
CUSTOM_METRICS_WINDOW = 100


class CallbackError(HerdError):
    """A callback raised: named with its hook, the traceback under ``--debug``."""


class RLlibCallback:
    """Base class of callbacks, with RLlib's new-stack hook names; override the hooks you need (every one here does
    nothing). Hooks are called with keyword arguments only."""

    def on_algorithm_init(self, *, algorithm: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
        """The algorithm is built (runners and learners started), before its first iteration."""

    def on_environment_created(self, *, env_runner: Any, metrics_logger: Any = None, env: Any, env_context: Any,
                               **kwargs: Any) -> None:
        """A runner made its vector env (``env_context``: the ``env_config`` dict, with ``worker_index``)."""

    def on_episode_created(self, *, episode: Any, env_runner: Any = None, metrics_logger: Any = None, env: Any = None,
                           env_index: int, rl_module: Any = None, **kwargs: Any) -> None:
        """An episode object exists for env copy ``env_index``, just before its start."""

    def on_episode_start(self, *, episode: Any, env_runner: Any = None, metrics_logger: Any = None, env: Any = None,
                         env_index: int, rl_module: Any = None, **kwargs: Any) -> None:
        """An episode began: ``episode`` holds its first observation and info."""

    def on_episode_step(self, *, episode: Any, env_runner: Any = None, metrics_logger: Any = None, env: Any = None,
                        env_index: int, rl_module: Any = None, **kwargs: Any) -> None:
        """One env step of an episode is in ``episode`` (the last observation, action, reward, info)."""

    def on_episode_end(self, *, episode: Any, env_runner: Any = None, metrics_logger: Any = None, env: Any = None,
                       env_index: int, rl_module: Any = None, **kwargs: Any) -> None:
        """An episode ended (terminated or truncated); its whole data is in ``episode``."""

    def on_sample_end(self, *, env_runner: Any = None, metrics_logger: Any = None, samples: Any, **kwargs: Any) -> None:
        """A runner sampled a fragment (``samples``: a list with the one :class:`~herdrl.rollout.runner.Fragment`)."""

    def on_train_result(self, *, algorithm: Any, metrics_logger: Any = None, result: dict, **kwargs: Any) -> None:
        """An iteration ended: ``result`` is its row, before it is logged (keys set here are logged too, nested ones
        such as ``result["custom_metrics"]["x"]`` as ``custom_metrics/x``)."""

    def on_evaluate_start(self, *, algorithm: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
        """A periodic (or ``herd evaluate``) evaluation is about to play."""

    def on_evaluate_end(self, *, algorithm: Any, metrics_logger: Any = None, evaluation_metrics: dict,
                        **kwargs: Any) -> None:
        """An evaluation ended with ``evaluation_metrics`` (the ``evaluation/...`` keys)."""

    def on_checkpoint_loaded(self, *, algorithm: Any, **kwargs: Any) -> None:
        """A checkpoint was restored into ``algorithm`` (``--resume``, ``restore``, ``from_checkpoint``)."""


class DefaultCallbacks(RLlibCallback):
    """RLlib's old-stack base class: the same hooks, called with the old keyword names too (``worker``,
    ``base_env``, ``policies``, ``episode``, ``env_index``); ``episode.custom_metrics`` and ``episode.user_data``
    work as they did there."""


def _accepting(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called with only the keyword arguments it takes (all of them if it has ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: give it everything
        return fn
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn
    names = {p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)}
    return lambda **kwargs: fn(**{k: v for k, v in kwargs.items() if k in names})


def _overrides(klass: type, hook: str) -> bool:
    """Whether ``klass`` has its own ``hook`` (not the do-nothing one of :class:`RLlibCallback`)."""
    own = getattr(klass, hook, None)
    return callable(own) and own is not getattr(RLlibCallback, hook, None)


_UNSUPPORTED_SAID: set[str] = set()


def _say_unsupported(klass: type) -> None:
    """One warning per class for RLlib hooks it defines that herdrl never calls (e.g. ``on_learn_on_batch``)."""
    import logging

    other = sorted(name for base in klass.__mro__ if base not in (RLlibCallback, object)
                   for name, member in vars(base).items() if name.startswith("on_") and callable(member)
                   and name not in HOOKS)
    if other and klass.__qualname__ not in _UNSUPPORTED_SAID:
        _UNSUPPORTED_SAID.add(klass.__qualname__)
        logging.getLogger("herdrl").warning("herdrl: %s.%s %s never called here (herdrl calls: %s)", klass.__name__,
                                            ", ".join(dict.fromkeys(other)), "is" if len(other) == 1 else "are",
                                            ", ".join(HOOKS))


def hooks_of(config: Any) -> set[str]:
    """The hooks a config's callbacks set, found without making instances of its classes."""
    hooks = {hook for klass in ([] if config.callbacks_class is None else resolve_class(config.callbacks_class))
             for hook in HOOKS if _overrides(klass, hook)}
    return hooks | set(config.callbacks_hooks or {})


def resolve_class(value: Any) -> list[type]:
    """The callbacks classes a config names: a class, a list of them, or ``"module:Class"`` of an imported module."""
    from herdrl.env import imports

    classes = []
    for item in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(item, str):
            module, _, name = item.partition(":")
            if not name or not module:
                raise ConfigError(f"callbacks {item!r}: name it as module:Class (the module imported with --import)")
            if module not in imports.IMPORTED:
                raise ConfigError(f"callbacks {item!r} is in module '{module}', which was not imported: add "
                                  f"--import {module} (or list it under imports: in the file); a file alone never "
                                  "decides what code runs")
            import sys

            item = getattr(sys.modules[module], name, None)
            if item is None:
                raise ConfigError(f"callbacks: module '{module}' has no class '{name}'")
        if not isinstance(item, type):
            raise ConfigError(f"callbacks got {item!r}; expected a class (a subclass of herdrl.RLlibCallback), a list "
                              "of them, or 'module:Class'")
        if any(base.__module__.startswith("ray.rllib") for base in item.__mro__):
            raise ConfigError(f"callbacks class {item.__name__} derives from RLlib's own base class: import "
                              "RLlibCallback (or DefaultCallbacks) from herdrl instead")
        classes.append(item)
    return classes


def check_hooks(hooks: Mapping[str, Any]) -> None:
    """Refuse unknown hook names and values that are not callables (or lists of them)."""
    from herdrl.errors import did_you_mean

    for hook, fns in hooks.items():
        if hook not in HOOKS:
            raise ConfigError(f"unknown callback hook '{hook}'{did_you_mean(hook, HOOKS)}; hooks: {', '.join(HOOKS)}")
        if not all(callable(fn) for fn in (fns if isinstance(fns, (list, tuple)) else [fns])):
            raise ConfigError(f"callback hook '{hook}' got {fns!r}; expected a function (or a list of them)")


def callback_code(config: Any) -> list[Any]:
    """The classes and functions a config's callbacks run (what Ray runners must be shipped)."""
    code: list[Any] = [] if config.callbacks_class is None else resolve_class(config.callbacks_class)
    for fns in (config.callbacks_hooks or {}).values():
        code += list(fns) if isinstance(fns, (list, tuple)) else [fns]
    return code


class Callbacks:
    """The callbacks of a run, ready to call: :meth:`from_config` builds them (None when there are none)."""

    def __init__(self, handlers: dict[str, list[tuple[str, Callable[..., Any]]]]) -> None:
        self._handlers = handlers

    @classmethod
    def from_config(cls, config: Any) -> Callbacks | None:
        """The config's ``callbacks_class`` instances and ``callbacks_hooks`` functions; None if it has neither."""
        handlers: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        if config.callbacks_class is not None:
            for klass in resolve_class(config.callbacks_class):
                _say_unsupported(klass)
                instance = klass()
                for hook in HOOKS:
                    if _overrides(klass, hook):
                        handlers.setdefault(hook, []).append((f"{klass.__name__}.{hook}",
                                                              _accepting(getattr(instance, hook))))
        for hook, fns in (config.callbacks_hooks or {}).items():
            for fn in fns if isinstance(fns, (list, tuple)) else [fns]:
                handlers.setdefault(hook, []).append((getattr(fn, "__name__", hook), _accepting(fn)))
        return cls(handlers) if handlers else None

    def has(self, *hooks: str) -> bool:
        """Whether any of ``hooks`` is set."""
        return any(hook in self._handlers for hook in hooks)

    def __call__(self, hook: str, **kwargs: Any) -> None:
        """Call every handler of ``hook``; any exception (a bad ``log_value`` too) becomes one :class:`CallbackError`
        line, which ends the run without restarting a Ray runner (its replacement would fail the same way)."""
        for name, fn in self._handlers.get(hook, ()):
            try:
                fn(**kwargs)
            except CallbackError:
                raise
            except Exception as exc:
                raise CallbackError(f"callback {name} raised {type(exc).__name__}: {exc}") from exc


# ------------------------------------------------------------------------------------------ custom metrics
REDUCES = ("mean", "ema", "min", "max", "sum", "lifetime_sum")
_REDUCE_FNS = {"mean": np.mean, "min": np.min, "max": np.max, "sum": np.sum}


def metric_settings(reduce: str | None = None, window: int | float | None = None, ema_coeff: float | None = None,
                    clear_on_reduce: bool | None = None) -> tuple[str, int | None, float | None]:
    """``(reduce, window, ema_coeff)`` from RLlib's ``log_value`` arguments, old spellings mapped: no ``reduce``
    means ``mean`` with a window, ``ema`` without; ``mean`` with an ``ema_coeff`` (RLlib before 2.50) is ``ema``;
    ``sum`` with ``clear_on_reduce=False`` is ``lifetime_sum``; an infinite window is none."""
    if window is not None and (isinstance(window, float) and math.isinf(window)):
        window = None
    if reduce is None:
        reduce = "mean" if window is not None else "ema"
    if reduce == "mean" and ema_coeff is not None and window is None:
        reduce = "ema"
    if reduce == "sum" and clear_on_reduce is False:
        reduce = "lifetime_sum"
    if reduce not in REDUCES:
        raise ConfigError(f"log_value reduce={reduce!r}; expected one of {list(REDUCES)}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, float)) or window < 1
                               or window != int(window)):
        raise ConfigError(f"log_value window={window!r}; expected an int >= 1 (or None)")
    if window is not None and ema_coeff is not None:
        raise ConfigError(f"log_value takes a window or an ema_coeff, not both (window={window}, "
                          f"ema_coeff={ema_coeff})")
    if window is not None and reduce in ("ema", "lifetime_sum"):
        raise ConfigError(f"log_value reduce={reduce!r} takes no window (got window={window})")
    if reduce == "ema":
        ema_coeff = 0.01 if ema_coeff is None else ema_coeff
        if not 0 < ema_coeff <= 1:
            raise ConfigError(f"log_value ema_coeff={ema_coeff!r}; expected a number in (0, 1]")
    else:
        ema_coeff = None
    return reduce, None if window is None else int(window), ema_coeff


def _flat_key(key: str | tuple[str, ...]) -> str:
    if isinstance(key, tuple):
        key = "/".join(str(part) for part in key)
    if not isinstance(key, str) or not key:
        raise ConfigError(f"log_value key {key!r}; expected a non-empty string (or a tuple of strings)")
    return key


def _number(key: str, value: Any) -> float:
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:  # numpy scalars, one-element arrays and tensors
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"log_value('{key}', {value!r}): only numbers can be logged as metrics")
    return float(value)


class MetricsLogger:
    """What hooks log custom metrics with (RLlib's ``metrics_logger``). Values logged in runners are shipped with
    each fragment and reduced in the driver over every runner's values pooled (a true mean of all values, not a
    mean of each runner's means), into the result row as ``env_runners/<key>`` (read also as
    ``result["env_runners"][key]``); values logged in the driver (``on_train_result``, ...) go in as ``<key>``,
    refused if the row has that key already (herdrl's own, or one set by ``on_train_result``).

    ``reduce`` (RLlib's meanings, as of Ray 2.50):

    - ``"mean"`` with ``window=N``: the mean of the last N values, carried over iterations; without a window, the
      mean of this iteration's values (NaN if none).
    - ``"ema"`` (the default without ``reduce`` and ``window``): an exponential moving average, each value moving it
      by ``ema_coeff`` (default 0.01), carried over iterations.
    - ``"min"``, ``"max"``: over the last ``window`` values, or this iteration's.
    - ``"sum"``: this iteration's total (0 if none), or the last ``window`` values'; ``"lifetime_sum"`` (or ``sum``
      with ``clear_on_reduce=False``): the total since the run began.

    A key's settings are those of its first ``log_value``. Windows, averages and lifetime sums are saved with
    checkpoints, so a resumed run continues them.
    """

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix
        self._pending: dict[str, tuple[tuple[str, int | None, float | None], list[float]]] = {}

    def log_value(self, key: str | tuple[str, ...], value: Any, *, reduce: str | None = None,
                  window: int | float | None = None, ema_coeff: float | None = None,
                  clear_on_reduce: bool | None = None, **kwargs: Any) -> None:
        """Log one value under ``key`` (see the class docstring for ``reduce``, ``window``, ``ema_coeff``)."""
        flat = self._prefix + _flat_key(key)
        entry = self._pending.get(flat)
        if entry is None:
            entry = self._pending[flat] = (metric_settings(reduce, window, ema_coeff, clear_on_reduce), [])
        entry[1].append(_number(flat, value))

    def push(self, flat_key: str, settings: tuple[str, int | None, float | None], value: float) -> None:
        """Log ``value`` under ``flat_key`` as it is (no prefix) with ready ``settings``."""
        self._pending.setdefault(flat_key, (settings, []))[1].append(float(value))

    def log_dict(self, values: Mapping[str, Any], *, key: str | tuple[str, ...] | None = None,
                 **settings: Any) -> None:
        """Log every leaf of a (nested) dict, under ``key/`` if given (``reduce`` defaults to ``mean``, as RLlib's)."""
        settings.setdefault("reduce", "mean")
        prefix = () if key is None else (key if isinstance(key, tuple) else (key,))
        for name, value in values.items():
            if isinstance(value, Mapping):
                self.log_dict(value, key=(*prefix, name), **settings)
            else:
                self.log_value((*prefix, name), value, **settings)

    def peek(self, key: str | tuple[str, ...], default: Any = None) -> Any:
        """The values logged under ``key`` since they were last handed on (each fragment, each iteration), reduced
        as the key's settings say for one batch; ``default`` if there are none."""
        entry = self._pending.get(self._prefix + _flat_key(key))
        if not entry or not entry[1]:
            return default
        stat = _Stat(*entry[0])
        stat.extend(entry[1])
        return stat.reduce()

    def take(self) -> list[tuple[str, tuple[str, int | None, float | None], list[float]]]:
        """Hand on what was logged since the last ``take``: ``[(key, settings, values), ...]``."""
        taken = [(key, settings, values) for key, (settings, values) in self._pending.items() if values]
        self._pending = {}
        return taken


class _Stat:
    """One metric's reduction state in the driver."""

    def __init__(self, reduce: str, window: int | None, ema_coeff: float | None) -> None:
        self.settings = (reduce, window, ema_coeff)
        self.values: deque[float] | list[float] = deque(maxlen=window) if window else []
        self.ema: float | None = None
        self.total = 0.0

    def extend(self, values: Iterable[float]) -> None:
        reduce, _, coeff = self.settings
        for value in values:
            if reduce == "ema":
                self.ema = value if self.ema is None else (1.0 - coeff) * self.ema + coeff * value
            elif reduce == "lifetime_sum":
                self.total += value
            else:
                self.values.append(value)

    def reduce(self) -> float:
        reduce, window, _ = self.settings
        if reduce == "ema":
            return math.nan if self.ema is None else self.ema
        if reduce == "lifetime_sum":
            return self.total
        values = list(self.values)
        if not window:
            self.values = []  # per iteration
        if not values:
            return 0.0 if reduce == "sum" else math.nan
        return float(_REDUCE_FNS[reduce](values))

    def state(self) -> dict[str, Any]:
        return {"settings": list(self.settings), "values": list(self.values) if self.settings[1] else [],
                "ema": self.ema, "total": self.total}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> _Stat:
        reduce, window, coeff = state["settings"]
        stat = cls(*metric_settings(reduce, window, coeff))
        if stat.settings[1]:
            stat.values.extend(float(v) for v in state.get("values", []))
        stat.ema = None if state.get("ema") is None else float(state["ema"])
        stat.total = float(state.get("total", 0.0))
        return stat


class MetricsReducer:
    """The driver's reduction of custom metrics over runners and iterations."""

    def __init__(self) -> None:
        self._stats: dict[str, _Stat] = {}

    def add(self, taken: Iterable[tuple[str, Any, list[float]]]) -> None:
        """Take in what a :meth:`MetricsLogger.take` handed on."""
        for key, settings, values in taken:
            stat = self._stats.get(key)
            if stat is None:
                stat = self._stats[key] = _Stat(*settings)
            stat.extend(values)

    def reduce(self) -> dict[str, float]:
        """This iteration's value of every metric logged so far in the run."""
        return {key: stat.reduce() for key, stat in self._stats.items()}

    def state(self) -> dict[str, Any]:
        """Plain data for a checkpoint's JSON."""
        return {key: stat.state() for key, stat in self._stats.items()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state` (metrics whose saved state cannot be read are started afresh)."""
        self._stats = {}
        for key, saved in (state or {}).items():
            try:
                self._stats[key] = _Stat.from_state(saved)
            except (ConfigError, KeyError, TypeError, ValueError):
                continue


# ----------------------------------------------------------------------------------------------- episodes
def _pick(items: list[Any], indices: int | slice | list[int] | None, stack: bool) -> Any:
    if isinstance(indices, (int, np.integer)):
        return items[indices]
    chosen = items if indices is None else items[indices] if isinstance(indices, slice) else [items[i]
                                                                                              for i in indices]
    if stack and chosen and not isinstance(chosen[0], dict):
        return np.asarray(chosen)
    return list(chosen)


class Episode:
    """One env copy's episode as callbacks see it: RLlib's ``SingleAgentEpisode`` calls (``len(episode)``,
    ``get_return()``, ``get_observations(-1)``, ``get_infos()``, ``custom_data``) and the old stack's ``Episode``
    ones (``length``, ``total_reward``, ``last_info_for()``, ``custom_metrics``, ``user_data``).

    It holds every observation, action, reward and info of the episode (raw, as the env gave them), one more
    observation and info than steps (the reset's).
    """

    def __init__(self, env_index: int) -> None:
        self.id_ = uuid.uuid4().hex
        self.env_index = env_index
        self._observations: list[Any] = []
        self._infos: list[dict] = []
        self._actions: list[Any] = []
        self._rewards: list[float] = []
        self.is_terminated = False
        self.is_truncated = False
        self.custom_data: dict[str, Any] = {}  # RLlib's new stack
        self.custom_metrics: dict[str, float] = {}  # RLlib's old stack: reduced at the episode's end
        self.user_data: dict[str, Any] = {}
        self.hist_data: dict[str, list[float]] = {}  # accepted; not reported

    def begin(self, observation: Any, info: dict) -> None:
        """The reset's observation and info."""
        self._observations.append(observation)
        self._infos.append(info)

    def add_env_step(self, observation: Any, action: Any, reward: float, info: dict, terminated: bool,
                     truncated: bool) -> None:
        """Append one step."""
        self._observations.append(observation)
        self._actions.append(action)
        self._rewards.append(reward)
        self._infos.append(info)
        self.is_terminated, self.is_truncated = terminated, truncated

    def __len__(self) -> int:
        return len(self._rewards)

    @property
    def t(self) -> int:
        """Steps so far."""
        return len(self._rewards)

    @property
    def is_done(self) -> bool:
        """Terminated or truncated."""
        return self.is_terminated or self.is_truncated

    def env_steps(self) -> int:
        """Steps so far."""
        return len(self._rewards)

    def get_return(self) -> float:
        """The sum of rewards so far (raw: before Atari's clipping or reward normalisation)."""
        return float(sum(self._rewards))

    def get_observations(self, indices: int | slice | list[int] | None = None) -> Any:
        """All observations (None), one (``-1``: the latest), or a slice / list of them (stacked as an array)."""
        return _pick(self._observations, indices, stack=True)

    def get_actions(self, indices: int | slice | list[int] | None = None) -> Any:
        """Actions, as :meth:`get_observations` picks them (in the runner's stored layout)."""
        return _pick(self._actions, indices, stack=True)

    def get_rewards(self, indices: int | slice | list[int] | None = None) -> Any:
        """Rewards, as :meth:`get_observations` picks them."""
        return _pick(self._rewards, indices, stack=True)

    def get_infos(self, indices: int | slice | list[int] | None = None) -> Any:
        """Info dicts (the reset's first), as :meth:`get_observations` picks them."""
        return _pick(self._infos, indices, stack=False)

    # RLlib's old stack
    @property
    def episode_id(self) -> str:
        """The episode's id (``id_``)."""
        return self.id_

    @property
    def length(self) -> int:
        """Steps so far."""
        return len(self._rewards)

    @property
    def total_reward(self) -> float:
        """The sum of rewards so far."""
        return self.get_return()

    def last_observation_for(self, agent_id: Any = None) -> Any:
        """The latest observation."""
        return self._observations[-1]

    def last_info_for(self, agent_id: Any = None) -> dict:
        """The latest info dict."""
        return self._infos[-1]

    def last_action_for(self, agent_id: Any = None) -> Any:
        """The latest action (None before the first step)."""
        return self._actions[-1] if self._actions else None

    def last_reward_for(self, agent_id: Any = None) -> float:
        """The latest reward (0 before the first step)."""
        return self._rewards[-1] if self._rewards else 0.0


def env_info(info: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Env copy ``index``'s own info dict out of a vector env's (arrays with ``_key`` masks, nested dicts alike)."""
    own = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is not None and not mask[index]:
            continue
        own[key] = env_info(value, index) if isinstance(value, Mapping) else value[index]
    return own


class _Tracker:
    """What both episode trackers share: the runner, its callbacks and metrics logger, and the hook call."""

    def __init__(self, runner: Any, callbacks: Callbacks, metrics: MetricsLogger) -> None:
        self.runner = runner
        self.callbacks = callbacks
        self.metrics = metrics
        self.episodes: dict[int, Any] = {}

    def _env_and_policies(self, episode: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def _call(self, hook: str, episode: Any) -> None:
        runner = self.runner
        env, policies = self._env_and_policies(episode)
        self.callbacks(hook, episode=episode, env_runner=runner, worker=runner, metrics_logger=self.metrics, env=env,
                       base_env=env, env_index=episode.env_index, rl_module=runner.module, policies=policies)


class EpisodeTracker(_Tracker):
    """A runner's episodes, one per env copy, fed step by step and handed to the episode hooks. Made only when an
    episode hook is set: without one a runner makes no per-step call for callbacks."""

    def _env_and_policies(self, episode: Episode) -> tuple[Any, Any]:
        return self.runner.env, {"default_policy": self.runner.policy}

    def create(self, env_index: int) -> None:
        """Env copy ``env_index`` is about to reset (RLlib calls ``on_episode_created`` before the reset, so a hook
        can set the env up for the episode)."""
        self.episodes[env_index] = Episode(env_index)
        self._call("on_episode_created", self.episodes[env_index])

    def create_all(self) -> None:
        """Every env copy is about to reset."""
        for index in range(self.runner.num_envs):
            self.create(index)

    def start(self, env_index: int, observation: Any, info: dict) -> None:
        """Env copy ``env_index`` began an episode."""
        episode = self.episodes[env_index]
        episode.begin(observation, info)
        self._call("on_episode_start", episode)

    def start_all(self, observations: Any, info: Mapping[str, Any]) -> None:
        """Every env copy was reset."""
        for index in range(self.runner.num_envs):
            self.start(index, _row(observations, index), _own_info(info, index))

    def step(self, env_indices: np.ndarray, observations: Any, actions: np.ndarray, rewards: np.ndarray,
             terminateds: np.ndarray, truncateds: np.ndarray, info: Mapping[str, Any], reset_only: np.ndarray) -> None:
        """One vector step of the env copies ``env_indices`` (the arrays hold their rows, in that order)."""
        for row, index in enumerate(env_indices):
            observation, own_info = _row(observations, row), _own_info(info, row)
            if reset_only[row]:  # the step after an episode's end only reset this copy: the next episode begins
                self.start(int(index), observation, own_info)
                continue
            episode = self.episodes[int(index)]
            episode.add_env_step(observation, np.array(actions[row]), float(rewards[row]), own_info,
                                 bool(terminateds[row]), bool(truncateds[row]))
            self._call("on_episode_step", episode)
            if episode.is_done:
                self._call("on_episode_end", episode)
                push_custom_metrics(self.metrics, episode.custom_metrics)
                self.create(int(index))  # the next step only resets this copy: the next episode begins there


def _own_info(info: Mapping[str, Any], index: int) -> dict[str, Any]:
    """:func:`env_info` for the episode hooks: an info the env gave that cannot be split per copy is a
    :class:`CallbackError` (one line, and no Ray runner restarted for it)."""
    try:
        return env_info(info, index)
    except Exception as exc:
        raise CallbackError(f"episode callbacks: the env's info dict cannot be split per env copy "
                            f"({type(exc).__name__}: {exc})") from exc


def runner_callbacks(runner: Any, tracker_class: type, env: Any) -> tuple[Callbacks | None, MetricsLogger, Any]:
    """A runner's callbacks (None without any), its metrics logger and, only when an episode hook is set, its
    episode tracker (``tracker_class``: a Python call per env step); calls ``on_environment_created`` with ``env``."""
    callbacks = Callbacks.from_config(runner.config)
    metrics = MetricsLogger(prefix="env_runners/")
    tracker = tracker_class(runner, callbacks, metrics) if callbacks is not None and callbacks.has(*EPISODE_HOOKS) \
        else None
    if callbacks is not None:
        callbacks("on_environment_created", env_runner=runner, worker=runner, metrics_logger=metrics, env=env,
                  env_context={**runner.config.env_config, "worker_index": runner.worker_index})
    return callbacks, metrics, tracker


def push_custom_metrics(metrics: MetricsLogger, custom: Mapping[str, Any]) -> None:
    """The old stack's ``episode.custom_metrics`` at an episode's end: ``custom_metrics/<key>_mean``, ``_min`` and
    ``_max`` over the last :data:`CUSTOM_METRICS_WINDOW` episodes."""
    for key, value in custom.items():
        try:
            value = _number(key, value)
        except ConfigError as exc:
            raise CallbackError(f"episode.custom_metrics[{key!r}]: {exc}") from None
        for stat in ("mean", "min", "max"):
            metrics.push(f"custom_metrics/{key}_{stat}", (stat, CUSTOM_METRICS_WINDOW, None), value)


def _row(observations: Any, row: int) -> Any:
    """A copy of one env copy's observation out of a batch (a dict of arrays for Dict/Tuple spaces)."""
    if isinstance(observations, Mapping):
        return {key: np.array(value[row]) for key, value in observations.items()}
    return np.array(observations[row])


class MultiAgentEpisode:
    """One env copy's episode of a multi-agent run as callbacks see it: RLlib's ``MultiAgentEpisode`` calls
    (``len(episode)`` in env steps, ``get_return()`` summed over agents, ``get_observations(-1)`` as
    ``{agent: observation}``, ``get_rewards``, ``get_actions``, ``get_infos``, ``agent_ids``, ``module_for(agent)``,
    ``custom_data``) and the old stack's (``length``, ``total_reward``, ``agent_rewards``, ``policy_for(agent)``,
    ``last_observation_for(agent)``, ``last_info_for(agent)``, ``custom_metrics``, ``user_data``).

    Each agent's lists are in its own time: an observation each time it is to decide (and its last one when it
    ends), an action per decision, a reward per env step that paid it.
    """

    def __init__(self, env_index: int, mapping: dict[str, str]) -> None:
        self.id_ = uuid.uuid4().hex
        self.env_index = env_index
        self._mapping = mapping  # agent -> policy id, filled as agents appear (the runner's own dict)
        self._observations: dict[str, list[Any]] = {}
        self._actions: dict[str, list[Any]] = {}
        self._rewards: dict[str, list[float]] = {}
        self._infos: dict[str, list[dict]] = {}
        self._length = 0
        self.is_terminated = self.is_truncated = False
        self.custom_data: dict[str, Any] = {}
        self.custom_metrics: dict[str, float] = {}
        self.user_data: dict[str, Any] = {}
        self.hist_data: dict[str, list[float]] = {}

    def add(self, step: Any, actions: Mapping[str, Any] | None = None) -> None:
        """Add what an env call produced (``herdrl.env.multi_agent.AgentStep``) after ``actions`` (None: a reset)."""
        if actions is not None:
            self._length += 1
            for agent, action in actions.items():
                self._actions.setdefault(agent, []).append(action)
        for agent, reward in step.rewards.items():
            self._rewards.setdefault(agent, []).append(reward)
        for agent, obs in step.decide.items():
            self._observations.setdefault(agent, []).append(obs)
        for agent, (_, _, obs) in step.ended.items():
            if obs is not None:
                self._observations.setdefault(agent, []).append(obs)
        for agent, info in step.infos.items():
            self._infos.setdefault(agent, []).append(dict(info or {}))
        if step.over:
            ended = step.ended.values()
            # The game over with no agent left to report an end (every agent was removed before): terminated.
            no_agent_reported = not ended
            self.is_terminated = any(terminated for terminated, _, _ in ended) or no_agent_reported
            self.is_truncated = not self.is_terminated

    def __len__(self) -> int:
        return self._length

    @property
    def is_done(self) -> bool:
        """The episode is over."""
        return self.is_terminated or self.is_truncated

    @property
    def agent_ids(self) -> list[str]:
        """The agents seen so far."""
        return sorted(set(self._observations) | set(self._rewards))

    def env_steps(self) -> int:
        """Env steps so far (a turn of a turn-based game is one)."""
        return self._length

    def agent_steps(self) -> int:
        """Decisions of all agents so far."""
        return sum(len(actions) for actions in self._actions.values())

    def get_return(self) -> float:
        """The rewards of every agent so far, summed (RLlib's episode return)."""
        return float(sum(sum(rewards) for rewards in self._rewards.values()))

    def _per_agent(self, table: dict[str, list[Any]], indices: Any, agent_ids: Any, stack: bool) -> dict[str, Any]:
        agents = self.agent_ids if agent_ids is None else [agent_ids] if isinstance(agent_ids, str) else agent_ids
        picked = {}
        for agent in agents:
            items = table.get(agent, [])
            if isinstance(indices, (int, np.integer)) and not -len(items) <= indices < len(items):
                continue  # this agent has no such item (yet)
            picked[agent] = _pick(items, indices, stack)
        return picked

    def get_observations(self, indices: Any = None, agent_ids: Any = None) -> dict[str, Any]:
        """``{agent: observations}``: all (None), one (``-1``: each agent's latest), a slice or a list of them."""
        return self._per_agent(self._observations, indices, agent_ids, stack=True)

    def get_actions(self, indices: Any = None, agent_ids: Any = None) -> dict[str, Any]:
        """``{agent: actions}`` (stored layout), picked as :meth:`get_observations` picks."""
        return self._per_agent(self._actions, indices, agent_ids, stack=True)

    def get_rewards(self, indices: Any = None, agent_ids: Any = None) -> dict[str, Any]:
        """``{agent: rewards}``, picked as :meth:`get_observations` picks."""
        return self._per_agent(self._rewards, indices, agent_ids, stack=True)

    def get_infos(self, indices: Any = None, agent_ids: Any = None) -> dict[str, Any]:
        """``{agent: info dicts}``, picked as :meth:`get_observations` picks."""
        return self._per_agent(self._infos, indices, agent_ids, stack=False)

    def module_for(self, agent_id: str) -> str | None:
        """The policy (RLlib: module) ``agent_id`` plays in this episode."""
        return self._mapping.get(agent_id)

    policy_for = module_for  # the old stack's name

    @property
    def episode_id(self) -> str:
        """The episode's id (``id_``)."""
        return self.id_

    @property
    def length(self) -> int:
        """Env steps so far."""
        return self._length

    @property
    def total_reward(self) -> float:
        """The rewards of every agent so far, summed."""
        return self.get_return()

    @property
    def agent_rewards(self) -> dict[tuple[str, str | None], float]:
        """The old stack's ``{(agent, policy): reward so far}``."""
        return {(agent, self._mapping.get(agent)): float(sum(rewards)) for agent, rewards in self._rewards.items()}

    def last_observation_for(self, agent_id: str) -> Any:
        """``agent_id``'s latest observation (None before its first)."""
        items = self._observations.get(agent_id)
        return items[-1] if items else None

    def last_info_for(self, agent_id: str) -> dict:
        """``agent_id``'s latest info dict ({} before its first)."""
        items = self._infos.get(agent_id)
        return items[-1] if items else {}

    def last_action_for(self, agent_id: str) -> Any:
        """``agent_id``'s latest action (None before its first)."""
        items = self._actions.get(agent_id)
        return items[-1] if items else None

    def last_reward_for(self, agent_id: str) -> float:
        """``agent_id``'s latest reward (0 before its first)."""
        items = self._rewards.get(agent_id)
        return items[-1] if items else 0.0


class MultiAgentEpisodeTracker(_Tracker):
    """A multi-agent runner's episodes, one per env copy, handed to the episode hooks (made only when one is set);
    ``env`` is that copy's PettingZoo env."""

    def _env_and_policies(self, episode: MultiAgentEpisode) -> tuple[Any, Any]:
        return self.runner.envs[episode.env_index].env, self.runner.policies

    def create(self, env_index: int, mapping: dict[str, str]) -> None:
        """Env copy ``env_index`` is about to reset (``mapping``: its agents' policies, filled as they appear)."""
        self.episodes[env_index] = MultiAgentEpisode(env_index, mapping)
        self._call("on_episode_created", self.episodes[env_index])

    def start(self, env_index: int, step: Any) -> None:
        """Env copy ``env_index`` was reset (``step``: what the reset gave)."""
        episode = self.episodes[env_index]
        episode.add(step)
        self._call("on_episode_start", episode)

    def step(self, env_index: int, actions: Mapping[str, Any], step: Any) -> None:
        """Env copy ``env_index`` was stepped with ``actions`` and gave ``step``."""
        episode = self.episodes[env_index]
        episode.add(step, actions)
        self._call("on_episode_step", episode)
        if step.over:
            self._call("on_episode_end", episode)
            push_custom_metrics(self.metrics, episode.custom_metrics)
