"""One Ray node of a herdrl cluster: start it, stop it by its own temp dir, wait for a cluster to assemble.

Every launcher (Slurm, MPI, PBS, ssh) is built from these three steps, run on each node:

* :func:`start_node` runs ``ray start`` with a temp dir of its own and free ports picked on that host, so
  several jobs (or several fake nodes) share a host without colliding, and token auth on.
* :func:`stop_node` stops the node by PID — the processes whose command line names its temp dir and their
  children. Never ``ray stop``: that kills every Ray process on the host, other users' clusters included.
* :func:`wait_for_nodes` polls (bounded) until the head answers and N nodes are alive: no fixed sleeps.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from herdrl.cluster.connect import ClusterError, wait_for_port
from herdrl.survival import health_check_env

RAY_START = [sys.executable, "-m", "ray.scripts.scripts", "start"]
AUTH_TOKEN_FILE = "ray_token"


def free_port(host: str = "", low: int = 20000, high: int = 32000, exclude: Collection[int] = ()) -> int:
    """A TCP port free on this host, outside Ray's worker port range (10002-19999) and the ephemeral range, and
    not in ``exclude``: the ports already picked for the same ``ray start``, which a probe cannot see (they are
    not bound yet; Ray refuses two components on one port)."""
    for _ in range(500):
        port = low + secrets.randbelow(high - low)
        if port in exclude:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
                return port
            except OSError:
                continue
    raise ClusterError(f"no free TCP port between {low} and {high} on this host")


def write_token(path: str | Path, token: str | None = None) -> Path:
    """Write ``token`` (default: a fresh random one) to ``path`` as Ray's auth token file, owner-only.

    The token goes into a new file of our own (mode 0600) that then replaces ``path``: a file or link someone else
    put at ``path`` is never written through, and never keeps its own mode.
    """
    from herdrl.logger import write_text_atomic

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, token or secrets.token_hex(32), mode=0o600)
    except OSError as exc:
        raise ClusterError(f"cannot write the cluster token to {path}: {exc.strerror} (a file of another user, or "
                           "a directory?)") from None
    return path


def private_dir(path: str | Path) -> Path:
    """``path`` as a directory only we can enter: created with mode 0700, or, if it exists, checked to be a real
    directory (not a link) of ours that no one else can read or write. A node's Ray files, logs, markers and its
    token live in one: under ``/tmp`` anyone could otherwise create or link the path first and read the token
    (and with it, run code on the cluster as us). ClusterError when it is not private."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    if is_private(path):
        return path
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ClusterError(f"'{path}' is a link or not a directory: a node's Ray files and token go only into a "
                           "private directory of this user's; remove it or choose another --temp-dir")
    raise ClusterError(f"'{path}' belongs to uid {info.st_uid} (this user is {os.geteuid()}) or is open to "
                       f"others (mode {stat.S_IMODE(info.st_mode):o}): a node's Ray files and token go only into "
                       "a private directory of this user's; remove it or choose another --temp-dir")


def ray_temp_dir(temp_dir: str | Path) -> Path:
    """Ray's own temp dir of the node whose (private) dir is ``temp_dir``: inside it, as Ray makes its temp dir
    world-writable (0777) for users who share one; within a private parent nobody else can reach it."""
    return Path(temp_dir) / "ray"


def is_private(path: str | Path) -> bool:
    """Whether ``path`` is a directory :func:`private_dir` would accept (nothing is created)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and not stat.S_ISLNK(info.st_mode) and info.st_uid == os.geteuid()
            and not info.st_mode & 0o077)


def node_token_path(temp_dir: str | Path) -> Path:
    """The auth token file of the node whose private dir is ``temp_dir``."""
    return Path(temp_dir) / "herd-token"


def write_node_token(temp_dir: str | Path, token: str | None = None) -> Path:
    """Make ``temp_dir`` private (:func:`private_dir`) and write the node's token into it; returns its path."""
    return write_token(node_token_path(private_dir(temp_dir)), token)


