"""Learning on MinAtar Breakout-v1 with PPO, DQN or APPO: herdrl (several seeds) beside SB3 (same settings, budget).

PPO, both: 8 envs x 128 steps per update, 4 epochs of 4 minibatches of 256, lr 2.5e-4, gamma 0.99, GAE 0.95,
clip 0.2, entropy 0.01, value 0.5, gradient norm 0.5. DQN, both (SB3's DQN defaults for the rest): 1 env,
replay 100k, learning from 5,000 steps, a gradient step of 32 every 4 env steps, lr 2.5e-4, target copied every
1,000 steps, epsilon 1 -> 0.01 over the first 10% of the budget, no double Q, gradient norm 10. The same network
(MinAtar's: 16 3x3 filters, 128 units; PPO's policy and value heads on one encoder); SB3 gets it as a
features extractor (its NatureCNN needs 36 pixels). APPO (herdrl only): 1 Ray runner of 8 envs x 128 steps
sampling while the learner learns, batches of 1024, 2 passes of 4 minibatches of 256 each (the old policy
refreshed once per batch), lr 1e-3, no entropy bonus, gamma 0.99, clip 0.2, the same value weight and gradient
clipping as PPO. ``--config KEY=VALUE ...`` overrides settings of every herdrl run. Each run trains for ``--steps`` env
steps or ``--seconds`` of wall-clock (herdrl's ``--stop-time``), each tool in its own process; the table shows
wall-clock and the mean return of the last 100 training episodes at the end;
``--plot`` writes herdrl's curves with `herd plot`.

    python benchmarks/minatar_learning.py [--algo ppo|dqn|appo ...] [--steps 500000 | --seconds 72] [--seeds 0 1 2]
        [--sb3-seeds 0] [--config KEY=VALUE ...] [--plot out.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = "MinAtar/Breakout-v1"
HERD = str(Path(sys.executable).parent / "herd")
DQN_SETTINGS = ["train_batch_size=32", "training_intensity=8", "lr=2.5e-4", "gamma=0.99", "double_q=false",
                "num_steps_sampled_before_learning_starts=5000", "target_network_update_freq=1000",
                "replay_buffer_config={capacity: 100000}", "grad_clip=10", "min_sample_timesteps_per_iteration=5000"]
APPO_SETTINGS = ["num_env_runners=1", "rollout_fragment_length=128", "train_batch_size=1024", "minibatch_size=256",
                 "circular_buffer_iterations_per_batch=2", "target_network_update_freq=2048", "lr=1e-3",
                 "gamma=0.99", "clip_param=0.2", "entropy_coeff=0.0", "vf_loss_coeff=1.0", "grad_clip=0.5"]
SETTINGS = ["train_batch_size=1024", "minibatch_size=256", "num_epochs=4", "lr=2.5e-4", "gamma=0.99",
            "lambda_=0.95", "clip_param=0.2", "entropy_coeff=0.01", "vf_loss_coeff=0.5", "grad_clip=0.5"]

SB3 = """
import sys, time, numpy as np, torch, gymnasium as gym
from torch import nn
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from herdrl.env.imports import register_minatar
import minatar  # noqa: F401
register_minatar()
steps, seed, algo = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

