"""A trial's training loop, as :func:`herdrl.experiment.run_experiment` runs it once the trial is set up: the
iterations until a stop criterion holds, the checkpoints kept on the way (every N iterations, each new best, the
last), and the signals and walltime that stop a run early with a checkpoint (SIGINT, SIGTERM, SIGUSR1,
``HERD_STOP_AT``)."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from herdrl.checkpoint import checkpoint_name, prune
from herdrl.errors import STOP_AT_ENV, ConfigError, HerdError
from herdrl.logger import ConsoleReporter, format_value, write_json_atomic
from herdrl.trial_dir import TrialLock

#: The file in a trial folder naming its best checkpoint (``--keep-best``).
BEST_FILE = "best_checkpoint.json"

_EARLY_WALLTIME: list[int] = []  # SIGUSR1 received before a run's loop began (catch_walltime_signal)


def catch_walltime_signal() -> None:
    """From now on SIGUSR1 (a batch job's walltime is near) is remembered until a run's loop takes over, instead of
    ending the process (its default action) while the run starts: the run then stops after its first iteration,
    with a checkpoint."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, lambda signum, frame: _EARLY_WALLTIME.append(signum))


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


def _best_so_far(logdir: Path, key: str) -> float | None:
    """The best ``key`` a resumed trial's ``--keep-best`` reached before, from its best_checkpoint.json."""
    import json

    try:
        value = json.loads((logdir / BEST_FILE).read_text()).get("value")
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


class TrainingLoop:
    """One trial's iterations until a stop criterion holds, and its checkpoints: every ``checkpoint_every``
    iterations (None: only at the end), at each new best of ``best_key`` (``--keep-best``; None: off), and when the
    run ends; pruned to the ``keep_checkpoints_num`` newest and the best by ``checkpoint_score_attr`` (by
    ``best_key`` when set). After :meth:`run`: ``result`` (the last row), ``stopped_by`` (the stop key that held,
    or "interrupted") and ``signum`` (the signal that stopped it, if one did). ``resumed``: ``algo`` was restored
    from a checkpoint of its current iteration."""

    def __init__(self, algo: Any, logdir: Path, criteria: dict[str, float], *, stop_at: float | None,
                 checkpoint_every: int | None, keep_checkpoints_num: int, checkpoint_score_attr: str | None,
                 best_key: str | None, console: ConsoleReporter | None, resumed: bool) -> None:
        self.algo, self.logdir, self.criteria, self.console = algo, logdir, criteria, console
        self.stop_at, self.checkpoint_every = stop_at, checkpoint_every
        self.keep_checkpoints_num = keep_checkpoints_num
        self.score_attr = best_key or checkpoint_score_attr  # keep_best: the best kept is the best by that metric
        self.best_key = best_key
        self.best = _best_so_far(logdir, best_key) if best_key else None
        self.saved_at = algo.iteration if resumed else -1  # a restored iteration has its checkpoint already
        self.result: dict[str, Any] = dict(algo.last_result)
        self.stopped_by = "interrupted"
        self.graceful: _GracefulStop | None = None

    @property
    def signum(self) -> int | None:
        """The signal that stopped the run (SIGINT, SIGTERM, SIGUSR1), if one did."""
        return self.graceful.signum if self.graceful is not None else None

    def save(self) -> None:
        """A checkpoint of the newest iteration, unless it has one; then the old ones pruned."""
        if self.algo.iteration > 0 and self.algo.iteration != self.saved_at:
            self.algo.save()
            self.saved_at = self.algo.iteration
            prune(self.logdir, self.keep_checkpoints_num, self.score_attr)

    def save_if_best(self, result: dict[str, Any]) -> None:
        """A checkpoint at a new best of ``best_key``, named in the trial's best_checkpoint.json."""
        value = result.get(self.best_key)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or (
                self.best is not None and value <= self.best):
            return
        self.best = value
        self.save()
        name = checkpoint_name(self.algo.iteration)
        write_json_atomic(self.logdir / BEST_FILE, {"checkpoint": name, "metric": self.best_key, "value": value,
                                                    "training_iteration": self.algo.iteration})
        if self.console:
            self.console.message(f"new best {self.best_key} {format_value(value)}: {name}")

    def _iterate(self, graceful: _GracefulStop) -> None:
        """Train until a stop criterion holds or a stop was asked for (a signal, the walltime)."""
        algo = self.algo
        while True:
            self.result = result = algo.train()
            if self.stop_at is not None and time.time() + result.get("time_this_iter_s", 0.0) >= self.stop_at:
                graceful.walltime(f"{STOP_AT_ENV}: no time left for another iteration")
            if self.checkpoint_every and algo.iteration % self.checkpoint_every == 0:
                self.save()
            if self.best_key:
                self.save_if_best(result)
            met = [k for k, v in self.criteria.items() if result.get(k, -math.inf) >= v]
            if met:
                self.stopped_by = met[0]
                return
            if graceful.requested:
                return

    def run(self, lock: TrialLock) -> None:
        """Train under the signal handlers and finish: a last checkpoint (none after a second Ctrl-C: mid-iteration
        state is not saved), the logger's end status, then the algorithm stopped and ``lock`` released whatever
        happened."""
        algo = self.algo
        try:
            with _GracefulStop(self.console) as self.graceful:
                try:
                    self._iterate(self.graceful)
                except HerdError:
                    algo.logger.end_status = "FAILED"
                    self.save()  # the last completed iteration is consistent: keep it, then report the error
                    raise
                if self.stopped_by == "interrupted":
                    algo.logger.end_status = "KILLED"  # stopped to be resumed (a signal, the walltime)
                self.save()
        except KeyboardInterrupt:  # the second Ctrl-C: mid-iteration state is not saved
            algo.logger.end_status = "KILLED"
            if self.console:
                self.console.message("aborted: the newest checkpoint is from before this iteration")
        except BaseException:
            algo.logger.end_status = "FAILED"
            raise
        finally:
            try:
                algo.stop()
            finally:
                lock.release()
