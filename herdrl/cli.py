"""The ``herd`` command.

    herd train ppo --env CartPole-v1                 # in-process, stops when solved
    herd train -f examples/cartpole-ppo.yaml
    herd train --run PPO --name-env CartPole-v1 --num-cpus 0   # the seed trainer's flags

Exit codes: 0 done (stop criterion met, or solved under the default criterion; also a resumed trial that was
already done), 2 bad input (one line on stderr; ``--debug`` shows the traceback), 3 the default step budget ran out
before the env was solved, 75 stopped for the job's walltime (SIGUSR1, as ``herd launch slurm --time`` asks Slurm to
send before it, or the time in ``HERD_STOP_AT``): resume me, 130 interrupted by Ctrl-C (SIGINT), 143 stopped by
SIGTERM (preemption, ``scancel``, a scheduler's time limit), each after a final checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2
EXIT_NOT_SOLVED = 3
EXIT_REQUEUE = 75  # herdrl.errors.EXIT_REQUEUE: stopped for the job's walltime, checkpointed: resume me
EXIT_INTERRUPTED = 130  # 128 + SIGINT (a signal's own code, 128 + its number, where one stopped the run)


def plural(count: int, noun: str) -> str:
    """``1 iteration``, ``2 iterations``."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"



def _add_import_option(p: Any) -> None:
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first: it registers envs (gymnasium.register or herdrl.register_env); "
                        "repeatable")