class MinAtarCNN(BaseFeaturesExtractor):
    def __init__(self, space):
        super().__init__(space, 128)
        c = space.shape[-1]
        self.net = nn.Sequential(nn.Conv2d(c, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(1024, 128), nn.ReLU())
    def forward(self, obs):
        return self.net(obs.permute(0, 3, 1, 2).float())

start = time.time()
extractor = dict(features_extractor_class=MinAtarCNN, net_arch=[], normalize_images=False)
if algo == "ppo":
    env = make_vec_env("ENV_ID", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=256, n_epochs=4, learning_rate=2.5e-4, gamma=0.99,
                gae_lambda=0.95, clip_range=0.2, ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, device="cpu",
                seed=seed, policy_kwargs=extractor)
else:
    from stable_baselines3 import DQN
    env = make_vec_env("ENV_ID", n_envs=1, seed=seed)
    model = DQN("MlpPolicy", env, buffer_size=100_000, learning_starts=5000, batch_size=32, train_freq=4,
                learning_rate=2.5e-4, gamma=0.99, target_update_interval=1000, exploration_fraction=0.1,
                exploration_final_eps=0.01, max_grad_norm=10, device="cpu", seed=seed, policy_kwargs=extractor)
model.learn(total_timesteps=steps)
returns = [info["r"] for info in model.ep_info_buffer]
print("RESULT", time.time() - start, float(np.mean(returns)), model.num_timesteps)
""".replace("ENV_ID", ENV)


def herdrl_run(steps: int, seed: int, out: str, algo: str, seconds: float | None = None,
               overrides: tuple[str, ...] = ()) -> tuple[float, float, int]:
    start = time.time()
    settings = [*{"ppo": SETTINGS, "appo": APPO_SETTINGS}.get(
        algo, [*DQN_SETTINGS, f"epsilon=[[0, 1.0], [{steps // 10}, 0.01]]"]), *overrides]
    budget = ["--stop-time", str(seconds)] if seconds else ["--stop-timesteps", str(steps)]
    subprocess.run([HERD, "train", algo, "--env", ENV, "--num-envs-per-env-runner", "1" if algo == "dqn" else "8",
                    "--seed", str(seed), *budget, "--output", out, "--name", f"minatar-{algo}",
                    "--trial", f"seed{seed}", "--no-tensorboard", "--quiet", "--config", *settings], check=True,
                   stdout=subprocess.DEVNULL)
    elapsed = time.time() - start
    last = json.loads((Path(out) / f"minatar-{algo}" / f"seed{seed}" / "result.json").read_text().splitlines()[-1])
    return elapsed, last["episode_return_mean"], last["num_env_steps_sampled_lifetime"]


def sb3_run(steps: int, seed: int, algo: str) -> tuple[float, float, int]:
    out = subprocess.run([sys.executable, "-c", SB3, str(steps), str(seed), algo], check=True, capture_output=True,
                         text=True).stdout
    elapsed, ret, done = out.split("RESULT")[-1].split()
    return float(elapsed), float(ret), int(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=("ppo", "dqn", "appo"), nargs="+", default=["ppo"])
    parser.add_argument("--seconds", type=float, help="a wall-clock budget per herdrl run instead of --steps")
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--sb3-seeds", type=int, nargs="*", default=[0])
    parser.add_argument("--plot", help="write herdrl's learning curves here (PNG)")
    parser.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE",
                        help="settings for every herdrl run, over the algorithm's")
    args = parser.parse_args()
    budget = f"{args.seconds:g} s" if args.seconds else f"{args.steps:,} env steps"
    print(f"{', '.join(a.upper() for a in args.algo)} on {ENV}, {budget} per run")
    print("| tool | algorithm | seed | wall-clock, s | env steps | mean return (last 100 episodes) |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as out:
        for seed in args.seeds:  # seeds outside, algorithms inside: machine noise hits all alike
            for algo in args.algo:
                elapsed, ret, done = herdrl_run(args.steps, seed, out, algo, args.seconds, tuple(args.config))
                rows.setdefault(f"herdrl {algo}", []).append((elapsed, ret))
                print(f"| herdrl | {algo} | {seed} | {elapsed:.0f} | {done:,} | {ret:.1f} |", flush=True)
        if args.plot and args.seeds:
            subprocess.run([HERD, "plot", str(Path(out) / f"minatar-{args.algo[0]}"), "--out", args.plot], check=True)
        for seed in args.sb3_seeds:
            for algo in (a for a in args.algo if a != "appo"):
                elapsed, ret, done = sb3_run(args.steps, seed, algo)
                rows.setdefault(f"sb3 {algo}", []).append((elapsed, ret))
                print(f"| sb3 | {algo} | {seed} | {elapsed:.0f} | {done:,} | {ret:.1f} |", flush=True)
    for tool, values in rows.items():
        print(f"{tool}: median wall-clock {statistics.median(v[0] for v in values):.0f} s, "
              f"median final return {statistics.median(v[1] for v in values):.1f}")


if __name__ == "__main__":
    main()
