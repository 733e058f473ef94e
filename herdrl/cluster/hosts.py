"""A private cluster over ssh: ``herd cluster up|status|down|sync hosts.yaml`` and ``herd train --cluster``.

The hosts file (every key but ``head`` optional)::

    cluster_name: lab                 # short name; local state in ~/.herd/clusters/lab/
    head: 10.0.0.1                    # host or host:ssh_port
    workers: [10.0.0.2, 10.0.0.3:2222]
    ssh: {user: alice, key: ~/.ssh/id_ed25519, port: 22, options: ["StrictHostKeyChecking=accept-new"]}
    setup: ["source ~/venvs/herd/bin/activate"]   # run on every host before `herd`
    workdir: herd-work                # where `herd train --cluster` runs on the head (relative to its home)
    ray: {port: 6379, num_cpus: 8, num_gpus: 1, object_store_memory: 2000000000, node_ip_address: host}

Ray's own ``cluster.yaml`` for ``ray up`` with ``provider: {type: local, head_ip, worker_ips}`` is read too.

``up`` copies a fresh auth token to every host (owner-only file), starts the head, then each worker, each
waiting for Ray to come up, then waits on the head until all nodes are alive. ``down`` stops each node
by PID through its own temp dir (never ``ray stop``). A Ray driver must run on a cluster node, so
``herd train --cluster`` runs the same command on the head over ssh and copies the results back.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from herdrl.cluster.connect import ClusterError
from herdrl.cluster.nodes import NodeOptions, node_token_path, write_token
from herdrl.errors import did_you_mean, yaml_error_parts

KEYS = {"cluster_name", "head", "workers", "ssh", "setup", "workdir", "ray"}
SSH_KEYS = {"user", "key", "port", "options"}
RAY_KEYS = {"port", "num_cpus", "num_gpus", "object_store_memory", "node_ip_address", "join_timeout_s"}


@dataclass
class Host:
    """One machine: its address and the ssh port to reach it on."""

    address: str
    ssh_port: int | None = None

    @classmethod
    def parse(cls, text: Any) -> Host:
        """``host`` or ``host:port``."""
        text = str(text).strip()
        host, sep, port = text.rpartition(":")
        if sep and port.isdigit() and ":" not in host:
            return cls(host, int(port))
        if not text or any(c.isspace() for c in text):
            raise ClusterError(f"bad host '{text}' in the hosts file: expected HOST or HOST:SSH_PORT")
        return cls(text)


@dataclass
class HostsFile:
    """A parsed hosts file (see the module docstring)."""

    name: str
    head: Host
    workers: list[Host] = field(default_factory=list)
    ssh_user: str | None = None
    ssh_key: str | None = None
    ssh_port: int | None = None
    ssh_options: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    workdir: str = "."
    ray: dict[str, Any] = field(default_factory=dict)
    source: str = "hosts.yaml"  #: the file it was read from (for the commands we print)
    #: A random tag of the running cluster (kept in its state.json), in its nodes' temp dir names: a path no one
    #: can guess is a path no one can create first.
    session: str = ""

    @property
    def hosts(self) -> list[Host]:
        """Head first, then the workers."""
        return [self.head, *self.workers]

    def temp_dir(self, index: int) -> str:
        """Private dir of host ``index``'s node (0 = head) on that host: short, for Ray's socket paths."""
        return f"/tmp/herd-{self.name}-{self.session}-{index}" if self.session else f"/tmp/herd-{self.name}-{index}"

    def node_ip(self, host: Host) -> str | None:
        """The address a node announces: the host's address from the file when that is an IP literal
        (``node_ip_address: host``, the default), else Ray's own choice."""
        if self.ray.get("node_ip_address", "host") != "host":
            value = self.ray["node_ip_address"]
            return None if value == "auto" else str(value)
        try:
            ipaddress.ip_address(host.address)
        except ValueError:
            return None
        return host.address

    def ssh(self, host: Host, remote: str) -> list[str]:
        """The ``ssh`` command line running shell text ``remote`` on ``host`` (never prompts)."""
        cmd = ["ssh"]
        for option in self.ssh_options:  # first: ssh keeps the first value it gets for an option
            cmd += ["-o", option]
        cmd += ["-o", "BatchMode=yes", "-o", "ConnectTimeout=15"]
        port = host.ssh_port or self.ssh_port
        if port:
            cmd += ["-p", str(port)]
        if self.ssh_key:
            cmd += ["-i", str(Path(self.ssh_key).expanduser())]
        target = f"{self.ssh_user}@{host.address}" if self.ssh_user else host.address
        return [*cmd, target, f"bash -c {shlex.quote(remote)}"]

    def script(self, *lines: str, token_of: int | None = None) -> str:
        """Shell text for a host: stop at the first failure, the setup lines, then ``lines``; with
        ``token_of`` the auth environment names that host's token file."""
        parts = ["set -e", *self.setup]
        if token_of is not None:
            token = node_token_path(self.temp_dir(token_of))
            parts.append(f"export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token}")
        return "\n".join([*parts, *lines])


