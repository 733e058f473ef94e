"""Weights out to N runners, as herdrl sends them: one `ray.put` per version, then one call per runner carrying the
reference (each node's object store fetches the weights once; its runners read them from shared memory). Measures,
at 1/8/32/64 receivers on fake nodes (loopback addresses, token auth: benchmarks/ingest.py's), the driver's CPU
and the wall time until every receiver has copied the weights in, for no weights (an empty dict: the baseline cost
of the calls themselves), a CartPole MLP and a Nature-CNN-sized weights dict. Receivers are numpy-only actors (no
env, no torch: ~90 MB each, so 64 fit on this machine).

    python benchmarks/broadcast.py                       # 4 nodes, 1,8,32,64 receivers, 20 versions each
    python benchmarks/broadcast.py --receivers 1,8 --versions 50
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from ingest import fake_nodes  # benchmarks/ingest.py


class _Receiver:
    """Copies the weights it is given into its own arrays (what a runner's set_weights does)."""

    def __init__(self) -> None:
        self.own: dict[str, np.ndarray] = {}

    def load(self, weights: dict[str, np.ndarray], version: int) -> int:
        """Copy ``weights`` in; returns the version loaded."""
        for key, value in weights.items():
            if key not in self.own:
                self.own[key] = np.empty_like(value)
            np.copyto(self.own[key], value)
        return version

    def rss_mb(self) -> float:
        """This process's resident memory."""
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def weights_of(kind: str) -> dict[str, np.ndarray]:
    """A weights dict the size of herdrl's default CartPole MLP or Atari Nature CNN actor-critic; ``empty``: no
    weights at all (the baseline: what one call per receiver costs the driver without them)."""
    if kind == "empty":
        return {}
    rng = np.random.default_rng(0)
    shapes = {"mlp": [(64, 4), (64,), (64, 64), (64,), (2, 64), (2,), (64, 4), (64,), (64, 64), (64,), (1, 64), (1,)],
              "cnn": [(32, 4, 8, 8), (32,), (64, 32, 4, 4), (64,), (64, 64, 3, 3), (64,), (512, 3136), (512,),
                      (6, 512), (6,), (1, 512), (1,)]}[kind]
    return {f"{kind}{i}": rng.standard_normal(shape).astype(np.float32) for i, shape in enumerate(shapes)}


def measure(receivers: list, weights: dict[str, np.ndarray], versions: int) -> tuple[float, float]:
    """Mean driver CPU ms and wall ms per version, from put to every receiver's copy."""
    import ray

    ray.get([r.load.remote(ray.put(weights), -1) for r in receivers])  # warm: arrays allocated, paths open
    cpu, wall = time.process_time(), time.perf_counter()
    for version in range(versions):
        ref = ray.put(weights)  # one copy per version, whatever the receiver count
        assert ray.get([r.load.remote(ref, version) for r in receivers]) == [version] * len(receivers)
    return (1e3 * (time.process_time() - cpu) / versions, 1e3 * (time.perf_counter() - wall) / versions)


def main() -> None:
    """Start fake nodes, measure each receiver count and weights size, print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--receivers", default="1,8,32,64")
    parser.add_argument("--versions", type=int, default=20)
    args = parser.parse_args()
    counts = [int(x) for x in args.receivers.split(",")]
    with fake_nodes(args.nodes, 1, 500) as address:
        import ray

        ray.init(address=address, _node_ip_address="127.0.0.2", logging_level="ERROR")
        try:
            run(ray, counts, args.versions)
        finally:
            ray.shutdown()  # before the nodes stop: a driver that outlives its cluster is ended by Ray's C++


def run(ray, counts: list[int], versions: int) -> None:
    """Receivers spread over the nodes; one table row per weights size and receiver count."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # receivers import numpy only
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    receiver = ray.remote(num_cpus=0)(_Receiver)
    actors = [receiver.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)],
                                                                                  soft=False)).remote()
              for i in range(max(counts))]
    rss = float(np.mean(ray.get([a.rss_mb.remote() for a in actors[:4]])))
    print(f"| weights | MB | receivers | driver CPU ms / version | wall ms / version |  (receiver RSS {rss:.0f} MB)")
    print("| --- | ---: | ---: | ---: | ---: |")
    for kind in ("empty", "mlp", "cnn"):
        weights = weights_of(kind)
        size = sum(a.nbytes for a in weights.values()) / 1e6
        for count in counts:
            cpu, wall = measure(actors[:count], weights, versions)
            print(f"| {kind} | {size:.2f} | {count} | {cpu:.2f} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
