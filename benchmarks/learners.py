"""1 vs 2 data-parallel CPU learners (gloo) on a PPO update large enough that learning dominates.

One batch of CartPole fragments (2 fragments of 8 envs x 1024 steps = 16,384 rows), PPO's update on it (4 epochs
of 8 minibatches of 2,048) with a 256x256 MLP; every learner uses one torch thread. Rows, side by side in one
invocation, alternating rounds:

* **driver**: the learner in this process (``num_learners=0``, 1 thread);
* **1 actor** / **2 actors**: ``num_learners=1`` / ``2`` Ray actors, 1 CPU and 1 thread each, given the fragments
  as object references (as from Ray runners);
* **2 actors, sharded**: ``shard_fragments=True``: each fetches one fragment and learns on its own rows.

Reported: the median update time, its all-reduce part (time inside the gradient sums, waiting for the slower
peer included), and the largest weight difference between the 2-learner and the 1-learner update on the same
batch from the same weights (float rounding only).

    python benchmarks/learners.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import ray
import torch

from herdrl import PPOConfig
from herdrl.algorithms.ppo import PPOLearner
from herdrl.learner.group import LocalLearnerGroup, RayLearnerGroup
from herdrl.rollout import EnvRunner
from herdrl.rollout.transport import FragmentInput


def config(num_learners: int, shard: bool = False) -> PPOConfig:
    # (num_env_runners=2: the shape of the config a sharded run has; fragments are sampled here, in this process)
    cfg = (PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2, num_envs_per_env_runner=8)
           .training(train_batch_size=16_384, minibatch_size=2048, num_epochs=4,
                     model={"fcnet_hiddens": [256, 256]})
           .learners(num_learners=num_learners, shard_fragments=shard).resources(num_cpus_for_main_process=1)
           .debugging(seed=0))
    cfg.validate()
    return cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    # The actor groups stay alive (5 CPUs reserved on 2 cores); only one of them works at a time.
    ray.init(address="local", include_dashboard=False, num_cpus=5, log_to_driver=False)
    runner = EnvRunner(config(0))
    fragments = [runner.sample(1024), runner.sample(1024)]
    refs = FragmentInput([ray.put(fragment) for fragment in fragments])
    spaces = (runner.observation_space, runner.action_space)
    groups = {"driver": LocalLearnerGroup(config(0), PPOLearner, *spaces),
              "1 actor": RayLearnerGroup(config(1), PPOLearner, *spaces, init_seed=0),
              "2 actors": RayLearnerGroup(config(2), PPOLearner, *spaces, init_seed=0),
              "2 actors, sharded": RayLearnerGroup(config(2, shard=True), PPOLearner, *spaces, init_seed=0)}
    start_state = groups["driver"].state()
    times: dict[str, list[float]] = {name: [] for name in groups}
    sums: dict[str, list[float]] = {name: [] for name in groups}
    weights = {}
    for _ in range(args.rounds):
        for name, group in groups.items():
            group.load_state(start_state)
            begin = time.perf_counter()
            group.update(fragments if name == "driver" else refs, 7)
            times[name].append(time.perf_counter() - begin)
            weights[name] = group.get_weights()
            if isinstance(group, RayLearnerGroup):
                sums[name].append(max(group.call("sum_seconds")))
    diff = max(float(np.abs(weights["2 actors"][k] - weights["1 actor"][k]).max()) for k in weights["1 actor"])
    base = statistics.median(times["driver"])
    print(f"PPO update on {sum(f.env_steps for f in fragments):,} rows, 4 epochs x 8 minibatches, 256x256 MLP, "
          f"1 thread per learner; median of {args.rounds}")
    print("| learners | update, s | all-reduce, s | speed-up vs driver |")
    print("| --- | --- | --- | --- |")
    for name in groups:
        t = statistics.median(times[name])
        allreduce = f"{statistics.median(sums[name]):.3f}" if sums[name] else "-"
        print(f"| {name} | {t:.3f} | {allreduce} | {base / t:.2f}x |")
    print(f"largest weight difference, 2 actors vs 1 actor after the update: {diff:.2e}")
    for group in groups.values():
        group.stop()


if __name__ == "__main__":
    main()
