"""``herd launch mpi``: one Ray node per MPI rank, started by any MPI launcher.

    mpirun -np 4 herd launch mpi -- herd train ppo --env CartPole-v1 --num-env-runners 6

Rank 0 starts the head and sends its address and a fresh auth token to the other ranks; they join and
wait. Rank 0 waits until every rank's node is alive, runs the driver with ``RAY_ADDRESS`` set, then tells
the other ranks to stop their nodes (by PID, never ``ray stop``) and exits with the driver's exit code —
which ``mpirun`` passes on as the job's.

Waiting ranks poll a non-blocking receive with sleeps: MPI's blocking receive spins a core, which would
take CPU from the Ray node on the same host.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from herdrl.cluster.connect import ClusterError
from herdrl.cluster.nodes import (
    NodeOptions,
    auth_env,
    exit_on_sigterm,
    node_log,
    node_token_path,
    start_node,
    stop_node,
    wait_for_nodes,
    write_node_token,
)

_START, _STOP, _DONE = 11, 12, 13


def _log(message: str) -> None:
    print(f"herd launch mpi: {message}", file=sys.stderr, flush=True)


def _poll(comm: Any, source: int, tag: int, timeout_s: float | None = None) -> Any:
    """Receive one message without spinning a core; None after ``timeout_s``."""
    request = comm.irecv(source=source, tag=tag)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        done, message = request.test()
        if done:
            return message
        if deadline is not None and time.monotonic() >= deadline:
            request.Cancel()
            return None
        time.sleep(0.1)


def run(driver: list[str], options: NodeOptions) -> int:
    """Run on every rank; returns this rank's exit code (rank 0: the driver's)."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ClusterError("herd launch mpi needs mpi4py: pip install 'herdrl[mpi]'") from exc
    if not driver:
        raise ClusterError("give the driver command after --, e.g. herd launch mpi -- herd train ppo ...")
    comm = MPI.COMM_WORLD
    exit_on_sigterm()
    if comm.Get_rank() == 0:
        return _rank_zero(comm, driver, options)
    return _other_rank(comm, options)


def _rank_zero(comm: Any, driver: list[str], options: NodeOptions) -> int:
    size = comm.Get_size()
    started = time.monotonic()
    session = secrets.token_hex(3)
    temp_dir = Path(f"/tmp/herd-{session}-r0")
    others = range(1, size)
    driver_proc: subprocess.Popen | None = None
    announced: list[int] = []  # ranks told the head's address: each must be told to stop
    token = node_token_path(temp_dir)
    try:
        try:
            token = write_node_token(temp_dir)
            os.environ.update(auth_env(token))
            address, _ = start_node(options.spec(temp_dir), block=True, timeout_s=options.join_timeout_s)
        except BaseException as exc:  # whatever stops the head, the other ranks must not wait for it
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            for rank in others:
                comm.send({"abort": why}, dest=rank, tag=_START)
            raise
        _log(f"head up at {address} after {time.monotonic() - started:.1f} s; {size - 1} rank(s) joining "
             f"(Ray files: /tmp/herd-{session}-r*)")
        for rank in others:
            comm.send({"address": address, "token": token.read_text(), "session": session}, dest=rank, tag=_START)
            announced.append(rank)
        wait_for_nodes(address, size, options.join_timeout_s)
        _log(f"all {size} Ray nodes joined after {time.monotonic() - started:.1f} s; running {' '.join(driver)}")
        driver_proc = subprocess.Popen(driver, env={**os.environ, "RAY_ADDRESS": address})
        rc = driver_proc.wait()
        _log(f"driver exited with {rc}; stopping Ray on {size} node(s)")
        return rc
    finally:
        if driver_proc is not None and driver_proc.poll() is None:
            driver_proc.terminate()
            try:
                driver_proc.wait(timeout=30)  # its own SIGTERM handling checkpoints; a hung driver is killed
            except subprocess.TimeoutExpired:
                driver_proc.kill()
                driver_proc.wait()
        clean = driver_proc is not None and driver_proc.returncode == 0
        for rank in announced:
            comm.send({"clean": clean}, dest=rank, tag=_STOP)
        _stop(temp_dir, token, clean)  # meanwhile the other ranks stop theirs
        deadline = time.monotonic() + 30.0  # one bound for all ranks' confirmations
        for rank in announced:
            if _poll(comm, rank, _DONE, timeout_s=max(0.0, deadline - time.monotonic())) is None:
                _log(f"rank {rank} did not confirm its Ray node stopped within 30 s")


def _stop(temp_dir: Path, token: Path, clean: bool) -> None:
    """Stop this rank's node; remove its files after a clean run, keep them (Ray's logs) after a failure."""
    stop_node(temp_dir, remove_files=clean)
    token.unlink(missing_ok=True)
    if not clean:
        _log(f"Ray logs of this node kept in {temp_dir} (start-up output: {node_log(temp_dir)})")


def _other_rank(comm: Any, options: NodeOptions) -> int:
    rank = comm.Get_rank()
    # Rank 0 announces the head (or an abort) within its own start-up time (the node's start, then its port, each
    # bounded by join_timeout_s): never wait longer than that.
    bound = 2 * options.join_timeout_s + 60
    message = _poll(comm, 0, _START, timeout_s=bound)
    if message is None:
        _log(f"rank 0 announced no Ray head within {bound:g} s; giving up")
        return 1
    if "abort" in message:
        return 0  # rank 0 reports the error and exits non-zero
    temp_dir = Path(f"/tmp/herd-{message['session']}-r{rank}")
    token = node_token_path(temp_dir)
    clean = False
    try:
        token = write_node_token(temp_dir, message["token"])
        os.environ.update(auth_env(token))
        start_node(options.spec(temp_dir, address=message["address"]), block=True, timeout_s=options.join_timeout_s)
        # The driver may run for days, and the run goes on if this rank's node dies: wait for rank 0's word, which
        # its `finally` always sends (a rank 0 killed outright ends the whole MPI job).
        clean = _poll(comm, 0, _STOP)["clean"]
        return 0
    finally:
        _stop(temp_dir, token, clean)
        comm.send("done", dest=0, tag=_DONE)
