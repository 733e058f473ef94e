"""The per-node pieces every launcher is built from (no Ray started here)."""

from __future__ import annotations

import secrets
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from herdrl.cluster.connect import ClusterError
from herdrl.cluster.nodes import (
    NodeSpec,
    auth_env,
    free_port,
    interface_address,
    node_pids,
    private_dir,
    process_alive,
    process_table,
    remove_node_files,
    start_node,
    stop_node,
    stopping_marker,
    write_node_token,
    write_token,
)

# xdist_group: one worker runs these one at a time (loopback node IPs, services, machine-wide checks; see conftest)
pytestmark = pytest.mark.xdist_group("cluster")


def test_free_ports_avoid_rays_worker_range() -> None:
    ports = {free_port() for _ in range(50)}
    assert all(20000 <= p < 32000 for p in ports)


def test_the_ports_of_one_ray_start_are_distinct(monkeypatch, tmp_path: Path) -> None:
    """Ray refuses two components on one port (seen once in the suite: --port and --ray-client-server-port both 24031).
    The random draws here repeat on purpose: the launcher's fixed --port, then the same port again."""
    with pytest.raises(ClusterError, match="no free TCP port"):  # the only port in range is excluded
        free_port(low=20001, high=20002, exclude={20001})
    draws = iter([4031, 4031, 4031, 5000, 5000, 6000])
    monkeypatch.setattr("herdrl.cluster.nodes.secrets.randbelow", lambda n: next(draws))
    args = NodeSpec(tmp_path, port=24031).ray_start_args()
    ports = [int(a.split("=")[1]) for a in args if a.split("=")[0].endswith("port")]
    assert len(ports) == 3 and len(set(ports)) == 3, args


def test_token_file_is_private_and_env_names_it(tmp_path: Path) -> None:
    path = write_token(tmp_path / "sub" / "ray_token")
    assert len(path.read_text()) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert write_token(path, "abc").read_text() == "abc"
    env = auth_env(path)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == str(path.resolve())


def test_a_token_is_never_written_through_a_file_or_link_someone_else_put_there(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "linked_token"
    link.symlink_to(victim)
    write_token(link, "secret")
    assert victim.read_text() == "precious" and not link.is_symlink() and link.read_text() == "secret"
    open_file = tmp_path / "open_token"
    open_file.write_text("")
    open_file.chmod(0o666)  # created first by someone else, world-readable
    inode = open_file.stat().st_ino
    write_token(open_file, "secret")
    assert stat.S_IMODE(open_file.stat().st_mode) == 0o600 and open_file.stat().st_ino != inode
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left behind


def test_a_nodes_files_live_only_in_a_private_directory(tmp_path: Path) -> None:
    fresh = private_dir(tmp_path / "fresh")
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    assert private_dir(fresh) == fresh  # ours, private: taken again
    token = write_node_token(tmp_path / "node", "abc")
    assert token.parent == tmp_path / "node" and stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    assert stopping_marker(tmp_path / "node").parent == tmp_path / "node"
    short = Path(f"/tmp/herd-t{secrets.token_hex(3)}")  # short: Ray's socket paths under it must fit
    shared, linked, elsewhere = Path(f"{short}s"), Path(f"{short}l"), tmp_path / "elsewhere"
    try:
        shared.mkdir()
        shared.chmod(0o777)  # pre-created, open to everyone (as another user's would be to us)
        elsewhere.mkdir(mode=0o700)
        linked.symlink_to(elsewhere)
        for path, why in ((shared, "open to others"), (linked, "a link")):
            with pytest.raises(ClusterError, match=why):
                write_node_token(path, "abc")
            with pytest.raises(ClusterError, match=why):  # refused before `ray start` is run
                start_node(NodeSpec(path, node_ip_address="127.0.0.2"), timeout_s=5)
        assert not list(shared.iterdir()) and not list(elsewhere.iterdir())
    finally:
        shared.rmdir()
        linked.unlink()


def test_stop_node_skips_a_process_it_may_not_signal_and_stops_its_own(tmp_path: Path, monkeypatch) -> None:
    import os

    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--temp-dir={tmp_path}"])
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        if pid == 1:  # stands for another user's process matching the marker
            raise PermissionError(1, "Operation not permitted")
        real_kill(pid, sig)

    monkeypatch.setattr("herdrl.cluster.nodes.node_pids", lambda temp_dir: [1, ours.pid])
    monkeypatch.setattr("herdrl.cluster.nodes.os.kill", kill)
    try:
        assert stop_node(tmp_path, grace_s=2.0) == 1  # ours; the other is not counted as stopped
        assert ours.wait(timeout=5) is not None
    finally:
        ours.kill()


def test_interface_address() -> None:
    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(ClusterError, match="no-such-if0"):
        interface_address("no-such-if0")


def test_ray_start_arguments_for_head_and_worker(tmp_path: Path) -> None:
    head = NodeSpec(tmp_path / "h", port=23456, num_cpus=2, resources={"big": 1})
    args = head.ray_start_args()
    assert "--head" in args and "--port=23456" in args and "--num-cpus=2" in args
    assert "--include-dashboard=false" in args and '--resources={"big": 1}' in args
    assert f"--temp-dir={tmp_path / 'h' / 'ray'}" in args  # Ray's own temp dir, inside the node's private one
    worker = NodeSpec(tmp_path / "w", address="10.0.0.1:23456", node_ip_address="10.0.0.2").ray_start_args()
    assert "--address=10.0.0.1:23456" in worker and "--node-ip-address=10.0.0.2" in worker
    assert "--head" not in worker and not any(a.startswith("--port=") for a in worker)


def test_temp_dir_too_long_for_ray_sockets_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="too long"):
        start_node(NodeSpec(Path("/tmp") / ("x" * 80)))