def _count_or_auto(text: str) -> int | str:
    """A count flag's value: an int, or ``auto`` (herdrl sizes it: :mod:`herdrl.auto_size`)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'auto', got {text!r}") from None


def _add_train_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "train", help="train an agent", description="Train an agent; stops when solved unless told otherwise.")
    p.add_argument("algorithm", nargs="?", help="algorithm name, e.g. ppo (or --run)")
    p.add_argument("--run", dest="run", help="algorithm name (the seed trainer's flag)")
    p.add_argument("--env", help="Gymnasium id, MODULE:ID (imports MODULE), or a register_env name")
    p.add_argument("--input", dest="input_", metavar="DIR",
                   help="offline algorithms (bc, marwil, cql, iql): the dataset to learn from (herd record's, or "
                        "Minari's)")
    p.add_argument("--init-from", dest="init_from", metavar="CHECKPOINT",
                   help="start from the matching weights of this checkpoint or trial (BC -> PPO: docs/offline.md)")
    _add_import_option(p)
    p.add_argument("--name-env", dest="name_env", help="same as --env (the seed trainer's flag)")
    p.add_argument("--callbacks", metavar="MODULE:CLASS",
                   help="callbacks class (RLlib's hooks, herdrl.RLlibCallback); imports MODULE as --import does")
    p.add_argument("-f", "--file", help="experiment YAML (RLlib tuned-example shape)")
    p.add_argument("--num-env-runners", type=_count_or_auto,
                   help="Ray env runner actors; 0 = sample in this process; auto = sized from measured costs")
    p.add_argument("--num-envs-per-env-runner", type=_count_or_auto,
                   help="env copies per runner (auto: sized with the runners)")
    p.add_argument("--num-cpus", type=int,
                   help="seed trainer flag: N env runners plus the driver's core (0 = in-process)")
    p.add_argument("--num-gpus", type=float, help="GPUs for the learner in the driver")
    p.add_argument("--num-learners", type=int, help="data-parallel learner actors on Ray; 0 = learn in this process")
    p.add_argument("--num-gpus-per-learner", type=float, help="GPUs per learner (fractions share one)")
    p.add_argument("--address", help="join this Ray cluster (HOST:PORT or auto; default: RAY_ADDRESS, else a "
                                     "private Ray started for this run)")
    p.add_argument("--node-ip-address", help="this driver's own address when joining a cluster")
    p.add_argument("--cluster", metavar="HOSTS_YAML",
                   help="run this command on the head of the cluster `herd cluster up HOSTS_YAML` started, "
                        "then copy its results here")
    p.add_argument("--detach", action="store_true",
                   help="with --cluster: run in the background on the head (survives this terminal); "
                        "copy results later with herd cluster sync")
    p.add_argument("--ray-connect-timeout", type=float, help="seconds to wait for the cluster's head (default 30)")
    p.add_argument("--dashboard", action="store_true", help="start Ray's dashboard with the private Ray")
    p.add_argument("--working-dir", help="ship this directory to every Ray node (Ray runtime_env working_dir)")
    p.add_argument("--redis-password", help="accepted for old scripts; current Ray needs none (ignored)")
    p.add_argument("--local-mode", action="store_true", help="seed trainer flag: sample in this process")
    p.add_argument("--stop-iters", type=int, help="stop after this many iterations")
    p.add_argument("--stop-timesteps", type=int, help="stop after this many env steps")
    p.add_argument("--stop-reward", type=float, help="stop when episode_return_mean reaches this")
    p.add_argument("--stop-time", type=float, help="stop after this many seconds of training")
    p.add_argument("--budget", type=int, default=None,
                   help="with no stop flag: env steps before giving up on solving (default 1,000,000; exit 3)")
    p.add_argument("--seed", type=int, help="random seed (same seed in-process -> same results)")
    p.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config overrides, e.g. lr=1e-3 model.fcnet_hiddens=[32,32]")
    p.add_argument("--output", default=None, help="results root (default: results)")
    p.add_argument("--name", help="experiment name (default: the env id)")
    p.add_argument("--trial", help="trial name (default: <ALGO>_<env>_<seed>_<timestamp>)")
    p.add_argument("--no-tensorboard", action="store_true", help="do not write TensorBoard event files")
    p.add_argument("--checkpoint-every", type=int, default=10,
                   help="checkpoint every N iterations (default 10; 0: only at the end); always at the end")
    p.add_argument("--keep-checkpoints-num", type=int, default=5,
                   help="keep the N newest checkpoints plus the best (default 5)")
    p.add_argument("--checkpoint-score-attr", default="episode_return_mean",
                   help="result key that picks the best checkpoint to keep (default episode_return_mean)")
    p.add_argument("--keep-best", action="store_true",
                   help="checkpoint at every new best of the algorithm's metric (its evaluation return when "
                        "evaluation runs), keep it, and name it in the trial's best_checkpoint.json (SB3's "
                        "EvalCallback habit)")
    p.add_argument("--resume", action="store_true",
                   help="continue the newest trial of the experiment (or --trial) from its newest valid checkpoint")
    p.add_argument("--resume-if-any", action="store_true",
                   help="with --trial: continue it if it has a checkpoint, else start it (a batch job that may run "
                        "again, e.g. requeued by its scheduler)")
    _add_tracker_options(p)
    p.add_argument("--quiet", action="store_true", help="no per-iteration console lines")


def _add_tracker_options(p: Any) -> None:
    p.add_argument("--mlflow", nargs="?", const="", default=None, metavar="URI",
                   help="log to MLflow: a tracking URI (default: MLFLOW_TRACKING_URI, else "
                        "sqlite:///<output>/mlflow.db); needs herdrl[tracking]")
    p.add_argument("--wandb", metavar="PROJECT",
                   help="log to Weights & Biases project PROJECT (WANDB_MODE=offline: no account needed); needs "
                        "herdrl[tracking]")


def _trackers(args: argparse.Namespace, spec: dict[str, Any], output: str) -> tuple[str | None, str | None]:
    """The MLflow URI and W&B project the command (or the experiment file) asks for."""
    from herdrl.trackers import default_mlflow_uri

    mlflow = args.mlflow if args.mlflow is not None else spec.get("mlflow")
    if mlflow is not None and mlflow is not False:
        mlflow = mlflow if isinstance(mlflow, str) and mlflow else default_mlflow_uri(output)
    else:
        mlflow = None
    return mlflow, args.wandb or spec.get("wandb")


def _add_bench_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="measure scaling and data paths",
                              description="Benchmarks of your own setup.")
    kinds = p.add_subparsers(dest="bench_kind", metavar="KIND", required=True)
    s = kinds.add_parser("scaling", help="sampling speedup with more env runners",
                         description="Env steps/s and iteration time for several runner counts.")
    s.add_argument("--env", required=True, help="Gymnasium id or register_env name (try herd/Latency-v0)")
    _add_import_option(s)
    s.add_argument("--algorithm", default="ppo", help="algorithm whose runners are measured (default ppo)")
    s.add_argument("--runners", default="1,2,4,8", help="comma-separated runner counts (default 1,2,4,8)")
    s.add_argument("--envs-per-runner", type=int, default=1, help="env copies per runner (default 1)")
    s.add_argument("--fragment", type=int, default=100, help="steps per env per iteration (default 100)")
    s.add_argument("--iters", type=int, default=5, help="measured iterations per runner count (default 5)")
    s.add_argument("--no-local", action="store_true", help="skip the in-process baseline")
    s.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE",
                   help="config overrides, e.g. 'env_config={step_latency_s: 0.002}' (quote values with spaces)")
    s.add_argument("--address", help="measure on this Ray cluster (HOST:PORT or auto)")
    s.add_argument("--node-ip-address", help="this driver's own address when joining a cluster")
    s.add_argument("--out", default="results/bench", help="folder for scaling.csv and scaling.png")
    z = kinds.add_parser("size", help="how many runners and envs, and how many nodes",
                         description="Measures the env's step, the policy's batched forward pass and the learner's "
                                     "time per env step here, then prints the runners and envs per runner the "
                                     "sizing model picks, and the throughput it projects for 1..N nodes like this "
                                     "one (docs/scaling.md). Nothing is trained beyond two measuring iterations.")
    z.add_argument("--env", required=True, help="Gymnasium id or register_env name")
    _add_import_option(z)
    z.add_argument("--algorithm", default="ppo", help="algorithm to size (default ppo)")
    z.add_argument("--config", nargs="+", default=[], metavar="KEY=VALUE", help="config overrides, as for train")
    z.add_argument("--nodes", type=int, default=8, help="project for 1..N nodes like this one (default 8)")
    z.add_argument("--address", help="size for this Ray cluster's nodes (HOST:PORT or auto)")
    z.add_argument("--node-ip-address", help="this driver's own address when joining a cluster")
    i = kinds.add_parser("ingest", help="fragments one learner absorbs, by each data path",
                         description="Synthetic producers (no env, no torch) feed one learner: fragments, MB and env "
                                     "steps absorbed per second, and the driver's and learner's CPU per fragment, "
                                     "for each data path (driver, via-driver, reference, aggregators).")
    i.add_argument("--shape", default="atari", help="fragment shape: cartpole, mujoco, atari (4-frame stacks) or "
                                                    "atari-packed (as runners ship them) (default atari)")
    i.add_argument("--producers", default="1,4,16", help="comma-separated producer counts (default 1,4,16)")
    i.add_argument("--modes", default="driver,via-driver,reference,aggregators",
                   help="comma-separated paths to measure (default: all four)")
    i.add_argument("--envs", type=int, default=8, help="envs per fragment (default 8)")
    i.add_argument("--steps", type=int, default=128, help="steps per fragment (default 128)")
    i.add_argument("--batch", type=int, default=8, help="fragments per learner update (default 8)")
    i.add_argument("--aggregators", type=int, default=2, help="aggregator actors for the aggregators path "
                                                               "(default 2)")
    i.add_argument("--rate", type=float, default=0.0, help="fragments/s each producer offers (default 0: as fast "
                                                            "as it can)")
    i.add_argument("--seconds", type=float, default=10.0, help="measured seconds per row (default 10)")
    i.add_argument("--placement", choices=("same-node", "cross-node"), default="same-node",
                   help="producers on the learner's node, or on the other nodes (default same-node)")
    i.add_argument("--address", help="measure on this Ray cluster (HOST:PORT or auto)")
    i.add_argument("--node-ip-address", help="this driver's own address when joining a cluster")
    i.add_argument("--out", default="results/bench", help="folder for ingest.csv and ingest.png")


def _add_evaluate_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("evaluate", help="play episodes with a trained policy",
                              description="Play episodes with a checkpoint's policy and print return statistics.")
    p.add_argument("checkpoint", help="a checkpoint directory, or a trial directory (its newest valid checkpoint)")
    p.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    p.add_argument("--explore", action="store_true", help="sample actions instead of the greedy ones")
    p.add_argument("--video", help="record the episodes to this .mp4 or .gif file")
    p.add_argument("--seed", type=int, help="seed of the evaluation envs")
    p.add_argument("--env", help="evaluate on this env instead of the checkpoint's (with the same spaces)")
    p.add_argument("--timeout-s", type=float, help="stop playing after this many seconds, leaving out the episodes "
                   "still running, with a line saying so (default: no bound)")
    _add_import_option(p)


def _add_export_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("export", help="write the greedy policy as a standalone file",
                              description="Export a checkpoint's greedy policy (raw observations -> actions).")
    p.add_argument("checkpoint", help="a checkpoint directory, or a trial directory")
    p.add_argument("--format", required=True, choices=["torch-export", "onnx"], help="torch.export (.pt2) or ONNX")
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--policy-id", help="which policy of a multi-agent checkpoint")
    p.add_argument("--agent", type=int, help="QMIX/VDN: one agent's network alone, by its index in the team "
                   "(decentralised execution: its own observation and action mask in, its action out)")
    _add_import_option(p)


def _add_tune_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("tune", help="run a sweep on Ray Tune",
                              description="Run the trials of a sweep file (search-space tags in its config).")
    p.add_argument("-f", "--file", required=True, help="sweep YAML: algorithm, env, config, stop, num_samples, "
                                                       "scheduler, metric, mode")
    p.add_argument("--num-samples", type=int, help="trials per grid point (default: the file's, else 1)")
    _add_import_option(p)
    p.add_argument("--name", help="experiment name (default: the file's, else the env id)")
    p.add_argument("--output", default="results", help="results root (default: results)")
    p.add_argument("--address", help="run the trials on this Ray cluster (HOST:PORT or auto)")
    p.add_argument("--max-concurrent-trials", type=int, help="cap on trials running at once")
    p.add_argument("--resume", action="store_true",
                   help="resume the experiment with Tune's restore (trusts the experiment folder: it unpickles "
                        "Tune's state files)")
    p.add_argument("--resume-if-any", action="store_true",
                   help="resume the experiment if it exists, else start it (a batch job that may run again, e.g. "
                        "requeued by its scheduler)")
    p.add_argument("--verbose", type=int, default=1, help="Tune's output: 0 silent, 1 status table (default), 2 more")
    _add_tracker_options(p)


def _add_plot_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("plot", help="learning curves as PNG/SVG",
                              description="Learning curves: runs grouped by what differs between them (algorithm, "
                                          "swept keys, folder), the mean and min-max band over each group's seeds.")
    p.add_argument("folders", nargs="+", help="result folders (an experiment, a trial, a sweep)")
    p.add_argument("--y", "--metric", dest="metric", default=None,
                   help="result column on the y axis (default: each run's algorithm's own metric, "
                        "episode_return_mean, or evaluation/episode_return_mean for DQN, SAC, TD3)")
    p.add_argument("--x", default=None,
                   help="x axis: steps (env steps), updates (gradient updates), time (s), iteration, or any result "
                        "column (default: env steps, or gradient updates for offline runs, which sample no env)")
    p.add_argument("--out", default="curves.png", help="output .png or .svg (default curves.png)")
    p.add_argument("--title", help="plot title")


def build_parser() -> argparse.ArgumentParser:
    """The ``herd`` argument parser."""
    parser = argparse.ArgumentParser(prog="herd", description="herdrl: distributed deep RL from laptop to cluster")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train_parser(subparsers)
    _add_bench_parser(subparsers)
    _add_evaluate_parser(subparsers)
    _add_export_parser(subparsers)
    from herdrl.offline.commands import add_parsers as add_offline_parsers

    add_offline_parsers(subparsers, _add_import_option)
    _add_tune_parser(subparsers)
    _add_plot_parser(subparsers)
    from herdrl.cluster.commands import add_cluster_parser, add_launch_parser

    add_launch_parser(subparsers)
    add_cluster_parser(subparsers)
    return parser


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["lr=1e-3", "model.fcnet_hiddens=[32,32]"]`` -> ``{"lr": 0.001, "model": {"fcnet_hiddens": [32, 32]}}``."""
    from herdrl.errors import ConfigError
    from herdrl.experiment import parse_yaml

    out: dict[str, Any] = {}
    joined: list[str] = []
    for item in items:  # `env_config={a: 1}` unquoted reaches us as "env_config={a:" "1}": put it back together
        if joined and "=" not in item and joined[-1].count("{") + joined[-1].count("[") > \
                joined[-1].count("}") + joined[-1].count("]"):
            joined[-1] += " " + item
        else:
            joined.append(item)
    for item in joined:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--config expects KEY=VALUE, got '{item}'")
        value = parse_yaml(text, f"--config {key}") if text else ""
        *parents, leaf = key.split(".")
        target = out
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    return out