def auth_env(token_path: str | Path) -> dict[str, str]:
    """Environment every node and the driver need to share one token-authenticated cluster."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(Path(token_path).resolve()),
            "RAY_USAGE_STATS_ENABLED": "0"}


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (e.g. ``ib0``) on this host."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError as exc:
            raise ClusterError(f"network interface '{name}' has no IPv4 address here ({exc.strerror}); "
                               f"list them with `ip -4 addr`") from exc
    return socket.inet_ntoa(packed[20:24])


@dataclass
class NodeSpec:
    """What one ``ray start`` needs. ``address`` is the head's ``HOST:PORT`` for a worker, None for the head."""

    temp_dir: Path
    address: str | None = None
    port: int | None = None
    node_ip_address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    object_store_memory: int | None = None
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def head(self) -> bool:
        """True for the head node (no address to join)."""
        return self.address is None

    def ray_start_args(self) -> list[str]:
        """``ray start`` arguments; fixed ports are picked free on this host and distinct (others Ray picks)."""
        taken = {self.port} if self.port else set()

        def pick() -> int:
            port = free_port(exclude=taken)
            taken.add(port)
            return port

        args = [f"--temp-dir={ray_temp_dir(self.temp_dir)}", f"--dashboard-agent-listen-port={pick()}"]
        if self.head:
            args += ["--head", f"--port={self.port or pick()}", "--include-dashboard=false",
                     f"--ray-client-server-port={pick()}"]
        else:
            args.append(f"--address={self.address}")
        if self.node_ip_address:
            args.append(f"--node-ip-address={self.node_ip_address}")
        for flag, value in (("num-cpus", self.num_cpus), ("num-gpus", self.num_gpus),
                            ("object-store-memory", self.object_store_memory)):
            if value is not None:
                args.append(f"--{flag}={value}")
        if self.resources:
            args.append(f"--resources={json.dumps(self.resources)}")
        return args


@dataclass
class NodeOptions:
    """Per-node settings every launcher passes to ``ray start``."""

    num_cpus: int | None = None
    num_gpus: int | None = None
    port: int | None = None
    node_ip_address: str | None = None
    interface: str | None = None
    object_store_memory: int | None = None
    join_timeout_s: float = 300.0

    def node_ip(self) -> str | None:
        """The address this node announces: ``--node-ip-address``, else ``--interface``'s, else Ray's pick."""
        if self.node_ip_address:
            return self.node_ip_address
        if self.interface:
            return interface_address(self.interface)
        return None

    def spec(self, temp_dir: str | Path, address: str | None = None) -> NodeSpec:
        """The ``ray start`` of one node on this host: the head (no ``address``) or a worker joining it."""
        return NodeSpec(Path(temp_dir), address=address, port=self.port if address is None else None,
                        node_ip_address=self.node_ip(), num_cpus=self.num_cpus, num_gpus=self.num_gpus,
                        object_store_memory=self.object_store_memory)

    def cli_args(self) -> list[str]:
        """The same options as ``herd cluster node`` / ``herd launch mpi`` flags, for scripts and ssh."""
        args: list[str] = []
        for flag, value in (("--num-cpus", self.num_cpus), ("--num-gpus", self.num_gpus), ("--port", self.port),
                            ("--node-ip-address", self.node_ip_address), ("--interface", self.interface),
                            ("--object-store-memory", self.object_store_memory)):
            if value is not None:
                args += [flag, str(value)]
        return [*args, "--join-timeout", f"{self.join_timeout_s:g}"]


def exit_on_sigterm() -> None:
    """Turn SIGTERM (a cancelled job, ``mpirun`` or ``srun`` ending a step) into SystemExit, so ``finally``
    blocks stop this host's Ray node."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def default_node_ip() -> str:
    """This host's outward address, found the way Ray finds it (the source address of a UDP socket
    "connected" to a public address; no packet is sent) without importing Ray (~1 s)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("8.8.8.8", 80))
            return probe.getsockname()[0]
    except OSError:  # no route out (e.g. a network namespace): Ray's own fallbacks
        from ray.util import get_node_ip_address

        return get_node_ip_address()


