"""Sampling throughput on image envs: herdrl's runner with its CNN policy vs the env's ceiling vs SB3, side by side.

For each env and number of envs, in one process, rounds alternate between:

* **ceiling**: the same vector env herdrl's runner steps (ale-py's vector env with the standard preprocessing;
  MinAtar on a sync vector env), stepped with random actions, no policy;
* **env step** and **inference** timed apart: one vector step, and one batched CNN forward pass on a batch of
  observations, so the pipeline's own cost shows as runner vs ``1 / (t_env + t_inference)`` ("predicted");
* **runner**: herdrl's ``EnvRunner`` (PPO's CNN policy, torch inference) writing fragments of 128 steps, as it
  runs by default (Atari: the envs in two halves, one stepping while the policy acts for the other) and with
  ``overlap: False`` (act, then step all envs: the loop the prediction describes);
* **sb3** (Pong only, when stable-baselines3 is installed): ``make_atari_env`` + ``VecFrameStack(4)`` with
  ``CnnPolicy.predict``, the way SB3 samples, on the same id (``PongNoFrameskip-v4``, the id SB3's zoo uses).

Agent steps/s (env frames/s = 4x for Atari's frame skip). Medians over rounds. ``--runner-gpus 1`` runs herdrl's
policy on the GPU (``num_gpus_per_env_runner``; inference alone timed there too); SB3 stays on the CPU.

    python benchmarks/atari_sampling.py [--env PongNoFrameskip-v4 MinAtar/Breakout-v1] [--envs 8 32]
        [--rounds 3] [--seconds 3] [--threads 2] [--runner-gpus 0]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from herdrl import PPOConfig
from herdrl.env import make_vector_env
from herdrl.models.encoders import to_torch, torch_device
from herdrl.obs import ObsSpec
from herdrl.rollout import EnvRunner


def timed(step, seconds: float) -> float:
    """Calls of ``step`` (each returning its number of agent steps) per second over ``seconds``."""
    step()  # warm up
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        steps += step()
    return steps / (time.perf_counter() - start)


def ceiling_and_parts(env_id: str, num_envs: int, seconds: float, gpus: float = 0.0) -> tuple[float, float, float]:
    """(ceiling agent steps/s, predicted runner steps/s from separately timed env step and inference)."""
    env = make_vector_env(env_id, {} if env_id.startswith("MinAtar") else {"overlap": False}, num_envs)
    obs, _ = env.reset(seed=0)
    n = env.single_action_space.n
    rng = np.random.default_rng(0)

    def env_step() -> int:
        env.step(rng.integers(0, n, num_envs))
        return num_envs

    ceiling = timed(env_step, seconds)
    config = PPOConfig().environment(env_id).debugging(seed=0)
    config.validate()
    device = torch_device(gpus, "--runner-gpus")
    module = config.build_module(env.single_observation_space, env.single_action_space).requires_grad_(False)
    module.to(device)
    batch = ObsSpec(env.single_observation_space).batch(obs)

    def inference() -> int:
        with torch.inference_mode():
            module.dist_inputs(to_torch(batch, device))
        if device.type == "cuda":
            torch.cuda.synchronize()  # the pass is done, not merely queued
        return num_envs

    infer = timed(inference, seconds)
    env.close()
    predicted = 1.0 / (1.0 / ceiling + 1.0 / infer)
    return ceiling, infer, predicted


def runner_rate(env_id: str, num_envs: int, seconds: float, env_config: dict | None = None,
                gpus: float = 0.0) -> float:
    config = PPOConfig().environment(env_id, env_config=env_config or {}) \
        .env_runners(num_envs_per_env_runner=num_envs, num_gpus_per_env_runner=gpus).debugging(seed=0)
    config.validate()
    runner = EnvRunner(config)
    rate = timed(lambda: runner.sample(128).actions.size, seconds)
    runner.stop()
    return rate


def sb3_rate(env_id: str, num_envs: int, seconds: float) -> float | None:
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack
    except ImportError:
        return None
    env = VecFrameStack(make_atari_env(env_id, n_envs=num_envs, seed=0), n_stack=4)
    model = PPO("CnnPolicy", env, device="cpu", seed=0)
    obs = env.reset()

    def step() -> int:
        nonlocal obs
        actions, _ = model.predict(obs, deterministic=False)
        obs, *_ = env.step(actions)
        return num_envs

    rate = timed(step, seconds)
    env.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", nargs="+", default=["PongNoFrameskip-v4", "MinAtar/Breakout-v1"])
    parser.add_argument("--envs", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads (both tools)")
    parser.add_argument("--runner-gpus", type=float, default=0.0, help="num_gpus_per_env_runner of herdrl's runner")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads: {args.threads}; agent steps/s, median of {args.rounds} rounds")
    print("| env | envs | ceiling | inference alone | predicted | runner, no overlap | herdrl runner | "
          "runner / predicted | runner / ceiling | sb3 | herdrl / sb3 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for env_id in args.env:
        for num_envs in args.envs:
            rows: dict[str, list[float]] = {"ceiling": [], "infer": [], "predicted": [], "serial": [], "runner": [],
                                            "sb3": []}
            atari = not env_id.startswith("MinAtar")
            for _ in range(args.rounds):
                ceiling, infer, predicted = ceiling_and_parts(env_id, num_envs, args.seconds, args.runner_gpus)
                rows["ceiling"].append(ceiling)
                rows["infer"].append(infer)
                rows["predicted"].append(predicted)
                if atari:
                    rows["serial"].append(runner_rate(env_id, num_envs, args.seconds, {"overlap": False},
                                                      args.runner_gpus))
                rows["runner"].append(runner_rate(env_id, num_envs, args.seconds, None, args.runner_gpus))
                if "NoFrameskip" in env_id:
                    rate = sb3_rate(env_id, num_envs, args.seconds)
                    if rate is not None:
                        rows["sb3"].append(rate)
            m = {k: statistics.median(v) if v else float("nan") for k, v in rows.items()}
            sb3 = f"{m['sb3']:,.0f} | {m['runner'] / m['sb3']:.2f}x" if rows["sb3"] else "- | -"
            serial = f"{m['serial']:,.0f}" if rows["serial"] else "-"
            print(f"| {env_id} | {num_envs} | {m['ceiling']:,.0f} | {m['infer']:,.0f} | {m['predicted']:,.0f} | "
                  f"{serial} | {m['runner']:,.0f} | {m['runner'] / m['predicted']:.2f} | "
                  f"{m['runner'] / m['ceiling']:.2f} | "
                  f"{sb3} |", flush=True)


if __name__ == "__main__":
    main()
