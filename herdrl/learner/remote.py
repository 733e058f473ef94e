"""The Ray actor that holds one data-parallel Learner (one rank). Imported only when learners run on Ray."""

from __future__ import annotations

import datetime
import importlib
import socket
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import torch

from herdrl.config import AlgorithmConfig
from herdrl.models.encoders import torch_device
from herdrl.rollout.transport import FragmentsLost, LearnerInput, fetch, join_side_by_side


# A thread of its own for `alive`: it answers while an update runs or hangs (a rank waiting in an all-reduce for a peer
# whose own update failed), so the group can tell a stuck learner from a dead one. Every other call stays one at a time.
@ray.remote(concurrency_groups={"health": 1})
class LearnerActor:
    """Rank ``rank`` of ``world_size`` learners: builds the algorithm's Learner once the process group is up."""

    @ray.method(concurrency_group="health")
    def alive(self) -> bool:
        """True, even while another call runs: this process is up."""
        return True

    def __init__(self, config: AlgorithmConfig, rank: int, world_size: int, env_modules: tuple[str, ...] = (),
                 env_creators: dict[str, Callable] | None = None, encoders: dict[str, Callable] | None = None) -> None:
        torch.set_num_threads(max(1, int(config.num_cpus_per_learner)))
        # Custom encoders come from the driver's modules and registrations, as for runners.
        importlib.import_module("herdrl.env.imports").adopt_driver_envs(env_modules, env_creators or {})
        importlib.import_module("herdrl.registry").ENCODERS.update(encoders or {})
        self.config, self.rank, self.world_size = config, rank, world_size
        self.device = torch_device(config.num_gpus_per_learner, "num_gpus_per_learner")
        self.learner: Any = None
        self.stream: Any = None  # this rank's reader of its share of a streamed dataset (open_stream)

    def rendezvous(self) -> str:
        """(Rank 0) an address for the process group: this node's IP and a free port, as ``tcp://ip:port``."""
        ip = ray.util.get_node_ip_address()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"tcp://{ip}:{port}"

    def start(self, init_method: str, learner_class: type, observation_space: gym.Space, action_space: gym.Space,
              init_seed: int, timeout_s: float) -> None:
        """Join the process group (gloo on CPU, NCCL on GPU) and build the Learner; every rank seeds torch with
        ``init_seed`` first, so all start from the same weights."""
        # Looked up at run time: Ray ships this class by value, and cloudpickle would follow `torch.distributed`
        # into torch's config modules, which do not pickle.
        distributed = importlib.import_module("torch.distributed")
        # NCCL needs a GPU per rank; learners sharing a GPU (num_gpus_per_learner < 1) all-reduce through gloo.
        backend = "nccl" if self.device.type == "cuda" and self.config.num_gpus_per_learner >= 1 else "gloo"
        # The timeout bounds every collective: a rank whose peer died fails instead of waiting forever.
        distributed.init_process_group(backend, init_method=init_method, rank=self.rank,
                                       world_size=self.world_size, timeout=datetime.timedelta(seconds=timeout_s))
        torch.manual_seed(init_seed)  # the same initial weights on every rank
        self.learner = learner_class(self.config, observation_space, action_space, device=self.device,
                                     rank=self.rank, world_size=self.world_size)
        # Then each rank its own stream: noise inside a loss (SAC's action samples) must differ between shards.
        torch.manual_seed(int(np.random.SeedSequence([init_seed, self.rank]).generate_state(1)[0]))

    def open_stream(self, spec: Any) -> int:
        """Open this rank's own stream of a dataset (a :class:`~herdrl.offline.reader.StreamSpec`), which
        :class:`~herdrl.offline.reader.StreamRows` inputs then read from; returns the transitions its share
        holds."""
        if self.stream is not None:
            self.stream.stop()
        self.stream, transitions = spec.open(self.rank, self.world_size)
        return transitions

    def stream_epochs(self) -> int:
        """Passes this rank's stream has begun over its share of the dataset."""
        return self.stream.epochs

    def call(self, method: str, *args: Any) -> Any:
        """``learner.method(*args)`` (object refs in ``args`` arrive resolved): ``update``, ``get_weights``,
        ``state``, ``load_state``. A :class:`~herdrl.rollout.transport.LearnerInput` argument is read here (the
        runners' fragments fetched from their nodes, or this rank's rows of its own dataset stream); if any of its
        items was lost (on any rank: the ranks agree), no rank updates and the result is :class:`FragmentsLost`."""
        args = list(args)
        try:
            for i, arg in enumerate(args):
                if isinstance(arg, LearnerInput):
                    args[i], lost, count = arg.read(self)
                    lost = self._agree(lost, count) if count else []
                    if lost:
                        return FragmentsLost(lost)
            return getattr(self.learner, method)(*args)
        finally:
            if self.learner is not None:
                self.learner.batch_share, self.learner.rows_sharded = None, False

    def _agree(self, lost: list[int], count: int) -> list[int]:
        """The fragments lost on any rank (every rank must skip the same update, or its peers would wait for it in
        their next all-reduce)."""
        if self.world_size == 1:
            return lost
        distributed = importlib.import_module("torch.distributed")
        flags = torch.zeros(count, device=self.device)
        flags[lost] = 1.0
        distributed.all_reduce(flags, op=distributed.ReduceOp.MAX)
        return [int(i) for i in torch.nonzero(flags).flatten().tolist()]

    def pid(self) -> int:
        """This actor's process id (tests kill it)."""
        import os

        return os.getpid()

    def node_ip(self) -> str:
        """The address of the node this learner runs on."""
        return ray.util.get_node_ip_address()

    def node_id(self) -> str:
        """The Ray id of the node this learner runs on (its aggregators are placed there)."""
        return ray.get_runtime_context().get_node_id()


@ray.remote(concurrency_groups={"health": 1})
class FragmentAggregator:
    """Beside a learner, on its node: fetches a share of the learner's fragments from the runners' nodes, rebuilds
    their frames and joins them into one wide fragment, so the learner reads one object per aggregator from its
    own node's store, ready to learn on, and spends no time on fetches or rebuilding
    (``num_aggregator_actors_per_learner``)."""

    def __init__(self) -> None:
        self.gathered = 0  # fragments fetched so far

    @ray.method(concurrency_group="health")
    def alive(self) -> bool:
        """True, even while a gather runs: this process is up."""
        return True

    def gather(self, refs: list[Any]) -> tuple[list[Any], list[int]]:
        """The fragments behind ``refs`` joined side by side into one (frames rebuilt straight into it:
        :func:`~herdrl.rollout.transport.join_side_by_side`), and the indices of those lost with their node."""
        fragments, lost = fetch(list(refs))
        self.gathered += len(fragments)
        if lost:  # the learners skip this update (every rank): nothing to build
            return [], lost
        return join_side_by_side(fragments), lost
