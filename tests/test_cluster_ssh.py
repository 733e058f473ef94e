"""`herd cluster up|status|sync|down` and `herd train --cluster` against two real sshd "hosts" on loopback."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from clustertools import BIN, processes_matching, require, subprocess_env
from sshhosts import SshHosts

from herdrl.cluster.connect import ClusterError
from herdrl.cluster.hosts import Host, load_hosts

# xdist_group: one worker runs these one at a time (loopback node IPs, services, machine-wide checks; see conftest)
pytestmark = [pytest.mark.cluster, pytest.mark.xdist_group("cluster")]


@pytest.fixture(scope="module")
def ssh_hosts():
    require("ssh")
    try:
        hosts = SshHosts(["127.0.0.2", "127.0.0.3"]).start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"ssh unavailable: {exc}")
    yield hosts
    hosts.stop()


def _hosts_file(tmp_path: Path, ssh_hosts: SshHosts, name: str) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({
        "cluster_name": name, "head": ssh_hosts.entries[0], "workers": ssh_hosts.entries[1:],
        "ssh": {"user": "root", "key": str(ssh_hosts.key),
                "options": ["StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null", "LogLevel=ERROR"]},
        "setup": [f"export PATH={BIN}:$PATH"], "workdir": str(tmp_path / "on-head"),
        "ray": {"num_cpus": 1, "object_store_memory": 80_000_000},
    }))
    return path


def _herd(args: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["herd", *args], cwd=cwd, env=subprocess_env(HERD_HOME=str(home)), capture_output=True,
                          text=True, timeout=300)


def test_up_status_train_sync_down(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    name = f"t{secrets.token_hex(3)}"
    hosts_file = _hosts_file(tmp_path, ssh_hosts, name)
    here = tmp_path / "laptop"
    here.mkdir()
    home = tmp_path / "herd-home"
    try:
        up = _herd(["cluster", "up", str(hosts_file)], here, home)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "2 Ray nodes alive at 127.0.0.2:" in up.stdout
        assert (home / "clusters" / name / "ray_token").stat().st_mode & 0o077 == 0, "the token is owner-only"
        again = _herd(["cluster", "up", str(hosts_file)], here, home)
        assert again.returncode == 2 and "already up" in again.stderr

        status = _herd(["cluster", "status", str(hosts_file)], here, home)
        assert status.returncode == 0, status.stderr
        assert "2 alive Ray node(s)" in status.stdout
        assert re.search(r"127\.0\.0\.2\s+head", status.stdout) and re.search(r"127\.0\.0\.3\s+worker", status.stdout)

        train = _herd(["train", "--cluster", str(hosts_file), "ppo", "--env", "CartPole-v1", "--num-env-runners",
                       "2", "--stop-iters", "3", "--output", "runs"], here, home)
        assert train.returncode == 0, train.stdout + train.stderr
        assert "running on 127.0.0.2" in train.stdout and re.search(r"iter\s+3\s", train.stdout)
        copied = list((here / "runs").glob("CartPole-v1/*/result.json"))
        assert len(copied) == 1, "results were copied back from the head"
        assert [json.loads(r)["training_iteration"] for r in copied[0].read_text().splitlines()] == [1, 2, 3]
        assert list((tmp_path / "on-head" / "runs").glob("CartPole-v1/*/result.json")), "they ran on the head"

        detached = _herd(["train", "--cluster", str(hosts_file), "--detach", "ppo", "--env", "CartPole-v1",
                          "--stop-iters", "2", "--output", "runs"], here, home)
        assert detached.returncode == 0, detached.stdout + detached.stderr
        log = Path(re.search(r"its output: (\S+)", detached.stdout).group(1))
        assert f"herd cluster sync {hosts_file} runs" in detached.stdout
        deadline = time.monotonic() + 120
        while "iteration limit:" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the detached run did not finish"
            time.sleep(0.3)
        assert len(list((tmp_path / "on-head" / "runs").glob("CartPole-v1/*/result.json"))) == 2

        (tmp_path / "on-head" / "runs" / "extra.txt").write_text("late file")
        synced = _herd(["cluster", "sync", str(hosts_file), "runs"], here, home)
        assert synced.returncode == 0, synced.stderr
        assert (here / "runs" / "extra.txt").read_text() == "late file"
        assert len(list((here / "runs").glob("CartPole-v1/*/result.json"))) == 2, "sync brought the detached run"
        session = json.loads((home / "clusters" / name / "state.json").read_text())["session"]
        assert len(session) == 6, "node dirs carry a random tag: no one can create them first"
        assert processes_matching(f"/tmp/herd-{name}-{session}-1/"), "the worker node runs until down"
    finally:
        down = _herd(["cluster", "down", str(hosts_file)], here, home)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not processes_matching(f"/tmp/herd-{name}-"), "down stopped every node"
    assert not list(Path("/tmp").glob(f"herd-{name}-*")), "and removed their temp dirs and tokens"
    assert not (home / "clusters" / name / "state.json").exists()
    status = _herd(["cluster", "status", str(hosts_file)], here, home)
    assert status.returncode == 2 and "not up" in status.stderr


def test_a_worker_that_fails_stops_the_nodes_that_started(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    name = f"t{secrets.token_hex(3)}"
    path = _hosts_file(tmp_path, ssh_hosts, name)
    spec = yaml.safe_load(path.read_text())
    spec["workers"].append("127.0.0.9:1")  # nothing listens there
    spec["ssh"]["options"].append("ConnectTimeout=3")
    path.write_text(yaml.safe_dump(spec))
    home = tmp_path / "home"
    done = _herd(["cluster", "up", str(path)], tmp_path, home)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "127.0.0.9" in done.stderr and "nodes that had started were stopped" in done.stderr
    assert not processes_matching(f"/tmp/herd-{name}-"), "the head and the good worker were stopped"
    assert not (home / "clusters" / name / "state.json").exists()


def test_unreachable_host_is_one_line_error(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump({"cluster_name": "dead", "head": "127.0.0.9:1",
                                    "ssh": {"options": ["ConnectTimeout=2"]}}))
    done = _herd(["cluster", "up", str(path)], tmp_path, tmp_path / "home")
    assert done.returncode == 2
    assert "127.0.0.9" in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("text, message", [
    ("workers: [a]", "needs at least `head"),
    ("head: a\nwrokers: [b]", "did you mean 'workers'"),
    ("head: a\nssh: {usr: me}", "did you mean 'user'"),
    ("head: a\ncluster_name: 'has space'", "cluster_name"),
    ("head: [a", "not valid YAML"),
])
def test_bad_hosts_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    with pytest.raises(ClusterError, match=re.escape(message)):
        load_hosts(path)


def test_ssh_command_and_node_addresses(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text("head: 10.0.0.1\nworkers: [node2.example:2222]\nssh: {user: me, port: 22, key: /k}\n")
    hosts = load_hosts(path)
    assert hosts.name == "lab" and hosts.workers == [Host("node2.example", 2222)]
    cmd = hosts.ssh(hosts.workers[0], "herd cluster node stop --temp-dir /tmp/x")
    assert cmd[:5] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15"], "no options in the file"
    assert cmd[cmd.index("-p") + 1] == "2222" and cmd[cmd.index("-i") + 1] == "/k" and "me@node2.example" in cmd
    assert hosts.node_ip(hosts.head) == "10.0.0.1", "an IP in the file is what the node announces"
    assert hosts.node_ip(hosts.workers[0]) is None, "a host name: Ray picks the address"


def test_rays_local_provider_cluster_yaml_is_read(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("cluster_name: deepcomp\nprovider: {type: local, head_ip: 10.0.0.1, worker_ips: [10.0.0.2]}\n"
                    "auth: {ssh_user: me, ssh_private_key: ~/.ssh/id_rsa}\n"
                    "setup_commands: [source ~/venv/bin/activate]\nmin_workers: 1\n")
    hosts = load_hosts(path)
    assert (hosts.name, hosts.head, hosts.workers) == ("deepcomp", Host("10.0.0.1"), [Host("10.0.0.2")])
    assert hosts.ssh_user == "me" and hosts.ssh_key == "~/.ssh/id_rsa"
    assert hosts.setup == ["source ~/venv/bin/activate"]
    path.write_text("provider: {type: aws}\n")
    with pytest.raises(ClusterError, match="local"):
        load_hosts(path)


def test_detach_needs_a_cluster(capsys) -> None:
    from herdrl.cli import main

    assert main(["train", "--detach", "ppo", "--env", "CartPole-v1"]) == 2
    assert "--cluster" in capsys.readouterr().err


def test_shipped_hosts_example_parses() -> None:
    hosts = load_hosts(Path(__file__).parent.parent / "examples" / "cluster" / "hosts.yaml")
    assert hosts.name == "lab" and len(hosts.workers) == 2 and hosts.ray["num_cpus"] == 8


def test_a_damaged_session_tag_never_reaches_a_shell_line(tmp_path: Path, monkeypatch) -> None:
    from herdrl.cluster import hosts
    from herdrl.cluster.connect import ClusterError

    monkeypatch.setenv("HERD_HOME", str(tmp_path))
    spec = hosts.HostsFile(name="c", head=hosts.Host("127.0.0.2"))
    (tmp_path / "clusters" / "c").mkdir(parents=True)
    (tmp_path / "clusters" / "c" / "state.json").write_text(json.dumps({"address": "x:1", "session": "a;rm -rf ~"}))
    with pytest.raises(ClusterError, match="damaged session tag"):
        hosts.down(spec)


def test_detached_runs_started_in_the_same_second_get_their_own_logs(tmp_path: Path, monkeypatch, capsys) -> None:
    from herdrl.cluster import hosts as hosts_module

    path = tmp_path / "hosts.yaml"
    path.write_text("head: 10.0.0.1\nworkers: []\n")
    hosts = load_hosts(path)
    scripts: list[str] = []

    def run(hosts, host, remote, stdin=None, timeout=300):  # the head's shell: echo the log's path
        scripts.append(remote)
        return "/w/" + re.search(r"> (herd-train-\S+\.log) 2>&1", remote).group(1) + "\n"

    monkeypatch.setattr(hosts_module, "_state", lambda hosts: {"address": "10.0.0.1:6379"})
    monkeypatch.setattr(hosts_module, "_run", run)
    monkeypatch.setattr(hosts_module.time, "strftime", lambda fmt, *a: "2026-12-07_12-00-00")  # one second
    for _ in range(5):
        assert hosts_module.train_on_head(hosts, ["ppo", "--env", "CartPole-v1"], detach=True) == 0
    logs = re.findall(r"its output: (\S+)", capsys.readouterr().out)
    assert len(logs) == 5 and len(set(logs)) == 5, logs
