"""Continuous control (issue 16): normalisation merged right and mattering, and MuJoCo beside Stable-Baselines3.

    python benchmarks/continuous_control.py merge         # 4 Ray runners: merged statistics == all samples pooled
    python benchmarks/continuous_control.py filter        # PPO on Hopper-v5 with and without normalisation, 3 seeds
    python benchmarks/continuous_control.py throughput    # HalfCheetah-v5, 2-minute runs: PPO, SAC, TD3 vs SB3
    python benchmarks/continuous_control.py returns       # Hopper-v5, 5-minute runs: PPO and SAC vs SB3, 3 seeds

The GPU rows (SAC and TD3 on HalfCheetah-v5 for 8 minutes, learner and SB3 on the GPU, in-process, no Ray):

    python benchmarks/continuous_control.py throughput --algos SAC TD3 --seconds 480 --parallel 2 --threads 8 --gpus 1

Both tools get the same hyperparameters, read from herdrl's example files (``examples/mujoco/*.yaml``: the
rl-baselines3-zoo settings) and translated to SB3's names, so the files are what is measured. Each run is its own
subprocess (``run``), timed from the start of learning (imports and env construction excluded for both); the
return reported is the mean of the last 20 finished training episodes. ``--parallel 2`` runs a herdrl and an SB3
run side by side (one core each), for the long ``returns`` and ``filter`` comparisons.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "mujoco"


def example(algo: str, env: str) -> dict:
    """The example file's config for ``algo`` on ``env`` (PPO: per env; SAC, TD3: one file for all)."""
    from herdrl.experiment import load_experiment_file

    name = f"{env.split('-')[0].lower()}-ppo.yaml" if algo == "PPO" else f"{algo.lower()}.yaml"
    return load_experiment_file(EXAMPLES / name)["config"]


# ------------------------------------------------------------------------------------------ one run
def run_herdrl(algo: str, env: str, seed: int, seconds: float, runners: int, normalize: bool, threads: int,
               gpus: float = 0.0) -> dict:
    from herdrl.registry import get_config_class

    config = get_config_class(algo)().environment(env)
    config.update_from_dict({**example(algo, env), "seed": seed, "num_env_runners": runners})
    if threads:
        config.update_from_dict({"num_cpus_for_main_process": threads})
    if gpus:  # the learner in the driver on the GPU; runners keep CPU inference
        config.update_from_dict({"num_gpus": gpus})
    if algo != "PPO":  # evaluation off (SB3 runs none), and iterations short enough for the time budget
        config.update_from_dict({"evaluation_interval": None, "min_sample_timesteps_per_iteration": 1000})
    if not normalize:
        config.update_from_dict({"observation_filter": "NoFilter", "norm_reward": False})
    algo_ = config.build()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        result = algo_.train()
    elapsed = time.perf_counter() - start
    returns = list(algo_._returns)[-20:]  # the last finished training episodes
    algo_.stop()
    return {"steps": result["num_env_steps_sampled_lifetime"], "seconds": elapsed, "returns": returns}


