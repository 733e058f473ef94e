"""A real multi-node Ray cluster on this host for tests: `ray start` processes on their own loopback
addresses, each with its own temp dir, torn down by PID (never `ray stop`, which kills every Ray process
on the host)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")


def free_port(low: int = 20000, high: int = 30000) -> int:
    """A free TCP port outside Ray's default worker port range (10002-19999)."""
    for _ in range(200):
        port = low + secrets.randbelow(high - low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port")


class RayStartCluster:
    """Head on 127.0.0.2 plus workers on 127.0.0.3, ...; token auth on with a private token file."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hr", dir="/tmp"))  # short: Ray's socket paths have a limit
        token = self.root / "token"
        token.write_text(secrets.token_hex(32))
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.env.pop("RAY_ADDRESS", None)
        self.port = free_port()
        self.address = f"127.0.0.2:{self.port}"

    def _start(self, args: list[str], temp: str) -> None:
        subprocess.run([RAY, "start", *args, f"--temp-dir={self.root / temp}", "--num-cpus=1",
                        f"--dashboard-agent-listen-port={free_port()}", "--object-store-memory=80000000"],
                       env=self.env, check=True, capture_output=True, text=True, timeout=120)

    def start(self, workers: int = 1) -> RayStartCluster:
        """Start the head, then the workers (each waits for the previous: `ray start` returns when up)."""
        self._start(["--head", "--node-ip-address=127.0.0.2", f"--port={self.port}", "--include-dashboard=false",
                     f"--ray-client-server-port={free_port()}"], "h")
        for i in range(workers):
            self._start([f"--address={self.address}", f"--node-ip-address=127.0.0.{3 + i}"], f"w{i}")
        return self

    def pids(self) -> list[int]:
        """Processes of this cluster: those whose command line names our temp dir or our head address."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(self.root) in cmd or f"--address={self.address}" in cmd or f"{self.address} " in cmd:
                found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """SIGTERM our processes, SIGKILL what is left after a grace period, remove the temp dir."""
        pids = self.pids()
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
                time.sleep(0.1)
            pids = [p for p in pids if Path(f"/proc/{p}").exists()]
            if not pids:
                break
        shutil.rmtree(self.root, ignore_errors=True)
