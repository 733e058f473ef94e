"""Learner update throughput, CPU vs GPU, bf16 on and off: PPO's gradient step on synthetic batches.

The issue-14 GPU rows, in-process: no Ray and no env is needed (a GPU machine with torch and gymnasium runs it
with ``PYTHONPATH=.``). For each network, batch size, device and precision, one PPO gradient step (forward,
loss, backward, gradient clipping, Adam) on the whole batch is timed, after the batch is on the device (frames
as uint8, converted by the encoder there). Networks:

* **mlp**: PPO's actor-critic with two 256-unit hidden layers per head on a 64-float vector, 6 actions;
* **cnn**: the Nature CNN (shared by the heads) on 84x84x4 uint8 frames, 6 actions (Atari).

Reported: gradient steps/s and rows/s (median of ``--rounds`` rounds of ``--seconds``), and each GPU row's
speed-up over the CPU row of the same network, batch and precision. Issue 14's target: the GPU >= 10x the
16-core CPU for the CNN.

    python benchmarks/gpu_updates.py [--devices cpu cuda] [--nets mlp cnn] [--batches 4096 32768]
        [--bf16 off on] [--threads 16] [--rounds 3] [--seconds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

from herdrl import PPOConfig
from herdrl.algorithms.ppo import PPOLearner
from herdrl.rollout import Fragment
from herdrl.rollout.batch import learner_batch, normalize_advantages

SPACES = {"mlp": gym.spaces.Box(-1.0, 1.0, (64,), np.float32), "cnn": gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)}
ACTIONS = gym.spaces.Discrete(6)


def synthetic_fragment(space: gym.spaces.Box, rows: int, rng: np.random.Generator) -> Fragment:
    """``rows`` steps of random observations and actions (16 envs side by side), no episode ends."""
    envs = 16
    steps = rows // envs
    if space.dtype == np.uint8:
        obs = rng.integers(0, 256, (steps + 1, envs, *space.shape), dtype=np.uint8)
    else:
        obs = rng.uniform(-1, 1, (steps + 1, envs, *space.shape)).astype(np.float32)
    return Fragment(obs=obs, actions=rng.integers(0, ACTIONS.n, (steps, envs)),
                    rewards=rng.normal(size=(steps, envs)).astype(np.float32),
                    terminateds=np.zeros((steps, envs), bool), truncateds=np.zeros((steps, envs), bool),
                    valid=np.ones((steps, envs), bool))


def steps_per_second(net: str, rows: int, device: str, bf16: bool, seconds: float, rounds: int) -> float:
    config = (PPOConfig().training(train_batch_size=rows, minibatch_size=rows, num_epochs=1, grad_clip=0.5)
              .resources(num_gpus=1 if device == "cuda" else 0).learners(mixed_precision="bf16" if bf16 else None)
              .debugging(seed=0))
    if net == "mlp":
        config.training(model={"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"})
    learner = PPOLearner(config, SPACES[net], ACTIONS)
    batch = learner_batch(learner.module, [synthetic_fragment(SPACES[net], rows, np.random.default_rng(0))], config,
                          learner.device)
    normalize_advantages(batch)

    def step() -> None:
        learner.gradient_step(learner.optimizer, learner.loss, batch, None, config.grad_clip)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):  # warm up (cuDNN autotuning, allocator)
        step()
    sync()
    rates = []
    for _ in range(rounds):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            step()
            count += 1
        sync()
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", nargs="+", choices=("cpu", "cuda"), default=["cpu", "cuda"])
    parser.add_argument("--nets", nargs="+", choices=sorted(SPACES), default=["mlp", "cnn"])
    parser.add_argument("--batches", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--bf16", nargs="+", choices=("off", "on"), default=["off", "on"])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads of the CPU rows")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(f"torch {torch.__version__}, {args.threads} CPU threads, GPU: {gpu}; median of {args.rounds} x "
          f"{args.seconds:g} s")
    print("| network | batch | device | bf16 | gradient steps/s | rows/s | vs CPU |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for net in args.nets:
        for rows in args.batches:
            for bf16 in args.bf16:
                cpu_rate = None
                for device in args.devices:
                    rate = steps_per_second(net, rows, device, bf16 == "on", args.seconds, args.rounds)
                    cpu_rate = rate if device == "cpu" else cpu_rate
                    ratio = f"{rate / cpu_rate:.1f}x" if device == "cuda" and cpu_rate else "-"
                    print(f"| {net} | {rows:,} | {device} | {bf16} | {rate:,.1f} | {rate * rows:,.0f} | {ratio} |",
                          flush=True)


if __name__ == "__main__":
    main()
