"""Runners across the nodes of a real multi-node Ray cluster (several raylets on this host)."""

import json
import os
import subprocess
import sys
from pathlib import Path


def test_runners_spread_over_nodes_ship_user_code_and_solve_cartpole(tmp_path):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, str(Path(__file__).parent / "multinode_driver.py")], capture_output=True,
                         text=True, timeout=300, env=env, cwd=tmp_path)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT "):])
    assert result["corridor_len"] == 6  # the env's code reached runners that cannot import its module
    assert len(set(result["corridor_nodes"])) == 2  # SPREAD: one runner per worker node
    assert len(set(result["nodes"])) == 2
    assert result["return"] >= 475, result
