"""Sampling throughput of the in-process EnvRunner vs the env's own ceiling, side by side.

Ceiling (DESIGN.md, Definitions): the same vector env (same mode, same number of envs) stepped with
random actions and no policy. The runner steps the same env with the PPO policy (one batched forward
pass per step) and writes every array a learner needs. Rounds alternate between the two so machine
noise hits both alike; the table shows medians.

    python benchmarks/sampling_throughput.py [--envs 8 64] [--mode auto] [--rounds 5] [--seconds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from herdrl import PPOConfig
from herdrl.env import make_vector_env
from herdrl.rollout import EnvRunner


def ceiling_rate(env_id: str, num_envs: int, mode: str, seconds: float) -> float:
    env = make_vector_env(env_id, {}, num_envs, mode)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, env.single_action_space.n, size=(1024, num_envs))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for row in actions:
            env.step(row)
        steps += len(actions) * num_envs
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def runner_rate(env_id: str, num_envs: int, mode: str, seconds: float) -> float:
    config = (PPOConfig().environment(env_id)
              .env_runners(num_envs_per_env_runner=num_envs, gym_env_vectorize_mode=mode).debugging(seed=0))
    config.validate()
    runner = EnvRunner(config)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        steps += runner.sample(256).obs[:-1].shape[0] * num_envs  # every vector step, as the ceiling counts
    rate = steps / (time.perf_counter() - start)
    runner.stop()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--mode", default="auto", help="gym_env_vectorize_mode: auto, vector_entry_point, sync")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    print("| env | envs | mode | ceiling steps/s | runner steps/s | runner / ceiling |")
    print("| --- | --- | --- | --- | --- | --- |")
    for num_envs in args.envs:
        ceilings, runners = [], []
        for _ in range(args.rounds):
            ceilings.append(ceiling_rate(args.env, num_envs, args.mode, args.seconds))
            runners.append(runner_rate(args.env, num_envs, args.mode, args.seconds))
        ceiling, runner = statistics.median(ceilings), statistics.median(runners)
        print(f"| {args.env} | {num_envs} | {args.mode} | {ceiling:,.0f} | {runner:,.0f} | {runner / ceiling:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
