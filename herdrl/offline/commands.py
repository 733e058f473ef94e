"""``herd record`` and ``herd data``: the command-line side of :mod:`herdrl.offline`."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any


def add_parsers(subparsers: Any, add_import_option: Any) -> None:
    """The ``record`` and ``data`` sub-commands."""
    p = subparsers.add_parser("record", help="play a trained policy and write its episodes as a dataset",
                              description="Play episodes with a checkpoint's policy and write them as a dataset in "
                                          "Minari's format (Parquet by default), for offline algorithms (BC, ...).")
    p.add_argument("checkpoint", help="a checkpoint directory, or a trial directory (its newest valid checkpoint)")
    p.add_argument("--episodes", type=int, required=True, help="episodes to record")
    p.add_argument("--out", required=True, help="the dataset folder to create (must be new or empty)")
    p.add_argument("--explore", action="store_true", help="sample actions (a noisier dataset) instead of greedy ones")
    p.add_argument("--seed", type=int, help="episode i is reset with SEED + i (reproducible datasets)")
    p.add_argument("--env", help="record on this env instead of the checkpoint's (same spaces)")
    p.add_argument("--num-runners", type=int, default=0,
                   help="Ray tasks that record at once, each writing its own episodes into --out (a folder every "
                        "node sees); 0 = in this process (default)")
    p.add_argument("--address", help="record on this Ray cluster (HOST:PORT or auto) with --num-runners")
    p.add_argument("--format", dest="data_format", choices=("parquet", "arrow"), default="parquet",
                   help="episode files: parquet (default; Ray Data reads it) or arrow (Minari's default)")
    add_import_option(p)
    d = subparsers.add_parser("data", help="inspect datasets", description="Inspect recorded datasets.")
    kinds = d.add_subparsers(dest="data_command", metavar="{info,finish,from-rllib}", required=True)
    i = kinds.add_parser("info", help="summarise a dataset: episodes, steps, returns, spaces",
                         description="Summarise a dataset: episodes, steps, returns, spaces, who recorded it.")
    i.add_argument("path", help="a dataset folder (herdrl's or Minari's: parquet, arrow or hdf5)")
    f = kinds.add_parser("finish", help="number the episodes of a recording a killed run left, write its metadata",
                         description="A run recording its episodes (output=DIR) numbers them and writes the "
                                     "dataset's metadata when it stops; for a run killed before that, this does it.")
    f.add_argument("path", help="the output folder of the run")
    r = kinds.add_parser("from-rllib", help="convert RLlib's recorded episodes (.offline_data(output=...)) into a "
                                           "dataset", description="Convert the episodes RLlib recorded (new API "
                                           "stack, output_write_episodes=True: its default) into a dataset in "
                                           "Minari's format; nothing is unpickled.")
    r.add_argument("source", help="RLlib's output folder (its Parquet files, in any subfolders)")
    r.add_argument("--out", required=True, help="the dataset folder to create (must be new or empty)")
    r.add_argument("--format", dest="data_format", choices=("parquet", "arrow"), default="parquet",
                   help="episode files: parquet (default) or arrow")


def record_command(args: argparse.Namespace) -> int:
    """``herd record``."""
    from herdrl.offline.record import record

    record(args.checkpoint, args.episodes, args.out, env=args.env, explore=args.explore, seed=args.seed,
           num_runners=args.num_runners, data_format=args.data_format, address=args.address,
           progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    return data_info(args.out)


def data_command(args: argparse.Namespace) -> int:
    """``herd data info|finish|from-rllib``."""
    if args.data_command == "from-rllib":
        from herdrl.offline.rllib_data import convert_rllib

        convert_rllib(args.source, args.out, args.data_format)
        return data_info(args.out)
    if args.data_command == "finish":
        from herdrl.offline.recorder import finish_recording

        finish_recording(args.path, algorithm_name="unknown (finished by herd data finish)")
    return data_info(args.path)


def data_info(path: str) -> int:
    """Print a dataset's summary."""
    from herdrl.offline.dataset import open_dataset

    info = open_dataset(path).info()
    number = lambda value: "-" if isinstance(value, float) and math.isnan(value) else f"{value:.2f}"  # noqa: E731
    print(f"{info['path']} ({info['data_format']})")
    print(f"  episodes      {info['episodes']:,}    steps {info['steps']:,}    mean length "
          f"{number(info['episode_length_mean'])}")
    print(f"  return        mean {number(info['return_mean'])}  min {number(info['return_min'])}  "
          f"max {number(info['return_max'])}")
    print(f"  observations  {info['observation_space']}")
    print(f"  actions       {info['action_space']}")
    for key in ("dataset_id", "algorithm_name", "herdrl_env", "herdrl_checkpoint", "herdrl_explore"):
        if key in info:
            print(f"  {key:13s} {info[key]}")
    return 0