def run_sb3(algo: str, env: str, seed: int, seconds: float, normalize: bool, gpus: float = 0.0) -> dict:
    import torch
    from stable_baselines3 import PPO, SAC, TD3
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize

    cfg = example(algo, env)
    model_cfg = cfg.get("model", {})
    activation = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}[model_cfg.get("fcnet_activation", "tanh")]
    venv = make_vec_env(env, n_envs=1, seed=seed)
    device = "cuda" if gpus else "cpu"  # SB3's "auto" would take a GPU the herdrl run was not given
    if algo == "PPO":
        if normalize:
            venv = VecNormalize(venv, gamma=cfg["gamma"], clip_obs=10.0, clip_reward=10.0)
        net = model_cfg.get("fcnet_hiddens", [64, 64])
        model = PPO("MlpPolicy", venv, n_steps=cfg["train_batch_size"], batch_size=cfg["minibatch_size"],
                    n_epochs=cfg["num_epochs"], gamma=cfg["gamma"], gae_lambda=cfg["lambda"], learning_rate=cfg["lr"],
                    ent_coef=cfg["entropy_coeff"], clip_range=cfg["clip_param"], max_grad_norm=cfg["grad_clip"],
                    vf_coef=cfg["vf_loss_coeff"], seed=seed, device=device,
                    policy_kwargs=dict(log_std_init=model_cfg.get("log_std_init", 0.0), ortho_init=False,
                                       activation_fn=activation, net_arch=dict(pi=net, vf=net)))
    else:
        common = dict(learning_rate=cfg["lr"], gamma=cfg["gamma"], tau=cfg["tau"], batch_size=cfg["train_batch_size"],
                      learning_starts=cfg["num_steps_sampled_before_learning_starts"], train_freq=1, gradient_steps=1,
                      buffer_size=cfg["replay_buffer_config"]["capacity"], seed=seed, device=device,
                      policy_kwargs=dict(net_arch=cfg["model"]["fcnet_hiddens"], activation_fn=activation))
        if algo == "TD3":
            noise = NormalActionNoise(np.zeros(venv.action_space.shape), cfg["exploration_noise"] *
                                      np.ones(venv.action_space.shape))
            model = TD3("MlpPolicy", venv, action_noise=noise, **common)
        else:
            model = SAC("MlpPolicy", venv, **common)

    class Deadline(BaseCallback):
        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            return time.perf_counter() - self.start < seconds

    deadline = Deadline()
    model.learn(total_timesteps=10**9, callback=deadline)
    elapsed = time.perf_counter() - deadline.start
    returns = [info["r"] for info in model.ep_info_buffer]
    return {"steps": model.num_timesteps, "seconds": elapsed, "returns": returns[-20:]}


def spawn(tool: str, algo: str, env: str, seed: int, seconds: float, runners: int = 0,
          normalize: bool = True, threads: int = 0, gpus: float = 0.0) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "run", tool, algo, env, str(seed), str(seconds), "--runners", str(runners),
           "--threads", str(threads), "--gpus", str(gpus)]
    return subprocess.Popen(cmd + ([] if normalize else ["--no-normalize"]), stdout=subprocess.PIPE, text=True)


def collect(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"a run failed (exit {proc.returncode}): {out[-2000:]}")
    return json.loads(lines[-1])


def run_all(jobs: list[tuple], parallel: int, threads: int, gpus: float = 0.0):
    """Run (label, spawn args...) jobs, ``parallel`` at a time, in order; yield their results, labelled."""
    for i in range(0, len(jobs), parallel):
        running = [(job[0], spawn(*job[1:], threads=threads, gpus=gpus)) for job in jobs[i:i + parallel]]
        for label, proc in running:
            yield {**label, **collect(proc)}


def row(result: dict) -> str:
    mean = np.mean(result["returns"]) if result["returns"] else float("nan")
    return (f"| {result['what']} | {result['tool']} | {result.get('seed', '')} | {result['steps']:,} | "
            f"{result['steps'] / result['seconds']:,.0f} | {mean:,.0f} |")


HEADER = ("| run | tool | seed | env steps | env steps/s | return (last 20 episodes) |\n"
          "| --- | --- | --- | --- | --- | --- |")


