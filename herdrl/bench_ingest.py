"""``herd bench ingest``: how many fragments one learner can absorb, and by which path.

Synthetic producers stand in for env runners: Ray actors with no env and no torch (their class travels by value,
so their processes import numpy only) that return fragments of a given shape, as fast as they can or at a given
rate each, as runners do (an info object and the fragment, ``num_returns=2``). One consumer stands in for the
learner: it fetches each train batch's fragments and concatenates them by key (what a learner does first). The
paths compared:

* ``driver``: the learner in the driver (``num_learners=0``): the driver fetches every fragment.
* ``via-driver``: the learner-actor path before herdrl 0.4: the driver fetched every fragment and put it in the
  object store again for the learner actor (two hops through one process).
* ``reference``: the learner-actor path now: the driver fetches only the infos and hands the fragments'
  references to the learner actor, which fetches them from the producers' nodes itself. Fragments over Ray's
  inline limit are put by their producers, which own them (as herdrl's runners do).
* ``aggregators``: as ``reference``, but K aggregator actors beside the learner fetch the fragments and join them
  side by side (each a share of the batch, packed stacks rebuilt straight into it); the learner fetches K partial
  batches and joins them (one: takes it as it is).

Every actor reserves no CPU (``num_cpus=0``: they measure transport, not scheduling); the learner and aggregators
sit on the driver's node, the producers on that node (``same-node``) or on the other nodes (``cross-node``, over
TCP: loopback between fake nodes on one host). Reported per row: fragments, MB and env steps absorbed per second,
the driver's and the learner's CPU seconds per fragment, and how many producers were offering more than was
absorbed (saturation: the producers out-run the path). Writes ``ingest.csv`` and ``ingest.png``.

    herd bench ingest --address 127.0.0.2:6379 --node-ip-address 127.0.0.2 --shape atari --producers 1,4,16
"""

from __future__ import annotations

import csv
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from herdrl.errors import ConfigError
from herdrl.rollout.transport import RUNNER_PUT_BYTES, shares

MODES = ("driver", "via-driver", "reference", "aggregators")

#: Per env step: observation shape and dtype (plus, for packed frame stacks, what the runner ships instead).
SHAPES: dict[str, dict[str, Any]] = {
    "cartpole": {"obs": ((4,), np.float32), "actions": ((), np.int64)},
    "mujoco": {"obs": ((17,), np.float32), "actions": ((6,), np.float32)},
    "atari": {"obs": ((4, 84, 84), np.uint8), "actions": ((), np.int64)},
    # Frame stacks as runners ship them (herdrl.rollout.transport): one new 84x84 frame per step (and 3 more per env
    # to start from) plus 4 indices; the learner rebuilds the stacks, as herdrl's does.
    "atari-packed": {"frames": ((84, 84), np.uint8), "index": ((4,), np.int32), "actions": ((), np.int64)},
}


class _Producer:
    """Returns the same synthetic fragment on every call (serialising it into the object store each time, as a
    runner's fragment is), no faster than one per ``period_s``."""

    def __init__(self, arrays: dict[str, tuple[tuple[int, ...], str]], steps: int, envs: int) -> None:
        rng = np.random.default_rng(0)
        self.fragment = {key: (rng.integers(0, 255, shape).astype(dtype) if np.dtype(dtype).kind in "iu"
                               else rng.standard_normal(shape).astype(dtype)) for key, (shape, dtype) in arrays.items()}
        if "index" in self.fragment:  # env b's stack at step t: its frames t..t+3 (each frame shared by 4 stacks)
            rows, width, depth = self.fragment["index"].shape
            start = np.arange(width)[None, :, None] * (rows + depth - 1)
            self.fragment["index"] = (start + np.arange(rows)[:, None, None] + np.arange(depth)).astype(np.int32)
        self.env_steps = steps * envs
        self.nbytes = sum(a.nbytes for a in self.fragment.values())
        self.last = 0.0

    def produce(self, period_s: float, put_here: bool = False) -> tuple[dict[str, Any], Any]:
        """One fragment and its info (env steps, bytes). ``put_here``: as herdrl's runners ship a fragment over
        Ray's inline limit (``herdrl.rollout.transport``): put by this producer, which owns it, its reference in
        the info."""
        wait = self.last + period_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self.last = time.monotonic()
        info: dict[str, Any] = {"env_steps": self.env_steps, "nbytes": self.nbytes}
        if put_here and self.nbytes > RUNNER_PUT_BYTES:
            import ray

            info["ref"] = ray.put(self.fragment)
            return info, None
        return info, self.fragment

    def modules(self) -> list[str]:
        """Top-level modules this process imported (is torch among them?)."""
        import sys

        return sorted({name.split(".")[0] for name in sys.modules})


