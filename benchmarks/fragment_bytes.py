"""Bytes per env step of the fragments runners ship, before and after stacked frames are packed, and what packing
costs (herdrl.rollout.transport).

    python benchmarks/fragment_bytes.py                       # Pong (8 envs x 128 steps), 5 fragments
    python benchmarks/fragment_bytes.py --env MinAtar/Breakout-v1 --fragments 3

Each fragment is sampled in-process by an EnvRunner with a random-weights PPO policy, copied, packed, unpacked
and compared with its copy (the benchmark fails if a single byte differs). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from herdrl import PPOConfig
from herdrl.obs import obs_map
from herdrl.rollout import EnvRunner
from herdrl.rollout.transport import nbytes, pack, unpack


def measure(env: str, envs: int, steps: int, fragments: int) -> dict[str, float]:
    """Mean bytes per env step before and after packing, and pack/unpack milliseconds per fragment."""
    config = PPOConfig().environment(env).env_runners(num_envs_per_env_runner=envs, rollout_fragment_length=steps)
    config.validate()
    runner = EnvRunner(config)
    runner.sample()  # warm-up: envs reset, first frames stacked
    before = after = env_steps = 0
    pack_s = unpack_s = 0.0
    for _ in range(fragments):
        fragment = runner.sample()
        recorded = obs_map(np.copy, fragment.obs)
        before += nbytes(fragment)
        start = time.perf_counter()
        pack(fragment)
        pack_s += time.perf_counter() - start
        after += nbytes(fragment)
        start = time.perf_counter()
        unpack(fragment)
        unpack_s += time.perf_counter() - start
        same = obs_map(np.array_equal, fragment.obs, recorded)
        if not all(same.values() if isinstance(same, dict) else [same]):
            raise SystemExit(f"{env}: an unpacked fragment differs from what the env returned")
        env_steps += fragment.env_steps
    runner.stop()
    return {"before": before / env_steps, "after": after / env_steps, "pack_ms": 1e3 * pack_s / fragments,
            "unpack_ms": 1e3 * unpack_s / fragments, "steps": env_steps / fragments}


def main() -> None:
    """Measure each env given and print one table row per env."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", action="append", help="env id (repeatable; default ALE/Pong-v5)")
    parser.add_argument("--envs", type=int, default=8, help="envs per runner")
    parser.add_argument("--steps", type=int, default=128, help="fragment length")
    parser.add_argument("--fragments", type=int, default=5)
    args = parser.parse_args()
    print("| env | env steps / fragment | bytes / env step, as sampled | packed | ratio | pack ms | unpack ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for env in args.env or ["ALE/Pong-v5"]:
        row = measure(env, args.envs, args.steps, args.fragments)
        print(f"| {env} | {row['steps']:,.0f} | {row['before']:,.0f} | {row['after']:,.0f} | "
              f"{row['after'] / row['before']:.3f} | {row['pack_ms']:.1f} | {row['unpack_ms']:.1f} |")


if __name__ == "__main__":
    main()
