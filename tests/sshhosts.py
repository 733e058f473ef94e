"""Two "hosts" for the ssh tests: sshd daemons on 127.0.0.2 and 127.0.0.3 (free ports), with host and client
keys generated here and accepting only that client key. Stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from herdrl.cluster.nodes import free_port

CONFIG = """\
Port {port}
ListenAddress {address}
HostKey {root}/host_key
PidFile {root}/sshd-{index}.pid
AuthorizedKeysFile {root}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
LogLevel ERROR
"""


class SshHosts:
    """``with SshHosts(["127.0.0.2", "127.0.0.3"]) as hosts: hosts.entries, hosts.key``"""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        self.root = Path(tempfile.mkdtemp(prefix="herd-ssh-", dir="/tmp"))
        self.key = self.root / "client_key"
        self.entries: list[str] = []

    def start(self) -> SshHosts:
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / name)], check=True)
        shutil.copy(self.root / "client_key.pub", self.root / "authorized_keys")
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation dir
        for index, address in enumerate(self.addresses):
            port = free_port(address)
            config = self.root / f"sshd-{index}.conf"
            config.write_text(CONFIG.format(port=port, address=address, root=self.root, index=index))
            started = subprocess.run([sshd, "-f", str(config), "-E", str(self.root / f"sshd-{index}.log")],
                                     capture_output=True, text=True)
            if started.returncode != 0:
                raise RuntimeError(f"sshd did not start: {started.stderr.strip()[-300:]}")
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection((address, port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sshd on {address}:{port} does not answer") from None
                    time.sleep(0.1)
            self.entries.append(f"{address}:{port}")
        return self

    def stop(self) -> None:
        for pidfile in self.root.glob("sshd-*.pid"):
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            except (ValueError, ProcessLookupError):
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SshHosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