def start_node(spec: NodeSpec, block: bool = False, timeout_s: float = 120.0) -> tuple[str, subprocess.Popen | None]:
    """Start one Ray node; returns the cluster address (``HOST:PORT`` of the head) and, with ``block``, the
    ``ray start --block`` process (the node lives as long as it does).

    Either way this returns once ``ray start`` reports the node up (a worker has then joined the head).
    Raises ClusterError with Ray's last error line when the start fails.
    """
    spec.temp_dir = Path(spec.temp_dir)
    if spec.head and not spec.node_ip_address:  # the address we announce is the one the head uses
        spec.node_ip_address = default_node_ip()
    if len(str(ray_temp_dir(spec.temp_dir))) > 60:  # Ray puts unix sockets under it; paths are limited to 107 bytes
        raise ClusterError(f"Ray temp dir '{spec.temp_dir}' is too long for Ray's socket paths; use a short "
                           "path such as /tmp/herd-<job>")
    private_dir(spec.temp_dir)  # before anything is written there: its log, its marker, Ray's sockets
    args = spec.ray_start_args()
    port = next((a.split("=", 1)[1] for a in args if a.startswith("--port=")), None)
    address = f"{spec.node_ip_address}:{port}" if spec.head else str(spec.address)
    # A dead node noticed in seconds, not ~20 s (read by the head's GCS; a value set in the environment wins).
    env = {**os.environ, **health_check_env()}
    if not block:
        try:
            done = subprocess.run([*RAY_START, *args], capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired as exc:
            stop_node(spec.temp_dir)
            raise ClusterError(f"`ray start` did not finish within {timeout_s:g} s (is the head at "
                               f"{spec.address} reachable?)") from exc
        if done.returncode != 0:
            raise ClusterError(f"`ray start` failed: {_last_error_line(done.stderr + done.stdout)}")
        return address, None
    log_path = node_log(spec.temp_dir)
    with open(log_path, "ab") as log:  # Ray's start-up banner stays out of the job's output
        proc = subprocess.Popen([*RAY_START, *args, "--block"], stdout=log, stderr=subprocess.STDOUT, env=env)
    _wait_until_started(proc, spec.temp_dir, timeout_s)
    if spec.head:
        wait_for_port(address, timeout_s)
    return address, proc


RAY_STARTED = "Ray runtime started"  # what `ray start` prints once every process of the node is up


def _wait_until_started(proc: subprocess.Popen, temp_dir: Path, timeout_s: float) -> None:
    """Poll the node's start-up log until Ray says it started; ClusterError at once if ``ray start`` exits
    first (a GCS can already answer while the raylet is failing), or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    log_path = node_log(temp_dir)
    while True:
        text = log_path.read_text(errors="replace")
        if RAY_STARTED in text:
            return
        if proc.poll() is not None or time.monotonic() >= deadline:
            proc.terminate()
            stop_node(temp_dir)
            why = "exited" if proc.poll() is not None else f"did not start within {timeout_s:g} s"
            raise ClusterError(f"the Ray node {why}: {_last_error_line(text)} (log: {log_path})")
        time.sleep(0.1)


def node_log(temp_dir: str | Path) -> Path:
    """Where ``ray start``'s own output goes: in the node's (private) temp dir."""
    return Path(temp_dir) / "herd-node.log"


def stopping_marker(temp_dir: str | Path) -> Path:
    """File :func:`stop_node` creates before stopping a node, so its foreground starter exits 0, not 1."""
    return Path(temp_dir) / "herd-stopping"


def remove_node_files(temp_dir: str | Path) -> None:
    """Delete a stopped node's temp dir: Ray's files, its start-up log, marker and token (kept instead when a run
    failed, for its logs)."""
    import shutil

    shutil.rmtree(temp_dir, ignore_errors=True)


def _last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no output"])[-1]


def process_table(own: bool = False) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) for every process we can see (``own``: this user's only)."""
    table = {}
    me = os.geteuid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if own and entry.stat().st_uid != me:
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            fields = (entry / "stat").read_text()
            ppid = int(fields.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry.name)] = (ppid, cmd)
    return table


def node_pids(temp_dir: str | Path) -> list[int]:
    """PIDs of the node whose temp dir is ``temp_dir``: this user's processes naming it, and all their descendants
    (another user's process that happens to name the same path is none of ours to stop)."""
    marker = str(temp_dir).rstrip("/") + "/"
    marker_eq = "=" + str(temp_dir).rstrip("/")
    table = process_table(own=True)
    me = os.getpid()
    found = {pid for pid, (_, cmd) in table.items()
             if pid != me and (marker in cmd or cmd.rstrip().endswith(marker_eq) or marker_eq + " " in cmd)}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in table.items() if ppid in found and pid != me} - found
        found |= children
        grew = bool(children)
    # A head started by a `ray start` that has exited leaves its Ray Client server orphaned, naming only the
    # cluster's address: find it through the address Ray records in the head's temp dir.
    # (Ray's temp dir is <temp_dir>/ray for nodes herdrl starts; a node started by hand may use temp_dir itself.)
    for recorded in (ray_temp_dir(temp_dir) / "ray_current_cluster", Path(temp_dir) / "ray_current_cluster"):
        if any("gcs_server" in table[pid][1] for pid in found) and recorded.exists():
            needle = f"--address={recorded.read_text().strip()} "
            found |= {pid for pid, (_, cmd) in table.items() if "ray.util.client.server" in cmd and needle in cmd}
    return sorted(found)