def load_hosts(path: str | Path) -> HostsFile:
    """Read and check a hosts file; one-line ClusterError naming the bad key or value."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ClusterError(f"cannot read hosts file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        where, problem = yaml_error_parts(exc, str(path))
        raise ClusterError(f"hosts file {where} is not valid YAML: {problem}") from exc
    if isinstance(data, dict) and "provider" in data:
        data = from_ray_cluster_yaml(data, str(path))
    if not isinstance(data, dict) or "head" not in data:
        raise ClusterError(f"hosts file {path} needs at least `head: HOST`")
    _check_keys(data, KEYS, str(path))
    ssh = data.get("ssh") or {}
    ray = data.get("ray") or {}
    _check_keys(ssh, SSH_KEYS, f"{path} ssh")
    _check_keys(ray, RAY_KEYS, f"{path} ray")
    name = str(data.get("cluster_name", path.stem))
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,24}", name):
        raise ClusterError(f"cluster_name '{name}' must be 1-24 letters, digits, '-' or '_'")
    workers = data.get("workers") or []
    if not isinstance(workers, list):
        raise ClusterError(f"{path}: workers must be a list of hosts")
    return HostsFile(name=name, head=Host.parse(data["head"]), workers=[Host.parse(w) for w in workers],
                     ssh_user=ssh.get("user"), ssh_key=ssh.get("key"),
                     ssh_port=int(ssh["port"]) if ssh.get("port") else None,
                     ssh_options=[str(o) for o in ssh.get("options") or []],
                     setup=[str(line) for line in data.get("setup") or []],
                     workdir=str(data.get("workdir", ".")), ray=dict(ray), source=str(path))


def from_ray_cluster_yaml(data: dict, where: str) -> dict:
    """Translate the ``cluster.yaml`` of ``ray up`` with a local provider (head_ip, worker_ips, auth,
    setup_commands) into a hosts file, so a user's existing file works with ``herd cluster up``."""
    provider = data.get("provider") or {}
    if provider.get("type") != "local":
        raise ClusterError(f"{where}: only Ray's `provider: {{type: local}}` cluster.yaml can be read (it lists "
                           "the machines); for cloud providers keep using `ray up`")
    auth = data.get("auth") or {}
    setup = [*(data.get("initialization_commands") or []), *(data.get("setup_commands") or [])]
    out: dict[str, Any] = {"head": provider.get("head_ip"), "workers": list(provider.get("worker_ips") or []),
                           "setup": setup,
                           "ssh": {k: v for k, v in (("user", auth.get("ssh_user")),
                                                     ("key", auth.get("ssh_private_key"))) if v}}
    if data.get("cluster_name"):
        out["cluster_name"] = data["cluster_name"]
    return out


def _check_keys(data: dict, allowed: set[str], where: str) -> None:
    if not isinstance(data, dict):
        raise ClusterError(f"{where}: expected a mapping")
    for key in data:
        if key not in allowed:
            raise ClusterError(f"unknown key '{key}' in {where}{did_you_mean(str(key), allowed)}; "
                               f"known: {', '.join(sorted(allowed))}")


def state_dir(hosts: HostsFile) -> Path:
    """Local state of a cluster: ``$HERD_HOME/clusters/NAME`` (default ``~/.herd``)."""
    home = Path(os.environ.get("HERD_HOME", Path.home() / ".herd"))
    return home / "clusters" / hosts.name


def _state(hosts: HostsFile) -> dict[str, Any] | None:
    """The running cluster's state (address, session tag), or None; sets ``hosts.session`` from it."""
    path = state_dir(hosts) / "state.json"
    if not path.exists():
        return None
    state = json.loads(path.read_text())
    session = str(state.get("session", ""))
    if not re.fullmatch(r"[0-9a-f]{6}|", session):  # it becomes part of a path in remote shell lines
        raise ClusterError(f"{path}: damaged session tag {session!r}; remove the file and stop the nodes by hand")
    hosts.session = session
    return state


