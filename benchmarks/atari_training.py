"""Training throughput on Pong: PPO with rl-baselines3-zoo's Atari settings, herdrl vs SB3, side by side.

Both tools: ``PongNoFrameskip-v4`` with the standard preprocessing (no-op starts, frame skip 4, 84x84 gray,
4 stacked frames, clipped rewards), 8 envs x 128 steps per update, 4 epochs of 4 minibatches of 256,
lr 2.5e-4, clip 0.1, entropy 0.01, value 0.5, the Nature CNN; the same torch thread count. Each trains for
``--seconds`` (after building); the figure is env (agent) steps trained per second, and the mean of the last
100 episodes' returns at the end. Tools alternate per round.

    python benchmarks/atari_training.py [--seconds 300] [--rounds 1] [--threads 2] [--gpus 0]
        [--tools herdrl sb3 herdrl-bf16]

``--gpus 1`` puts herdrl's learner (``num_gpus``) and SB3's model on the GPU (the GPU row: 8 minutes, in-process).
The tool ``herdrl-bf16`` is herdrl with its learner's losses under bf16 autocast (``mixed_precision="bf16"``):
faster on GPUs and on CPUs with AMX (``lscpu | grep amx_bf16``), slower on other CPUs.
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np
import torch

ENV = "PongNoFrameskip-v4"


def herdrl_rate(seconds: float, seed: int, gpus: float = 0.0, bf16: bool = False) -> tuple[float, float]:
    from herdrl import PPOConfig

    algo = (PPOConfig().environment(ENV).resources(num_gpus=gpus)
            .learners(mixed_precision="bf16" if bf16 else None)
            .env_runners(num_envs_per_env_runner=8, rollout_fragment_length=128)
            .training(train_batch_size=1024, minibatch_size=256, num_epochs=4, lr=2.5e-4, clip_param=0.1,
                      entropy_coeff=0.01, vf_loss_coeff=0.5, gamma=0.99, lambda_=0.95, grad_clip=0.5)
            .debugging(seed=seed).build())
    start, result = time.perf_counter(), {}
    while time.perf_counter() - start < seconds:
        result = algo.train()
    rate = result["num_env_steps_sampled_lifetime"] / (time.perf_counter() - start)
    algo.stop()
    return rate, result.get("episode_return_mean", float("nan"))


def sb3_rate(seconds: float, seed: int, gpus: float = 0.0) -> tuple[float, float]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            return time.perf_counter() - self.start < seconds

    env = VecFrameStack(make_atari_env(ENV, n_envs=8, seed=seed), n_stack=4)
    model = PPO("CnnPolicy", env, n_steps=128, n_epochs=4, batch_size=256, learning_rate=2.5e-4, clip_range=0.1,
                vf_coef=0.5, ent_coef=0.01, device="cuda" if gpus else "cpu", seed=seed)
    stop = Stop()
    stop.start = time.perf_counter()
    model.learn(total_timesteps=10**9, callback=stop)
    rate = model.num_timesteps / (time.perf_counter() - stop.start)
    returns = [info["r"] for info in model.ep_info_buffer]
    env.close()
    return rate, float(np.mean(returns)) if returns else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--gpus", type=float, default=0.0, help="herdrl's num_gpus; SB3's device cuda")
    parser.add_argument("--tools", nargs="+", default=["herdrl", "sb3"], choices=["herdrl", "sb3", "herdrl-bf16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads {args.threads}, {args.seconds:.0f} s per run, learner on "
          f"{'the GPU' if args.gpus else 'the CPU'}")
    print("| round | tool | env steps/s | mean return (last 100 episodes) |")
    print("| --- | --- | --- | --- |")
    rates: dict[str, list[float]] = {tool: [] for tool in args.tools}
    runs = {"herdrl": herdrl_rate, "sb3": sb3_rate, "herdrl-bf16": functools.partial(herdrl_rate, bf16=True)}
    for r in range(args.rounds):
        for tool in args.tools:
            rate, ret = runs[tool](args.seconds, r, args.gpus)
            rates[tool].append(rate)
            print(f"| {r + 1} | {tool} | {rate:,.0f} | {ret:.1f} |", flush=True)
    for tool in (t for t in rates if t != "sb3" and "sb3" in rates):
        ratio = np.median(rates[tool]) / np.median(rates["sb3"])
        print(f"\n{tool} / SB3 (median env steps/s): {ratio:.2f}x")


if __name__ == "__main__":
    main()
