"""Stopping a sweep for a batch job's walltime or preemption without losing an iteration.

:class:`WalltimeStop` is a Ray Tune callback that ``herd tune`` (:func:`herdrl.tune.run`) adds to every sweep. At
SIGUSR1 (Slurm's signal before the walltime, see ``herd launch slurm --time``), ``HERD_STOP_AT`` (PBS) or SIGTERM
(preemption), every result from then on is checkpointed; once each running trial has a checkpoint of its last
result and no save is in flight, Tune's own interrupt ends the sweep with its state saved, and
``herd tune --resume`` continues every unfinished trial from that checkpoint, its iterations contiguous. Until then
every result is checkpointed (a trial that saved goes on while the others finish their iteration), so a sweep
with large checkpoints (replay buffers) writes a few more. A repeated signal changes nothing; Ctrl-C (Tune's own
interrupt) stops at once.

A module of its own, and the class at its top level, because Tune pickles its callbacks into the experiment
state: a restored sweep then finds this class by reference (today's code) rather than a copy of the old one.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Any

from ray.tune import Callback

from herdrl.trial_run import _EARLY_WALLTIME, _stop_at

#: The callback of the sweep now running in this process (set when Tune sets it up, restored sweeps included).
CURRENT: WalltimeStop | None = None


class WalltimeStop(Callback):
    """Checkpoint every running trial's last result, then interrupt the sweep (see the module's docstring)."""

    def __init__(self) -> None:
        self.reason: str | None = None  # why the sweep is stopping, once asked to
        self.signum: int | None = None  # SIGUSR1 for the walltime (HERD_STOP_AT too), SIGTERM for preemption
        self.interrupted = False
        self.status: dict[str, str] = {}  # trial id -> its status after Tune's last step (before its clean-up)
        self._running_then: set[str] | None = None  # trials running when the stop was asked for
        self._results: dict[str, int] = {}  # results since the stop was asked for, per trial
        self._saves: dict[str, int] = {}  # checkpoints written since, per trial
        self._tune_interrupt: Any = None
        self._stop_at: float | None = None

    def __getstate__(self) -> dict:
        return {}  # pickled into Tune's experiment state before the sweep starts: always fresh

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def setup(self, **info: Any) -> None:
        global CURRENT
        CURRENT = self
        self._stop_at = _stop_at()
        if threading.current_thread() is threading.main_thread():
            # Tune has just set its interrupt (the experiment state saved, trials stopped) on SIGUSR1: ours
            # first checkpoints every trial, then calls it.
            self._tune_interrupt = signal.getsignal(signal.SIGUSR1)
            signal.signal(signal.SIGUSR1, self._signal)
            signal.signal(signal.SIGTERM, self._signal)
        if _EARLY_WALLTIME:  # SIGUSR1 while Ray and Tune started
            _EARLY_WALLTIME.clear()
            self._ask("SIGUSR1 while the sweep started (the job's walltime is near)", signal.SIGUSR1)

    def _signal(self, signum: int, frame: Any) -> None:
        if self.reason is not None:
            # Already stopping. (Slurm sends SIGTERM to every process of a job it ends and the batch script forwards
            # its own: a repeat must not skip the checkpoints. Ctrl-C, Tune's own, stops at once.)
            return
        why = " (the job's walltime is near)" if signum == signal.SIGUSR1 else " (the job is preempted or ended)"
        self._ask(f"{signal.Signals(signum).name}{why}", signum)

    def _ask(self, why: str, signum: int) -> None:
        self.reason, self.signum = why, signum
        print(f"herd tune: {why}: every running trial checkpoints after its iteration, then the sweep stops "
              "(continue it with --resume)", file=sys.stderr, flush=True)

    def _interrupt(self) -> None:
        if not self.interrupted and callable(self._tune_interrupt):
            self.interrupted = True
            # Tune's lines ("Stop signal received (e.g. via SIGINT/Ctrl+C)", "Resume experiment with:
            # Tuner.restore(...)", "Trials did not complete") would contradict ours: herdrl.tune.run restores them.
            logging.getLogger("ray.tune.tune").setLevel(logging.CRITICAL)
            self._tune_interrupt(signal.SIGUSR1, None)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if self.reason is not None:
            result["should_checkpoint"] = True  # Tune lets a callback change the result: save this one
            self._results[trial.trial_id] = self._results.get(trial.trial_id, 0) + 1

    def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any, **info: Any) -> None:
        if self.reason is not None:
            self._saves[trial.trial_id] = self._saves.get(trial.trial_id, 0) + 1

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        self.status = {t.trial_id: t.status for t in trials}
        if self.reason is None and self._stop_at is not None and time.time() >= self._stop_at:
            self._ask("HERD_STOP_AT reached (the job's walltime is near)", signal.SIGUSR1)
        if self.reason is None or self.interrupted:
            return
        running = {t.trial_id for t in trials if t.status == "RUNNING"}
        if self._running_then is None:
            self._running_then = running
        unsaved = {t for t in self._running_then & running if not self._saves.get(t)}
        in_flight = {t for t, n in self._results.items() if t in running and self._saves.get(t, 0) < n}
        if not unsaved and not in_flight:
            self._interrupt()

    @property
    def unfinished(self) -> list[str] | None:
        """Trials neither finished nor failed when the sweep stopped (``--resume`` continues them). Read from
        Tune's last step, since its clean-up marks the trials it stops as terminated; None when no step ran."""
        if not self.status:
            return None
        return [trial for trial, status in self.status.items() if status not in ("TERMINATED", "ERROR")]

