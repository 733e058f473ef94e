"""d3rlpy's side of benchmarks/offline.py: train one d3rlpy algorithm on a herdrl-recorded dataset, evaluate it
(with ``--online-steps N``: then fine-tune it online for N env steps, the dataset kept in its replay buffer).

Runs in d3rlpy's own venv (it pins gymnasium 1.0.0), never imports herdrl: it reads the dataset's Parquet episode
files itself (Minari's columns) and prints one JSON line: the greedy evaluation return, the training seconds.

    /tmp/d3rlpy-venv/bin/python benchmarks/d3rlpy_offline.py --dataset benchmarks/data/pendulum-medium \
        --algorithm cql --env Pendulum-v1 --steps 50000 --seed 0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def read_episodes(path: Path, discrete: bool) -> tuple[np.ndarray, ...]:
    """(observations, actions, rewards, terminals, timeouts) of every episode, d3rlpy's step-wise layout (each
    episode's final observation dropped: d3rlpy does not store it)."""
    import pyarrow.parquet as pq

    columns: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "act", "rew", "term", "trunc")}
    files = sorted((path / "data").glob("*/part-0.parquet"), key=lambda p: int(p.parent.name))
    for file in files:
        table = pq.read_table(file)
        obs = np.stack(table.column("observations").to_numpy(zero_copy_only=False)).astype(np.float32)
        steps = len(obs) - 1
        actions = table.column("actions").to_numpy(zero_copy_only=False)[:steps]
        actions = actions.astype(np.int64) if discrete else np.stack(actions).astype(np.float32)
        columns["obs"].append(obs[:steps])
        columns["act"].append(actions)
        columns["rew"].append(table.column("rewards").to_numpy()[:steps].astype(np.float32))
        term = table.column("terminations").to_numpy()[:steps]
        trunc = table.column("truncations").to_numpy()[:steps]
        trunc = trunc | ((np.arange(steps) == steps - 1) & ~term)  # an episode cut by the recorder ends too
        columns["term"].append(term.astype(np.float32))
        columns["trunc"].append(trunc.astype(np.float32))
    return tuple(np.concatenate(columns[k]) for k in ("obs", "act", "rew", "term", "trunc"))


