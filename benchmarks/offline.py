"""Offline RL beside d3rlpy: the same recorded dataset, network sizes, batch and gradient steps for both tools.

    .venv/bin/python benchmarks/offline.py record                       # (re)records the datasets, deterministically
    .venv/bin/python benchmarks/offline.py compare --task pendulum --algorithms bc,cql,iql --seeds 0,1,2 \
        --steps 50000 --d3rlpy /tmp/d3rlpy-venv/bin/python
    .venv/bin/python benchmarks/offline.py compare --task hopper --seeds 0,1,2 --steps 100000 --eval-every 5000 \
        --minutes 5 --parallel --device cuda      # every run at once on a GPU machine: returns every 5k steps
    .venv/bin/python benchmarks/offline.py compare --task pendulum --algorithms cql --herdrl-seeds "" \
        --d3rlpy-seeds 1,2 --steps 50000 --eval-every 10000                # one tool's runs only, on its own seeds
    .venv/bin/python benchmarks/offline.py feed --task hopper --algorithm cql    # Ray Data vs in-memory batches
    .venv/bin/python benchmarks/offline.py online --seeds 0,1 --steps 10000 --online-steps 10000 \
        --eval-every 1000 --d3rlpy /tmp/d3rlpy-venv/bin/python  # IQL offline, then online, beside d3rlpy's

Datasets (benchmarks/data/, never committed; recorded again, bit for bit, by ``record``) come from committed
behaviour policies: CartPole-v1, a hand-written controller taking a random action 20% of the time (near-expert);
Pendulum-v1, a hand-written swing-up controller with Gaussian action noise (medium); Hopper-v5, a small SAC policy
trained here (benchmarks/policies/hopper-sac, sampling its actions: medium and noisy). Each run trains in its own
process, one after another (never two at once: they would share the 2 cores; ``--parallel`` runs them all at
once, for returns only, where a machine has the cores), both on one torch thread, then
plays 10 greedy episodes (seeds 10000..10009). Scores are normalised: 0 is the random policy's return, 100 the
behaviour policy's (the dataset's mean; no D4RL reference exists for these datasets). d3rlpy runs in its own venv
(it pins gymnasium 1.0.0): ``python -m venv /tmp/d3rlpy-venv && /tmp/d3rlpy-venv/bin/pip install torch==2.13.0
d3rlpy==2.8.1 pyarrow imageio mujoco``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
EVAL_SEED, EVAL_EPISODES = 10_000, 10

#: task -> env, dataset folder, and each algorithm's settings (both tools get the same).
TASKS = {
    "cartpole": {"env": "CartPole-v1", "dataset": "cartpole-noisy"},
    "pendulum": {"env": "Pendulum-v1", "dataset": "pendulum-medium"},
    "hopper": {"env": "Hopper-v5", "dataset": "hopper-medium"},
}
SETTINGS = {
    "bc": {"lr": 1e-3, "batch": 256, "hidden": [256, 256]},
    "cql": {"lr": 3e-4, "batch": 256, "hidden": [256, 256], "target_update": 2000},
    "iql": {"lr": 3e-4, "batch": 256, "hidden": [256, 256]},
}


# ------------------------------------------------------------------------------------------------ behaviour
def cartpole_controller(obs: np.ndarray, rng: np.random.Generator) -> int:
    """Push where the pole falls; a random action 20% of the time."""
    return int(rng.integers(2)) if rng.random() < 0.2 else int(obs[2] + 0.5 * obs[3] > 0)


def pendulum_controller(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Pump energy until near the top, then a PD hold; Gaussian noise (std 0.5) on the torque."""
    angle, speed = np.arctan2(obs[1], obs[0]), obs[2]
    torque = -(10 * angle + 2 * speed) if obs[0] > 0.85 else 2.0 * (np.sign(speed) or 1.0)
    return np.clip([torque + rng.normal(0, 0.5)], -2, 2).astype(np.float32)


