"""Custom metrics: what callbacks log (:class:`MetricsLogger`, RLlib's ``metrics_logger``) and the driver's
reduction of them over runners and iterations (:class:`MetricsReducer`), with RLlib's ``reduce`` meanings."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from herdrl.errors import CallbackError, ConfigError

#: Episodes RLlib's old stack reduces ``episode.custom_metrics`` over (its ``metrics_num_episodes_for_smoothing``).
CUSTOM_METRICS_WINDOW = 100
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
