"""Helpers for the tests that run real Slurm, MPI and sshd: install them when missing (or skip, saying why),
and find processes left behind."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from herdrl.cluster.nodes import process_alive, process_table

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
HEALTH_CHECK_ENV = {  # a dead node is noticed in ~1.5 s instead of ~20 s (read by the head's GCS)
    "RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_timeout_ms": "500", "RAY_health_check_initial_delay_ms": "0",
}


@functools.cache
def _install(kind: str) -> str:
    done = subprocess.run(["bash", str(HERE / "services" / "install.sh"), kind], capture_output=True, text=True,
                          timeout=600)
    return "" if done.returncode == 0 else (done.stdout + done.stderr).strip().splitlines()[-1]


def require(kind: str) -> None:
    """Install ``kind`` (slurm, mpi, ssh) when missing; skip the test with the reason when that fails."""
    reason = _install(kind)
    if reason:
        pytest.skip(f"{kind} unavailable: {reason}")
    if kind == "mpi":
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            pytest.skip("mpi unavailable: mpi4py is not installed (pip install 'herdrl[mpi]')")


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess: this venv first on PATH, no inherited Ray address."""
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0", **extra}
    env.pop("RAY_ADDRESS", None)
    return env


def processes_matching(text: str) -> list[str]:
    """Command lines of live processes that contain ``text``."""
    return [f"{pid}: {cmd[:200]}" for pid, (_, cmd) in process_table().items()
            if pid != os.getpid() and text in cmd and process_alive(pid)]
