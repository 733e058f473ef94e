"""Run as a subprocess by test_multinode.py: a 3-node Ray cluster on this host (ray.cluster_utils),
PPO with 2 runners joining it by address, and an env whose module exists only in this driver's memory."""

import json
import os
import shutil
import sys
import tempfile
import textwrap

from ray.cluster_utils import Cluster

ENV_CODE = textwrap.dedent('''
    import gymnasium as gym
    import numpy as np

    class Corridor(gym.Env):
        def __init__(self, length=4):
            self.length = length
            self.observation_space = gym.spaces.Box(0.0, 100.0, (1,), np.float32)
            self.action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.pos = 0
            return np.array([0.0], np.float32), {}

        def step(self, action):
            self.pos += 1
            done = self.pos >= self.length
            return np.array([self.pos], np.float32), 1.0, done, False, {}
''')


def main() -> None:
    system = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "object_store_memory": 80_000_000, "_system_config": system})
    for _ in range(2):
        cluster.add_node(num_cpus=1, object_store_memory=80_000_000)
    cluster.wait_for_nodes()
    try:
        # A user module that exists nowhere once imported: runners must get its code from the driver.
        where = tempfile.mkdtemp()
        with open(os.path.join(where, "corridor_env_xyz.py"), "w") as f:
            f.write(ENV_CODE)
        sys.path.insert(0, where)
        import corridor_env_xyz

        sys.path.remove(where)
        shutil.rmtree(where)

        import herdrl
        from herdrl import PPOConfig

        herdrl.register_env("corridor", lambda cfg: corridor_env_xyz.Corridor(**cfg))
        corridor = (PPOConfig().environment("corridor", env_config={"length": 6})
                    .env_runners(num_env_runners=2, num_envs_per_env_runner=2)
                    .training(train_batch_size=64, minibatch_size=32).resources(address=cluster.address))
        algo = corridor.build()
        corridor_len = algo.train()["episode_len_mean"]
        corridor_nodes = [node_id for node_id, _ in algo.runners.call("node")]
        algo.stop()

        cartpole = (PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2, num_envs_per_env_runner=8)
                    .resources(address=cluster.address).debugging(seed=0))
        algo = cartpole.build()
        nodes = [node_id for node_id, _ in algo.runners.call("node")]
        result = algo.train()
        while result["episode_return_mean"] < 475 and result["num_env_steps_sampled_lifetime"] < 150_000:
            result = algo.train()
        algo.stop()
        print("RESULT " + json.dumps({
            "corridor_len": corridor_len, "corridor_nodes": corridor_nodes, "nodes": nodes,
            "return": result["episode_return_mean"], "steps": result["num_env_steps_sampled_lifetime"]}))
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main()
