"""A real multi-node Ray cluster on this host for tests: `ray start` processes on their own loopback
addresses, each with its own temp dir, torn down by PID (never `ray stop`, which kills every Ray process
on the host)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from herdrl.cluster.nodes import free_port, node_pids, process_table, stop_node

RAY = str(Path(sys.executable).parent / "ray")


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
        self.client_port = free_port(exclude={self.port})
        self.address = f"127.0.0.2:{self.port}"
        self.temps: list[Path] = []  # the nodes' temp dirs, head first

    def _start(self, args: list[str], temp: str, num_cpus: int = 1, env: dict[str, str] | None = None) -> None:
        self.temps.append(self.root / temp)
        subprocess.run([RAY, "start", *args, f"--temp-dir={self.root / temp}", f"--num-cpus={num_cpus}",
                        f"--dashboard-agent-listen-port={free_port(exclude={self.port, self.client_port})}",
                        "--object-store-memory=80000000"],
                       env={**self.env, **(env or {})}, check=True, capture_output=True, text=True, timeout=120)

    def start(self, workers: int = 1, head_cpus: int = 1, worker_cpus: int = 1,
              fast_health_checks: bool = False) -> RayStartCluster:
        """Start the head, then the workers (each waits for the previous: `ray start` returns when up).
        ``fast_health_checks``: a dead node is noticed in ~1.5 s instead of ~20 s (the settings of
        ``../shared/infra``, read by the head's GCS)."""
        health = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3",
                  "RAY_health_check_timeout_ms": "500", "RAY_health_check_initial_delay_ms": "0"}
        self._start(["--head", "--node-ip-address=127.0.0.2", f"--port={self.port}", "--include-dashboard=false",
                     f"--ray-client-server-port={self.client_port}"], "h", head_cpus,
                    health if fast_health_checks else None)
        for _ in range(workers):
            self.add_worker(worker_cpus)
        return self

    def add_worker(self, cpus: int = 1) -> str:
        """Start one more worker node, on the next loopback address; returns that address."""
        index = len(self.temps) - 1
        ip = f"127.0.0.{3 + index}"
        self._start([f"--address={self.address}", f"--node-ip-address={ip}"], f"w{index}", cpus)
        return ip

    def pids(self) -> list[int]:
        """Processes of this cluster: each node's (herdrl's lookup through its temp dir), and any process naming
        the head's address (checked again after the temp dirs are gone)."""
        named = {pid for pid, (_, cmd) in process_table().items() if pid != os.getpid()
                 and (f"--address={self.address}" in cmd or f"{self.address} " in cmd)}
        return sorted(named.union(*(node_pids(temp) for temp in self.temps)))

    def stop(self) -> None:
        """Stop every node by PID (workers first), remove the temp dir."""
        for temp in reversed(self.temps):
            stop_node(temp)
        shutil.rmtree(self.root, ignore_errors=True)
