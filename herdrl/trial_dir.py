"""Trial folders that two runs never share: created atomically, locked for the life of a run.

A run holds an exclusive ``flock`` on ``<trial>/.herd.lock`` until it ends; the kernel releases it when the
process dies, however it dies, so a killed run's lock is taken over by the next run (which says so). The file
names the holder (host, pid, start time) for the message a second run gets. File systems without ``flock``
(some parallel file systems) fall back to the holder's pid: a live process on this host holds the trial.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

from herdrl.errors import HerdError

logger = logging.getLogger("herdrl")

LOCK_FILE = ".herd.lock"


class TrialBusy(HerdError):
    """Another live run holds the trial folder."""


def create_unique_dir(path: Path, mode: int = 0o777) -> Path:
    """Create ``path`` atomically (``mode``, less the umask) and return it; if it exists, ``path_2``, ``path_3``,
    ... (the first that this process creates: two processes naming a folder in the same second never share it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate, n = path, 1
    while True:
        try:
            candidate.mkdir(mode)
            return candidate
        except FileExistsError:
            n += 1
            candidate = path.with_name(f"{path.name}_{n}")


def create_trial_dir(path: Path, exact: bool) -> Path:
    """Create ``path`` atomically and return it. ``exact=False`` (a generated name): if it exists, take
    ``path_2``, ``path_3``, ... (:func:`create_unique_dir`). ``exact=True``: an existing folder is returned as is
    (the caller's lock then decides whether it may be used)."""
    if not exact:
        return create_unique_dir(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    return path


def _holder_alive(holder: dict[str, Any]) -> bool:
    if holder.get("host") != socket.gethostname():
        return True  # cannot be checked from here: assume it runs
    from herdrl.cluster.nodes import process_alive

    try:
        return process_alive(int(holder["pid"]))
    except (KeyError, ValueError, TypeError):
        return True


class TrialLock:
    """The exclusive right to write into a trial folder (``with TrialLock(dir): ...`` or ``acquire/release``)."""

    def __init__(self, trial_dir: Path) -> None:
        self.path = Path(trial_dir) / LOCK_FILE
        self._fd: int | None = None

    def _open(self, flags: int) -> int:
        """The lock file's descriptor: a regular file only, never through a link (a crafted folder could point
        it at a file of the user's, which the lock would truncate) and never blocking (a FIFO)."""
        try:
            fd = os.open(self.path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise HerdError(f"{self.path}: cannot be used as a lock ({exc.strerror}); remove it") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise HerdError(f"{self.path}: not a regular file; remove it")
        return fd

    def _read_holder(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self) -> None:
        """Take the lock, or raise :class:`TrialBusy` naming the live run that holds it."""
        import fcntl

        fd = self._open(os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            busy = self._busy_after(exc)
            if busy is not None:
                os.close(fd)
                raise busy from None
        holder = self._read_holder()  # ours now: whatever it names ended without releasing it
        if holder.get("pid") and holder.get("pid") != os.getpid():
            logger.warning("herdrl: %s: taking over from a run that ended without releasing it (pid %s on %s)",
                           self.path.parent, holder.get("pid"), holder.get("host"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        self._fd = fd

    def check_free(self) -> None:
        """Raise :class:`TrialBusy` if a live run holds the lock; take nothing (a quick look before work)."""
        import fcntl

        if not self.path.exists():
            return
        fd = self._open(os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            busy = self._busy_after(exc)
            if busy is not None:
                raise busy from None
        finally:
            os.close(fd)  # closing drops the look's own lock, if it got one

    def _busy_after(self, exc: OSError) -> TrialBusy | None:
        """What a failed ``flock`` means: the lock is held (:class:`TrialBusy`), or, on a file system without
        ``flock``, held if the pid in the file is a live run's (None: free)."""
        holder = self._read_holder()
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return self._busy(holder)
        if holder.get("pid") and _holder_alive(holder) and holder.get("pid") != os.getpid():
            return self._busy(holder, checked=holder.get("host") == socket.gethostname())
        return None

    def _busy(self, holder: dict[str, Any], checked: bool = True) -> TrialBusy:
        who = (f"run pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
               if holder else "another run")
        gone = "" if checked else f" (if that run is gone, delete {self.path})"
        return TrialBusy(f"trial {self.path.parent} is in use by {who}: wait for it to end, or choose "
                         f"another --trial{gone}")

    def release(self) -> None:
        """Give the lock up (the file stays, empty: deleting it would let two runs lock different files)."""
        if self._fd is None:
            return
        import fcntl

        os.ftruncate(self._fd, 0)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        except OSError:
            pass  # no flock on this file system: the emptied file is the release
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> TrialLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