# ------------------------------------------------------------------------------------------ comparisons
def merge_check() -> None:
    """4 Ray runners with different env counts: the run's statistics against numpy's over every observation."""
    import os
    import tempfile

    import gymnasium as gym

    import herdrl

    class Recording(gym.Wrapper):
        def __init__(self, config: dict) -> None:
            super().__init__(gym.make(config.get("id", "HalfCheetah-v5")))
            self.log = open(os.path.join(config["log_dir"], f"{os.getpid()}-{id(self)}.txt"), "a")

        def _record(self, obs):  # repr of a float64: exact, so the pooled statistics see the stored values
            self.log.write(" ".join(repr(float(x)) for x in np.float32(obs)) + "\n")
            self.log.flush()
            return obs

        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            return self._record(obs), info

        def step(self, action):
            obs, *rest = self.env.step(action)
            return (self._record(obs), *rest)

    with tempfile.TemporaryDirectory() as log_dir:
        herdrl.register_env("recording", Recording)
        algo = (herdrl.PPOConfig().environment("recording", env_config={"log_dir": log_dir})
                .env_runners(num_env_runners=4, num_envs_per_env_runner=3, observation_filter="MeanStdFilter")
                .training(train_batch_size=3000, minibatch_size=500, num_epochs=1).debugging(seed=0)).build()
        for _ in range(3):
            algo.train()
        stats = algo.normalizer.stats["obs"]
        algo.stop()
        raw = np.concatenate([np.loadtxt(f, ndmin=2) for f in Path(log_dir).glob("*.txt")])
    mean_err = np.max(np.abs(stats.mean - raw.mean(0)))
    var_err = np.max(np.abs(stats.var - raw.var(0)) / raw.var(0))
    print(f"4 runners x 3 envs, 3 iterations of HalfCheetah-v5: {int(stats.count):,} observations merged, "
          f"{len(raw):,} recorded; max |mean - pooled mean| = {mean_err:.2e}, max relative variance error = "
          f"{var_err:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("run", help="one run (used by the others)")
    for arg in ("tool", "algo", "env"):
        one.add_argument(arg)
    one.add_argument("seed", type=int)
    one.add_argument("seconds", type=float)
    one.add_argument("--runners", type=int, default=0)
    one.add_argument("--no-normalize", action="store_true")
    one.add_argument("--threads", type=int, default=0, help="torch threads of both tools (0: the tool's default)")
    one.add_argument("--gpus", type=float, default=0.0, help="herdrl's num_gpus (its learner); SB3's device cuda")
    sub.add_parser("merge")
    for name, seconds in (("filter", 120.0), ("throughput", 120.0), ("returns", 300.0)):
        p = sub.add_parser(name)
        p.add_argument("--seeds", type=int, nargs="+", default=[1] if name == "throughput" else [1, 2, 3])
        p.add_argument("--seconds", type=float, default=seconds)
        p.add_argument("--parallel", type=int, default=1 if name == "throughput" else 2)
        p.add_argument("--algos", nargs="+", default=["PPO", "SAC", "TD3"], help="throughput: which algorithms")
        p.add_argument("--env", default="Hopper-v5", help="filter: the env (PPO example file of its name)")
        p.add_argument("--threads", type=int, default=None,
                       help="torch threads per run (default: 2 alone, 1 when runs share the 2 cores)")
        p.add_argument("--gpus", type=float, default=0.0, help="learners (and SB3) on the GPU")
    args = parser.parse_args()

    if args.command == "run":
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        normalize = not args.no_normalize
        result = run_herdrl(args.algo, args.env, args.seed, args.seconds, args.runners, normalize, args.threads,
                            args.gpus) if args.tool == "herdrl" else \
            run_sb3(args.algo, args.env, args.seed, args.seconds, normalize, args.gpus)
        print(json.dumps(result))
        return
    if args.command == "merge":
        merge_check()
        return
    jobs: list[tuple] = []
    for seed in args.seeds:
        if args.command == "throughput":
            for algo in args.algos:
                for tool in ("herdrl", "sb3"):
                    jobs.append(({"what": f"{algo} HalfCheetah-v5", "tool": tool, "seed": seed}, tool, algo,
                                 "HalfCheetah-v5", seed, args.seconds))
            if "PPO" in args.algos:
                jobs.append(({"what": "PPO HalfCheetah-v5, 2 runners", "tool": "herdrl", "seed": seed}, "herdrl",
                             "PPO", "HalfCheetah-v5", seed, args.seconds, 2))
        elif args.command == "returns":
            for algo in ("PPO", "SAC"):
                for tool in ("herdrl", "sb3"):
                    jobs.append(({"what": f"{algo} Hopper-v5", "tool": tool, "seed": seed}, tool, algo, "Hopper-v5",
                                 seed, args.seconds))
        else:  # filter
            for normalize in (True, False):
                what = f"PPO {args.env}, {'normalised' if normalize else 'raw'}"
                jobs.append(({"what": what, "tool": "herdrl", "seed": seed}, "herdrl", "PPO", args.env, seed,
                             args.seconds, 0, normalize))
    print(HEADER, flush=True)
    threads = args.threads if args.threads is not None else (2 if args.parallel == 1 else 1)
    print(f"torch threads per run: {threads}; runs side by side: {args.parallel}", flush=True)
    for result in run_all(jobs, args.parallel, threads, args.gpus):
        print(row(result), flush=True)


if __name__ == "__main__":
    main()
