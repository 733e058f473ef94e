"""Run as a subprocess by test_multinode.py: one 2-node `ray start` cluster on loopback addresses (token auth, short
health checks), PPO with 8 runners over the two worker nodes and two learner actors on one of them, through what a
cluster does to a run. Prints one ``RESULT {json}`` line.

1. The node without the learners dies after its runners sampled and before the learners read their fragments:
   they are lost and sampled again; its runners' replacements find no room (the learners' node is full), so the
   run goes on with 4 runners, each sampling twice so the train batch keeps its size.
2. A third worker node joins: the replacements are placed there and back in service.
3. Learner rank 1's process is killed before an update's call reaches it: the group restarts from the learner
   state kept every 3 updates and makes the update again.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from raycluster import RayStartCluster  # noqa: E402


def main() -> None:
    # The head holds no work (it cannot be killed: the GCS lives there).
    cluster = RayStartCluster().start(workers=2, head_cpus=0, worker_cpus=6, fast_health_checks=True)
    os.environ.update({key: value for key, value in cluster.env.items() if key.startswith("RAY_AUTH")})
    try:
        import numpy as np
        import ray

        from herdrl import PPOConfig
        from herdrl.cluster.nodes import stop_node

        # 2000-float observations: a 20-step fragment is ~170 KB, over Ray's 100 KiB limit for objects it inlines
        # into the caller, so each stays in its runner's node's object store until a learner fetches it.
        algo = (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.0, "obs_size": 2000})
                .env_runners(num_env_runners=8, num_envs_per_env_runner=1, rollout_fragment_length=20,
                             sample_timeout_s=60)
                .training(train_batch_size=160, minibatch_size=80, num_epochs=1).learners(num_learners=2)
                .fault_tolerance(learner_state_interval=3)
                .resources(address=cluster.address, node_ip_address="127.0.0.2").debugging(seed=0).build())
        # The driver's copy of the weights after each iteration, counted here (not by herdrl): PPO makes one update
        # per iteration, and the learner state is kept every 3 iterations.
        weights_at, done = {}, [0]

        def train():
            row = algo.train()
            done[0] += 1
            weights_at[done[0]] = algo.get_weights()
            return row

        first = train()
        runner_ips = [ip for _, ip in algo.runners.call("node")]
        learner_ips = ray.get([actor.node_ip.remote() for actor in algo.learners.actors])
        learner_ip = learner_ips[0]
        sample, calls = algo.runners.sample, []

        def sample_then_lose_the_worker(*args):
            sampled = sample(*args)
            calls.append(len(sampled))
            if len(calls) == 1:
                victim = "127.0.0.4" if learner_ip == "127.0.0.3" else "127.0.0.3"
                start = time.monotonic()
                stop_node(cluster.temps[1 if victim == "127.0.0.3" else 2], grace_s=0.0)
                while any(n["Alive"] for n in ray.nodes() if n["NodeManagerAddress"] == victim):
                    if time.monotonic() - start > 30:
                        raise RuntimeError("the killed node is still alive after 30 s")
                    time.sleep(0.2)
            return sampled

        algo.runners.sample = sample_then_lose_the_worker
        start = time.monotonic()
        second = train()
        seconds = time.monotonic() - start
        start = time.monotonic()
        third = train()
        third_seconds = time.monotonic() - start
        algo.runners.sample = sample

        # 2. capacity returns
        cluster.add_worker(6)
        start, back = time.monotonic(), []
        while time.monotonic() - start < 90:
            back.append(train())
            if back[-1]["num_healthy_env_runners"] == 8:
                break
        back_seconds = time.monotonic() - start
        new_ips = [ip for _, ip in algo.runners.call("node")]

        # 3. a learner dies
        pid = algo.learners.call("pid")[1]
        iterations_before = done[0]
        update, restart, restored = algo.learners.update, algo.learners._restart, []

        def update_after_a_kill(*args):
            algo.learners.update = update
            os.kill(pid, signal.SIGKILL)
            return update(*args)

        def restart_and_read(*args):
            restart(*args)
            restored.append(ray.get(algo.learners.actors[0].call.remote("get_weights")))

        algo.learners.update, algo.learners._restart = update_after_a_kill, restart_and_read
        fourth = train()
        kept = iterations_before - iterations_before % 3
        restored_ok = bool(restored) and all(np.array_equal(restored[0][k], weights_at[kept][k])
                                             for k in weights_at[kept])
        ranks = algo.learners.call("get_weights")
        ranks_equal = all(bool((ranks[0][k] == ranks[1][k]).all()) for k in ranks[0])
        new_pids = algo.learners.call("pid")
        algo.stop()
        print("RESULT " + json.dumps({
            "runner_ips": runner_ips, "learner_ips": learner_ips, "learner_ip": learner_ip,
            "ranks_equal": ranks_equal, "first_steps": first["num_env_steps_sampled"],
            "bytes_per_step": first["fragment_bytes_per_env_step"], "lost": second["num_fragments_lost"],
            "healthy": second["num_healthy_env_runners"], "calls": calls, "seconds": seconds,
            "nodes_lost": third["num_nodes_lost"], "third_seconds": third_seconds,
            "third_steps": third["num_env_steps_sampled"], "third_lost": third["num_fragments_lost"],
            "third_healthy": third["num_healthy_env_runners"], "third_waiting": third["num_env_runners_waiting"],
            "third_extra": third["num_extra_fragments"],
            "back_rows": [[r["num_healthy_env_runners"], r["num_env_runners_waiting"], r["num_env_steps_sampled"]]
                          for r in back], "back_seconds": back_seconds, "new_ips": new_ips,
            "learner_restarts": fourth["num_learner_restarts"], "updates_lost": fourth["num_learner_updates_lost"],
            "expected_lost": iterations_before % 3, "restored_ok": restored_ok, "pid": pid, "new_pids": new_pids,
            "fourth_steps": fourth["num_env_steps_sampled"]}), flush=True)
    finally:
        import ray

        ray.shutdown()  # first: a driver connected to a head that stops is ended by Ray before it stops the rest
        cluster.stop()


if __name__ == "__main__":
    main()
