"""Memory (issue 17): a partially observed CartPole, LSTM vs MLP, beside sb3-contrib's RecurrentPPO.

    python benchmarks/memory.py --seeds 1 2 3
    python benchmarks/memory.py --env herd/Recall-v0 --target 0.95 --budget 100000 --seeds 1 2 3
    python benchmarks/memory.py --defaults --seeds 0 1 2 3 4 --budget 500000   # the README's line, defaults

``herd/StatelessCartPole-v1`` is CartPole-v1 showing positions only (no velocities). Each run trains until the
mean return of the last 100 training episodes reaches ``--target`` or the step budget is spent, in its own
subprocess, timed from the start of learning. RecurrentPPO uses rl-baselines3-zoo's tuned CartPoleNoVel-v1
settings (8 envs x 32 steps, 20 epochs of one 256-step minibatch, gamma 0.98, lambda 0.8, lr 1e-3 decaying to 0,
clip 0.2 decaying, LSTM 64 for the actor and one for the critic, [64] ReLU layers, VecNormalize); herdrl's LSTM
PPO takes the same numbers (constant lr and clip, one LSTM shared by both heads, sequences of 32 steps,
observation and reward normalisation); its MLP run is the same without the LSTM. ``herd/Recall-v0`` (name at the
last of 7 steps a cue shown at the first; without memory the best is 0.5) runs with the same settings.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

ENV = "herd/StatelessCartPole-v1"


def run_herdrl(seed: int, target: float, budget: int, lstm: bool, env: str = ENV,
               env_config: dict | None = None) -> dict:
    from herdrl import PPOConfig

    model = {"use_lstm": lstm, "lstm_cell_size": 64, "max_seq_len": 32, "fcnet_hiddens": [64],
             "fcnet_activation": "relu"}
    algo = (PPOConfig().environment(env, env_config=env_config or {})
            .env_runners(num_envs_per_env_runner=8, rollout_fragment_length=32, observation_filter="MeanStdFilter",
                         norm_reward=True)
            .training(train_batch_size=256, minibatch_size=256, num_epochs=20, gamma=0.98, lambda_=0.8, lr=1e-3,
                      clip_param=0.2, entropy_coeff=0.0, vf_loss_coeff=0.5, model=model)
            .debugging(seed=seed)).build()
    start = time.perf_counter()
    result: dict = {}
    while True:
        result = algo.train()
        mean = result["episode_return_mean"]
        if (len(algo._returns) >= 100 and mean >= target) or result["num_env_steps_sampled_lifetime"] >= budget:
            break
    elapsed = time.perf_counter() - start
    algo.stop()
    return {"solved": bool(mean >= target), "seconds": elapsed, "steps": result["num_env_steps_sampled_lifetime"],
            "return": mean}


def run_sb3(seed: int, target: float, budget: int, env: str = ENV, env_config: dict | None = None) -> dict:
    import gymnasium as gym
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    import herdrl.env  # noqa: F401  (registers herd/StatelessCartPole-v1)

    def linear(value: float):
        return lambda remaining: remaining * value

    venv = VecNormalize(make_vec_env(lambda: gym.make(env, **(env_config or {})), n_envs=8, seed=seed), gamma=0.98)
    model = RecurrentPPO("MlpLstmPolicy", venv, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                         ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2), seed=seed,
                         policy_kwargs=dict(ortho_init=False, activation_fn=torch.nn.ReLU, lstm_hidden_size=64,
                                            enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64])))

    class Solved(BaseCallback):
        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            returns = [info["r"] for info in self.model.ep_info_buffer]
            return not (len(returns) >= 100 and np.mean(returns) >= target)

    solved = Solved()
    model.learn(total_timesteps=budget, callback=solved)
    returns = [info["r"] for info in model.ep_info_buffer]
    mean = float(np.mean(returns)) if returns else float("nan")
    return {"solved": bool(mean >= target and len(returns) >= 100), "seconds": time.perf_counter() - solved.start,
            "steps": model.num_timesteps, "return": mean}


def run_defaults(seed: int, budget: int, config: list[str]) -> dict:
    """The README's line as a user runs it: ``herd train ppo --env herd/StatelessCartPole-v1 --config
    model.use_lstm=true`` (every other setting herdrl's default), to the env's threshold (475) or ``budget``."""
    import tempfile
    from pathlib import Path

    herd = str(Path(sys.executable).parent / "herd")
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        proc = subprocess.run([herd, "train", "ppo", "--env", ENV, "--config", "model.use_lstm=true", *config,
                               "--seed", str(seed), "--budget", str(budget), "--output", out, "--quiet",
                               "--no-tensorboard"], capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        rows = [json.loads(line) for trial in Path(out).glob("*/*/result.json") for line in trial.open()]
    if not rows:
        return {"solved": False, "seconds": elapsed, "steps": 0, "return": float("nan"), "error": proc.stderr[-300:]}
    best = max(r["episode_return_mean"] for r in rows if r["episode_return_mean"] == r["episode_return_mean"])
    return {"solved": proc.returncode == 0, "seconds": elapsed, "steps": rows[-1]["num_env_steps_sampled_lifetime"],
            "return": rows[-1]["episode_return_mean"], "best": best}


def defaults_table(seeds: list[int], budget: int, config: list[str]) -> None:
    """One row per seed of :func:`run_defaults`, from process start (imports included)."""
    extra = f" {' '.join(config)}" if config else ""
    print(f"herd train ppo --env {ENV} --config model.use_lstm=true{extra} --seed S --budget {budget:,}")
    print("| seed | solved (475) | env steps | time, s | return at the end | best 100-episode mean |")
    print("| --- | --- | --- | --- | --- | --- |")
    for seed in seeds:
        r = run_defaults(seed, budget, config)
        print(f"| {seed} | {'yes' if r['solved'] else 'no'} | {r['steps']:,} | {r['seconds']:.0f} | "
              f"{r['return']:.0f} | {r.get('best', float('nan')):.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--defaults", action="store_true",
                        help="the README's LSTM line with herdrl's defaults, to 475, one row per seed")
    parser.add_argument("--config", nargs="*", default=[], help="with --defaults: extra KEY=VALUE overrides")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--env", default=ENV, choices=[ENV, "herd/Recall-v0"])
    parser.add_argument("--delay", type=int, help="herd/Recall-v0: blank steps between the cue and the answer")
    parser.add_argument("--target", type=float, default=300.0)
    parser.add_argument("--budget", type=int, default=200_000)
    parser.add_argument("--run", nargs=2, metavar=("TOOL", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.defaults:
        defaults_table(args.seeds, args.budget, args.config)
        return
    env_config = {} if args.delay is None else {"delay": args.delay}
    if args.run:
        tool, seed = args.run[0], int(args.run[1])
        result = run_sb3(seed, args.target, args.budget, args.env, env_config) if tool == "sb3-contrib" else \
            run_herdrl(seed, args.target, args.budget, lstm=tool == "herdrl-lstm", env=args.env, env_config=env_config)
        print(json.dumps(result))
        return
    print(f"{args.env} {env_config}, target {args.target:g} (100-episode mean), budget {args.budget:,} env steps")
    print("| tool | seed | solved | time, s | env steps | return at the end |\n| --- | --- | --- | --- | --- | --- |")
    for seed in args.seeds:
        for tool in ("herdrl-lstm", "sb3-contrib", "herdrl-mlp"):
            command = [sys.executable, __file__, "--run", tool, str(seed), "--target", str(args.target), "--budget",
                       str(args.budget), "--env", args.env]
            command += [] if args.delay is None else ["--delay", str(args.delay)]
            out = subprocess.run(command, capture_output=True, text=True).stdout
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if not lines:
                print(f"| {tool} | {seed} | failed | | | |", flush=True)
                continue
            r = json.loads(lines[-1])
            print(f"| {tool} | {seed} | {'yes' if r['solved'] else 'no'} | {r['seconds']:.1f} | {r['steps']:,} | "
                  f"{r['return']:.{0 if r['return'] > 10 else 2}f} |", flush=True)


if __name__ == "__main__":
    main()
