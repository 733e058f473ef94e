"""Replay memory on Atari: bytes per transition with each frame stored once, against whole stacks.

herdrl's env runner plays Pong with a uniformly random policy (the standard preprocessing: 84 x 84 grayscale,
4-frame stacks, no-op starts, as DQN's runners sample it) and its fragments go into a replay buffer as DQN adds
them (``fragment_transitions``, n-step 1). Reported: frames stored per transition, the buffer's bytes per
transition once its ring is full (ring, indices, actions, rewards) against a buffer of whole ``obs`` and
``next_obs`` stacks (2 x 4 x 84 x 84 bytes), what 1M transitions would take, and the time to add 1,000
transitions and to draw a batch of 32. Every sampled stack is checked against the fragments' own.

    python benchmarks/replay_frames.py [--env PongNoFrameskip-v4] [--capacity 20000] [--steps 60000] [--envs 8]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from herdrl import DQNConfig
from herdrl.buffers import ReplayBuffer, fragment_transitions
from herdrl.obs import ObsSpec
from herdrl.rollout import EnvRunner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--capacity", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=60_000, help="env steps sampled (more than capacity: wraps)")
    parser.add_argument("--envs", type=int, default=8)
    args = parser.parse_args()

    config = DQNConfig().environment(args.env).env_runners(num_envs_per_env_runner=args.envs).debugging(seed=0)
    config.validate()
    runner = EnvRunner(config, 0)
    runner.set_exploration({"epsilon": 1.0})  # uniformly random actions
    buffer = ReplayBuffer(args.capacity, ObsSpec(runner.observation_space), np.random.default_rng(0))
    added = adds = 0
    add_seconds, recent = 0.0, []
    while added < args.steps:
        transitions = fragment_transitions(runner.sample(), 0.99)
        start = time.perf_counter()
        buffer.add(transitions)
        add_seconds += time.perf_counter() - start
        added, adds = added + len(transitions["rewards"]), adds + 1
        recent = (recent + [transitions])[-2:]
    check = {key: np.concatenate([t[key] for t in recent]) for key in ("obs", "next_obs")}
    newest = len(check["obs"])
    slots = (buffer.cursor - newest + np.arange(newest)) % buffer.capacity
    data = buffer._gather(slots)  # the newest transitions, as the buffer gives them back
    assert np.array_equal(data["obs"], check["obs"]) and np.array_equal(data["next_obs"], check["next_obs"])
    start, draws = time.perf_counter(), 2000
    for _ in range(draws):
        buffer.sample(32)
    sample_ms = 1e3 * (time.perf_counter() - start) / draws

    store = buffer.frames[""]
    ring = store.units.nbytes + store.obs_ids.nbytes + store.next_ids.nbytes + store.oldest.nbytes
    rest = buffer.actions.nbytes + buffer.rewards.nbytes + buffer.discounts.nbytes
    per_transition = (ring + rest) / buffer.capacity
    whole = 2 * np.prod(runner.observation_space.shape) + rest / buffer.capacity
    print("| env | transitions added | frames stored per transition | bytes per transition | whole | "
          "1M transitions | add 1,000, ms | sample 32, ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {args.env} | {added:,} | {store.written / added:.3f} | {per_transition:,.0f} | {whole:,.0f} "
          f"({whole / per_transition:.1f}x) | {per_transition * 1e6 / 1e9:.1f} GB vs {whole * 1e6 / 1e9:.0f} GB | "
          f"{1e3 * add_seconds / added * 1000:.1f} | {sample_ms:.3f} |")
    print(f"(checked: the newest {newest} transitions come back equal to the fragments')")


if __name__ == "__main__":
    main()
