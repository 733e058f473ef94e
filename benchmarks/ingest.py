"""`herd bench ingest` on fake nodes: one raylet per loopback address (127.0.0.2 head, .3, .4, ... workers), token
auth, each with a bounded object store — the recipe of ../shared/infra. Same-node and cross-node rows (cross-node
traffic is loopback TCP between raylets: no NIC limits it, only this host's CPUs and memory bandwidth).

    python benchmarks/ingest.py                                  # Pong-shaped fragments, 4 nodes, all four paths
    python benchmarks/ingest.py --shape atari-packed --producers 1,4,16,32
    python benchmarks/ingest.py --shape cartpole --envs 1 --steps 100 --placement same-node
    python benchmarks/ingest.py --shape mujoco --producers 4 --rate 5 --modes reference   # 20 fragments/s in all

Prints each table (also in results/bench-ingest/<shape>-<placement>/ingest.csv and .png).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from herdrl.bench_ingest import MODES, run_ingest
from herdrl.cluster.nodes import NodeSpec, auth_env, start_node, stop_node, write_node_token


@contextlib.contextmanager
def fake_nodes(count: int, cpus: int, object_store_mb: int, head_cpus: int | None = None) -> Iterator[str]:
    """``count`` Ray nodes on 127.0.0.2, .3, ... (the first is the head, with ``head_cpus`` where given); yields
    the head's address."""
    root = Path(tempfile.mkdtemp(prefix="hi", dir="/tmp"))  # short: Ray's socket paths have a length limit
    temps = [root / "h", *(root / f"w{i}" for i in range(count - 1))]
    token = write_node_token(temps[0])
    saved = dict(os.environ)
    os.environ.update(auth_env(token))
    os.environ.pop("RAY_ADDRESS", None)
    started: list[Path] = []
    try:
        store = object_store_mb * 1_000_000
        address, _ = start_node(NodeSpec(temps[0], node_ip_address="127.0.0.2",
                                         num_cpus=cpus if head_cpus is None else head_cpus, object_store_memory=store))
        started.append(temps[0])
        for i, temp in enumerate(temps[1:]):
            start_node(NodeSpec(temp, address=address, node_ip_address=f"127.0.0.{3 + i}", num_cpus=cpus,
                                object_store_memory=store))
            started.append(temp)
        yield address
    finally:
        for temp in reversed(started):
            stop_node(temp)
        shutil.rmtree(root, ignore_errors=True)
        os.environ.clear()
        os.environ.update(saved)


def main() -> None:
    """Start the fake nodes, run the ingest rows for each placement, stop the nodes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--object-store-mb", type=int, default=1000, help="per node (Ray's default: 30%% of RAM)")
    parser.add_argument("--shape", default="atari")
    parser.add_argument("--producers", default="1,4,16")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--placement", action="append", choices=("same-node", "cross-node"))
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--aggregators", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=0.0,
                        help="fragments/s per producer (0: as fast as they can); a fixed rate compares shapes at "
                             "the same fragments/s")
    args = parser.parse_args()
    counts = [int(x) for x in args.producers.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    with fake_nodes(args.nodes, 1, args.object_store_mb) as address:
        for placement in args.placement or ["same-node", "cross-node"]:
            run_ingest(address, "127.0.0.2", modes, counts, args.shape,
                       Path("results/bench-ingest") / f"{args.shape}-{placement}", steps=args.steps,
                       envs=args.envs, batch=args.batch, seconds=args.seconds, rate=args.rate,
                       aggregators=args.aggregators, placement=placement)


if __name__ == "__main__":
    main()