#: ``herd train`` flags whose value is a config key's as given: (argparse dest, config key, the flag as typed).
PLAIN_FLAG_KEYS = (("num_envs_per_env_runner", "num_envs_per_env_runner", "--num-envs-per-env-runner"),
                   ("num_gpus", "num_gpus", "--num-gpus"), ("num_learners", "num_learners", "--num-learners"),
                   ("num_gpus_per_learner", "num_gpus_per_learner", "--num-gpus-per-learner"),
                   ("address", "address", "--address"), ("node_ip_address", "node_ip_address", "--node-ip-address"),
                   ("ray_connect_timeout", "ray_connect_timeout_s", "--ray-connect-timeout"),
                   ("seed", "seed", "--seed"), ("input_", "input_", "--input"),
                   ("init_from", "init_from", "--init-from"))
#: Every ``herd train`` flag that sets a config key (those above, and those whose value is turned into the key's).
FLAG_KEYS = PLAIN_FLAG_KEYS + (
    ("num_env_runners", "num_env_runners", "--num-env-runners"), ("num_cpus", "num_env_runners", "--num-cpus"),
    ("local_mode", "num_env_runners", "--local-mode"), ("callbacks", "callbacks_class", "--callbacks"),
    ("dashboard", "include_dashboard", "--dashboard"), ("working_dir", "runtime_env", "--working-dir"))

