"""Runners across the nodes of a real multi-node Ray cluster (several raylets on this host)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# xdist_group: one worker runs these one at a time (loopback node IPs, services, machine-wide checks; see conftest)
pytestmark = pytest.mark.xdist_group("cluster")


def _run_driver(script, cwd):
    """Run a driver script of this folder in its own process (its own Ray cluster); its RESULT line, parsed."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, str(Path(__file__).parent / script)], capture_output=True, text=True,
                         timeout=300, env=env, cwd=cwd)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-3000:]
    return {**json.loads(lines[0][len("RESULT "):]), "stderr": out.stderr}


def test_runners_spread_over_nodes_ship_user_code_and_solve_cartpole(tmp_path):
    result = _run_driver("multinode_driver.py", tmp_path)
    assert result["corridor_len"] == 6  # the env's code reached runners that cannot import its module
    assert len(set(result["corridor_nodes"])) == 2  # SPREAD: one runner per worker node
    assert len(set(result["nodes"])) == 2
    assert result["return"] >= 475, result


def test_a_run_survives_a_lost_node_without_room_a_joining_node_and_a_killed_learner(tmp_path):
    """`ray start` nodes on 127.0.0.3 and .4 (token auth, short health checks): 8 runners spread over both, two
    data-parallel learner actors on one (which they fill). The other node dies after its runners' fragments were
    sampled and before the learners fetched them: they are lost, both learners skip that update, the fragments are
    sampled again from the survivors; the dead runners' replacements find no room, so the run goes on with 4 runners
    sampling twice each (the batch keeps its size). A third node joins: the replacements start there. A learner's
    process is killed: the group restarts from the state kept every 3 updates, losing the updates since."""
    result = _run_driver("lost_node_driver.py", tmp_path)
    ips = result["runner_ips"]
    assert set(ips) == {"127.0.0.3", "127.0.0.4"} and result["first_steps"] == 8 * 20
    assert result["learner_ips"] == [result["learner_ip"]] * 2 and result["ranks_equal"]
    on_dead_node = sum(ip != result["learner_ip"] for ip in ips)
    assert on_dead_node == 4  # SPREAD: half the runners on each node
    # Runners on the dead node are found out when asked to sample: some while replacing the lost fragments, the rest
    # in the next iteration; every replacement waits for room
    assert result["lost"] == on_dead_node and result["nodes_lost"] == 1
    calls = result["calls"]  # fragments each sampling call returned: the first round, replacements, the next iteration
    assert calls[0] == 8 and sum(calls[1:-2]) == on_dead_node and calls[-2:] == [4, 4]
    # (an env step is not counted where a runner's vector env resets after an episode: a few per iteration)
    assert result["third_lost"] == 0 and result["third_steps"] > 150 and result["third_extra"] == 4
    assert result["third_healthy"] == 4 and result["third_waiting"] == 4
    # nothing waits on the dead node (measured: under 1 s each once Ray noticed; bounded loosely for a loaded CI)
    assert result["seconds"] < 30 and result["third_seconds"] < 30
    assert result["bytes_per_step"] > 8000  # 2000 float32 per observation: fragments over Ray's inline limit
    # capacity returns: the replacements start on the new node, one iteration after another, none lost
    back = result["back_rows"]
    assert back[-1][:2] == [8, 0] and all(healthy + waiting == 8 for healthy, waiting, _ in back)
    assert sorted(result["new_ips"]) == sorted([result["learner_ip"]] * 4 + ["127.0.0.5"] * 4)
    # a learner dies: restarted with the state kept at the last multiple of 3 updates (compared with the driver's
    # own copy of the weights then), the updates since are lost and said so, and the update is made again
    assert result["learner_restarts"] == 1 and result["restored_ok"]
    assert result["updates_lost"] == result["expected_lost"]
    assert result["pid"] not in result["new_pids"] and result["fourth_steps"] > 150 and result["ranks_equal"]
    # what the console showed: one line per event, none of Ray's dumps
    err = result["stderr"]
    assert "Plasma Store Usage" not in err and "Eviction Stats" not in err and "Traceback" not in err
    assert "worker died or was killed" not in err
    assert "herdrl: node 127.0.0.4 is gone" in err or "herdrl: node 127.0.0.3 is gone" in err
    assert "4 of 8 env runners in service, 4 starting or waiting for room" in err
    assert "restarted (1 of at most 10" in err


def test_runners_follow_a_node_that_joins_and_take_the_degraded_path_when_it_leaves(tmp_path):
    """max_env_runners=4 with 2 runners (1 env each) filling the one worker node: a second node joins mid-run (`ray
    start --address`), 2 runners start there within 15 s and the rows say so; fragments shorten from 200 to 100 steps
    so the batch keeps its 400 (episodes longer than the run: no step of a reset to leave out of the count). The
    node leaves: its runners' replacements wait for room and the 2 left sample their fragments too."""
    result = _run_driver("growth_driver.py", tmp_path)
    # healthy, target, waiting, env steps, extra fragments
    assert result["before"] == [[2, 2, 0, 400, 0]] * 2
    assert result["grown"][-1] == [4, 4, 0, 400, 0] and result["seconds"] < 15, result
    assert result["runner_ips"] == ["127.0.0.3"] * 2 + [result["new_ip"]] * 2
    assert result["after"][-1] == [2, 4, 2, 400, 2]
    err = result["stderr"]
    assert "room for 2 more env runners (max_env_runners=4)" in err and "2 env runners joined (4 in service)" in err
    assert "Traceback" not in err


def test_a_short_chaos_run_survives_each_kind_of_fault_and_leaves_no_process(tmp_path):
    """benchmarks/chaos.py with one fault of each kind in turn (a runner's process, the learner actor's, a whole
    worker node, the driver, restarted with --resume as a requeued job would be): each is survived, the driver stops
    at the end's SIGTERM with a checkpoint (exit 143, its own: not killed by it), the trial's rows are contiguous
    with env steps never going back, no Ray process is left."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    script = Path(__file__).parent.parent / "benchmarks" / "chaos.py"
    out = subprocess.run([sys.executable, str(script), "--faults", "runner,learner,node,driver", "--runners", "3",
                          "--algo", "ppo", "--minutes", "5", "--out", str(tmp_path / "chaos")],
                         capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["injected"] == ["runner", "learner", "node", "driver"], out.stdout[-3000:]
    assert result["survived"] == 4 and result["other_exits"] == 0 and result["rc"] == 143, out.stdout[-3000:]
    assert result["left"] == 0
    iterations, steps = result["iterations"], result["steps"]
    assert iterations == list(range(1, len(iterations) + 1)) and steps == sorted(set(steps))
