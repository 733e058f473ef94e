"""The seed course exercise: does collecting experience with more rollout workers speed up PPO?

PPO on FrozenLake-v1 with fcnet_hiddens [32, 32], 5 training iterations, once with 1 worker x 1 env and
once with 2 workers x 2 envs, written with the seed's own builder calls. Only the import line differs
from the RLlib original.

    python examples/rollout_workers.py
"""

import time

from herdrl import PPOConfig  # RLlib: from ray.rllib.algorithms.ppo import PPOConfig


def run(num_rollout_workers: int, num_envs_per_worker: int) -> float:
    config = (
        PPOConfig()
        .framework("torch")
        .rollouts(num_rollout_workers=num_rollout_workers, num_envs_per_worker=num_envs_per_worker)
        .resources(num_gpus=0)
        .environment(env="FrozenLake-v1")
        .training(model={"fcnet_hiddens": [32, 32]}, train_batch_size=4000, sgd_minibatch_size=128,
                  num_sgd_iter=5)
        .debugging(seed=0)
    )
    start = time.time()
    algo = config.build()
    for i in range(5):
        result = algo.train()
        print(f"  iter {i + 1}: return {result['episode_return_mean']:.3f}, "
              f"{result['num_env_steps_sampled']} steps, {result['time_this_iter_s']:.2f} s")
    algo.stop()
    return time.time() - start


if __name__ == "__main__":
    print("1 worker x 1 env:")
    single = run(1, 1)
    print("2 workers x 2 envs:")
    double = run(2, 2)
    print(f"elapsed: 1x1 {single:.1f} s, 2x2 {double:.1f} s (both include starting Ray and the workers)")