def record(args: argparse.Namespace) -> None:
    """Record every dataset again (deterministic: the same seeds give the same files)."""
    import shutil

    from herdrl.offline.record import record as record_checkpoint
    from herdrl.offline.record import record_controller

    for name in ("cartpole-noisy", "pendulum-medium", "hopper-medium"):
        shutil.rmtree(DATA / name, ignore_errors=True)
    rng = np.random.default_rng(0)  # the controllers' own noise
    record_controller(lambda obs: cartpole_controller(obs, rng), "CartPole-v1", DATA / "cartpole-noisy", 50, seed=0)
    rng = np.random.default_rng(0)
    record_controller(lambda obs: pendulum_controller(obs, rng), "Pendulum-v1", DATA / "pendulum-medium", 100, seed=0)
    policy = HERE / "policies" / "hopper-sac"
    if policy.exists():
        torch_threads()
        record_checkpoint(policy, args.hopper_episodes, DATA / "hopper-medium", explore=True, seed=0)
    for name in ("cartpole-noisy", "pendulum-medium", "hopper-medium"):
        if (DATA / name).exists():
            from herdrl.offline import open_dataset

            info = open_dataset(DATA / name).info()
            print(f"{name}: {info['episodes']} episodes, {info['steps']} steps, return mean "
                  f"{info['return_mean']:.1f} (min {info['return_min']:.1f}, max {info['return_max']:.1f})")


def torch_threads() -> None:
    import torch

    torch.set_num_threads(1)


# -------------------------------------------------------------------------------------------------- one run
def herdrl_run(task: str, algorithm: str, seed: int, steps: int, device: str = "cpu", eval_every: int = 0,
               deadline: float = 0.0, extra: dict | None = None) -> dict:
    """Train herdrl's ``algorithm`` for ``steps`` gradient steps on the task's dataset; evaluate greedily (also
    every ``eval_every`` steps, into ``curve``; past the wall-clock ``deadline`` it stops at the next milestone).
    ``extra``: config keys given on top of the shared settings (e.g. ``{"deterministic_backup": False}``)."""
    from herdrl.registry import get_config_class

    torch_threads()
    spec, settings = TASKS[task], SETTINGS[algorithm]
    chunk = eval_every or steps
    config = get_config_class(algorithm).from_dict({
        "input_": str(DATA / spec["dataset"]), "lr": settings["lr"], "train_batch_size": settings["batch"],
        "updates_per_iteration": chunk, "updates_per_call": min(1000, chunk), "seed": seed,
        "num_gpus": 1 if device == "cuda" else 0,
        "model": {"fcnet_hiddens": settings["hidden"], "fcnet_activation": "relu"}})
    if algorithm == "cql":
        config.update_from_dict({"target_network_update_freq": settings["target_update"]})
    config.update_from_dict(extra or {})
    algo = config.build()
    train_s, done, curve = 0.0, 0, {}
    while done < steps and not (done and deadline and time.time() > deadline):  # (one chunk at least)
        start = time.perf_counter()
        algo.train()
        train_s += time.perf_counter() - start
        done += chunk
        if eval_every:
            curve[done] = greedy_return(spec["env"], algo.get_policy())
            print(f"herdrl {algorithm} seed {seed}: {done} steps, return {curve[done]:.1f}, train {train_s:.0f} s",
                  file=sys.stderr, flush=True)
    return_mean = curve[done] if eval_every else greedy_return(spec["env"], algo.get_policy())
    algo.stop()
    return {"tool": "herdrl", "algorithm": algorithm, "seed": seed, "steps": done, "return_mean": return_mean,
            "train_s": train_s, "curve": curve, **({"config": extra} if extra else {})}


def greedy_return(env_id: str, policy) -> float:
    """The mean return of ``EVAL_EPISODES`` greedy episodes (seeds ``EVAL_SEED``...)."""
    from herdrl.evaluation import Evaluator

    evaluator = Evaluator(env_id, {}, EVAL_EPISODES)
    returns, _ = evaluator.run(policy, seed=EVAL_SEED)
    evaluator.close()
    return float(np.mean(returns))


