"""RLlib's APPO on CartPole-v1, to set beside herdrl's (``async_learning.py``, ``async_throughput.py``).

Runs in RLlib's own venv (``ray[rllib]`` pins pieces herdrl's venv should not carry); see benchmarks/results/async.md:

    python3.11 -m venv /tmp/rllib-venv
    /tmp/rllib-venv/bin/pip install torch==2.13.0 gymnasium "ray[rllib]==2.60.0"
    /tmp/rllib-venv/bin/python benchmarks/rllib_appo.py --seed 1 [--num-env-runners 2] [--target 450]

RLlib's default (new) API stack and APPO defaults; only the env, the runner count and the seed are set. Prints
the time from process start to the first result whose 100-episode mean reaches ``--target`` (imports, Ray start
and build included), the env steps then, and the sampled env steps per second of training, as one JSON line.
"""

from __future__ import annotations

import time

START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-env-runners", type=int, default=2)
    parser.add_argument("--target", type=float, default=450.0)
    parser.add_argument("--cap", type=float, default=600.0, help="seconds of training before giving up")
    args = parser.parse_args()
    import ray
    from ray.rllib.algorithms.appo import APPOConfig

    # RLlib's APPO also starts an aggregator actor per learner (a CPU each): offer enough CPUs that it is placed.
    ray.init(address="local", include_dashboard=False, num_cpus=max(4, args.num_env_runners + 2),
             _temp_dir=os.path.join(tempfile.gettempdir(), "rllib-appo-ray"))
    config = (APPOConfig().environment("CartPole-v1").env_runners(num_env_runners=args.num_env_runners)
              .debugging(seed=args.seed))
    algo = config.build_algo()
    train_start, solved, steps, mean = time.perf_counter(), None, 0, float("nan")
    while time.perf_counter() - train_start < args.cap:
        result = algo.train()
        runners = result.get("env_runners", {})
        mean = runners.get("episode_return_mean", float("nan"))
        steps = result.get("num_env_steps_sampled_lifetime") or runners.get("num_env_steps_sampled_lifetime", 0)
        print(f"iter steps={steps} return_mean={mean}", flush=True)
        if mean == mean and mean >= args.target:
            solved = time.perf_counter() - START
            break
    train_s = time.perf_counter() - train_start
    algo.stop()
    ray.shutdown()
    print(json.dumps({"tool": "rllib", "seed": args.seed, "solved": solved is not None,
                      "time_to_target_s": solved, "env_steps": int(steps), "return_mean": mean,
                      "sampled_steps_per_s": steps / train_s, "ray": ray.__version__}))


if __name__ == "__main__":
    main()
