"""Runners across the nodes of a real multi-node Ray cluster (several raylets on this host)."""

import json
import os
import subprocess
import sys
from pathlib import Path


def _run_driver(script, cwd):
    """Run a driver script of this folder in its own process (its own Ray cluster); its RESULT line, parsed."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, str(Path(__file__).parent / script)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=cwd)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(lines[0][len("RESULT "):])


def test_runners_spread_over_nodes_ship_user_code_and_solve_cartpole(tmp_path):
    result = _run_driver("multinode_driver.py", tmp_path)
    assert result["corridor_len"] == 6  # the env's code reached runners that cannot import its module
    assert len(set(result["corridor_nodes"])) == 2  # SPREAD: one runner per worker node
    assert len(set(result["nodes"])) == 2
    assert result["return"] >= 475, result


def test_eight_runners_on_two_nodes_feed_learner_actors_and_a_dead_nodes_fragments_are_sampled_again(tmp_path):
    """`ray start` nodes on 127.0.0.3 and .4 (token auth): 8 runners spread over both, two data-parallel learner
    actors on one. The other node dies after its runners' fragments were sampled and before the learners fetched
    them: they are lost, both learners skip that update, the fragments are sampled again from the survivors, and
    the next iteration runs on the runners left; the learners' weights stay identical."""
    result = _run_driver("lost_node_driver.py", tmp_path)
    ips = result["runner_ips"]
    assert set(ips) == {"127.0.0.3", "127.0.0.4"} and result["first_steps"] == 8 * 20
    assert result["learner_ips"] == [result["learner_ip"]] * 2 and result["ranks_equal"]
    on_dead_node = sum(ip != result["learner_ip"] for ip in ips)
    # Runners on the dead node are found out when asked to sample: some while replacing the lost fragments, the rest
    # in the next iteration
    assert result["lost"] == on_dead_node >= 1 and result["healthy"] >= result["third_healthy"] == 8 - on_dead_node
    calls = result["calls"]  # fragments each sampling call returned: the first round, replacements, the next iteration
    assert calls[0] == 8 and sum(calls[1:-1]) == on_dead_node and calls[-1] == 8 - on_dead_node
    assert result["third_lost"] == 0 and result["third_steps"] == 20 * (8 - on_dead_node)
    assert result["bytes_per_step"] > 8000  # 2000 float32 per observation: fragments over Ray's inline limit
