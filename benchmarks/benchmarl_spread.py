"""MAPPO, QMIX and VDN on MPE ``simple_spread`` with BenchMARL's settings, herdrl beside BenchMARL (TorchRL's
multi-agent benchmark), one invocation: each tool in its own subprocess, BenchMARL in its own venv.

    python benchmarks/benchmarl_spread.py --frames 150000 --seeds 1 --benchmarl-python /tmp/benchmarl-venv/bin/python
    python benchmarks/benchmarl_spread.py --algorithm qmix --frames 150000 --seeds 1
    python benchmarks/benchmarl_spread.py --algorithm ippo --frames 150000 --seeds 1 2 3

BenchMARL's venv (its torchrl pulls its own torch; PettingZoo 1.24 still ships MPE, which torchrl's PettingZoo
wrapper imports): ``python3.11 -m venv /tmp/benchmarl-venv && /tmp/benchmarl-venv/bin/pip install torch==2.13.0
benchmarl "pettingzoo[mpe]==1.24.3"``.

The task as BenchMARL's ``pettingzoo/simple_spread`` config has it: 3 agents, ``max_cycles=100``,
``local_ratio=0.5``; discrete actions (``prefer_continuous_actions=False``) for both. BenchMARL's MAPPO defaults
(its ``mappo.yaml``, ``base_experiment.yaml``, ``mlp.yaml``), given to herdrl as the same keys: 6,000 env steps per
batch from 10 env copies, 45 passes of minibatches of 400 env steps (1,200 agent rows: herdrl counts rows), lr
5e-5, gamma 0.99, GAE lambda 0.9, clip 0.2, no entropy bonus, value loss weight 1, [256, 256] tanh networks, one
actor shared by the agents and a centralised critic (herdrl's ``centralized_critic``: the env's global state beside
the agent's observation; ``--algorithm ippo``: BenchMARL's IPPO against the same shared policy whose critic sees
its agent's observation only). The score is the training return of the last batch's episodes, summed over the agents
(BenchMARL reports the mean over agents: multiplied by 3 here), and the wall-clock seconds of the run. Prints
``RESULT {json}`` lines.

Every run records a curve: (env steps, seconds, return) after each iteration's training, the return the mean over
the episodes that ended in that iteration's sampling (both tools: ~60 episodes per 6,000-step batch; the final
``return`` of a herdrl run stays its last 100 episodes), stamped with the time after the iteration's update. When both
tools ran, the summary gives the first iteration at which each run's return reached R (``--reach R``, else the median
of BenchMARL's final returns), and the first from which it stayed there for two iterations, with the ratio of the
tools' median seconds. ``--random`` first plays 200 episodes with uniformly random actions (the floor).

``--algorithm qmix`` / ``vdn``: BenchMARL's off-policy defaults (``base_experiment.yaml``, ``qmix.yaml``,
``vdn.yaml``) given to herdrl's ``QMIXConfig``: 6,000 env steps per iteration from 10 env copies, 1,000 gradient
steps of 128 transitions each per iteration (``training_intensity`` 128 x 1,000 / 6,000), lr 5e-5, gamma 0.99,
gradient norm clipped at 5, a soft target update (tau 0.005) per gradient step (every 6 env steps), epsilon from
0.8 to 0.01 over the first third of the frames, [256, 256] tanh agent networks, a mixing network of width 32.
Differences left: herdrl's TD loss is Huber where BenchMARL's is L2, and its Adam epsilon is its own. The team's
return (the agents' mean reward) is multiplied by 3 as BenchMARL's is. ``--local-ratio 0``: the shared-reward
variant (each agent paid the team's coverage reward alone, no collision term of its own), for both tools.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time

try:  # BenchMARL's venv: its callback records the curve (a module-level class: BenchMARL pickles its callbacks)
    from benchmarl.experiment import Callback as BenchmarlCallback
except ImportError:  # herdrl's venv
    BenchmarlCallback = object

FRAMES_PER_BATCH, MINIBATCH, EPOCHS, ENVS = 6000, 400, 45, 10
AGENTS = 3  # BenchMARL's minibatch is 400 frames of all 3 agents; herdrl's minibatch_size counts agent rows
ENV_CONFIG = {"N": 3, "max_cycles": 100, "local_ratio": 0.5, "continuous_actions": False}


class Curve(BenchmarlCallback):
    """(env steps, seconds, team return) per iteration: the batch's return, the time after its training."""

    def __init__(self):
        super().__init__()
        self.points, self.start, self.pending = [], None, None

    def on_batch_collected(self, batch):
        self.pending = (self.experiment.total_frames, 3 * float(self.experiment.mean_return))

    def on_train_end(self, training_td, group):
        if self.pending is not None:  # (once per iteration: a task with several groups trains each)
            frames_, return_ = self.pending
            self.points.append((frames_, round(time.perf_counter() - self.start, 2), return_))
            self.pending = None