#: What a flag that only some algorithms take is for, in the message that refuses it for the others.
FLAG_PURPOSES = {"--input": "the offline algorithms, which learn from a dataset"}


def check_flags(args: argparse.Namespace, config_class: type) -> None:
    """Refuse a flag whose config key the algorithm does not have, by the flag the user typed (``--input``), not
    the key it sets (``input_``), naming the algorithms it is for."""
    from herdrl.errors import ConfigError
    from herdrl.registry import algorithms_with_key

    for dest, key, flag in FLAG_KEYS:
        if getattr(args, dest, None) not in (None, False) and key not in config_class.fields():
            owners = [name for name in algorithms_with_key(key) if name != config_class.algo_name]
            purpose = FLAG_PURPOSES.get(flag, "")
            where = f"is for {purpose}{' (' if purpose else ''}{', '.join(owners)}{')' if purpose else ''}" \
                if owners else "sets a key it does not have"
            raise ConfigError(f"{flag} {where}, not {config_class.algo_name}: drop {flag}"
                              + (" or train one of those" if owners else ""))


def _flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Config keys the command line sets explicitly (``--config`` items and the dedicated flags)."""
    from herdrl.errors import ConfigError

    overrides = parse_overrides(args.config)
    runners = {args.num_env_runners, args.num_cpus} - {None}
    if len(runners) > 1:
        raise ConfigError("--num-env-runners and --num-cpus disagree; give one of them")
    if runners:
        overrides["num_env_runners"] = runners.pop()
    if args.local_mode:
        overrides["num_env_runners"] = 0
    for flag, key, _ in PLAIN_FLAG_KEYS:
        if getattr(args, flag) is not None:
            overrides[key] = getattr(args, flag)
    if args.callbacks:
        from herdrl.env.imports import import_envs

        module = args.callbacks.partition(":")[0]
        if not module or ":" not in args.callbacks:
            raise ConfigError(f"--callbacks {args.callbacks}: give MODULE:CLASS (e.g. mycallbacks:LogAngles)")
        import_envs(module)  # the user's own command names it, as --import does
        overrides["callbacks_class"] = args.callbacks
    if args.dashboard:
        overrides["include_dashboard"] = True
    if args.working_dir:
        overrides["runtime_env"] = {**overrides.get("runtime_env", {}), "working_dir": args.working_dir}
    return overrides


def _train_args_without_cluster(argv: list[str]) -> list[str]:
    """The ``herd train`` arguments of ``argv`` minus ``--cluster FILE`` and ``--detach`` (to run on the head)."""
    rest = argv[argv.index("train") + 1:]
    out, skip = [], False
    for arg in rest:
        if skip:
            skip = False
        elif arg == "--cluster":
            skip = True
        elif arg != "--detach" and not arg.startswith("--cluster="):
            out.append(arg)
    return out


def _train(args: argparse.Namespace) -> int:
    """``herd train``: one run here (or on a cluster's head, with ``--cluster``), its summary line and exit code."""
    from herdrl.errors import ConfigError

    if args.detach and not args.cluster:
        raise ConfigError("--detach runs a training on a cluster's head: give --cluster HOSTS_YAML too")
    if args.checkpoint_every < 0:  # before a cluster's head is asked to run it
        raise ConfigError(f"--checkpoint-every got {args.checkpoint_every}; expected a number of iterations >= 1, "
                          "or 0 (only at the end)")
    if args.cluster:
        from herdrl.cluster.hosts import load_hosts, train_on_head

        return train_on_head(load_hosts(args.cluster), _train_args_without_cluster(args.argv), detach=args.detach)
    from herdrl.experiment import catch_walltime_signal, run_experiment

    catch_walltime_signal()  # a batch job's walltime signal during start-up (Ray, runners) must not end us
    request = _TrainRequest.from_args(args)
    start_over = _resume_if_any(args, request)
    if args.resume:
        config, name, trial = _resumed_config(args, request)
    else:
        config, name, trial = _new_config(args, request), request.name, args.trial
    _print_notes(args, config)
    outcome = run_experiment(
        config, stop=_stop_criteria(args, request.spec), output=request.output, name=name, trial=trial,
        quiet=args.quiet, tensorboard=not args.no_tensorboard, budget=args.budget, resume=args.resume,
        start_over=start_over, checkpoint_every=args.checkpoint_every or None,
        keep_checkpoints_num=args.keep_checkpoints_num, checkpoint_score_attr=args.checkpoint_score_attr,
        keep_best=args.keep_best,
        **dict(zip(("mlflow", "wandb"), _trackers(args, request.spec, request.output), strict=True)))
    _print_summary(config, outcome)
    return _exit_code(outcome)


@dataclass
class _TrainRequest:
    """What ``herd train`` was asked for, its flags over its experiment file (``-f``)."""

    spec: dict[str, Any]  # the experiment file's (load_experiment_file), or an empty one
    algorithm: str | None
    env: Any
    subject: Any  # what the experiment is named after: the env; an offline run without one, its dataset's folder
    overrides: dict[str, Any]  # config keys: the file's, then the command line's
    output: str
    name: str | None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> _TrainRequest:
        """The request of ``args``; the file's ``imports:`` imported."""
        from herdrl.env.imports import import_envs
        from herdrl.errors import ConfigError
        from herdrl.experiment import load_experiment_file

        spec: dict[str, Any] = {"algorithm": None, "env": None, "stop": {}, "config": {}, "name": None}
        if args.file:
            spec = load_experiment_file(args.file)
            import_envs(*spec["imports"])  # the file is the user's own command, as --import is
        names = [n for n in (args.algorithm, args.run) if n]
        if len(names) == 2 and names[0].upper() != names[1].upper():
            raise ConfigError(f"algorithm given twice: '{names[0]}' and --run '{names[1]}'")
        file_config = dict(spec["config"])
        env = args.env or args.name_env or spec["env"] or file_config.get("env")
        file_config.pop("env", None)
        dataset = args.input_ or file_config.get("input_") or file_config.get("input")
        return cls(spec=spec, algorithm=names[0] if names else spec["algorithm"], env=env,
                   subject=env or (dataset and Path(str(dataset)).expanduser().resolve().name),
                   overrides={**file_config, **_flag_overrides(args)}, output=args.output or "results",
                   name=args.name or spec["name"])

    def experiment(self) -> str | None:
        """The experiment (results folder) name: ``--name``, else the subject's."""
        from herdrl.experiment import experiment_name

        return self.name or (self.subject and experiment_name(self.subject))


def _resume_if_any(args: argparse.Namespace, request: _TrainRequest) -> bool:
    """``--resume-if-any``: set ``args.resume`` when the trial has a checkpoint; whether the trial starts over
    (in place, dropping rows of a run that saved nothing)."""
    if not args.resume_if_any:
        return False
    from herdrl.checkpoint import newest_valid_checkpoint
    from herdrl.errors import ConfigError

    if args.resume or not args.trial:
        raise ConfigError("--resume-if-any needs --trial (the trial to continue or start), and no --resume")
    experiment = request.experiment()
    trial_dir = Path(request.output) / str(experiment) / args.trial
    args.resume = experiment is not None and trial_dir.is_dir() and newest_valid_checkpoint(trial_dir) is not None
    return not args.resume


def _resumed_config(args: argparse.Namespace, request: _TrainRequest) -> tuple[Any, str, str]:
    """``--resume``: the config of the trial's newest valid checkpoint with the command's keys over it, the
    experiment and the trial; a ConfigError when the command names another algorithm or env than the trial's."""
    from herdrl.checkpoint import checkpoint_config, read_meta
    from herdrl.env.imports import plain_env
    from herdrl.errors import ConfigError
    from herdrl.experiment import find_resume_point
    from herdrl.registry import get_config_class

    algorithm, env = request.algorithm, request.env
    experiment = request.experiment()
    if not experiment:
        raise ConfigError("--resume needs the experiment: give --env (or --name, or -f) as in the original run")
    trial_dir, checkpoint = find_resume_point(request.output, experiment, args.trial, algorithm)
    meta = read_meta(checkpoint)
    if algorithm and str(algorithm).upper() != meta["algorithm"]:
        raise ConfigError(f"--resume: {trial_dir} is a {meta['algorithm']} trial, not {algorithm}")
    if env and meta["config"]["env"] and plain_env(env) != plain_env(meta["config"]["env"]):
        raise ConfigError(f"--resume: {trial_dir} trained on {meta['config']['env']}, not {env}")
    check_flags(args, get_config_class(meta["algorithm"]))
    config = get_config_class(meta["algorithm"]).from_dict(checkpoint_config(meta, env))
    if env and not meta["config"]["env"]:
        config.environment(env)
    config.update_from_dict(request.overrides)
    return config, experiment, trial_dir.name


def _new_config(args: argparse.Namespace, request: _TrainRequest) -> Any:
    """A new run's config: the algorithm's, with the file's and the command line's keys and env."""
    from herdrl.errors import ConfigError
    from herdrl.registry import get_config_class

    if not request.algorithm:
        raise ConfigError("no algorithm: use `herd train ppo ...`, --run PPO, or `run:` in the -f file")
    check_flags(args, get_config_class(str(request.algorithm)))
    config = get_config_class(str(request.algorithm)).from_dict(request.overrides)
    if request.env is not None:
        config.environment(request.env)
    return config


def _print_notes(args: argparse.Namespace, config: Any) -> None:
    """Notes on stderr about flags that do nothing here."""
    if args.redis_password is not None:
        print("herd train: note: --redis-password is ignored; current Ray has no Redis (token auth protects "
              "the cluster)", file=sys.stderr)
    if (config.address or os.environ.get("RAY_ADDRESS")) and config.num_env_runners == 0:
        print("herd train: note: a Ray address is set but num_env_runners is 0, so sampling runs in this "
              "process; add --num-env-runners N to use the cluster", file=sys.stderr)


def _stop_criteria(args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    """The file's ``stop:`` with the ``--stop-*`` flags over it."""
    stop = dict(spec["stop"])
    for flag, key in (("stop_iters", "training_iteration"), ("stop_timesteps", "num_env_steps_sampled_lifetime"),
                      ("stop_reward", "episode_return_mean"), ("stop_time", "time_total_s")):
        if getattr(args, flag) is not None:
            stop[key] = getattr(args, flag)
    return stop


def _print_summary(config: Any, outcome: Any) -> None:
    """The run's last line: why it stopped, its metric, the work done and where its results are (on stderr when
    the budget ran out)."""
    from herdrl.logger import format_value

    result = outcome.result
    metric = config.stop_metric
    labels = {"training_iteration": "iteration limit", "num_env_steps_sampled_lifetime": "step limit",
              "time_total_s": "time limit"}
    label = labels.get(outcome.stopped_by, outcome.stopped_by)
    if "episode_return_mean" in outcome.stopped_by:  # a reward target: the env's threshold, or the user's own
        label = "solved" if outcome.solved else "target reached"
    if outcome.already_done:
        label = f"already done ({label})"
    summary = (f"{label}: {metric} {format_value(result.get(metric))} "
               f"after {_work_done(config, result)}, "
               f"{plural(result.get('training_iteration', 0), 'iteration')}, {result.get('time_total_s', 0.0):.1f} s; "
               f"results in {outcome.logdir}")
    print(summary, file=sys.stderr if outcome.stopped_by == "budget" else sys.stdout)


def _exit_code(outcome: Any) -> int:
    """``herd train``'s exit code for how the run ended (the module's docstring lists them)."""
    if outcome.already_done:  # a chained job after the last one: the chain ends here, successfully
        return 0
    if outcome.stopped_by == "interrupted":
        if outcome.signal == signal.SIGUSR1:
            return EXIT_REQUEUE
        return 128 + outcome.signal if outcome.signal else EXIT_INTERRUPTED
    if outcome.stopped_by == "budget" and outcome.solved is False:
        return EXIT_NOT_SOLVED
    return 0


def _work_done(config: Any, result: dict[str, Any]) -> str:
    """``1,000 env steps`` (``1,000 gradient steps`` for an offline run)."""
    if config.learns_offline:
        return plural(result.get("num_gradient_updates_lifetime", 0), "gradient step")
    return plural(result.get("num_env_steps_sampled_lifetime", 0), "env step")


def _bench(args: argparse.Namespace) -> int:
    from herdrl.bench import run_scaling
    from herdrl.errors import ConfigError
    from herdrl.registry import get_config_class

    if args.bench_kind == "ingest":
        return _bench_ingest(args)
    if args.bench_kind == "size":
        return _bench_size(args)
    try:
        counts = [int(x) for x in args.runners.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--runners expects comma-separated integers, got '{args.runners}'") from None
    if not counts or min(counts) < 1:
        raise ConfigError("--runners needs counts >= 1 (the in-process baseline is measured anyway)")
    config = get_config_class(args.algorithm).from_dict(parse_overrides(args.config)).environment(args.env)
    config.env_runners(num_envs_per_env_runner=args.envs_per_runner, rollout_fragment_length=args.fragment)
    if args.address:
        config.resources(address=args.address)
    if args.node_ip_address:
        config.resources(node_ip_address=args.node_ip_address)
    run_scaling(config, counts, args.iters, Path(args.out), include_local=not args.no_local)
    return 0


def _bench_size(args: argparse.Namespace) -> int:
    from herdrl.bench_size import run_size
    from herdrl.cluster import connect, disconnect
    from herdrl.errors import ConfigError
    from herdrl.registry import get_config_class

    if args.nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, got {args.nodes}")
    config = get_config_class(args.algorithm).from_dict(parse_overrides(args.config)).environment(args.env)
    if args.address:
        config.resources(address=args.address)
    if args.node_ip_address:
        config.resources(node_ip_address=args.node_ip_address)
    joined = bool(args.address) and connect(config)  # only to read the cluster's nodes: the measuring is here
    try:
        run_size(config, nodes=args.nodes)
    finally:
        if joined:
            disconnect()
    return 0


def _bench_ingest(args: argparse.Namespace) -> int:
    from herdrl.bench_ingest import run_ingest
    from herdrl.errors import ConfigError

    try:
        counts = [int(x) for x in args.producers.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--producers expects comma-separated integers, got '{args.producers}'") from None
    for flag, value in (("--envs", args.envs), ("--steps", args.steps), ("--batch", args.batch),
                        ("--aggregators", args.aggregators)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")
    if args.seconds <= 0 or args.rate < 0:
        raise ConfigError("--seconds must be > 0 and --rate >= 0")
    run_ingest(args.address, args.node_ip_address, [m.strip() for m in args.modes.split(",") if m.strip()], counts,
               args.shape, Path(args.out), steps=args.steps, envs=args.envs, batch=args.batch,
               seconds=args.seconds, rate=args.rate, aggregators=args.aggregators, placement=args.placement)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from herdrl.checkpoint import env_to_make, read_meta
    from herdrl.env.previous import inputs_of
    from herdrl.errors import ConfigError
    from herdrl.evaluation import Evaluator, record_video, summarize
    from herdrl.policy import Policy

    if args.episodes < 1:
        raise ConfigError(f"--episodes got {args.episodes}; expected >= 1")
    if args.timeout_s is not None and not args.timeout_s > 0:
        raise ConfigError(f"--timeout-s got {args.timeout_s:g}; expected > 0")
    meta = read_meta(args.checkpoint)
    env, env_config = env_to_make(meta, args.env), meta["config"]["env_config"]
    if env is None:
        raise ConfigError("the checkpoint's env was a Python object: give --env ID")
    if meta["config"].get("policies") is not None:
        return _evaluate_multi_agent(args, meta, env)
    policy = Policy.from_checkpoint(meta["path"])
    if args.video:
        returns, lengths = record_video(policy, env, env_config, args.video, args.episodes, args.seed, args.explore,
                                        progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
                                        timeout_s=args.timeout_s, timeout_option="--timeout-s")
    else:
        evaluator = Evaluator(env, env_config, args.episodes, previous=inputs_of(policy.observation_space))
        try:
            returns, lengths = evaluator.run(policy, seed=args.seed, explore=args.explore,
                                             progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
                                             timeout_s=args.timeout_s, timeout_option="--timeout-s")
        finally:
            evaluator.close()
    stats = summarize(returns, lengths)
    print(f"{env}: {plural(stats['num_episodes'], 'episode')} ({'exploring' if args.explore else 'greedy'}) "
          f"from {meta['path']}")
    for name, key in (("return", "episode_return"), ("length", "episode_len")):
        print(f"  {name:6s} mean {stats[key + '_mean']:10.2f}  std {stats[key + '_std']:9.2f}  "
              f"min {stats[key + '_min']:10.2f}  max {stats[key + '_max']:10.2f}")
    if args.video:
        print(f"  video: {args.video}")
    return 0


def _evaluate_multi_agent(args: argparse.Namespace, meta: dict, env: str) -> int:
    """Every policy of a multi-agent checkpoint plays its agents, mapped by the run's mapping (the default one when
    the run's was a Python function, which checkpoints do not hold)."""
    from herdrl.algorithms.base import Algorithm
    from herdrl.errors import ConfigError

    if args.video:
        raise ConfigError("--video is not built for multi-agent checkpoints yet")
    algo = Algorithm.from_checkpoint(meta["path"], env=env, num_env_runners=0, num_learners=0,
                                     evaluation_duration=args.episodes,
                                     evaluation_config={"explore": args.explore},
                                     evaluation_sample_timeout_s=args.timeout_s,
                                     **({} if args.seed is None else {"seed": args.seed}))
    algo._timeout_option = "--timeout-s"  # the line a cut evaluation leaves names the option given here
    try:
        stats = algo.evaluate(progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    finally:
        algo.stop()
    print(f"{env}: {plural(stats['evaluation/num_episodes'], 'episode')} ({'exploring' if args.explore else 'greedy'}) "
          f"from {meta['path']}")
    print(f"  return mean {stats['evaluation/episode_return_mean']:10.2f} (summed over agents)  length mean "
          f"{stats['evaluation/episode_len_mean']:8.2f}")
    for key, value in stats.items():
        if "_return_mean/" in key:
            print(f"  {key.removeprefix('evaluation/'):32s} {value:10.2f}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from herdrl.export import export_policy

    path = export_policy(args.checkpoint, args.format, args.out, args.policy_id, args.agent)
    print(f"wrote {args.format} policy to {path}")
    return 0


def _tune(args: argparse.Namespace) -> int:
    from herdrl import tune
    from herdrl.env.imports import import_envs
    from herdrl.errors import ConfigError
    from herdrl.experiment import catch_walltime_signal, load_experiment_file
    from herdrl.logger import format_value

    catch_walltime_signal()  # a batch job's walltime signal while Ray starts must not end us
    if args.resume and args.resume_if_any:
        raise ConfigError("give --resume or --resume-if-any, not both")
    spec = load_experiment_file(args.file, sweep=True)
    import_envs(*spec["imports"])
    if not spec["algorithm"]:
        raise ConfigError(f"{args.file}: no algorithm (`algorithm:` or `run:`)")
    config = tune.search_space(spec["config"])
    if spec["env"]:
        config["env"] = spec["env"]
    metric, mode = spec.get("metric", "episode_return_mean"), spec.get("mode", "max")
    analysis = tune.run(
        spec["algorithm"], config=config, stop=spec["stop"], name=args.name or spec["name"],
        num_samples=args.num_samples or spec.get("num_samples", 1), storage_path=args.output,
        checkpoint_freq=spec.get("checkpoint_freq", 10), metric=metric, mode=mode,
        scheduler=spec.get("scheduler"), resume="if_any" if args.resume_if_any else args.resume, verbose=args.verbose,
        max_concurrent_trials=args.max_concurrent_trials or spec.get("max_concurrent_trials"), address=args.address,
        **dict(zip(("mlflow", "wandb"), _trackers(args, spec, args.output), strict=True)))
    if analysis.num_unfinished:
        why = analysis.stop_reason or "interrupted"
        print(f"herd tune: {why}: stopped with {plural(analysis.num_unfinished, 'trial')} unfinished, each from its "
              "newest checkpoint: continue with --resume", file=sys.stderr)
        if analysis.stop_signal == signal.SIGUSR1:
            return EXIT_REQUEUE  # the walltime: the chain's next job resumes it
        return 128 + analysis.stop_signal if analysis.stop_signal else EXIT_INTERRUPTED
    searched = [k for k, v in spec["config"].items() if isinstance(v, dict) and len(v) == 1
                and next(iter(v)) in ("grid_search", "choice", "uniform", "loguniform")]
    if analysis.has_best:
        best = analysis.best_result
        print(f"best trial: {analysis.best_logdir}")
        iterations = plural(best.get("training_iteration") or 0, "iteration")
        print(f"  {metric} = {format_value(best.get(metric))} after {iterations}")
        print("  config: " + ", ".join(f"{k}={analysis.best_config.get(k)}" for k in searched))
        print(f"  checkpoint: {analysis.best_checkpoint}")
    else:
        print(f"best trial: none (no trial reported a finite {metric} in its last result)")
    if analysis.errors:
        print(f"herd tune: {len(analysis.errors)} trial(s) failed: {analysis.errors[0]}", file=sys.stderr)
        return 1
    return 0


def _plot(args: argparse.Namespace) -> int:
    from herdrl.plot import plot_curves

    path = plot_curves(args.folders, metric=args.metric, x=args.x, out=args.out, title=args.title)
    print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``herd`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.version:
        from herdrl import __version__

        print(f"herdrl {__version__}")
        return 0
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    from herdrl.errors import HerdError

    try:
        from herdrl.cluster.commands import cluster, launch

        if getattr(args, "imports", None):
            from herdrl.env.imports import import_envs

            import_envs(*args.imports)
        from herdrl.offline.commands import data_command, record_command

        commands = {"train": _train, "bench": _bench, "evaluate": _evaluate, "export": _export, "tune": _tune,
                    "plot": _plot, "launch": launch, "cluster": cluster, "record": record_command,
                    "data": data_command}
        return commands[args.command](args)
    except HerdError as exc:
        if args.debug:
            raise
        print(f"herd {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"herd {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