def _run(hosts: HostsFile, host: Host, remote: str, stdin: str | None = None, timeout: float = 300) -> str:
    """Run ``remote`` on ``host``; its stdout, or ClusterError with its last error line."""
    try:
        done = subprocess.run(hosts.ssh(host, remote), input=stdin, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"ssh {host.address}: no answer within {timeout:g} s") from exc
    except FileNotFoundError as exc:
        raise ClusterError("ssh is not installed on this machine") from exc
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if "rror" in line or "denied" in line or "refused" in line]
        raise ClusterError(f"on {host.address}: {(errors or lines or ['exit ' + str(done.returncode)])[-1].strip()}")
    return done.stdout


def _node_flags(hosts: HostsFile, host: Host) -> str:
    options = NodeOptions(num_cpus=hosts.ray.get("num_cpus"), num_gpus=hosts.ray.get("num_gpus"),
                          object_store_memory=hosts.ray.get("object_store_memory"),
                          node_ip_address=hosts.node_ip(host),
                          join_timeout_s=float(hosts.ray.get("join_timeout_s", 120)))
    return shlex.join(options.cli_args())


def _start_host(hosts: HostsFile, index: int, token: str, address: str | None) -> str:
    host = hosts.hosts[index]
    temp = hosts.temp_dir(index)
    role = "--head" + (f" --port {int(hosts.ray['port'])}" if hosts.ray.get("port") else "") if address is None \
        else f"--address {shlex.quote(address)}"
    # The token arrives on stdin (never on a command line) and goes into the node's private temp dir.
    start = f"herd cluster node start {role} --temp-dir {temp} --token-stdin {_node_flags(hosts, host)}"
    out = _run(hosts, host, hosts.script(start, token_of=index), stdin=token)
    return out.strip().splitlines()[-1] if out.strip() else ""


def up(hosts: HostsFile, log: Any = print) -> dict[str, Any]:
    """Start Ray on every host (head first, then the workers) and wait until all nodes are alive."""
    state = _state(hosts)
    if state is not None:
        raise ClusterError(f"cluster '{hosts.name}' is already up at {state['address']} (per {state_dir(hosts)}); "
                           "run `herd cluster down` first")
    started = time.monotonic()
    hosts.session = secrets.token_hex(3)
    token_path = write_token(state_dir(hosts) / "ray_token")
    token = token_path.read_text()
    log(f"herd cluster up: starting the head on {hosts.head.address}")
    try:
        address = _start_host(hosts, 0, token, None)
    except BaseException:
        token_path.unlink(missing_ok=True)
        raise
    if not re.fullmatch(r"\S+:\d+", address):
        raise ClusterError(f"the head on {hosts.head.address} did not report its address (got '{address}')")
    state = {"address": address, "hosts": [h.address for h in hosts.hosts], "started": time.time(),
             "session": hosts.session}
    (state_dir(hosts) / "state.json").write_text(json.dumps(state))
    log(f"herd cluster up: head up at {address} after {time.monotonic() - started:.1f} s; "
        f"starting {len(hosts.workers)} worker(s)")
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts.workers)))) as pool:
            futures = [pool.submit(_start_host, hosts, i, token, address) for i in range(1, len(hosts.hosts))]
            for i, future in enumerate(futures, start=1):
                future.result()
                log(f"herd cluster up: worker {hosts.hosts[i].address} joined")
        wait = (f"herd cluster wait --address {shlex.quote(address)} --nodes {len(hosts.hosts)} "
                f"--timeout {float(hosts.ray.get('join_timeout_s', 120)):g}{_driver_ip_flag(hosts)}")
        _run(hosts, hosts.head, hosts.script(wait, token_of=0))
    except (ClusterError, KeyboardInterrupt) as exc:  # no half-started cluster is left behind
        log("herd cluster up: failed; stopping the nodes that started")
        try:
            down(hosts, log=lambda message: None)
        except ClusterError:
            pass  # the host that failed is usually unreachable for `down` too
        raise ClusterError(f"{exc}; the nodes that had started were stopped") from exc
    log(f"herd cluster up: {len(hosts.hosts)} Ray nodes alive at {address} after "
        f"{time.monotonic() - started:.1f} s")
    return state


def _driver_ip_flag(hosts: HostsFile) -> str:
    ip = hosts.node_ip(hosts.head)
    return f" --node-ip-address {shlex.quote(ip)}" if ip else ""


def down(hosts: HostsFile, log: Any = print) -> int:
    """Stop every node by its own temp dir (workers first; its token is inside), and remove the local state."""
    _state(hosts)  # the running cluster's session tag names its nodes' temp dirs
    failures = []
    for index in reversed(range(len(hosts.hosts))):
        temp = hosts.temp_dir(index)
        try:
            out = _run(hosts, hosts.hosts[index], hosts.script(
                f"herd cluster node stop --temp-dir {temp} --remove-files"))  # the token goes with the temp dir
            log(f"herd cluster down: {hosts.hosts[index].address}: {out.strip()}")
        except ClusterError as exc:
            failures.append(str(exc))
            log(f"herd cluster down: {exc}")
    for name in ("state.json", "ray_token"):
        (state_dir(hosts) / name).unlink(missing_ok=True)
    if failures:
        raise ClusterError(f"{len(failures)} host(s) could not be stopped: {failures[0]}")
    return 0


