"""Run as a subprocess by test_multinode.py: a 2-node `ray start` cluster on loopback addresses (token auth), PPO
with 8 runners over two worker nodes and two learner actors on one of them; the other node is killed after the runners
sampled and before the learner read their fragments. Prints one ``RESULT {json}`` line."""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from raycluster import RayStartCluster  # noqa: E402


def main() -> None:
    # The head holds no work (it cannot be killed: the GCS lives there); runners and the two learners (packed on
    # one node) go to the two worker nodes, and the one without the learners is killed.
    cluster = RayStartCluster().start(workers=2, head_cpus=0, worker_cpus=6, fast_health_checks=True)
    import os

    os.environ.update({key: value for key, value in cluster.env.items() if key.startswith("RAY_AUTH")})
    try:
        import ray

        from herdrl import PPOConfig
        from herdrl.cluster.nodes import stop_node

        # 2000-float observations: a 20-step fragment is ~170 KB, over Ray's 100 KiB limit for objects it inlines
        # into the caller, so each stays in its runner's node's object store until a learner fetches it.
        algo = (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.0, "obs_size": 2000})
                .env_runners(num_env_runners=8, num_envs_per_env_runner=1, rollout_fragment_length=20,
                             sample_timeout_s=60)
                .training(train_batch_size=160, minibatch_size=80, num_epochs=1).learners(num_learners=2)
                .fault_tolerance(restart_failed_env_runners=False, ignore_env_runner_failures=True)
                .resources(address=cluster.address, node_ip_address="127.0.0.2").debugging(seed=0).build())
        first = algo.train()
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
        second = algo.train()
        seconds = time.monotonic() - start
        third = algo.train()
        ranks = algo.learners.call("get_weights")
        ranks_equal = all(bool((ranks[0][k] == ranks[1][k]).all()) for k in ranks[0])
        algo.stop()
        print("RESULT " + json.dumps({
            "runner_ips": runner_ips, "learner_ips": learner_ips, "learner_ip": learner_ip,
            "ranks_equal": ranks_equal, "first_steps": first["num_env_steps_sampled"],
            "bytes_per_step": first["fragment_bytes_per_env_step"], "lost": second["num_fragments_lost"],
            "healthy": second["num_healthy_env_runners"], "calls": calls, "seconds": seconds,
            "third_steps": third["num_env_steps_sampled"], "third_lost": third["num_fragments_lost"],
            "third_healthy": third["num_healthy_env_runners"]}), flush=True)
    finally:
        import ray

        ray.shutdown()  # first: a driver connected to a head that stops is ended by Ray before it stops the rest
        cluster.stop()


if __name__ == "__main__":
    main()
