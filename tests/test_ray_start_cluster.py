"""End to end: `herd train --address` on a cluster started with `ray start` (head + worker node)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from raycluster import RayStartCluster


@pytest.fixture(scope="module")
def cluster():
    c = RayStartCluster()
    try:
        yield c.start(workers=1)
    finally:
        c.stop()
    assert not c.pids()


def test_herd_train_joins_a_ray_start_cluster_by_address(cluster, tmp_path):
    herd = str(Path(sys.executable).parent / "herd")
    out = subprocess.run(
        [herd, "train", "ppo", "--env", "CartPole-v1", "--address", cluster.address, "--node-ip-address",
         "127.0.0.2", "--num-env-runners", "2", "--seed", "0", "--quiet", "--output", str(tmp_path),
         "--trial", "t"], env=cluster.env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("solved:")
    assert "Token authentication is enabled" not in out.stderr
    rows = [json.loads(line) for line in (tmp_path / "CartPole-v1" / "t" / "result.json").read_text().splitlines()]
    assert rows[-1]["episode_return_mean"] >= 475 and rows[-1]["num_healthy_env_runners"] == 2


def test_driver_without_the_token_gets_a_clear_error(cluster, tmp_path):
    env = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
    env["RAY_AUTH_MODE"] = "disabled"
    herd = str(Path(sys.executable).parent / "herd")
    out = subprocess.run(
        [herd, "train", "ppo", "--env", "CartPole-v1", "--address", cluster.address, "--node-ip-address",
         "127.0.0.2", "--num-env-runners", "1", "--stop-iters", "1", "--output", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "token auth" in out.stderr.strip().splitlines()[-1]
