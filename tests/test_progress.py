"""The console's progress: time left to the stop criteria at the pace so far, the expected duration once, and a
live line on a terminal (plain lines in a log file)."""

import re
from io import StringIO

from rich.console import Console

from herdrl.logger import _NOT_LIVE_ENV, ConsoleReporter, format_duration


def _row(iteration, steps, seconds):
    return {"training_iteration": iteration, "num_env_steps_sampled_lifetime": steps, "num_episodes_lifetime": 3,
            "episode_return_mean": 10.0, "env_steps_per_s": 500.0, "time_total_s": seconds, "num_episodes": 1}


def test_the_eta_is_the_nearest_counted_stop_at_the_pace_since_the_first_row():
    out = StringIO()
    reporter = ConsoleReporter(limits={"num_env_steps_sampled_lifetime": 10_000, "training_iteration": 1000,
                                       "episode_return_mean": 475}, console=Console(file=out, width=300))
    assert not reporter.live
    reporter.report(_row(1, 1000, 2.0))  # the pace is not known yet
    reporter.report(_row(2, 2000, 4.0))  # 500 steps/s since the first row: 8,000 steps left -> 16 s
    reporter.report(_row(4, 4000, 8.0))  # 3,000 steps in 6 s: 6,000 left -> 12 s; iterations: 996 x 2 s
    lines = out.getvalue().splitlines()
    assert "ETA" not in lines[0] and lines[1].endswith("ETA 16s") and lines[-1].endswith("ETA 12s")
    assert not [line for line in lines if line.startswith("at this pace")]  # 12 s left: not worth a line
    long = ConsoleReporter(limits={"num_env_steps_sampled_lifetime": 1_000_000}, console=Console(file=out, width=300))
    for row in (_row(1, 1000, 2.0), _row(2, 2000, 4.0), _row(4, 4000, 8.0), _row(5, 5000, 10.0)):
        long.report(row)  # 500 steps/s: 995,000 steps left at the last row -> 1,990 s
    expected = [line for line in out.getvalue().splitlines() if line.startswith("at this pace")]
    assert len(expected) == 1 and "reaches 1,000,000 steps in about 33m" in expected[0]
    quick = ConsoleReporter(limits={"training_iteration": 5}, console=Console(file=StringIO()))
    quick.report(_row(1, 100, 1.0))
    assert quick.eta(_row(3, 300, 3.0)) == (2.0, "5 iterations")  # 1 s per iteration, 2 left
    assert format_duration(7530) == "2h05m" and format_duration(450) == "7m30s" and format_duration(45) == "45s"


def _live(monkeypatch, width):
    """A reporter on a terminal ``width`` wide (none of the variables of a job's log set), and what it writes."""
    for name in _NOT_LIVE_ENV:
        monkeypatch.delenv(name, raising=False)
    out = StringIO()
    reporter = ConsoleReporter(limits={"num_env_steps_sampled_lifetime": 10_000},
                               console=Console(file=out, force_terminal=True, width=width))
    assert reporter.live
    return reporter, out


def test_on_a_terminal_the_line_is_live_and_messages_keep_it(monkeypatch):
    reporter, out = _live(monkeypatch, 300)
    reporter.report(_row(1, 1000, 2.0))
    reporter.report(_row(2, 2000, 4.0))
    text = out.getvalue()
    assert text.count("\r\x1b[2K") == 2 and "\n" not in text  # one line, rewritten in place
    reporter.message("stopped: 10,000 steps")
    reporter.finish()
    assert out.getvalue().split("\n")[0].endswith("ETA 16s")  # the live line was ended before the message
    assert out.getvalue().count("stopped: 10,000 steps") == 1


def _screen(text, width):
    """What a terminal ``width`` columns wide shows after ``text``: carriage returns, erased lines, new lines and
    the automatic wrap of a line written past the last column."""
    lines, col = [""], 0
    for part in re.split(r"(\r|\n|\x1b\[2K)", text):
        if part == "\r":
            col = 0
        elif part == "\n":
            lines.append("")
            col = 0
        elif part == "\x1b[2K":
            lines[-1] = ""
        else:
            for char in part:
                if col == width:  # past the last column: the terminal wraps onto a new line
                    lines.append("")
                    col = 0
                lines[-1] = lines[-1][:col].ljust(col) + char + lines[-1][col + 1:]
                col += 1
    return lines


def test_a_live_line_drops_fields_to_fit_the_terminal_never_the_elapsed_time_or_the_eta(monkeypatch):
    """An 80-column terminal (and 60, 120) shows one line with the time so far and the time left; the fields
    that do not fit (speed, episode count, ...) are dropped whole, not cut off in the middle."""
    big = {"training_iteration": 12, "num_episodes_lifetime": 31_250, "episode_return_mean": 187.5,
           "evaluation/episode_return_mean": 402.25, "env_steps_per_s": 12_500.0, "num_episodes": 0,
           "policy_lag_mean": 1.5, "policy_lag_max": 3, "learner_busy_fraction": 0.5, "queue_depth": 2}
    for width in (60, 80, 120):
        for name in _NOT_LIVE_ENV:
            monkeypatch.delenv(name, raising=False)
        out = StringIO()
        reporter = ConsoleReporter(target=475, metric="evaluation/episode_return_mean",
                                   limits={"num_env_steps_sampled_lifetime": 10_000_000},
                                   console=Console(file=out, force_terminal=True, width=width))
        reporter.report({**big, "num_env_steps_sampled_lifetime": 1_000_000, "time_total_s": 100.0})
        reporter.report({**big, "num_env_steps_sampled_lifetime": 1_200_000, "time_total_s": 116.0})
        reporter.finish()
        # 200,000 steps in 16 s: 8,800,000 left at 12,500 steps/s -> 704 s
        live = out.getvalue().rstrip("\n").rsplit("\n", 1)[-1]  # (after the line saying the expected duration)
        (shown,) = _screen(live, width)  # one line: nothing wrapped
        assert "116.0 s" in shown and "ETA 11m44s" in shown, (width, shown)
        assert "…" not in shown and len(shown) < width
        assert "402.2/475" in shown  # what the run is judged by stays longest
    assert "steps/s" in shown and "1,200,000" in shown  # 120 columns: room for more


def test_a_live_line_fits_the_terminal_and_a_warning_starts_on_a_line_of_its_own(monkeypatch):
    import logging

    reporter, out = _live(monkeypatch, 60)
    reporter.report(_row(1, 1000, 2.0))
    shown = out.getvalue().split("\r\x1b[2K")[-1]
    assert len(shown) <= 60 and shown.endswith("2.0 s")  # a wrapped line could not be rewritten in place
    narrow, out_narrow = _live(monkeypatch, 5)
    narrow.report(_row(1, 1000, 2.0))
    assert out_narrow.getvalue().split("\r\x1b[2K")[-1] == "2.0…"  # not even the time fits: cut, and said so
    narrow.finish()
    logging.getLogger("herdrl").warning("herdrl: node 127.0.0.3 is gone")
    assert out.getvalue().endswith("\n") and not reporter._pending
    reporter.finish()
    assert not any(isinstance(f, type(reporter._end_line)) for f in logging.getLogger("herdrl").filters)