def _concatenate(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Fragments side by side along their env axis (axis 1), key by key: the first thing a learner does, as
    herdrl's does it (packed stacks rebuilt straight into the batch: ``herdrl.rollout.transport``). One part
    without packed frames (an aggregator's share, already joined) is taken as it is, as herdrl's learner reads it."""
    from herdrl.obs import obs_concat
    from herdrl.rollout.transport import PackedFrames, rebuild_side_by_side

    if len(parts) == 1 and "frames" not in parts[0]:
        return parts[0]
    if "frames" in parts[0]:
        obs = rebuild_side_by_side([PackedFrames(part["frames"], part["index"]) for part in parts])
        parts = [{"obs": leaf, **{k: v for k, v in part.items() if k not in ("frames", "index")}}
                 for leaf, part in zip(obs, parts, strict=True)]
    return {key: obs_concat([part[key] for part in parts], axis=1) for key in parts[0]}


class _Aggregator:
    """Fetches a share of a batch's fragments and joins them, as herdrl's aggregators do."""

    def gather(self, refs: list[Any]) -> dict[str, np.ndarray]:
        """The fragments behind ``refs``, side by side (packed stacks rebuilt straight into the joined array)."""
        import ray

        return _concatenate(ray.get(refs))


class _Learner:
    """Fetches each batch (fragments or partial batches, by value or reference) and concatenates it; counts its
    own CPU time."""

    def __init__(self) -> None:
        self.cpu_start = time.process_time()

    def consume(self, batch: Any) -> int:
        """Absorb one batch; returns the rows it concatenated."""
        import ray

        parts = ray.get(batch) if batch and isinstance(batch[0], ray.ObjectRef) else batch
        return len(_concatenate(parts)["actions"])

    def cpu_seconds(self) -> float:
        """CPU seconds of this process since it started (or since the last call)."""
        now = time.process_time()
        spent, self.cpu_start = now - self.cpu_start, now
        return spent


@dataclass
class IngestRow:
    """One measured (mode, producer count)."""

    mode: str
    producers: int
    shape: str
    placement: str
    fragment_mb: float
    fragments_per_s: float
    mb_per_s: float
    env_steps_per_s: float
    driver_cpu_ms_per_fragment: float
    learner_cpu_ms_per_fragment: float
    producers_waiting: float  # mean number of finished fragments waiting for the consumer: > 0 means saturated


def fragment_arrays(shape: str, steps: int, envs: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """The arrays of one synthetic fragment of ``shape`` (time-major, ``(T, B, ...)``), as (shape, dtype) pairs."""
    if shape not in SHAPES:
        raise ConfigError(f"--shape must be one of {', '.join(SHAPES)}, not '{shape}'")
    arrays = {key: ((steps + 1, envs, *leaf), np.dtype(dtype).str) for key, (leaf, dtype) in SHAPES[shape].items()}
    arrays["actions"] = ((steps, envs, *SHAPES[shape]["actions"][0]), arrays["actions"][1])
    if "frames" in arrays:  # all envs' frames in one array: steps + 4 per env
        arrays["frames"] = (((steps + 4) * envs, 84, 84), arrays["frames"][1])
    arrays.update({key: ((steps, envs), dtype) for key, dtype in
                   (("rewards", "<f4"), ("logp", "<f4"), ("terminateds", "|b1"), ("truncateds", "|b1"),
                    ("valid", "|b1"))})
    return arrays


def _placements(placement: str) -> tuple[Any, list[Any]]:
    """Scheduling for the learner side (this driver's node) and the node ids producers go to in turn."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    others = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here]
    if placement == "cross-node" and not others:
        raise ConfigError("--placement cross-node needs a cluster with nodes besides the driver's (give --address)")
    targets = others if placement == "cross-node" else [here]
    return NodeAffinitySchedulingStrategy(here, soft=False), [NodeAffinitySchedulingStrategy(n, soft=False)
                                                              for n in targets]


def measure(mode: str, producers: int, shape: str, *, steps: int, envs: int, batch: int, seconds: float,
            rate: float, aggregators: int, placement: str) -> IngestRow:
    """Run one (mode, producer count) for ``seconds`` after a short warm-up; each producer keeps two calls in
    flight and the learner absorbs ``batch`` fragments per update."""
    import ray

    if mode not in MODES:
        raise ConfigError(f"--modes takes {', '.join(MODES)}, not '{mode}'")
    learner_side, producer_nodes = _placements(placement)
    Producer = ray.remote(num_cpus=0)(_Producer)  # noqa: N806
    arrays = fragment_arrays(shape, steps, envs)
    actors = [Producer.options(scheduling_strategy=producer_nodes[i % len(producer_nodes)]).remote(arrays, steps,
                                                                                                     envs)
              for i in range(producers)]
    learner = ray.remote(num_cpus=0)(_Learner).options(scheduling_strategy=learner_side).remote()
    gatherers = [ray.remote(num_cpus=0)(_Aggregator).options(scheduling_strategy=learner_side).remote()
                 for _ in range(aggregators if mode == "aggregators" else 0)]
    period = 1.0 / rate if rate > 0 else 0.0
    calls: dict[Any, tuple[Any, Any]] = {}  # info ref -> (producer, fragment ref)

    def submit(actor: Any) -> None:
        info, data = actor.produce.options(num_returns=2).remote(period, mode in ("reference", "aggregators"))
        calls[info] = (actor, data)

    def absorb(refs: list[Any]) -> None:
        if mode == "driver":  # the learner is this process
            len(_concatenate(ray.get(refs))["actions"])
        elif mode == "via-driver":
            ray.get(learner.consume.remote(ray.put(ray.get(refs))))
        elif mode == "reference":
            ray.get(learner.consume.remote(refs))
        else:  # consecutive shares, as herdrl's aggregators take them
            ray.get(learner.consume.remote([g.gather.remote(share) for g, share in zip(
                gatherers, shares(refs, len(gatherers)), strict=False)]))

    try:
        ray.get([a.modules.remote() for a in actors] + [learner.cpu_seconds.remote()])  # all up before timing
        for actor in actors:
            for _ in range(2):
                submit(actor)
        queue: list[Any] = []
        fragments = nbytes = env_steps = 0
        waiting: list[int] = []
        start = time.monotonic()
        warm_until, measured_from, cpu0 = start + min(3.0, seconds / 3), None, 0.0
        while True:
            now = time.monotonic()
            if measured_from is None and now >= warm_until:
                measured_from, cpu0 = now, time.process_time()
                ray.get(learner.cpu_seconds.remote())
                fragments = nbytes = env_steps = 0
                waiting.clear()
            if measured_from is not None and now - measured_from >= seconds:
                break
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=1.0)
            ready += ray.wait([r for r in calls if r not in ready], num_returns=len(calls) - len(ready),
                              timeout=0)[0]
            for ref in ready:
                actor, data = calls.pop(ref)
                info = ray.get(ref)
                queue.append(info.pop("ref", data))
                nbytes += info["nbytes"]
                env_steps += info["env_steps"]
                submit(actor)
            while len(queue) >= batch:
                refs, queue = queue[:batch], queue[batch:]
                absorb(refs)
                fragments += batch
                waiting.append(len(queue) + sum(1 for r in ray.wait(list(calls), num_returns=len(calls),
                                                                    timeout=0)[0]))
        elapsed = time.monotonic() - measured_from
        driver_cpu = time.process_time() - cpu0
        learner_cpu = ray.get(learner.cpu_seconds.remote())
    finally:
        for actor in [*actors, learner, *gatherers]:
            ray.kill(actor)
    size = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in arrays.values()) / 1e6
    absorbed = max(fragments, 1)
    return IngestRow(mode=mode, producers=producers, shape=shape, placement=placement, fragment_mb=size,
                     fragments_per_s=fragments / elapsed, mb_per_s=fragments * size / elapsed,
                     env_steps_per_s=fragments * steps * envs / elapsed,
                     driver_cpu_ms_per_fragment=1e3 * driver_cpu / absorbed,
                     learner_cpu_ms_per_fragment=1e3 * learner_cpu / absorbed,
                     producers_waiting=float(np.mean(waiting)) if waiting else 0.0)


def run_ingest(address: str | None, node_ip_address: str | None, modes: list[str], producer_counts: list[int],
               shape: str, out_dir: Path, echo: Any = print, **options: Any) -> list[IngestRow]:
    """Every (mode, producer count), printed as a table and written to ``ingest.csv`` and ``ingest.png``."""
    import ray

    from herdrl.cluster import connect, disconnect
    from herdrl.config import AlgorithmConfig

    for mode in modes:
        if mode not in MODES:
            raise ConfigError(f"--modes takes {', '.join(MODES)}, not '{mode}'")
    if not producer_counts or min(producer_counts) < 1:
        raise ConfigError("--producers needs counts >= 1")
    config = AlgorithmConfig()
    config.address, config.node_ip_address, config.include_dashboard = address, node_ip_address, False
    owns_ray = connect(config, num_cpus=1)
    # The actors' classes travel by value, so the producers' processes import numpy only (importing this module
    # would import herdrl, and with it torch); the learner and aggregators import herdrl's rebuild of packed frames
    # (herdrl.rollout.transport, herdrl.obs) when they first meet one, as a learner does.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rows: list[IngestRow] = []
    try:
        for mode in modes:
            for count in producer_counts:
                rows.append(measure(mode, count, shape, **options))
                r = rows[-1]
                echo(f"measured {mode} with {count} producer(s): {r.fragments_per_s:,.1f} fragments/s, "
                     f"{r.mb_per_s:,.0f} MB/s")
        probe = ray.remote(num_cpus=0)(_Producer).remote(fragment_arrays(shape, 1, 1), 1, 1)
        light = "torch" not in ray.get(probe.modules.remote())
        ray.kill(probe)
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        if owns_ray:
            disconnect()
    echo(format_table(rows))
    echo(f"producers import torch: {'no' if light else 'yes'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "ingest.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    plot(rows, out_dir / "ingest.png")
    echo(f"wrote {out_dir / 'ingest.csv'} and {out_dir / 'ingest.png'}")
    return rows


def format_table(rows: list[IngestRow]) -> str:
    """A Markdown table of the rows."""
    lines = ["| path | producers | shape | placement | fragment MB | fragments/s | MB/s | env steps/s | "
             "driver CPU ms/fragment | learner CPU ms/fragment | waiting fragments |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.mode} | {r.producers} | {r.shape} | {r.placement} | {r.fragment_mb:.3f} | "
                     f"{r.fragments_per_s:,.1f} | {r.mb_per_s:,.0f} | {r.env_steps_per_s:,.0f} | "
                     f"{r.driver_cpu_ms_per_fragment:.2f} | {r.learner_cpu_ms_per_fragment:.2f} | "
                     f"{r.producers_waiting:.1f} |")
    return "\n".join(lines)


def plot(rows: list[IngestRow], path: Path) -> None:
    """Fragments absorbed per second against producers, one line per path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for mode in dict.fromkeys(r.mode for r in rows):
        mine = [r for r in rows if r.mode == mode]
        ax.plot([r.producers for r in mine], [r.fragments_per_s for r in mine], "o-", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("producers")
    ax.set_ylabel("fragments absorbed per second")
    ax.set_title(f"herd bench ingest: {rows[0].shape}, {rows[0].placement}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
