"""herdrl's exception types.

Every error a user can cause (a bad config value, an unknown env, a broken env)
raises one of these with a single actionable line. The CLI prints that line and
exits non-zero; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: The exit code of a ``herd train`` stopped for its job's walltime (SIGUSR1, or the time in ``HERD_STOP_AT``) after
#: a checkpoint: "resume me" (EX_TEMPFAIL). A job chain submits its next job on it.
EXIT_REQUEUE = 75
#: The environment variable naming when ``herd train`` stops with a checkpoint and :data:`EXIT_REQUEUE` (seconds
#: since the epoch): a walltime less a lead, for schedulers that send no signal before it (PBS).
STOP_AT_ENV = "HERD_STOP_AT"


class HerdError(Exception):
    """Base class of herdrl's user-facing errors (one line, names the fix)."""


class ConfigError(HerdError, ValueError):
    """A config key or value is invalid (unknown key, wrong type, out of range)."""


class EnvError(HerdError):
    """An environment cannot be made or misbehaves (unknown id, bad space, NaN output)."""


class CallbackError(HerdError):
    """A callback raised: named with its hook, the traceback under ``--debug``."""


class AlgorithmNotFound(HerdError, KeyError):
    """An algorithm name is not registered."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Return `` (did you mean 'x'?)`` for the closest candidate, or ``""``."""
    candidates = list(candidates)
    lowered = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return f" (did you mean '{lowered[close[0]]}'?)" if close else ""


def yaml_error_parts(exc: Exception, source: str) -> tuple[str, str]:
    """Where a YAML syntax error is and what is wrong, for a one-line message: ``("cfg.yaml, line 5, column 9",
    "mapping values are not allowed here")`` from PyYAML's ``problem_mark`` (counted from 1, as editors count) and
    ``problem``, with the construct it arose in (``context``) and where that starts when elsewhere."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or not problem:  # not a marked error: PyYAML's own first line is all there is
        return source, (str(exc).splitlines() or [type(exc).__name__])[0]
    where = f"{source}, line {mark.line + 1}, column {mark.column + 1}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        if start is not None and (start.line, start.column) != (mark.line, mark.column):
            context += f" that starts at line {start.line + 1}, column {start.column + 1}"
        problem = f"{problem} ({context})"
    if "'\\t'" in problem:
        problem += "; YAML indents with spaces, not tabs"
    return where, problem
