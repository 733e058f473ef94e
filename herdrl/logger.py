"""Result files of one trial and the console progress line.

``<output>/<experiment>/<trial>/`` holds ``params.json`` (the config),
``progress.csv`` and ``result.json`` (one row per iteration, flushed as it is
written, so a killed run keeps every finished iteration) and TensorBoard
event files (``tensorboard --logdir <output>``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

logger = logging.getLogger("herdrl")

#: Keys whose values depend on machine load; everything else is deterministic for a fixed seed (but see GAUGE_KEYS).
TIMING_KEYS = ("time_this_iter_s", "time_total_s", "sample_time_s", "learn_time_s", "env_steps_per_s",
               "evaluation/time_s")
#: Gauges of the Ray cluster a run shares (its object store's use): measured, not seeded.
GAUGE_KEYS = ("object_store_bytes", "object_store_fraction")


def write_text_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write text to a fresh temporary sibling (random name, never an existing file or link), fsync, then
    rename it over ``path`` (a link there is replaced, never written through). The file gets ``mode``, by default
    the one a plain ``open`` would give it (0666 less the umask): results stay as readable as they were."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask() if mode is None else mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_umask() -> int:
    """The process's umask (read by setting it and back: Python has no getter), once at import, before any thread
    could create a file while it is briefly changed."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def _umask() -> int:
    return _UMASK


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON atomically (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=repr))


#: Keys Ray Tune adds to a trial's results; not herdrl's metrics, so not in its TensorBoard files.
TUNE_KEYS = {"timestamp", "pid", "time_since_restore", "timesteps_since_restore", "iterations_since_restore", "done",
             "date", "hostname", "node_ip", "trial_id", "experiment_id", "checkpoint_dir_name", "should_checkpoint",
             "experiment_tag", "timesteps_total", "episodes_total"}


def write_tensorboard(writer: Any, result: dict[str, Any]) -> None:
    """One result row as TensorBoard scalars: a tag per numeric result key, env steps on the x axis (the same
    for `herd train` and `herd tune` trials)."""
    step = result.get("num_env_steps_sampled_lifetime", result.get("training_iteration", 0))
    for key, value in result.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in TUNE_KEYS:
            writer.add_scalar(key, value, step)


def _int(value: Any) -> float:
    try:
        return int(value)
    except (TypeError, ValueError):
        return math.inf  # unreadable rows sort after every checkpoint: dropped