def status(hosts: HostsFile) -> str:
    """The cluster's alive nodes, asked on the head (a Ray driver must run on a node)."""
    state = _state(hosts)
    if state is None:
        raise ClusterError(f"cluster '{hosts.name}' is not up (no state in {state_dir(hosts)}); "
                           "start it with `herd cluster up`")
    return _run(hosts, hosts.head, hosts.script(
        f"herd cluster status --address {shlex.quote(state['address'])}{_driver_ip_flag(hosts)}", token_of=0))


def sync(hosts: HostsFile, results: str, log: Any = print) -> Path:
    """Copy ``results`` (relative to the head's workdir) from the head to the same path here, with rsync."""
    ssh = hosts.ssh(hosts.head, "")[:-2]  # the ssh options without target and command
    target = f"{hosts.ssh_user}@{hosts.head.address}" if hosts.ssh_user else hosts.head.address
    remote_path = results if results.startswith(("/", "~")) else f"{hosts.workdir.rstrip('/')}/{results}"
    local = Path(results if not results.startswith("~") else Path(results).expanduser())
    local.mkdir(parents=True, exist_ok=True)
    cmd = ["rsync", "-az", "-e", shlex.join(ssh), f"{target}:{remote_path.rstrip('/')}/", f"{local}/"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise ClusterError("rsync is not installed on this machine") from exc
    if done.returncode != 0:
        raise ClusterError(f"rsync from {hosts.head.address} failed: {done.stderr.strip().splitlines()[-1]}")
    log(f"herd cluster sync: {target}:{remote_path} -> {local.resolve()}")
    return local


def remote_path(path: str) -> str:
    """``path`` quoted for the remote shell, keeping a leading ``~`` (the remote home) expandable."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def train_on_head(hosts: HostsFile, train_args: list[str], detach: bool = False) -> int:
    """Run ``herd train TRAIN_ARGS`` on the head (joined to the cluster), streaming its output, then copy its
    results back here; returns the remote exit code. ``detach``: start it in the background on the head
    (it survives this terminal) and return at once; copy results later with :func:`sync`."""
    state = _state(hosts)
    if state is None:
        raise ClusterError(f"cluster '{hosts.name}' is not up: run `herd cluster up` with this hosts file first")
    args = [*train_args, "--address", state["address"]]
    ip = hosts.node_ip(hosts.head)
    if ip and "--node-ip-address" not in args:
        args += ["--node-ip-address", ip]
    workdir = remote_path(hosts.workdir)
    command = shlex.join(["herd", "train", *args])
    results = _output_of(train_args)
    if detach:
        # (a random tail: two detached runs started in the same second must not share a log)
        log = f"herd-train-{time.strftime('%Y-%m-%d_%H-%M-%S')}-{secrets.token_hex(3)}.log"
        out = _run(hosts, hosts.head, hosts.script(
            f"mkdir -p {workdir} && cd {workdir}", f"nohup {command} > {log} 2>&1 < /dev/null &",
            f'echo "$PWD/{log}"', token_of=0))
        log_path = out.strip().splitlines()[-1]
        print(f"herd train --cluster: running detached on {hosts.head.address}; its output: {log_path}\n"
              f"  follow it:    {shlex.join(hosts.ssh(hosts.head, 'tail -f ' + shlex.quote(log_path)))}\n"
              f"  copy results: herd cluster sync {shlex.quote(hosts.source)} {shlex.quote(results)}", flush=True)
        return 0
    remote = hosts.script(f"mkdir -p {workdir} && cd {workdir}", "set +e", command, token_of=0)
    print(f"herd train --cluster: running on {hosts.head.address} in {hosts.workdir}", flush=True)
    rc = subprocess.call(hosts.ssh(hosts.head, remote))
    try:
        sync(hosts, results)
    except ClusterError as exc:
        print(f"herd train --cluster: results stay on the head: {exc}", file=sys.stderr)
    return rc


def _output_of(train_args: list[str]) -> str:
    for i, arg in enumerate(train_args):
        if arg == "--output" and i + 1 < len(train_args):
            return train_args[i + 1]
        if arg.startswith("--output="):
            return arg.split("=", 1)[1]
    return "results"