def stop_node(temp_dir: str | Path, grace_s: float = 3.0, remove_files: bool = False) -> int:
    """SIGTERM the node's processes, SIGKILL what is left after ``grace_s``; returns how many there were.

    (Ray's GCS ignores SIGTERM for several seconds, hence the SIGKILL.) ``remove_files`` deletes the node's
    temp dir and log afterwards — or leaves that to the node's ``herd cluster node start --block`` process,
    which exits 0 (a deliberate stop, not a crash) and removes them itself.
    """
    pids = node_pids(temp_dir)
    if pids and is_private(temp_dir):  # tells a foreground `herd cluster node start --block` it ends on purpose
        with contextlib.suppress(OSError):  # gone meanwhile: the node's processes are stopped regardless
            stopping_marker(temp_dir).write_text("remove" if remove_files else "keep")
    total = len(pids)
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        for pid in list(pids):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError:  # a process that became another user's: skip it, stop ours
                pids.remove(pid)
                total -= 1
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(process_alive(p) for p in pids):
            time.sleep(0.1)
        pids = [p for p in pids if process_alive(p)]
        if not pids:
            break
    if not _foreground_starter(temp_dir):
        if remove_files:
            remove_node_files(temp_dir)
        with contextlib.suppress(OSError):
            stopping_marker(temp_dir).unlink(missing_ok=True)
    return total


def _foreground_starter(temp_dir: str | Path) -> bool:
    needle = f"--temp-dir {str(temp_dir).rstrip('/')} "
    return any("cluster node start" in cmd and needle in cmd + " "
               for pid, (_, cmd) in process_table(own=True).items() if pid != os.getpid())


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped, counts as ended)."""
    if not Path("/proc/self").exists():  # no /proc (e.g. macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, OverflowError, ValueError):
            return False
        except PermissionError:
            return True
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@contextlib.contextmanager
def _short_driver(address: str, node_ip_address: str | None, timeout_s: float) -> Iterator[Any]:
    """``ray`` connected to ``address`` for the duration of the block (port checked first, bounded)."""
    import logging

    import ray

    from herdrl.cluster.connect import _quiet_auth_warning

    _quiet_auth_warning()
    wait_for_port(address, timeout_s)
    kwargs = {"_node_ip_address": node_ip_address} if node_ip_address else {}
    os.environ["RAY_ADDRESS"] = address  # ray.init prefers RAY_ADDRESS over its argument
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, **kwargs)
    try:
        yield ray
    finally:
        ray.shutdown()


def alive_nodes(address: str, node_ip_address: str | None = None, timeout_s: float = 30.0) -> list[dict]:
    """The alive nodes of the cluster at ``address`` (``ray.nodes()`` entries), seen from a short driver."""
    with _short_driver(address, node_ip_address, timeout_s) as ray:
        return [n for n in ray.nodes() if n["Alive"]]


def wait_for_nodes(address: str, count: int, timeout_s: float = 120.0, node_ip_address: str | None = None,
                   on_progress: Callable[[int, int], None] | None = None,
                   check: Callable[[], None] | None = None) -> int:
    """Block until the cluster at ``address`` has ``count`` alive nodes; returns that count.

    Polls every half second, calling ``check`` (which may raise to give up early); ClusterError after
    ``timeout_s`` saying how many joined.
    """
    deadline = time.monotonic() + timeout_s
    with _short_driver(address, node_ip_address, timeout_s) as ray:
        seen = -1
        while True:
            alive = sum(1 for n in ray.nodes() if n["Alive"])
            if alive != seen and on_progress is not None:
                on_progress(alive, count)
            seen = alive
            if alive >= count:
                return alive
            if check is not None:
                check()
            if time.monotonic() >= deadline:
                raise ClusterError(f"only {alive} of {count} Ray nodes joined {address} within {timeout_s:g} s; "
                                   "see the nodes' logs (their --temp-dir/ray/session_latest/logs)")
            time.sleep(0.5)
