"""``herd launch ...`` and ``herd cluster ...``: argument parsing and the small commands behind them."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
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
    p.add_argument("--node-ip-address",
                   help="address the node(s) announce; one host only (on several nodes use --interface)")
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

    sl = kinds.add_parser("slurm", help="write and submit an sbatch script (or run it in this allocation)",
                          description="Write an sbatch script that starts Ray on every node, runs the driver on "
                                      "the first and stops Ray at the end; submit it.")
    _add_batch_options(sl, queue_flag="--partition")
    sl.add_argument("--submit", action=argparse.BooleanOptionalAction, default=True,
                    help="submit it with sbatch (default; --no-submit: write it and print the command)")
    sl.add_argument("--in-allocation", action="store_true",
                    help="run the script here, inside an existing salloc / srun --pty allocation")
    sl.add_argument("--wait", action="store_true", help="wait for the job to end; exit with its exit code")
    _add_chain_options(sl, "Slurm signals the driver")
    _driver_args(sl)

    pb = kinds.add_parser("pbs", help="write (and with --submit, qsub) a PBS or Cobalt script",
                          description="Write a PBS Pro or Cobalt script that runs `herd launch mpi` on every node.")
    _add_batch_options(pb, queue_flag="--queue")
    pb.add_argument("--launcher", choices=["mpiexec", "aprun", "mpirun"], default="mpiexec",
                    help="the site's MPI launcher (default mpiexec; aprun on Cray XC such as Theta)")
    pb.add_argument("--launcher-args", default="", help="extra arguments for the launcher, e.g. '--cpu-bind none'")
    pb.add_argument("--flavor", choices=["pbs", "cobalt"], default="pbs", help="#PBS (default) or #COBALT directives")
    pb.add_argument("--submit", action=argparse.BooleanOptionalAction, default=False,
                    help="run qsub on the script (default --no-submit: write it and print the command)")
    _add_chain_options(pb, "the driver stops by itself (HERD_STOP_AT)")
    _driver_args(pb)


def _add_chain_options(p: argparse.ArgumentParser, how: str) -> None:
    p.add_argument("--max-jobs", type=int, default=1, metavar="N",
                   help="chain up to N jobs: a `herd train` driver stopped before the walltime checkpoints, and the "
                        "job submits the next one, which resumes the trial (needs --time; default 1: no chain; PBS "
                        "Pro and Slurm)")
    p.add_argument("--signal-lead", type=int, default=None, metavar="SECONDS",
                   help=f"with --time: {how} this long before the walltime, to finish its iteration and checkpoint "
                        "(default 300, or a quarter of a walltime under 20 minutes)")


def _add_batch_options(p: argparse.ArgumentParser, queue_flag: str) -> None:
    p.add_argument("--nodes", type=int, default=2, help="nodes, one Ray node each (default 2)")
    _add_node_options(p, per_node_names=True)
    p.add_argument("--time", help="walltime HH:MM:SS")
    p.add_argument(queue_flag, dest="queue", help="partition / queue")
    p.add_argument("--account", help="account / project to charge")
    p.add_argument("--job-name", default="herd", help="job name (default herd)")
    p.add_argument("--setup", action="append", default=[], metavar="LINES",
                   help="shell lines run first on the nodes, e.g. 'module load python; source venv/bin/activate' "
                        "(repeatable)")
    p.add_argument("--unset-ld-preload", action="store_true",
                   help="unset LD_PRELOAD in the job (site preload libraries can crash Ray)")
    p.add_argument("--output", default="results",
                   help="results root; the script and the job's log go to OUTPUT/launch/ (default results)")
    p.add_argument("--dry-run", action="store_true", help="print the script, write and submit nothing")


def add_cluster_parser(subparsers: Any) -> None:
    """``herd cluster node|wait``: the per-node steps the launch scripts run."""
    p = subparsers.add_parser("cluster", help="start, stop and inspect Ray clusters",
                              description="Ray clusters herdrl starts: per-node steps and private clusters.")
    kinds = p.add_subparsers(dest="cluster_kind", metavar="ACTION", required=True)
    n = kinds.add_parser("node", help="start or stop one Ray node on this host (used by launch scripts)",
                         description="Start or stop one Ray node on this host, with token auth; launch scripts "
                                     "run this on every node of an allocation.")
    n.add_argument("action", choices=["start", "stop"])
    n.add_argument("--temp-dir", required=True, help="the node's own Ray temp dir; stop finds its processes by it")
    n.add_argument("--head", action="store_true", help="start the head (otherwise join --address)")
    n.add_argument("--address", help="head address HOST:PORT to join")
    n.add_argument("--address-file", help="head: write its address here once it answers")
    n.add_argument("--remove-files", action="store_true", help="stop: also delete the node's temp dir and log")
    n.add_argument("--token-stdin", action="store_true",
                   help="start: read the cluster's auth token from stdin into the node's private temp dir")
    n.add_argument("--block", action="store_true",
                   help="stay in the foreground; stop the node when this process ends or is signalled")
    _add_node_options(n)
    w = kinds.add_parser("wait", help="wait until a cluster has N nodes; prints its address",
                         description="Wait until a Ray cluster has N alive nodes, then print its head address.")
    w.add_argument("--address", help="head address HOST:PORT")
    w.add_argument("--address-file", help="read the head address from this file once it appears")
    w.add_argument("--nodes", type=int, required=True, help="number of alive nodes to wait for")
    w.add_argument("--timeout", type=float, default=300.0, help="seconds (default 300)")
    w.add_argument("--node-ip-address", help="this host's node address (when several are on one host)")
    w.add_argument("--watch", type=int, nargs="*", default=[], metavar="PID",
                   help="give up at once when one of these processes (node start steps) has ended")

    up = kinds.add_parser("up", help="start Ray over ssh on the hosts of a hosts.yaml",
                          description="Start a private cluster: the head, then each worker, over ssh.")
    up.add_argument("hosts_file", help="hosts.yaml (head, workers, ssh, setup, ray)")
    dn = kinds.add_parser("down", help="stop the Ray nodes a `herd cluster up` started (by PID, never ray stop)",
                          description="Stop the Ray nodes `herd cluster up HOSTS_YAML` started, by their PIDs "
                                      "(never `ray stop`, which would stop other users' Ray on a shared host).")
    dn.add_argument("hosts_file")
    st = kinds.add_parser("status", help="alive nodes of a cluster: from a hosts.yaml, or --address on a node",
                          description="Show the alive nodes of a cluster and their CPUs: from a hosts.yaml, or "
                                      "with --address when run on one of its nodes.")
    st.add_argument("hosts_file", nargs="?")
    st.add_argument("--address", help="head address HOST:PORT (when run on a node of that cluster)")
    st.add_argument("--node-ip-address", help="this host's node address (when several are on one host)")
    sy = kinds.add_parser("sync", help="copy a results directory back from the head with rsync",
                          description="Copy a results directory back from the cluster's head with rsync (for "
                                      "runs started with herd train --cluster --detach).")
    sy.add_argument("hosts_file")
    sy.add_argument("results_dir", nargs="?", default="results",
                    help="results directory, relative to the head's workdir (default results)")


def launch(args: argparse.Namespace) -> int:
    """``herd launch KIND``."""
    if args.launch_kind == "mpi":
        from herdrl.cluster import mpi

        return mpi.run(_driver(args), _node_options(args))
    if args.launch_kind in ("slurm", "pbs"):
        return _batch(args)
    raise ClusterError(f"unknown launcher {args.launch_kind}")


def _batch_job(args: argparse.Namespace, launch_dir: Path) -> Any:
    from herdrl.cluster.scripts import BatchJob

    return BatchJob(driver=_driver(args), launch_dir=launch_dir, workdir=Path.cwd(), nodes=args.nodes,
                    node_options=_node_options(args), time=args.time, partition=args.queue, account=args.account,
                    job_name=args.job_name, setup=list(args.setup), unset_ld_preload=args.unset_ld_preload,
                    max_jobs=getattr(args, "max_jobs", 1), signal_lead_s=getattr(args, "signal_lead", None))


def _batch(args: argparse.Namespace) -> int:
    """Write the Slurm or PBS script into a launch folder of its own, OUTPUT/launch/NAME_STAMP[_N]/, and run,
    submit or print it."""
    from herdrl.cluster import scripts
    from herdrl.cluster.nodes import AUTH_TOKEN_FILE, private_dir, write_token
    from herdrl.trial_dir import create_unique_dir

    slurm = args.launch_kind == "slurm"
    if slurm and args.wait and (not args.submit or args.dry_run):
        raise ClusterError("--wait waits for a submitted job: drop --no-submit/--dry-run, or --wait")
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    launch_dir = (Path(args.output) / "launch" / f"{args.job_name}_{stamp}").resolve()
    if not args.dry_run:
        # Every launch its own folder (script, token, chained trial name): launches in the same second get _2, _3,
        # ... The folder is created private (0700) in one step: it holds the cluster's token until the job starts.
        launch_dir = create_unique_dir(launch_dir, mode=0o700)
    try:
        job = _batch_job(args, launch_dir)
        text = scripts.slurm_script(job) if slurm else scripts.pbs_script(job, args.launcher, args.flavor,
                                                                            args.launcher_args)
    except BaseException:
        if not args.dry_run:
            launch_dir.rmdir()  # refused options leave no empty launch folder behind
        raise
    if args.dry_run:
        print(text, end="")
        return 0
    private_dir(job.launch_dir)  # checks what was made is ours alone
    path = job.launch_dir / ("job.sbatch" if slurm else "job.pbs")
    path.write_text(text)
    if slurm:
        write_token(job.launch_dir / AUTH_TOKEN_FILE)
    results = _results_root(job.driver)
    print(f"herd launch: wrote {path}; the driver's results go to {results}", flush=True)
    if slurm and args.in_allocation:
        if "SLURM_JOB_ID" not in os.environ:
            raise ClusterError("--in-allocation needs a Slurm allocation (salloc / srun --pty): SLURM_JOB_ID is unset")
        return subprocess.call(["bash", str(path)])
    if not args.submit:
        print(f"herd launch: submit it with: {'sbatch' if slurm else 'qsub'} {path}")
        return 0
    submit = ["sbatch", "--parsable", str(path)] if slurm else ["qsub", str(path)]
    try:
        done = subprocess.run(submit, stdout=subprocess.PIPE, text=True)
    except FileNotFoundError as exc:
        raise ClusterError(f"{submit[0]} not found: run this on the cluster's login node (or use --dry-run)") from exc
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job_id:
        raise ClusterError(f"{submit[0]} refused the job (exit {done.returncode}); its message is above")
    log = job.launch_dir / (f"slurm-{job_id}.out" if slurm else f"{args.flavor}.out")
    print(f"herd launch: submitted job {job_id}; its output (live progress table): {log}", flush=True)
    return _wait_for_slurm_job(job_id) if slurm and args.wait else 0


def _wait_for_slurm_job(job_id: str) -> int:
    """Poll until the job leaves the queue (every second: `sbatch --wait` backs off to tens of seconds);
    return its exit code."""
    while subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True).stdout.strip():
        time.sleep(1.0)
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    match = re.search(r"\bExitCode=(\d+):(\d+)", shown)
    if match is None:  # older than the controller's MinJobAge: ask accounting
        shown = subprocess.run(["sacct", "-n", "-X", "-j", job_id, "-o", "ExitCode"], capture_output=True,
                               text=True).stdout
        match = re.search(r"(\d+):(\d+)", shown)
    if match is None:
        raise ClusterError(f"job {job_id} ended but Slurm no longer reports its exit code")
    code, signal_number = int(match.group(1)), int(match.group(2))
    state = re.search(r"\bJobState=(\w+)", shown)
    print(f"herd launch: job {job_id} ended ({state.group(1) if state else 'done'}, exit {code})", flush=True)
    return code if code or not signal_number else 128 + signal_number


def _results_root(driver: list[str]) -> Path:
    """Where a ``herd train``/``tune`` driver writes results: its --output, else results/ here."""
    for i, arg in enumerate(driver):
        if arg == "--output" and i + 1 < len(driver):
            return Path(driver[i + 1]).resolve()
        if arg.startswith("--output="):
            return Path(arg.split("=", 1)[1]).resolve()
    return (Path.cwd() / "results").resolve()


def cluster(args: argparse.Namespace) -> int:
    """``herd cluster ACTION``."""
    if args.cluster_kind == "node":
        return _node(args)
    if args.cluster_kind == "wait":
        return _wait(args)
    from herdrl.cluster import hosts

    if args.cluster_kind == "status" and not args.hosts_file:
        return _status_here(args)
    spec = hosts.load_hosts(args.hosts_file)
    if args.cluster_kind == "up":
        state = hosts.up(spec)
        print(f"train on it: herd train --cluster {args.hosts_file} ppo --env CartPole-v1 --num-env-runners N "
              f"(or on a node: --address {state['address']})")
        return 0
    if args.cluster_kind == "down":
        return hosts.down(spec)
    if args.cluster_kind == "status":
        print(hosts.status(spec), end="")
        return 0
    if args.cluster_kind == "sync":
        hosts.sync(spec, args.results_dir)
        return 0
    raise ClusterError(f"unknown cluster action {args.cluster_kind}")


def _node(args: argparse.Namespace) -> int:
    from herdrl.cluster.nodes import (
        exit_on_sigterm,
        node_pids,
        remove_node_files,
        start_node,
        stop_node,
        stopping_marker,
    )
    from herdrl.logger import write_text_atomic

    temp_dir = Path(args.temp_dir)
    if args.action == "stop":
        count = stop_node(temp_dir, remove_files=args.remove_files)
        print(f"stopped {count} Ray process(es) of {temp_dir}")
        return 0
    if args.head == bool(args.address):
        raise ClusterError("give exactly one of --head or --address HOST:PORT")
    options = _node_options(args)
    spec = options.spec(temp_dir, address=args.address)
    if args.token_stdin:
        from herdrl.cluster.nodes import auth_env, write_node_token

        token = sys.stdin.read().strip()
        if not token:
            raise ClusterError("--token-stdin: no token on stdin")
        # the node's `ray start` sends it (a node joined by hand has no launch script's environment to do so)
        os.environ.update(auth_env(write_node_token(temp_dir, token)))
    if not args.block:
        address, _ = start_node(spec, timeout_s=options.join_timeout_s)
        if args.address_file:
            write_text_atomic(Path(args.address_file), address)
        print(address)
        return 0
    # Foreground node: whatever ends this process (driver done, scancel, Ctrl-C) stops the node by PID.
    exit_on_sigterm()
    try:
        address, proc = start_node(spec, block=True, timeout_s=options.join_timeout_s)
        if args.address_file:
            write_text_atomic(Path(args.address_file), address)
        print(address, flush=True)
        rc = proc.wait() if proc is not None else 0
    finally:
        if node_pids(temp_dir):
            stop_node(temp_dir)
    marker = stopping_marker(temp_dir)
    if not marker.exists():
        return rc  # the node died on its own: Ray's logs stay in the temp dir
    if marker.read_text() == "remove":  # `herd cluster node stop --remove-files` while we were running
        remove_node_files(temp_dir)
    marker.unlink(missing_ok=True)
    return 0


def _status_here(args: argparse.Namespace) -> int:
    from herdrl.cluster.nodes import alive_nodes

    address = args.address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ClusterError("give a hosts file, or --address HOST:PORT when running on a node of the cluster")
    nodes = alive_nodes(address, args.node_ip_address)
    print(f"{len(nodes)} alive Ray node(s) at {address}")
    for node in sorted(nodes, key=lambda n: not n["Resources"].get("node:__internal_head__")):
        res = node["Resources"]
        role = "head" if res.get("node:__internal_head__") else "worker"
        print(f"  {node['NodeManagerAddress']:<16} {role:<7} CPUs {res.get('CPU', 0):g}  GPUs {res.get('GPU', 0):g}")
    return 0


def _wait(args: argparse.Namespace) -> int:
    from herdrl.cluster.connect import wait_for_port
    from herdrl.cluster.nodes import process_alive, wait_for_nodes

    deadline = time.monotonic() + args.timeout

    def check() -> None:  # a node's start step that ended means it failed: no use waiting out the timeout
        ended = [pid for pid in args.watch if not process_alive(pid)]
        if ended:
            raise ClusterError(f"a Ray node's start (pid {ended[0]}) ended before the cluster was up; its error "
                               "is above (Ray's own output: herd-node.log in the node's private dir, /tmp/herd-*)")

    address = args.address
    if not address:
        if not args.address_file:
            raise ClusterError("give --address HOST:PORT or --address-file FILE")
        path = Path(args.address_file)
        while not path.exists():
            check()
            if time.monotonic() >= deadline:
                raise ClusterError(f"no head address in {path} after {args.timeout:g} s: the head did not start; "
                                   "see its log next to that file")
            time.sleep(0.2)
        address = path.read_text().strip()

    def progress(alive: int, wanted: int) -> None:
        print(f"herd cluster wait: {alive}/{wanted} Ray nodes alive at {address}", file=sys.stderr, flush=True)

    if args.nodes <= 1:  # the head alone: its port answering is enough (no Ray driver needed, ~2 s saved)
        while True:
            check()
            try:
                wait_for_port(address, 1.0)
                break
            except ClusterError:
                if time.monotonic() >= deadline:
                    raise
    else:
        wait_for_nodes(address, args.nodes, max(1.0, deadline - time.monotonic()), args.node_ip_address, progress,
                       check)
    print(address)
    return 0