def online(args: argparse.Namespace) -> None:
    """Per seed: IQL offline for ``--steps`` gradient steps on the Pendulum dataset, then online for
    ``--online-steps`` env steps with the dataset in replay, greedily evaluated every ``--eval-every`` env steps;
    herdrl, then (``--d3rlpy``) d3rlpy's ``fit_online`` on the same settings, one after the other; one table (the
    mean of each run's online evaluations: one 10-episode evaluation alone is mostly noise here)."""
    from herdrl.offline import open_dataset
    from herdrl.offline.record import record_controller

    spec = TASKS["pendulum"]
    if not (DATA / spec["dataset"]).exists():  # (as `record` records it)
        rng = np.random.default_rng(0)
        record_controller(lambda obs: pendulum_controller(obs, rng), "Pendulum-v1", DATA / spec["dataset"], 100,
                          seed=0)
    behaviour = open_dataset(DATA / spec["dataset"]).info()["return_mean"]
    random = random_return(spec["env"])
    rows = []
    for seed in sorted(args.seeds):
        rows.append(herdrl_online(seed, args.steps, args.online_steps, args.eval_every, args.log_std_init))
        print(json.dumps(rows[-1]), flush=True)
        if args.d3rlpy:
            command = [*d3rlpy_command(args.d3rlpy, "pendulum", "iql", seed, args.steps),
                       "--online-steps", str(args.online_steps), "--online-eval-every", str(args.eval_every)]
            row = finished("d3rlpy", subprocess.run(command, capture_output=True, text=True, check=False))
            if row is not None:
                rows.append(row)
                print(json.dumps(row), flush=True)

    def score(value: float) -> str:
        return f"{value:.1f} ({100 * (value - random) / (behaviour - random):.0f})"

    print(f"\nIQL on {spec['dataset']} (behaviour {behaviour:.1f}, random {random:.1f}): {args.steps:,} gradient "
          f"steps offline, then {args.online_steps:,} env steps online (one gradient step each), evaluated every "
          f"{args.eval_every:,}")
    print("| tool | seed | offline (score) | online: mean of evaluations (score) | online: last (score) | "
          "online: best | offline s | online s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        curve = list(row["online_curve"].values())
        row["online_mean"] = float(np.mean(curve))
        print(f"| {row['tool']} | {row['seed']} | {score(row['return_mean'])} | {score(row['online_mean'])} | "
              f"{score(curve[-1])} | {max(curve):.1f} | {row['train_s']:.0f} | {row['online_s']:.0f} |")
    for tool in sorted({row["tool"] for row in rows}):
        mine = [row for row in rows if row["tool"] == tool]
        means = [row["online_mean"] for row in mine]
        gains = [row["online_mean"] - row["return_mean"] for row in mine]
        print(f"{tool}: median over seeds of the online mean {statistics.median(means):.1f}, of its gain over "
              f"offline {statistics.median(gains):+.1f}")
    for row in rows:
        print(f"{row['tool']} seed {row['seed']} curve: " + ", ".join(f"{v:.0f}" for v in row["online_curve"].values()))


def herdrl_online(seed: int, steps: int, online_steps: int, eval_every: int, log_std_init: float | None = None) -> dict:
    """herdrl's IQL offline for ``steps`` gradient steps, then ``online=True`` from that checkpoint (the dataset in
    replay, runners exploring with IQL's actor, ``training_intensity`` 256: a gradient step per env step), evaluated
    greedily at each iteration that passes a multiple of ``eval_every`` env steps (the evaluations' time left out;
    ``log_std_init``: the actor's starting log std, else IQL's default)."""
    import tempfile

    from herdrl.algorithms.iql import IQLConfig

    torch_threads()
    spec, settings = TASKS["pendulum"], SETTINGS["iql"]
    model = {"fcnet_hiddens": settings["hidden"], "fcnet_activation": "relu",
             **({"log_std_init": log_std_init} if log_std_init is not None else {})}
    base = (IQLConfig().offline_data(input_=str(DATA / spec["dataset"])).environment(spec["env"])
            .training(lr=settings["lr"], train_batch_size=settings["batch"], model=model).debugging(seed=seed))
    offline = base.copy().training(updates_per_iteration=steps, updates_per_call=1000).build()
    start = time.perf_counter()
    offline.train()
    offline_s = time.perf_counter() - start
    before = greedy_return(spec["env"], offline.get_policy())
    checkpoint = offline.save(Path(tempfile.mkdtemp()) / "checkpoint_000001")
    offline.stop()
    algo = base.copy().training(online=True, init_from=str(checkpoint),
                                min_sample_timesteps_per_iteration=min(1000, eval_every),
                                training_intensity=256.0).evaluation(evaluation_interval=1000).build()
    online_s, curve = 0.0, {}
    while algo.env_steps_lifetime < online_steps:
        start = time.perf_counter()
        algo.train()
        online_s += time.perf_counter() - start
        if algo.env_steps_lifetime // eval_every > len(curve) or algo.env_steps_lifetime >= online_steps:
            curve[algo.env_steps_lifetime] = greedy_return(spec["env"], algo.get_policy())
            print(f"herdrl iql seed {seed}: {algo.env_steps_lifetime} env steps online, return "
                  f"{curve[algo.env_steps_lifetime]:.1f}", file=sys.stderr, flush=True)
    algo.stop()
    return {"tool": "herdrl", "algorithm": "iql", "seed": seed, "steps": steps, "return_mean": before,
            "train_s": offline_s, "online_steps": online_steps, "online_s": online_s,
            "online_return": curve[max(curve)], "online_curve": curve}


def d3rlpy_command(python: str, task: str, algorithm: str, seed: int, steps: int, device: str = "cpu",
                   eval_every: int = 0, deadline: float = 0.0) -> list[str]:
    """The command of d3rlpy's run of the same, in its venv (benchmarks/d3rlpy_offline.py)."""
    spec, settings = TASKS[task], SETTINGS[algorithm]
    return [python, str(HERE / "d3rlpy_offline.py"), "--dataset", str(DATA / spec["dataset"]),
            "--algorithm", algorithm, "--env", spec["env"], "--steps", str(steps), "--seed", str(seed),
            "--hidden", ",".join(map(str, settings["hidden"])), "--lr", str(settings["lr"]),
            "--batch", str(settings["batch"]), "--eval-episodes", str(EVAL_EPISODES),
            "--eval-seed", str(EVAL_SEED), "--target-update", str(settings.get("target_update", 8000)),
            "--device", "cuda:0" if device == "cuda" else "cpu:0", "--eval-every", str(eval_every),
            "--deadline", str(deadline)]


def herdrl_command(task: str, algorithm: str, seed: int, steps: int, device: str = "cpu", eval_every: int = 0,
                   deadline: float = 0.0, extra: str = "") -> list[str]:
    """The command of herdrl's run (this script's ``one``), in a fresh process."""
    return [sys.executable, __file__, "one", "--task", task, "--algorithm", algorithm, "--seed", str(seed),
            "--steps", str(steps), "--device", device, "--eval-every", str(eval_every), "--deadline", str(deadline),
            "--herdrl-config", extra]


def finished(tool: str, out: subprocess.CompletedProcess) -> dict | None:
    """The JSON row a run printed last; None (its error printed) where it failed: the other runs still count."""
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        print(f"{tool} failed ({' '.join(out.args[2:])}): {(out.stderr or '(its errors above)')[-2000:]}",
              file=sys.stderr, flush=True)
        return None
    return json.loads(lines[-1])


def random_return(env_id: str) -> float:
    """The uniformly random policy's mean return over the evaluation seeds."""
    env = gym.make(env_id)
    env.action_space.seed(EVAL_SEED)
    returns = []
    for i in range(EVAL_EPISODES):
        env.reset(seed=EVAL_SEED + i)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def compare(args: argparse.Namespace) -> None:
    """Each algorithm and seed: herdrl, then d3rlpy, each in a fresh process (``--parallel``: every run at once,
    for returns only: their wall-clock shares the machine); a table of medians."""
    from herdrl.offline import open_dataset

    spec = TASKS[args.task]
    behaviour = open_dataset(DATA / spec["dataset"]).info()["return_mean"]
    random = random_return(spec["env"])
    deadline = time.time() + args.minutes * 60 if args.minutes else 0.0
    runs = [(tool, algorithm, seed) for algorithm in args.algorithms.split(",") for seed in args.all_seeds
            for tool in ("herdrl", "d3rlpy") if seed in args.tool_seeds[tool]]
    commands = [herdrl_command(args.task, algorithm, seed, args.steps, args.device, args.eval_every, deadline,
                               args.herdrl_config)
                if tool == "herdrl" else
                d3rlpy_command(args.d3rlpy, args.task, algorithm, seed, args.steps, args.device, args.eval_every,
                               deadline) for tool, algorithm, seed in runs]
    if args.parallel:
        # (their stderr, progress lines and errors, straight to ours)
        started = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in commands]
        outs = []
        for c, p in zip(commands, started, strict=True):
            out = p.communicate()[0]  # (read as it waits: a full pipe never blocks a child)
            outs.append(subprocess.CompletedProcess(c, p.returncode, out))
    else:  # (their stderr, as in parallel: a 50k-step run's progress lines show as it goes)
        outs = (subprocess.run(c, stdout=subprocess.PIPE, text=True, check=False) for c in commands)
    rows = []
    for (tool, _, _), out in zip(runs, outs, strict=True):
        row = finished(tool, out)
        if row is None:
            continue
        row["score"] = 100 * (row["return_mean"] - random) / (behaviour - random)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n{args.task} ({spec['env']}, dataset {spec['dataset']}: behaviour {behaviour:.1f}, random {random:.1f}), "
          f"{args.steps:,} gradient steps, seeds: herdrl {sorted(args.tool_seeds['herdrl'])}, "
          f"d3rlpy {sorted(args.tool_seeds['d3rlpy'])}, "
          f"device {args.device}"
          + (" (runs side by side: wall-clock not comparable)" if args.parallel else "")
          + (f", herdrl given {args.herdrl_config}" if args.herdrl_config else ""))
    if not rows:
        raise SystemExit("no run finished (their errors above)")
    if args.eval_every:
        curves(rows, random, behaviour)
        return
    print("| algorithm | tool | return (median) | normalised score (median) | per seed | train s (median) |")
    print("| --- | --- | ---: | ---: | --- | ---: |")
    for algorithm in args.algorithms.split(","):
        times = {}
        for tool in ("herdrl", "d3rlpy"):
            mine = [r for r in rows if r["algorithm"] == algorithm and r["tool"] == tool]
            if not mine:
                continue
            times[tool] = statistics.median(r["train_s"] for r in mine)
            per_seed = ", ".join(f"{r['return_mean']:.0f}" for r in mine)
            print(f"| {algorithm} | {tool} | {statistics.median(r['return_mean'] for r in mine):.1f} | "
                  f"{statistics.median(r['score'] for r in mine):.0f} | {per_seed} | {times[tool]:.0f} |")
        if len(times) == 2:
            print(f"| {algorithm} | ratio herdrl/d3rlpy wall-clock | | | | "
                  f"**{times['herdrl'] / times['d3rlpy']:.2f}** |")