def make_algorithm(name: str, discrete: bool, hidden: list[int], lr: float, batch: int, low: float, high: float,
                   target_update: int):
    """The d3rlpy algorithm with herdrl's settings for it (benchmarks/offline.py says which)."""
    import d3rlpy

    encoder = d3rlpy.models.VectorEncoderFactory(hidden_units=hidden, activation="relu")
    scaler = None if discrete else d3rlpy.preprocessing.MinMaxActionScaler(minimum=low, maximum=high)
    if name == "bc" and discrete:
        return d3rlpy.algos.DiscreteBCConfig(learning_rate=lr, batch_size=batch, encoder_factory=encoder,
                                             beta=0.0)
    if name == "bc":
        return d3rlpy.algos.BCConfig(learning_rate=lr, batch_size=batch, encoder_factory=encoder,
                                     policy_type="stochastic", action_scaler=scaler)
    if name == "cql" and discrete:
        return d3rlpy.algos.DiscreteCQLConfig(learning_rate=lr, batch_size=batch, encoder_factory=encoder,
                                              target_update_interval=target_update, alpha=1.0)
    if name == "cql":  # the conservative weight fixed at 5 (alpha_learning_rate 0): herdrl's min_q_weight
        return d3rlpy.algos.CQLConfig(actor_learning_rate=lr, critic_learning_rate=lr, temp_learning_rate=lr,
                                      alpha_learning_rate=0.0, initial_alpha=1.0, conservative_weight=5.0,
                                      batch_size=batch, actor_encoder_factory=encoder,
                                      critic_encoder_factory=encoder, action_scaler=scaler)
    if name == "iql":
        return d3rlpy.algos.IQLConfig(actor_learning_rate=lr, critic_learning_rate=lr, batch_size=batch,
                                      actor_encoder_factory=encoder, critic_encoder_factory=encoder,
                                      value_encoder_factory=encoder, action_scaler=scaler)
    raise SystemExit(f"unknown algorithm {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--algorithm", required=True, choices=("bc", "cql", "iql"))
    parser.add_argument("--env", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", default="256,256")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--target-update", type=int, default=8000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--eval-seed", type=int, default=10_000)
    parser.add_argument("--device", default="cpu:0", help="d3rlpy's device: cpu:0 or cuda:0")
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate every this many gradient steps")
    parser.add_argument("--deadline", type=float, default=0.0, help="stop at the first milestone after this time")
    parser.add_argument("--online-steps", type=int, default=0,
                        help="then this many env steps online (fit_online: the dataset in replay, exploring with "
                             "the algorithm's own sampling, one gradient step per env step)")
    parser.add_argument("--online-eval-every", type=int, default=0,
                        help="online, also evaluate greedily every this many env steps (their time left out)")
    args = parser.parse_args()

    import d3rlpy
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)  # as herdrl's learner (num_cpus_for_main_process=1)
    d3rlpy.seed(args.seed)
    env = gym.make(args.env)
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    obs, actions, rewards, terminals, timeouts = read_episodes(Path(args.dataset), discrete)
    dataset = d3rlpy.dataset.MDPDataset(obs, actions, rewards, terminals, timeouts)
    low = float(np.min(env.action_space.low)) if not discrete else 0.0
    high = float(np.max(env.action_space.high)) if not discrete else 0.0
    algo = make_algorithm(args.algorithm, discrete, [int(h) for h in args.hidden.split(",")], args.lr, args.batch,
                          low, high, args.target_update).create(device=args.device)

    def greedy() -> float:
        returns = []
        for i in range(args.eval_episodes):
            observation, _ = env.reset(seed=args.eval_seed + i)
            total, done = 0.0, False
            while not done:
                action = algo.predict(np.asarray(observation, np.float32)[None])[0]
                observation, reward, terminated, truncated, _ = env.step(int(action) if discrete else action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        return float(np.mean(returns))

    chunk = args.eval_every or args.steps
    fitter = algo.fitter(dataset, n_steps=args.steps, n_steps_per_epoch=chunk, show_progress=False,
                         save_interval=10**9, logger_adapter=d3rlpy.logging.NoopAdapterFactory())
    train_s, done, curve = 0.0, 0, {}
    start = time.perf_counter()
    for _ in fitter:  # (one epoch of ``chunk`` gradient steps per item)
        train_s += time.perf_counter() - start
        done += chunk
        if args.eval_every:
            curve[done] = greedy()
            print(f"d3rlpy {args.algorithm} seed {args.seed}: {done} steps, return {curve[done]:.1f}, "
                  f"train {train_s:.0f} s", file=sys.stderr, flush=True)
        if args.deadline and time.time() > args.deadline:
            break
        start = time.perf_counter()
    return_mean = curve[done] if args.eval_every else greedy()
    row = {"tool": "d3rlpy", "algorithm": args.algorithm, "seed": args.seed, "steps": done,
           "return_mean": return_mean, "train_s": train_s, "curve": curve}
    if args.online_steps:
        # The dataset's episodes in the replay buffer; the online env's own seed, apart from the evaluation's.
        buffer = d3rlpy.dataset.ReplayBuffer(d3rlpy.dataset.InfiniteBuffer(), episodes=dataset.episodes)
        online_env = gym.make(args.env)
        online_env.reset(seed=args.seed)
        online_curve: dict[int, float] = {}
        eval_s = 0.0

        def evaluate(algo_: object, epoch: int, total_step: int) -> None:  # (fit_online's callback, every step)
            nonlocal eval_s
            if args.online_eval_every and total_step % args.online_eval_every == 0:
                begin = time.perf_counter()
                online_curve[total_step] = greedy()
                eval_s += time.perf_counter() - begin
                print(f"d3rlpy {args.algorithm} seed {args.seed}: {total_step} env steps online, return "
                      f"{online_curve[total_step]:.1f}", file=sys.stderr, flush=True)

        start = time.perf_counter()
        algo.fit_online(online_env, buffer, n_steps=args.online_steps, n_steps_per_epoch=1000, update_interval=1,
                        n_updates=1, update_start_step=0, save_interval=10**9, show_progress=False,
                        logger_adapter=d3rlpy.logging.NoopAdapterFactory(), callback=evaluate)
        online_s = time.perf_counter() - start - eval_s
        if args.online_steps not in online_curve:
            online_curve[args.online_steps] = greedy()
        row.update(online_steps=args.online_steps, online_s=online_s, online_return=online_curve[args.online_steps],
                   online_curve=online_curve)
    print(json.dumps(row))

if __name__ == "__main__":
    main()