def batch_return(algo, result: dict) -> float:
    """The mean return of the episodes that ended in this iteration (as BenchMARL's point: its batch's episodes),
    read from the algorithm's window of the last 100 episodes (``episode_return_mean`` averages all of them)."""
    ended = result["num_episodes"]
    return sum(list(algo._returns)[-ended:]) / ended if 0 < ended <= len(algo._returns) else float("nan")


def run_herdrl_team(mixer: str, seed: int, frames: int) -> dict:
    """herdrl's QMIX or VDN with BenchMARL's off-policy settings, in-process."""
    from herdrl import QMIXConfig

    algo = (QMIXConfig().environment("mpe2.simple_spread_v3", env_config=ENV_CONFIG)
            .env_runners(num_envs_per_env_runner=ENVS, rollout_fragment_length=FRAMES_PER_BATCH // ENVS)
            .training(mixer=mixer, train_batch_size=128, training_intensity=128 * 1000 / FRAMES_PER_BATCH, lr=5e-5,
                      gamma=0.99, grad_clip=5.0, tau=0.005, target_network_update_freq=FRAMES_PER_BATCH // 1000,
                      epsilon=[[0, 0.8], [frames // 3, 0.01]], num_steps_sampled_before_learning_starts=1,
                      # one sampling round per iteration (its reset-only steps are not counted: 5,940 of 6,000)
                      min_sample_timesteps_per_iteration=FRAMES_PER_BATCH // 2, mixing_embed_dim=32,
                      model={"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"})
            .evaluation(evaluation_interval=None).debugging(seed=seed).build())
    start, curve = time.perf_counter(), []
    for _ in range(frames // FRAMES_PER_BATCH):  # BenchMARL's iterations (each 1,000 gradient steps)
        result = algo.train()
        curve.append((result["num_env_steps_sampled_lifetime"], round(time.perf_counter() - start, 2),
                      AGENTS * batch_return(algo, result)))
    seconds = time.perf_counter() - start
    algo.stop()
    return {"return": AGENTS * result["episode_return_mean"], "frames": result["num_env_steps_sampled_lifetime"],
            "seconds": seconds, "curve": curve}


def run_herdrl(seed: int, frames: int, algorithm: str = "mappo") -> dict:
    """herdrl's MAPPO (IPPO: each critic sees its agent's observation only) with BenchMARL's settings,
    in-process."""
    from herdrl import PPOConfig

    algo = (PPOConfig().environment("mpe2.simple_spread_v3", env_config=ENV_CONFIG)
            .env_runners(num_envs_per_env_runner=ENVS, rollout_fragment_length=FRAMES_PER_BATCH // ENVS)
            .training(train_batch_size=FRAMES_PER_BATCH, minibatch_size=MINIBATCH * AGENTS, num_epochs=EPOCHS, lr=5e-5,
                      gamma=0.99, lambda_=0.9, clip_param=0.2, entropy_coeff=0.0, vf_loss_coeff=1.0,
                      model={"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"})
            .multi_agent(policies={"shared"}, centralized_critic=algorithm == "mappo").debugging(seed=seed).build())
    start, curve = time.perf_counter(), []  # (env steps, seconds, return) after each iteration
    while True:
        result = algo.train()
        curve.append((result["num_env_steps_sampled_lifetime"], round(time.perf_counter() - start, 2),
                      batch_return(algo, result)))
        if result["num_env_steps_sampled_lifetime"] >= frames:
            break
    seconds = time.perf_counter() - start
    algo.stop()
    return {"return": result["episode_return_mean"], "batch_return": curve[-1][2],
            "frames": result["num_env_steps_sampled_lifetime"], "seconds": seconds, "curve": curve}


def random_return(episodes: int = 200, seed: int = 0) -> dict:
    """The team return of uniformly random actions on the same task (summed over the agents), in herdrl's venv."""
    import numpy as np
    from mpe2 import simple_spread_v3

    env, rng, returns = simple_spread_v3.parallel_env(**ENV_CONFIG), np.random.default_rng(seed), []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total = 0.0
        while env.agents:
            actions = {agent: int(rng.integers(env.action_space(agent).n)) for agent in env.agents}
            total += sum(env.step(actions)[1].values())
        returns.append(total)
    return {"return": float(np.mean(returns)), "std": float(np.std(returns)), "episodes": episodes}


def run_benchmarl(seed: int, frames: int, algorithm: str = "mappo") -> dict:
    """BenchMARL's MAPPO (or QMIX, VDN), its defaults, on CPU, no loggers, no evaluation (run in BenchMARL's venv)."""
    from benchmarl.algorithms import IppoConfig, MappoConfig, QmixConfig, VdnConfig
    from benchmarl.environments import PettingZooTask
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    config = ExperimentConfig.get_from_yaml()
    config.max_n_frames, config.loggers, config.evaluation = frames, [], False
    config.prefer_continuous_actions = False
    config.sampling_device = config.train_device = config.buffer_device = "cpu"
    config.save_folder, config.checkpoint_interval, config.checkpoint_at_end = tempfile.mkdtemp(), 0, False
    task = PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
    task.config["local_ratio"] = ENV_CONFIG["local_ratio"]
    algorithm_config = {"mappo": MappoConfig, "ippo": IppoConfig, "qmix": QmixConfig,
                        "vdn": VdnConfig}[algorithm].get_from_yaml()
    experiment = Experiment(task=task, algorithm_config=algorithm_config,
                            model_config=MlpConfig.get_from_yaml(), critic_model_config=MlpConfig.get_from_yaml(),
                            seed=seed, config=config, callbacks=[curve := Curve()])
    start = curve.start = time.perf_counter()
    experiment.run()
    seconds = time.perf_counter() - start
    return {"return": 3 * float(experiment.mean_return), "frames": experiment.total_frames, "seconds": seconds,
            "curve": curve.points}


def first_reach(curve: list, target: float, held: int = 1) -> tuple | None:
    """The first (env steps, seconds, return) point of a curve that begins ``held`` points in a row whose returns
    are >= target, or None."""
    return next((curve[i] for i in range(len(curve) - held + 1)
                 if all(r >= target for _, _, r in curve[i:i + held])), None)


def summarise_reach(results: list[dict], target: float | None) -> None:
    """Print when each run first reached the target return, and the ratio of the tools' median times."""
    curves = [r for r in results if r.get("curve")]
    if target is None:
        finals = [r["return"] for r in curves if r["tool"] == "benchmarl"]
        if not finals:
            return
        target = statistics.median(finals)
    for held in (1, 2):
        print(f"first iteration whose return reached {target:.1f}" + (" (and the next one too)" if held > 1 else "")
              + ":")
        times = {}
        for r in curves:
            point = first_reach(r["curve"], target, held)
            times.setdefault(r["tool"], []).append(point[1] if point else float("inf"))
            print(f"  {r['tool']} seed {r['seed']}: " + (f"{point[2]:.1f} at {point[0]:,} env steps, {point[1]:.0f} s "
                                                         f"(run: {r['seconds']:.0f} s)" if point else "never"))
        median = {tool: statistics.median(t) for tool, t in times.items()}
        if len(median) == 2:
            ratio = median["herdrl"] / median["benchmarl"] if math.isfinite(median["benchmarl"]) else float("nan")
            print(f"  median seconds to reach: herdrl {median['herdrl']:.0f}, BenchMARL {median['benchmarl']:.0f}, "
                  f"ratio {ratio:.2f}x")


def summarise_logs(paths: list[str], target: float | None) -> None:
    """The final returns (median per tool and algorithm) and the time-to-reach summary of logged RESULT lines."""
    results = [json.loads(line[len("RESULT "):]) for path in paths for line in open(path)
               if line.startswith("RESULT ")]
    if not results:
        raise SystemExit(f"no RESULT lines in {', '.join(paths)}")
    finals: dict[tuple, list] = {}
    for r in results:  # the last batch's return (BenchMARL's own score) for both tools
        finals.setdefault((r["tool"], r["algorithm"]), []).append((r["seed"], r["curve"][-1][2], r["seconds"]))
    for (tool, algorithm), runs in sorted(finals.items()):
        runs.sort()
        print(f"{tool} {algorithm}: " + ", ".join(f"seed {s} {ret:.1f} in {sec:.0f} s" for s, ret, sec in runs)
              + f"; median {statistics.median(r[1] for r in runs):.1f}, {statistics.median(r[2] for r in runs):.0f} s")
    for algorithm in sorted({r["algorithm"] for r in results}):
        summarise_reach([r for r in results if r["algorithm"] == algorithm], target)


def main() -> None:
    """Each (tool, seed) in its own subprocess; one RESULT line each, then a side-by-side summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--tools", nargs="+", default=["herdrl", "benchmarl"], choices=["herdrl", "benchmarl"])
    parser.add_argument("--benchmarl-python", default="/tmp/benchmarl-venv/bin/python")
    parser.add_argument("--algorithm", default="mappo", choices=["mappo", "ippo", "qmix", "vdn"])
    parser.add_argument("--reach", type=float, default=None,
                        help="the return whose first crossing the summary times (default: the median of BenchMARL's "
                             "final returns)")
    parser.add_argument("--random", action="store_true", help="first play 200 episodes of uniformly random actions")
    parser.add_argument("--local-ratio", type=float, default=0.5,
                        help="0: every agent is paid the team's reward alone (the shared-reward variant)")
    parser.add_argument("--summarise", nargs="+", metavar="LOG",
                        help="only print the summary of the RESULT lines in these logs (runs made apart, e.g. each "
                             "tool alone with --tools)")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # (tool, seed): run it here
    args = parser.parse_args()
    if args.summarise:
        summarise_logs(args.summarise, args.reach)
        return
    ENV_CONFIG["local_ratio"] = args.local_ratio
    if args.one:
        tool, seed = args.one
        if tool == "benchmarl":
            result = run_benchmarl(int(seed), args.frames, args.algorithm)
        elif args.algorithm in ("mappo", "ippo"):
            result = run_herdrl(int(seed), args.frames, args.algorithm)
        else:
            result = run_herdrl_team(args.algorithm, int(seed), args.frames)
        print("RESULT " + json.dumps({"tool": tool, "algorithm": args.algorithm, "seed": int(seed), **result}),
              flush=True)
        return
    if args.random:
        print("RANDOM " + json.dumps(random_return()), flush=True)
    results = []
    for seed in args.seeds:
        for tool in args.tools:
            python = sys.executable if tool == "herdrl" else args.benchmarl_python
            command = [python, __file__, "--frames", str(args.frames), "--algorithm", args.algorithm,
                       "--local-ratio", str(args.local_ratio), "--one", tool, str(seed)]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            line = next(line for line in out.splitlines() if line.startswith("RESULT "))
            print(line, flush=True)
            results.append(json.loads(line[len("RESULT "):]))
    summarise_reach(results, args.reach)


if __name__ == "__main__":
    main()