def format_value(value: Any, width: int = 0) -> str:
    """A metric for people: one decimal, or ``-`` where there is none yet (no finished episode: NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-".rjust(width)
    return f"{value:{width}.1f}"


#: Environment variables that say the console is a job's log, not a person's terminal (plain lines there).
_NOT_LIVE_ENV = ("SLURM_JOB_ID", "PBS_JOBID", "COBALT_JOBID", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                 "CI")

#: Stop criteria that count up at a steady rate: an ETA can be given for them (see ConsoleReporter).
_COUNTED = {"num_env_steps_sampled_lifetime": "steps", "training_iteration": "iterations", "time_total_s": "s",
            "num_gradient_updates_lifetime": "gradient steps"}
#: The losses an offline run's progress line shows, when its rows have them.
OFFLINE_LOSSES = ("policy_loss", "vf_loss", "critic_loss", "actor_loss", "cql_loss", "value_loss")


def format_duration(seconds: float) -> str:
    """``2h05m``, ``7m30s``, ``45s``."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ConsoleReporter:
    """One line per iteration: iteration, steps, return (and the target), speed, and the time left to the stop
    criteria that count (env steps, iterations, seconds). On a terminal the line is live (rewritten in place, kept
    every :attr:`keep_every_s` seconds); in a log file (CI, a batch job) every iteration is a plain line. Once the
    speed is known, one line says how long the whole run should take."""

    #: On a terminal, how often the live line is kept as a line of its own (the rest are overwritten).
    keep_every_s = 30.0

    def __init__(self, target: float | None = None, metric: str = "episode_return_mean",
                 limits: dict[str, float] | None = None, console: Any = None) -> None:
        from rich.console import Console

        self.console = console or Console(highlight=False)
        self.target = target
        self.metric = metric  # the return the target applies to (greedy evaluation for off-policy)
        self.limits = {k: v for k, v in (limits or {}).items() if k in _COUNTED}
        # Live only on a person's terminal: under a batch system or MPI the "terminal" is a pseudo-terminal whose
        # output ends in the job's log, where rewritten lines would be a mess.
        self.live = bool(self.console.is_terminal) and not any(name in os.environ for name in _NOT_LIVE_ENV)
        self._first: dict[str, Any] | None = None  # the first row reported (the rates are measured from it)
        self._said_duration = False
        self._pending = False  # a live line on screen, not yet ended with a newline
        self._kept_at = time.monotonic()
        if self.live:  # a warning of herdrl's (a lost node, a restart) starts on a line of its own
            self._end_line = _EndLine(self)
            logging.getLogger("herdrl").addFilter(self._end_line)

    def eta(self, result: dict[str, Any]) -> tuple[float, str] | None:
        """Seconds until the first counted stop criterion is reached, at the pace since the first row, and which
        (``"1,000,000 steps"``); None before the pace is known or without such a criterion."""
        first = self._first
        if first is None or not self.limits:
            return None
        elapsed = result.get("time_total_s", 0.0) - first.get("time_total_s", 0.0)
        if elapsed <= 0:
            return None
        best = None
        for key, limit in self.limits.items():
            done, start = result.get(key), first.get(key)
            if done is None or start is None or done <= start:
                continue
            seconds = (limit - done) * elapsed / (done - start) if key != "time_total_s" else limit - done
            label = f"{limit:,.0f} {_COUNTED[key]}"
            if best is None or seconds < best[0]:
                best = (max(0.0, seconds), label)
        return best

    def fields(self, result: dict[str, Any], eta: tuple[float, str] | None = None) -> list[tuple[str, str, int]]:
        """The progress line of one result row as fields ``(text, compact text, rank)``, in order: a narrow
        terminal drops the fields of the highest rank first; rank 0 (the elapsed time and the ETA) never goes."""
        it, t = result["training_iteration"], result["time_total_s"]
        target = f"/{self.target:g}" if self.target is not None else ""
        fields = [(f"iter {it:4d}", f"iter {it}", 4)]
        if "num_gradient_updates_lifetime" in result and not result.get("num_env_steps_sampled_lifetime"):
            # an offline run: no env steps or training episodes; its gradient steps and losses instead
            updates, ret = result["num_gradient_updates_lifetime"], result.get("evaluation/episode_return_mean")
            fields += [(f"updates {updates:>9,}", f"updates {updates:,}", 2),
                       (f"eval {format_value(ret, 8)}{target}", f"eval {format_value(ret)}{target}", 1)]
            fields += [(f"{key} {result[key]:.4g}",) * 2 + (5 + i,)
                       for i, key in enumerate(key for key in OFFLINE_LOSSES if key in result)]
        else:
            steps, episodes, speed = (result["num_env_steps_sampled_lifetime"], result["num_episodes_lifetime"],
                                      result["env_steps_per_s"])
            ret, short = format_value(result.get(self.metric), 8), format_value(result.get(self.metric))
            if self.metric != "episode_return_mean":
                train = result.get("episode_return_mean")
                ret, short = (f"{format_value(train, 8)}  eval {ret}", f"{format_value(train)}  eval {short}")
            fields += [(f"steps {steps:>9,}", f"steps {steps:,}", 2), (f"return {ret}{target}",
                                                                       f"return {short}{target}", 1),
                       (f"episodes {episodes:>6,}", f"episodes {episodes:,}", 6),
                       (f"{speed:>8,.0f} steps/s", f"{speed:,.0f} steps/s", 5)]
        fields.append((f"{t:6.1f} s", f"{t:.1f} s", 0))
        if eta:
            fields.append((f"ETA {format_duration(eta[0])}",) * 2 + (0,))
        extras = []
        scores = [key for key in result if key.startswith("score_vs_random/")]
        if scores:  # turn-based zero-sum games: the returns above say little, this says how well it plays
            extras.append("vs random " + " ".join(f"{key.split('/', 1)[1]} {result[key]:+.2f}" for key in scores[:4]))
        policies = [key for key in result if key.startswith("policy_return_mean/")]
        if policies:  # multi-agent: each policy's return, after the sum over agents
            extras.append(" ".join(f"{key.split('/', 1)[1]} {result[key]:.2f}" for key in policies[:4]))
        if "policy_lag_mean" in result:  # asynchronous algorithms: how stale the learned-on samples were
            extras.append(f"lag {result['policy_lag_mean']:.1f}/{result['policy_lag_max']:g}  learner "
                          f"{100 * result['learner_busy_fraction']:.0f}% busy  queue {result['queue_depth']}")
        # The mean is over the last 100 finished episodes: say when it is not new (long episodes, or all
        # episodes restarted by a resume), rather than repeat it as if it were.
        if "num_gradient_updates_lifetime" not in result or result.get("num_env_steps_sampled_lifetime"):
            if result.get("num_episodes", 1) == 0:
                extras.append("(no episode finished this iteration)")
        return fields + [(text, text, 10 + i) for i, text in enumerate(extras)]

    def report(self, result: dict[str, Any]) -> None:
        """Print the progress line of one result row (on a terminal, fitted to its width: see :func:`fit_line`)."""
        if self._first is None:
            self._first = dict(result)
        eta = self.eta(result)
        fields = self.fields(result, eta)
        if eta and not self._said_duration and eta[0] >= 60.0 and result.get("time_total_s", 0.0) - self._first.get(
                "time_total_s", 0.0) >= 5.0:  # once the pace is known, for runs long enough to plan around
            self._said_duration = True
            finish = time.strftime("%H:%M", time.localtime(time.time() + eta[0]))
            self.message(f"at this pace the run reaches {eta[1]} in about {format_duration(eta[0])} (around "
                         f"{finish}), unless a return target stops it first")
        if not self.live:  # a log file: every field, aligned from row to row
            self.console.print("  ".join(text for text, _, _ in fields), soft_wrap=True, markup=False,
                               highlight=False)
            return
        now = time.monotonic()
        keep = now - self._kept_at >= self.keep_every_s
        # (narrower than the terminal: a wrapped line could not be rewritten in place)
        line = fit_line(fields, self.console.width - 1)
        self.console.file.write("\r\x1b[2K" + line + ("\n" if keep else ""))
        self.console.file.flush()
        self._pending = not keep
        if keep:
            self._kept_at = now

    def end_line(self) -> None:
        """End a live line still on screen, so what is written next starts on a line of its own."""
        if self._pending:
            self.console.file.write("\n")
            self.console.file.flush()
            self._pending = False

    def finish(self) -> None:
        """End a live line still on screen (the run is over)."""
        self.end_line()
        if self.live:
            logging.getLogger("herdrl").removeFilter(self._end_line)

    def message(self, text: str) -> None:
        """Print a line of its own (start, stop reason, where results are); a live line on screen is kept."""
        self.end_line()
        self.console.print(text, soft_wrap=True, highlight=False)


