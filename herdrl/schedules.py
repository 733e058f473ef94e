"""Hyperparameters that change during training: RLlib's piecewise-linear schedules and named decays.

    config.training(lr=[[0, 3e-4], [1_000_000, 0.0]])          # RLlib's form: [[step, value], ...]
    config.training(lr={"schedule": "linear", "start": 2.5e-4, "end": 0.0, "steps": 10_000_000})
    config.training(entropy_coeff={"schedule": "cosine", "start": 0.01, "end": 0.0, "steps": 500_000})

In YAML, ``lr: {schedule: linear, start: 2.5e-4, end: 0}`` without ``steps`` decays over the run's
``--stop-timesteps``. A piecewise schedule interpolates linearly between its points and holds its first value
before the first point and its last value after the last one (as RLlib does). ``cosine`` goes from ``start`` to
``end`` along half a cosine, then holds ``end``.

Schedules are counted in env steps sampled (``num_env_steps_sampled_lifetime``; in multi-agent runs each policy's
own agent steps), so a resumed run continues where it was; every learner of a data-parallel group is given the same
count, so they agree. Which keys take a schedule: ``lr`` (every optimizer of every algorithm), ``entropy_coeff``
(PPO, A2C, IMPALA, APPO) and DQN's ``epsilon``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from herdrl.errors import ConfigError

NAMED = ("linear", "cosine")


@dataclass(frozen=True)
class Schedule:
    """A value as a function of the env-step count: piecewise linear through ``points``, or a ``cosine`` decay
    from ``points[0]`` to ``points[1]``."""

    points: tuple[tuple[float, float], ...]
    kind: str = "piecewise"

    def __call__(self, step: float) -> float:
        """The value at ``step``."""
        (first_step, first), (last_step, last) = self.points[0], self.points[-1]
        if step <= first_step:
            return first
        if step >= last_step:
            return last
        if self.kind == "cosine":
            done = (step - first_step) / (last_step - first_step)
            return last + (first - last) * 0.5 * (1.0 + math.cos(math.pi * done))
        for (x0, y0), (x1, y1) in zip(self.points, self.points[1:], strict=False):
            if step <= x1:
                return y0 + (y1 - y0) * (step - x0) / (x1 - x0)
        return last  # not reached

    @property
    def constant(self) -> bool:
        """Whether the value never changes."""
        return len({value for _, value in self.points}) == 1


def is_schedule(value: Any) -> bool:
    """Whether ``value`` is a schedule spec (a list of points or a named decay), not a plain number."""
    return isinstance(value, (list, tuple, Mapping))


def schedule_of(key: str, value: Any) -> Schedule:
    """The :class:`Schedule` of a checked config value (a number, points, or a named decay with ``steps``)."""
    if isinstance(value, Mapping):
        kind = value["schedule"]
        if value.get("steps") is None:
            raise ConfigError(f"config key '{key}': a '{kind}' schedule needs steps: (or a --stop-timesteps for the "
                              "run to decay over)")
        points = ((0.0, float(value["start"])), (float(value["steps"]), float(value["end"])))
        return Schedule(points, "cosine" if kind == "cosine" else "piecewise")
    if isinstance(value, (list, tuple)):
        return Schedule(tuple((float(step), float(v)) for step, v in value))
    return Schedule(((0.0, float(value)),))


def check_schedule(key: str, value: Any, check_value: Any) -> Any:
    """``value`` validated as a schedule of ``key`` (``check_value(number)`` checks each value's range); returned
    in plain JSON form (lists of ``[step, value]``, or the named decay's dict)."""
    if isinstance(value, Mapping):
        unknown = set(value) - {"schedule", "start", "end", "steps"}
        kind = value.get("schedule")
        if kind not in NAMED or unknown or "start" not in value or "end" not in value:
            raise ConfigError(f"config key '{key}' got {dict(value)!r}; a named schedule is {{schedule: "
                              f"{'|'.join(NAMED)}, start: V, end: V, steps: N}} (steps: optional, the run's "
                              "--stop-timesteps)")
        steps = value.get("steps")
        if steps is not None and (not _number(steps) or steps <= 0):
            raise ConfigError(f"config key '{key}': schedule steps got {steps!r}; expected a number > 0")
        return {"schedule": kind, "start": check_value(value["start"]), "end": check_value(value["end"]),
                **({"steps": int(steps)} if steps is not None else {})}
    points = list(value) if isinstance(value, Sequence) else []
    if not points or not all(isinstance(p, Sequence) and not isinstance(p, str) and len(p) == 2 and _number(p[0])
                             for p in points):
        raise ConfigError(f"config key '{key}' got {value!r}; a schedule is [[env_step, value], ...] (RLlib's "
                          "form) or {schedule: linear|cosine, start: V, end: V, steps: N}")
    steps = [p[0] for p in points]
    if steps[0] < 0 or any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
        raise ConfigError(f"config key '{key}' got env steps {steps}; they must start at >= 0 and increase")
    return [[int(step) if float(step).is_integer() else float(step), check_value(v)] for step, v in points]


def with_steps(value: Any, steps: int) -> Any:
    """A named decay without ``steps`` given ``steps`` (the run's env-step budget); anything else (a Tune search
    space among them) unchanged."""
    if isinstance(value, Mapping) and "schedule" in value and value.get("steps") is None:
        return {**value, "steps": int(steps)}
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
