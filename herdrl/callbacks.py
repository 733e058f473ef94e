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

This module dispatches the hooks; the episodes hooks see are in :mod:`herdrl.episodes`, the metrics logger and its
reduction in :mod:`herdrl.metrics_logger` (their names importable from here too).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

# Episodes and the metrics logger live in their own modules; their names stay importable from here.
from herdrl.episodes import (  # noqa: F401
    Episode,
    EpisodeTracker,
    MultiAgentEpisode,
    MultiAgentEpisodeTracker,
    env_info,
)
from herdrl.errors import CallbackError, ConfigError
from herdrl.metrics_logger import (  # noqa: F401
    CUSTOM_METRICS_WINDOW,
    REDUCES,
    MetricsLogger,
    MetricsReducer,
    metric_settings,
    push_custom_metrics,
)

ALGORITHM_HOOKS = ("on_algorithm_init", "on_train_result", "on_evaluate_start", "on_evaluate_end",
                   "on_checkpoint_loaded")
RUNNER_HOOKS = ("on_environment_created", "on_sample_end")
EPISODE_HOOKS = ("on_episode_created", "on_episode_start", "on_episode_step", "on_episode_end")
HOOKS = ALGORITHM_HOOKS + RUNNER_HOOKS + EPISODE_HOOKS


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