def fit_line(fields: list[tuple[str, str, int]], width: int) -> str:
    """Fields ``(text, compact text, rank)`` joined into at most ``width`` cells: every field as it is if they fit,
    else their compact texts, dropping the fields of the highest rank first (never rank 0: the elapsed time and the
    ETA); only a line still too wide then is cut, with an ellipsis."""
    from rich.cells import cell_len, set_cell_size

    line = "  ".join(text for text, _, _ in fields)
    if cell_len(line) <= width:
        return line

    def joined(kept: set[int]) -> str:
        return "  ".join(fields[i][1] for i in sorted(kept))

    kept = set(range(len(fields)))
    by_rank = sorted(kept, key=lambda i: fields[i][2])
    for i in reversed(by_rank):  # the highest rank first, until the rest fits
        if cell_len(joined(kept)) <= width or not fields[i][2]:
            break
        kept.discard(i)
    for i in by_rank:  # a field dropped on the way that fits after all (a shorter one of a lower rank)
        if i not in kept and cell_len(joined(kept | {i})) <= width:
            kept.add(i)
    line = joined(kept)
    return line if cell_len(line) <= width else set_cell_size(line, max(0, width - 1)) + "…"


class _EndLine(logging.Filter):
    """Ends the reporter's live line before a herdrl log line is written (the record itself passes)."""

    def __init__(self, reporter: ConsoleReporter) -> None:
        super().__init__()
        self.reporter = reporter

    def filter(self, record: logging.LogRecord) -> bool:
        self.reporter.end_line()
        return True


#: Where a trial folder keeps its trackers' run ids and last rows (herdrl.trackers).
TRACKERS_FILE = "trackers.json"


