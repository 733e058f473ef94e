"""``herd launch ...`` and ``herd cluster ...``: argument parsing and the small commands behind them."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from herdrl.cluster.connect import ClusterError


def _add_node_options(p: argparse.ArgumentParser, per_node_names: bool = False) -> None:
    cpus, gpus = ("--cpus-per-node", "--gpus-per-node") if per_node_names else ("--num-cpus", "--num-gpus")
    p.add_argument(cpus, dest="num_cpus", type=int, help="CPUs each Ray node offers (default: all it has)")
    p.add_argument(gpus, dest="num_gpus", type=int, help="GPUs each Ray node offers (default: all it has)")
    p.add_argument("--port", type=int, help="head port (default: a free port picked on the head node)")
    p.add_argument("--node-ip-address", help="address every node announces (default: Ray's choice)")
    p.add_argument("--interface", help="announce this network interface's address, e.g. ib0 (fast fabric)")
    p.add_argument("--object-store-memory", type=int, help="bytes of object store per node (default: Ray's)")
    p.add_argument("--join-timeout", type=float, default=300.0,
                   help="seconds to wait for the head and for all nodes to join (default 300)")


def _node_options(args: argparse.Namespace) -> Any:
    from herdrl.cluster.nodes import NodeOptions

    return NodeOptions(num_cpus=args.num_cpus, num_gpus=args.num_gpus, port=args.port,
                       node_ip_address=args.node_ip_address, interface=args.interface,
                       object_store_memory=args.object_store_memory, join_timeout_s=args.join_timeout)


def _driver_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("driver", nargs=argparse.REMAINDER, metavar="-- DRIVER COMMAND...",
                   help="the command to run once the cluster is up, e.g. herd train ppo --env CartPole-v1")


def _driver(args: argparse.Namespace) -> list[str]:
    driver = list(args.driver)
    if driver and driver[0] == "--":
        driver = driver[1:]
    if not driver:
        raise ClusterError("give the driver command after --, e.g. -- herd train ppo --env CartPole-v1")
    return driver


def add_launch_parser(subparsers: Any) -> None:
    """``herd launch slurm|mpi|pbs``."""
    p = subparsers.add_parser("launch", help="start Ray on an HPC allocation and run a driver on it",
                              description="Start a Ray cluster on Slurm, MPI or PBS nodes, run a driver, stop it.")
    kinds = p.add_subparsers(dest="launch_kind", metavar="KIND", required=True)
    m = kinds.add_parser("mpi", help="one Ray node per MPI rank: mpirun -np N herd launch mpi -- ...",
                         description="Run under any MPI launcher: rank 0 is the head and runs the driver.")
    _add_node_options(m)
    _driver_args(m)


def add_cluster_parser(subparsers: Any) -> None:
    """``herd cluster node|wait``: the per-node steps the launch scripts run."""
    p = subparsers.add_parser("cluster", help="start, stop and inspect Ray clusters",
                              description="Ray clusters herdrl starts: per-node steps and private clusters.")
    kinds = p.add_subparsers(dest="cluster_kind", metavar="ACTION", required=True)
    n = kinds.add_parser("node", help="start or stop one Ray node on this host (used by launch scripts)")
    n.add_argument("action", choices=["start", "stop"])
    n.add_argument("--temp-dir", required=True, help="the node's own Ray temp dir; stop finds its processes by it")
    n.add_argument("--head", action="store_true", help="start the head (otherwise join --address)")
    n.add_argument("--address", help="head address HOST:PORT to join")
    n.add_argument("--address-file", help="head: write its address here once it answers")
    n.add_argument("--block", action="store_true",
                   help="stay in the foreground; stop the node when this process ends or is signalled")
    _add_node_options(n)
    w = kinds.add_parser("wait", help="wait until a cluster has N nodes; prints its address")
    w.add_argument("--address", help="head address HOST:PORT")
    w.add_argument("--address-file", help="read the head address from this file once it appears")
    w.add_argument("--nodes", type=int, required=True, help="number of alive nodes to wait for")
    w.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    w.add_argument("--node-ip-address", help="this host's node address (when several are on one host)")


def launch(args: argparse.Namespace) -> int:
    """``herd launch KIND``."""
    if args.launch_kind == "mpi":
        from herdrl.cluster import mpi

        return mpi.run(_driver(args), _node_options(args))
    raise ClusterError(f"unknown launcher {args.launch_kind}")


def cluster(args: argparse.Namespace) -> int:
    """``herd cluster ACTION``."""
    if args.cluster_kind == "node":
        return _node(args)
    if args.cluster_kind == "wait":
        return _wait(args)
    raise ClusterError(f"unknown cluster action {args.cluster_kind}")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _node(args: argparse.Namespace) -> int:
    from herdrl.cluster.nodes import NodeSpec, start_node, stop_node

    temp_dir = Path(args.temp_dir)
    if args.action == "stop":
        count = stop_node(temp_dir)
        print(f"stopped {count} Ray process(es) of {temp_dir}")
        return 0
    if args.head == bool(args.address):
        raise ClusterError("give exactly one of --head or --address HOST:PORT")
    options = _node_options(args)
    spec = NodeSpec(temp_dir, address=args.address, port=options.port, node_ip_address=options.node_ip(),
                    num_cpus=options.num_cpus, num_gpus=options.num_gpus,
                    object_store_memory=options.object_store_memory)
    if not args.block:
        address, _ = start_node(spec, timeout_s=options.join_timeout_s)
        if args.address_file:
            _write_atomic(Path(args.address_file), address)
        print(address)
        return 0
    # Foreground node: whatever ends this process (driver done, scancel, Ctrl-C) stops the node by PID.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        address, proc = start_node(spec, block=True, timeout_s=options.join_timeout_s)
        if args.address_file:
            _write_atomic(Path(args.address_file), address)
        print(address, flush=True)
        return proc.wait() if proc is not None else 0
    finally:
        stop_node(temp_dir)


def _wait(args: argparse.Namespace) -> int:
    from herdrl.cluster.nodes import wait_for_nodes

    deadline = time.monotonic() + args.timeout
    address = args.address
    if not address:
        if not args.address_file:
            raise ClusterError("give --address HOST:PORT or --address-file FILE")
        path = Path(args.address_file)
        while not path.exists():
            if time.monotonic() >= deadline:
                raise ClusterError(f"no head address in {path} after {args.timeout:g} s: the head did not start; "
                                   "see its log next to that file")
            time.sleep(0.2)
        address = path.read_text().strip()

    def progress(alive: int, wanted: int) -> None:
        print(f"herd cluster wait: {alive}/{wanted} Ray nodes alive at {address}", file=sys.stderr, flush=True)

    wait_for_nodes(address, args.nodes, max(1.0, deadline - time.monotonic()), args.node_ip_address, progress)
    print(address)
    return 0