def test_stop_node_kills_the_processes_naming_its_temp_dir_and_their_children_only(tmp_path: Path) -> None:
    ours, other = tmp_path / "ours", tmp_path / "other"
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", code, f"--temp-dir={ours}"])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"--temp-dir={other}"])
    try:
        for _ in range(50):
            if len(node_pids(ours)) == 2:
                break
            time.sleep(0.1)
        pids = node_pids(ours)
        assert parent.pid in pids and len(pids) == 2, "the node's process and its child"
        assert bystander.pid not in pids
        assert stop_node(ours, grace_s=2.0) == 2
        assert parent.wait(timeout=5) is not None
        assert node_pids(ours) == []
        assert bystander.poll() is None, "another node's process is left alone"
    finally:
        parent.kill()
        bystander.kill()


def test_a_head_whose_ray_start_fails_is_reported_at_once() -> None:
    """`ray start --head` refuses a 1 KB object store and exits: reported at once, not after the timeout."""
    temp = Path(f"/tmp/herd-t{secrets.token_hex(3)}")
    started = time.monotonic()
    with pytest.raises(ClusterError, match="exited: .*minimum allowed"):
        start_node(NodeSpec(temp, node_ip_address="127.0.0.2", num_cpus=1, object_store_memory=1000), block=True,
                   timeout_s=120)
    assert time.monotonic() - started < 60
    assert node_pids(temp) == []
    remove_node_files(temp)


def test_stopping_a_daemonised_head_also_stops_its_orphaned_client_server(tmp_path: Path) -> None:
    """`ray start` without --block exits, leaving the head's Ray Client server with only the address on its
    command line; stop_node must find it too (it would otherwise linger ~30 s after `herd cluster down`)."""
    import os

    temp = Path(f"/tmp/herd-t{secrets.token_hex(3)}")
    token = write_node_token(temp)
    saved = dict(os.environ)
    os.environ.update(auth_env(token))
    try:
        address, _ = start_node(NodeSpec(temp, node_ip_address="127.0.0.2", num_cpus=1,
                                         object_store_memory=80_000_000))
        client = [pid for pid, (_, cmd) in process_table().items()
                  if "ray.util.client.server" in cmd and f"--address={address} " in cmd]
        assert client and set(client) <= set(node_pids(temp))
        stop_node(temp, remove_files=True)
        assert not any(process_alive(pid) for pid in client)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        stop_node(temp, remove_files=True)
        token.unlink(missing_ok=True)
