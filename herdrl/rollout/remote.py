"""The Ray actor that wraps an EnvRunner. Imported only when runners run on Ray; imports no torch (a runner whose
policy runs in numpy never loads it: ``herdrl.rollout.light``)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from herdrl.rollout.light import RunnerConfig
from herdrl.rollout.runner import EnvRunner
from herdrl.rollout.transport import RUNNER_PUT_BYTES, FragmentInfo, info_of, nbytes, pack


class _Remote:
    """What a runner needs to live in a Ray actor (mixed into EnvRunner and MultiAgentEnvRunner)."""

    def __init__(self, config: Any, worker_index: int,
                 env_creators: dict[str, Callable[[dict], Any]], incarnation: int = 0, epoch: int = 0,
                 env_modules: tuple[str, ...] = (), **runner_options: Any) -> None:
        """``config``: a :class:`~herdrl.rollout.light.RunnerConfig` (single-agent runners) or the algorithm's
        config; the driver's env modules and ``register_env`` creators are adopted first. ``runner_options``: the
        runner's own (an EnvRunner's ``recorder``)."""
        if not isinstance(config, RunnerConfig):  # (a torch runner from the start)
            _one_torch_thread()
        # The driver's env modules and register_env calls, shipped with the actor. Look the functions up at run
        # time: Ray may ship this class by value, with a copy of this module's globals.
        importlib.import_module("herdrl.env.imports").adopt_driver_envs(env_modules, env_creators)
        importlib.import_module("herdrl.env.atari").quiet_in_runners()  # the driver says what needs saying once
        super().__init__(config, worker_index, incarnation, epoch, **runner_options)
        self._loaded_broadcast: int | None = None

    def reseed(self, epoch: int) -> None:
        """The runner's streams (see EnvRunner.reseed), torch's too where torch is loaded."""
        super().reseed(epoch)
        self._seed_torch()

    def _build_module(self, model_space: Any) -> Any:
        _one_torch_thread()
        module = super()._build_module(model_space)
        self._seed_torch()  # (a runner told to use torch after its streams were made)
        return module

    def _seed_torch(self) -> None:
        """Seed torch from this runner's stream: this process is the runner's own."""
        if getattr(self, "torch_stream", None) is not None and "torch" in sys.modules:
            import torch

            torch.manual_seed(int(self.torch_stream.generate_state(1, np.uint64)[0] >> np.uint64(1)))

    def spaces(self) -> tuple[Any, Any]:
        """The single-env observation and action spaces."""
        return self.observation_space, self.action_space

    def sample_with(self, weights: dict[str, Any], exploration: dict[str, Any] | None = None,
                    version: int | None = None, broadcast: int | None = None,
                    steps: int | None = None) -> tuple[FragmentInfo, Any]:
        """Load ``weights`` (and exploration settings), then sample one fragment (one call: a dead actor
        fails once); ``version`` is stamped on it. The weights are copied into the policy only when ``broadcast``
        (a count that never repeats) changed; ``steps`` per env where the run's runner count changed since this
        runner started (None: its own fragment length). Returns its info and the fragment, frames packed
        (``herdrl.rollout.transport``): called with ``num_returns=2``, two objects the driver can fetch apart."""
        if broadcast is None or broadcast != self._loaded_broadcast:
            self.set_weights(weights, version)
            self._loaded_broadcast = broadcast
        self.set_exploration(exploration)
        fragment = pack(self.sample(steps))
        info = info_of(fragment, nbytes(fragment))
        if info.nbytes > RUNNER_PUT_BYTES:  # owned here, not by the driver (herdrl.rollout.transport)
            info.fragment_ref = ray.put(fragment)
            return info, None
        return info, fragment

    def apply(self, func: Callable[[Any], Any]) -> tuple[bool, Any]:
        """``func(self)`` for ``foreach_env_runner``: (True, its value), or (False, the error in a line): the
        caller's code failing is not this runner failing (which would restart or drop it)."""
        try:
            return True, func(self)
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"

    def has_module(self, name: str) -> bool:
        """Whether module ``name`` is loaded in this runner's process (light runners hold no ``torch``)."""
        return name in sys.modules

    def pid(self) -> int:
        """This actor's process id (tests kill it to check fault tolerance)."""
        return os.getpid()

    def node(self) -> tuple[str, str]:
        """(node id, node address) of the node this actor runs on."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


def _one_torch_thread() -> None:
    import torch

    torch.set_num_threads(1)  # many runners share a node's cores; each steps small batches


@ray.remote
class RemoteEnvRunner(_Remote, EnvRunner):
    """An EnvRunner in its own process, possibly on another node."""