def curves(rows: list[dict], random: float, behaviour: float) -> None:
    """Greedy return at each evaluation milestone (median over seeds; per seed in brackets; blank where a run
    stopped before it), and each algorithm's normalised score at the last milestone all its runs reached."""
    milestones = sorted({int(k) for r in rows for k in r["curve"]})
    print("| algorithm | tool | seeds | " + " | ".join(f"{m:,} steps" for m in milestones) + " | normalised (at) |")
    print("| --- | --- | ---: |" + " ---: |" * (len(milestones) + 1))
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        last = min(max(map(int, r["curve"])) for r in rows if r["algorithm"] == algorithm)
        for tool in ("herdrl", "d3rlpy"):
            mine = [r for r in rows if r["algorithm"] == algorithm and r["tool"] == tool]
            if not mine:
                continue
            cells = []
            for m in milestones:
                values = [r["curve"].get(str(m)) for r in mine]  # (JSON keys)
                cells.append("" if None in values else
                             f"{statistics.median(values):.0f} ({', '.join(f'{v:.0f}' for v in values)})")
            score = statistics.median(100 * (r["curve"][str(last)] - random) / (behaviour - random) for r in mine)
            print(f"| {algorithm} | {tool} | {len(mine)} | " + " | ".join(cells) + f" | {score:.0f} ({last:,}) |")