def read_tracker_state(logdir: Path) -> dict[str, Any]:
    """What the trial folder remembers of its trackers' runs: tracker name -> its ``state()``."""
    try:
        state = json.loads((Path(logdir) / TRACKERS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def save_tracker_state(logdir: Path, trackers: list[Any], known: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write every tracker's ``state()`` (run id, last row) to the trial's ``trackers.json`` in one write; entries
    of trackers not used this time are kept (a later run with them continues their runs). ``known``: the file's
    content as last read or written (read here when None); returns what was written."""
    state = {**(read_tracker_state(logdir) if known is None else known),
             **{tracker.name: tracker.state() for tracker in trackers}}
    if trackers:
        write_json_atomic(Path(logdir) / TRACKERS_FILE, state)
    return state


class Logger:
    """Writes a trial's result files; ``log(result)`` once per iteration."""

    def __init__(self, logdir: str | os.PathLike, params: dict[str, Any], *,
                 console: ConsoleReporter | None = None, tensorboard: bool = True,
                 resume_after: tuple[int, int] | None = None, trackers: list[Any] | None = None) -> None:
        """``resume_after=(iteration, env_steps)``: continue a trial's files after that checkpointed
        iteration, dropping rows written after it (those iterations are run again). ``trackers``
        (``herdrl.trackers``): MLflow / W&B runs given every row and checkpoint too."""
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        for name in ("result.json", "progress.csv"):  # opened for writing in place: a link would write elsewhere
            if (self.logdir / name).is_symlink() or self.logdir.is_symlink():
                from herdrl.errors import HerdError

                raise HerdError(f"{self.logdir / name}: a symbolic link; results are written only into the trial "
                                "folder itself: remove it")
        from herdrl.site_keys import mask_site_values

        write_json_atomic(self.logdir / "params.json", mask_site_values(params))  # no credentials in results
        self.console = console
        self.trackers = list(trackers or [])
        self._tracker_state = read_tracker_state(self.logdir) if self.trackers else {}  # (read once, kept here)
        #: How the run ended, for the trackers: FINISHED, FAILED, or KILLED (stopped to be resumed).
        self.end_status = "FINISHED"
        self._tracker_said: set[str] = set()
        self._csv_path = self.logdir / "progress.csv"
        self._csv_fields: list[str] | None = None
        self._csv: TextIO | None = None
        if resume_after is not None:
            self._truncate_after(resume_after[0])
        self._json: TextIO = open(self.logdir / "result.json", "a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step hides events a killed run wrote after the checkpoint we resume from.
            purge = resume_after[1] + 1 if resume_after is not None else None
            self._tb = SummaryWriter(log_dir=str(self.logdir), flush_secs=10, purge_step=purge)

    def _truncate_after(self, iteration: int) -> None:
        """Keep rows up to ``iteration`` in result.json and progress.csv (a partial last line is dropped)."""
        json_path = self.logdir / "result.json"
        kept: list[str] = []
        if json_path.exists():
            for line in json_path.read_text().splitlines():
                try:
                    if json.loads(line)["training_iteration"] <= iteration:
                        kept.append(line)
                except (ValueError, KeyError, TypeError):
                    break  # a line cut by the kill: nothing valid follows it
        write_text_atomic(json_path, "".join(line + "\n" for line in kept))
        rows = [r for r in self._read_csv() if _int(r.get("training_iteration")) <= iteration]
        if rows:
            self._rewrite_csv(list(rows[0].keys()), rows)
        elif self._csv_path.exists():
            self._csv_path.unlink()

    def log(self, result: dict[str, Any]) -> None:
        """Append one result row to every output."""
        self._json.write(json.dumps(result) + "\n")
        self._json.flush()
        self._write_csv(result)
        if self._tb is not None:
            write_tensorboard(self._tb, result)
        if self.trackers:
            self._to_trackers("log", result)
            # (run ids, last rows: a resumed run logs no row twice)
            self._tracker_state = save_tracker_state(self.logdir, self.trackers, self._tracker_state)
        if self.console is not None:
            self.console.report(result)

    def checkpoint(self, path: Path) -> None:
        """A checkpoint was written to ``path``: the trackers record it."""
        self._to_trackers("checkpoint", path)

    def _to_trackers(self, method: str, *args: Any) -> None:
        """A tracker that fails (its server away) costs a warning, never the run: the rows stay in the files."""
        for tracker in self.trackers:
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:  # noqa: BLE001 - any failure of the tracker's client
                if tracker.name not in self._tracker_said:
                    self._tracker_said.add(tracker.name)
                    logger.warning("herdrl: %s failed (%s: %s); training goes on, every row is in progress.csv",
                                   tracker.name, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")

    def _write_csv(self, result: dict[str, Any]) -> None:
        new_keys = [k for k in result if self._csv_fields is None or k not in self._csv_fields]
        if self._csv_fields is None or new_keys:
            # First row, or a key appeared (e.g. evaluation metrics): rewrite with the wider header.
            rows = self._read_csv() if self._csv_fields is not None else []
            self._rewrite_csv((self._csv_fields or []) + new_keys, rows)
        csv.DictWriter(self._csv, fieldnames=self._csv_fields).writerow(result)
        self._csv.flush()

    def _rewrite_csv(self, fields: list[str], rows: list[dict[str, Any]]) -> None:
        """Replace progress.csv with ``rows`` under the header ``fields`` atomically (a kill at any moment leaves
        the old file or the new one, never a truncated curve), then reopen it for appending."""
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
        if self._csv is not None:
            self._csv.close()
        write_text_atomic(self._csv_path, text.getvalue())
        self._csv_fields = fields
        self._csv = open(self._csv_path, "a", newline="")

    def _read_csv(self) -> list[dict[str, str]]:
        if not self._csv_path.exists():
            return []
        with open(self._csv_path, newline="") as f:
            return list(csv.DictReader(f))

    def close(self) -> None:
        """Flush and close every file (and end a live console line)."""
        if self.console is not None:
            self.console.finish()
        self._json.close()
        if self._csv is not None:
            self._csv.close()
        if self._tb is not None:
            self._tb.close()
        self._to_trackers("close", self.end_status)
        self.trackers = []