def feed(args: argparse.Namespace) -> None:
    """Gradient steps per second of an algorithm fed from memory, then streamed by Ray Data (after a first
    iteration that starts the stream), on the task's dataset."""
    from herdrl.registry import get_config_class

    torch_threads()
    rates = {}
    for method in ("memory", "ray_data"):
        config = get_config_class(args.algorithm).from_dict({
            "input_": str(DATA / TASKS[args.task]["dataset"]), "offline_read_method": method,
            "train_batch_size": 256, "updates_per_iteration": args.steps, "updates_per_call": 50, "seed": 0})
        algo = config.build()
        algo.train()  # (the stream's start-up, and torch's first passes)
        start = time.perf_counter()
        algo.train()
        rates[method] = args.steps / (time.perf_counter() - start)
        algo.stop()
        print(f"{args.algorithm} on {args.task}, batches {method}: {rates[method]:.1f} gradient steps/s", flush=True)
    print(f"Ray Data / memory: **{rates['ray_data'] / rates['memory']:.2f}**")


def seed_set(text: str) -> set[int]:
    """An option's comma-separated seeds ("" for none) as a set; anything but integers refused in one line."""
    try:
        return {int(s) for s in text.split(",") if s.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record")
    r.add_argument("--hopper-episodes", type=int, default=300)
    c = sub.add_parser("compare")
    c.add_argument("--task", choices=sorted(TASKS), required=True)
    c.add_argument("--algorithms", default="bc,cql,iql")
    c.add_argument("--seeds", type=seed_set, default="0,1,2")
    c.add_argument("--steps", type=int, default=50_000)
    c.add_argument("--d3rlpy", default="/tmp/d3rlpy-venv/bin/python")
    c.add_argument("--herdrl-seeds", type=seed_set, default=None, help="herdrl's seeds (default: --seeds; \"\": none)")
    c.add_argument("--d3rlpy-seeds", type=seed_set, default=None, help="d3rlpy's seeds (default: --seeds; \"\": none)")
    c.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="both tools' learner device")
    c.add_argument("--eval-every", type=int, default=0, help="also evaluate every this many gradient steps")
    c.add_argument("--parallel", action="store_true", help="every run at once (returns only, not timings)")
    c.add_argument("--minutes", type=float, default=0.0,
                   help="stop each run at the first milestone after this many minutes (with --eval-every)")
    c.add_argument("--herdrl-config", default="", help="JSON: config keys for herdrl's runs on top of the shared "
                   "settings, e.g. '{\"deterministic_backup\": false}'")
    f = sub.add_parser("feed")
    f.add_argument("--task", choices=sorted(TASKS), default="hopper")
    f.add_argument("--algorithm", default="cql")
    f.add_argument("--steps", type=int, default=300)
    n = sub.add_parser("online")
    n.add_argument("--seeds", type=seed_set, default="0")
    n.add_argument("--d3rlpy", default=None, help="d3rlpy's python: its fit_online after each herdrl run")
    n.add_argument("--steps", type=int, default=10_000)
    n.add_argument("--online-steps", type=int, default=10_000)
    n.add_argument("--eval-every", type=int, default=1000, help="evaluate greedily every this many env steps")
    n.add_argument("--log-std-init", type=float, default=None,
                   help="herdrl's IQL actor's starting log std (default IQL's, 0, the paper's; d3rlpy's: -1.5)")
    o = sub.add_parser("one")
    o.add_argument("--task", choices=sorted(TASKS), required=True)
    o.add_argument("--algorithm", required=True)
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--steps", type=int, required=True)
    o.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    o.add_argument("--eval-every", type=int, default=0)
    o.add_argument("--deadline", type=float, default=0.0)
    o.add_argument("--herdrl-config", default="")
    args = parser.parse_args()
    if args.command == "compare":
        if args.eval_every and args.steps % args.eval_every:
            parser.error("--steps must be a multiple of --eval-every (both tools train whole chunks)")
        if args.minutes and not (args.parallel and args.eval_every):
            parser.error("--minutes needs --parallel and --eval-every (one deadline for runs side by side)")
        args.tool_seeds = {tool: args.seeds if given is None else given  # (--seeds where a tool's are not given)
                           for tool, given in (("herdrl", args.herdrl_seeds), ("d3rlpy", args.d3rlpy_seeds))}
        args.all_seeds = sorted(set().union(*args.tool_seeds.values()))
        if not args.all_seeds:
            parser.error("no seeds to run: give --seeds, --herdrl-seeds or --d3rlpy-seeds")
        if args.herdrl_config:  # (checked here, before any run starts: every herdrl run is given these keys)
            from herdrl.errors import HerdError
            from herdrl.registry import get_config_class

            try:
                extra = json.loads(args.herdrl_config)
                for algorithm in args.algorithms.split(","):
                    get_config_class(algorithm)().update_from_dict(extra)
            except (ValueError, HerdError) as exc:
                parser.error(f"--herdrl-config: {exc}")
    if args.command == "online" and not args.seeds:
        parser.error("no seeds to run: give --seeds")
    if args.command == "record":
        record(args)
    elif args.command == "compare":
        compare(args)
    elif args.command == "feed":
        feed(args)
    elif args.command == "online":
        online(args)
    else:
        print(json.dumps(herdrl_run(args.task, args.algorithm, args.seed, args.steps, args.device, args.eval_every,
                                    args.deadline, json.loads(args.herdrl_config) if args.herdrl_config else None)))


if __name__ == "__main__":
    main()
