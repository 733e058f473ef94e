"""The Learner: one algorithm's module, optimizers and update, wherever it runs.

Each algorithm file defines a ``Learner`` subclass (``PPOLearner``, ``DQNLearner``, ...) holding its loss and
update, written once. The same object runs in the driver (the default: ``num_learners=0``) or, one per rank,
in N Ray actors (``herdrl.learner.group``) that split every minibatch between them: each computes the loss on
its share of the rows, the gradients are summed with ``torch.distributed`` (weighted by each share, so the
result is the gradient of the whole minibatch's loss), and every rank takes the same optimizer step. The
weights stay identical on every rank without ever being sent between them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.config import AlgorithmConfig
from herdrl.models.encoders import torch_device
from herdrl.rollout.batch import take

#: loss_fn(minibatch) -> (loss, stats): the loss of one algorithm on the rows it is given, and its metrics.
LossFn = Callable[[dict[str, Any]], tuple[torch.Tensor, dict[str, Any]]]


def learner_device(config: AlgorithmConfig) -> torch.device:
    """The device of the learner in the driver: ``num_gpus`` (or ``num_gpus_per_learner`` without learner actors)."""
    return torch_device(config.learner_gpus, "num_gpus" if config.num_gpus else "num_gpus_per_learner")


class Learner:
    """Owns the module, the optimizers and the update of one algorithm.

    Subclasses implement :meth:`setup` (optimizers, target networks) and :meth:`update` (one call per batch the
    algorithm sends: fragments for on-policy algorithms, a replayed batch for off-policy ones), using
    :meth:`gradient_step` for every optimizer step so the same code runs on one learner or N.
    """

    #: Attributes holding this learner's optimizers; saved and restored under these names.
    optimizer_names: tuple[str, ...] = ("optimizer",)
    #: Whether :meth:`update` learns on a share of the fragments (``shard_fragments``): batch-wide statistics
    #: through :meth:`global_sums`, minibatches drawn over every share through :meth:`share_layout`.
    supports_sharded_fragments = False

    def __init__(self, config: AlgorithmConfig, observation_space: gym.Space, action_space: gym.Space,
                 device: torch.device | None = None, rank: int = 0, world_size: int = 1) -> None:
        self.config = config
        self.observation_space, self.action_space = observation_space, action_space
        self.device = device if device is not None else learner_device(config)
        self.rank, self.world_size = rank, world_size
        #: None: every rank is given the same batch and learns on its shard of each minibatch. A number: the batches
        #: given are already this rank's own rows (a streamed offline dataset, each rank reading its own share),
        #: this share of each gradient step's rows (see :meth:`gradient_step`).
        self.batch_share: float | None = None
        #: True while an update's fragments are this rank's own share (``shard_fragments``): each gradient step
        #: learns on all of this rank's rows of its minibatch, weighted by their count over every rank's.
        self.rows_sharded = False
        self._sum_seconds = 0.0  # time spent summing gradients across learners (all-reduce), see sum_seconds
        self._real_steps: tuple[torch.Tensor, np.ndarray] | None = None  # see _share
        self.module: nn.Module = config.build_module(observation_space, action_space).to(self.device)
        self.schedules = config.schedules()
        #: The scheduled hyperparameters' current values (``lr``, ``entropy_coeff``, ...): see :meth:`at_step`.
        self.hp: dict[str, float] = {key: schedule(0) for key, schedule in self.schedules.items()}
        self.setup()

    # ------------------------------------------------------------------ for subclasses
    def setup(self) -> None:
        """Create optimizers (and target networks, ...); called at the end of ``__init__``."""

    #: Where ``update``'s seed is among its arguments after the fragments (PPO's ``update(fragments, seed)``: 0;
    #: IMPALA's ``update(fragments, passes, seed)``: 1): the multi-agent learner draws each policy's own from it.
    seed_arg = 0

    def update(self, *args: Any, **kwargs: Any) -> Any:
        """Learn from one batch; return metrics (a dict of floats)."""
        raise NotImplementedError

    def at_step(self, step: int) -> None:
        """Set the scheduled hyperparameters to their values at env step ``step`` (every optimizer's ``lr``)."""
        self.hp = {key: schedule(step) for key, schedule in self.schedules.items()}
        if "lr" in self.hp:
            for name in self.optimizer_names:
                getattr(self, name).lr = self.hp["lr"]

    def update_at(self, step: int | None, *args: Any, **kwargs: Any) -> Any:
        """:meth:`update` with the hyperparameters of env step ``step`` (None: as they are)."""
        if step is not None:
            self.at_step(step)
        return self.update(*args, **kwargs)

    def extra_state(self) -> dict[str, Any]:
        """Tensors and numbers besides the module and optimizers (target networks, counters)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`extra_state`."""

    # ------------------------------------------------------------------ data parallelism
    def global_sums(self, values: list[float]) -> list[float]:
        """``values`` summed over every rank while each learns on its own share of the fragments; as they are
        otherwise (every rank holds the whole batch)."""
        if not self.rows_sharded or self.world_size == 1:
            return values
        import torch.distributed as dist

        totals = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(totals)
        return totals.cpu().tolist()

    def share_layout(self, size: int, steps: int) -> tuple[int, int, int]:
        """(While this rank's batch is its share of the fragments) where its ``size`` rows begin among every
        share's laid end to end in rank order, and every share's rows and real ``steps`` in all."""
        table = torch.zeros(self.world_size, 2, dtype=torch.float64, device=self.device)
        table[self.rank] = torch.tensor([float(size), float(steps)], dtype=torch.float64)
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(table)
        sizes, total_steps = table[:, 0].cpu().numpy().astype(int), float(table[:, 1].sum())
        return int(sizes[:self.rank].sum()), int(sizes.sum()), int(round(total_steps))

    def shard(self, index: np.ndarray) -> np.ndarray:
        """This learner's rows of a minibatch ``index``: all of them on one learner, else a contiguous
        ``1/world_size`` slice (sizes differ by at most one row, so none is empty while rows >= learners)."""
        if self.world_size == 1:
            return index
        return np.array_split(index, self.world_size)[self.rank]

    def gradient_step(self, optimizer: Any, loss_fn: LossFn, batch: dict[str, Any], index: np.ndarray | None = None,
                      grad_clip: float | None = None) -> dict[str, Any]:
        """One optimizer step on rows ``index`` of ``batch`` (a dict of tensors on this learner's device; ``None``:
        every row, as on one learner the batch itself, uncopied).

        ``loss_fn`` sees this learner's share of the rows; with N learners each share's gradient is weighted by
        its size and the gradients summed across learners, which gives the gradient of ``loss_fn`` on all the
        rows (``loss_fn`` returns a mean over its rows). The gradient norm (all parameters of ``optimizer``,
        after summing) is clipped to ``grad_clip`` and returned in the stats as ``grad_norm`` (not computed
        without ``grad_clip``: pass ``inf`` to get the norm unclipped).
        """
        optimizer.zero_grad()
        stats: dict[str, Any] = {}
        count = None  # (sharded fragments: this rank's real steps in the minibatch, summed with the gradients)
        if self.rows_sharded and self.world_size > 1:  # this rank's share of the minibatch: all of its rows
            rows = np.arange(len(batch["actions"])) if index is None else index
            count = self._real_count(batch, rows)
            if count > 0:
                with self.autocast():
                    loss, stats = loss_fn(take(batch, torch.from_numpy(rows).to(self.device)))
                (loss * count).backward()  # (summed over ranks, then divided by every rank's count)
        elif self.batch_share is not None and index is None:  # this rank's own rows: all of them, weighted
            with self.autocast():
                loss, stats = loss_fn(batch)
            (loss * self.batch_share).backward()
        elif self.world_size == 1 and index is None:
            with self.autocast():
                loss, stats = loss_fn(batch)
            loss.backward()
        else:
            if index is None:
                index = np.arange(len(batch["actions"]))
            rows = self.shard(index)
            share = self._share(batch, rows, index)
            if share > 0:
                with self.autocast():
                    loss, stats = loss_fn(take(batch, torch.from_numpy(rows).to(self.device)))
                (loss if self.world_size == 1 else loss * share).backward()
        if self.world_size > 1:
            start = time.perf_counter()
            total = self._sum_gradients(optimizer.params, count)
            self._sum_seconds += time.perf_counter() - start
            if count is not None:
                for p in optimizer.params:
                    if p.grad is not None:
                        p.grad /= max(total, 1.0)
        if grad_clip is not None:
            stats["grad_norm"] = nn.utils.clip_grad_norm_(optimizer.params, grad_clip)
        optimizer.step()
        return stats

    def _share(self, batch: dict[str, Any], rows: np.ndarray, index: np.ndarray) -> float:
        """This learner's weight in the minibatch: its rows' share of the rows, or for a recurrent batch (rows are
        sequences of ``valid`` steps; replayed windows: of ``train`` steps, their burn-in carries no loss) its share
        of the real steps (0: nothing to learn from)."""
        if not len(rows):
            return 0.0
        if "valid" not in batch:
            return len(rows) / len(index)
        total = self._real_count(batch, index)
        return self._real_count(batch, rows) / total if total else 0.0

    def _real_count(self, batch: dict[str, Any], rows: np.ndarray) -> float:
        """The real steps in ``rows``: the rows, or the valid steps of a recurrent batch's sequences (counted per
        sequence once per batch: one device-to-host read, not one per minibatch)."""
        if "valid" not in batch:
            return float(len(rows))
        counted = batch.get("train", batch["valid"])  # (the steps the loss averages over)
        if self._real_steps is None or self._real_steps[0] is not counted:
            self._real_steps = (counted, counted.sum(dim=1).cpu().numpy())
        return float(self._real_steps[1][rows].sum())

    def _sum_gradients(self, params: list[torch.Tensor], count: float | None = None) -> float:
        """Sum every parameter's gradient over the learners in one all-reduce (a flat buffer, plus one flag per
        parameter: a parameter no learner computed a gradient for keeps none, as on a single learner); ``count``
        (this rank's rows) rides along: returns the sum of every rank's (0 without)."""
        import torch.distributed as dist

        sizes = [p.numel() for p in params]
        total = sum(sizes)  # gradients first, then one flag per parameter, then the count
        flat = torch.zeros(total + len(params) + 1, device=self.device)
        flat[-1] = count or 0.0
        offset = 0
        for i, (p, size) in enumerate(zip(params, sizes, strict=True)):
            if p.grad is not None:
                flat[offset:offset + size] = p.grad.reshape(-1)
                flat[total + i] = 1.0
            offset += size
        dist.all_reduce(flat)
        computed = flat[total:].cpu().tolist()  # one device-to-host read for all the flags and the count
        offset = 0
        for p, size, flag in zip(params, sizes, computed[:-1], strict=True):
            p.grad = flat[offset:offset + size].view_as(p).clone() if flag > 0 else None
            offset += size
        return computed[-1]

    def autocast(self) -> contextlib.AbstractContextManager:
        """``mixed_precision="bf16"``: the block computes in bfloat16 where torch's autocast says it is safe (matrix
        products, convolutions), keeping float32 weights and gradients; otherwise a no-op."""
        if self.config.mixed_precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def sum_seconds(self) -> float:
        """Seconds spent in gradient all-reduces since the last call (waiting for slower peers included)."""
        seconds, self._sum_seconds = self._sum_seconds, 0.0
        return seconds

    @contextlib.contextmanager
    def frozen(self, params: list[torch.Tensor]) -> Iterator[None]:
        """Within the block, gradients flow through ``params`` but are not computed for them (SAC's actor loss
        differentiates through the critics without changing them)."""
        for p in params:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in params:
                p.requires_grad_(True)

    # ------------------------------------------------------------------ weights and checkpoints
    def get_weights(self) -> dict[str, np.ndarray]:
        """The module's weights as numpy arrays (copies, on the CPU)."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.module.state_dict().items()}

    def state(self) -> dict[str, Any]:
        """Everything the learner needs to go on: module, optimizers, :meth:`extra_state`, as CPU tensors (a
        checkpoint written on a GPU loads on a CPU and the other way round)."""
        state = {"module": self.module.state_dict(),
                 **{name: getattr(self, name).state_dict() for name in self.optimizer_names},
                 **self.extra_state()}
        return _to_cpu(state)

    def load_matching_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy ``weights`` (some of the module's, by name: ``init_from``) into the module; targets follow."""
        self.module.load_state_dict(weights, strict=False)
        target = getattr(self, "target", None)
        if target is not None:
            target.load_state_dict(self.module.state_dict())

    def freeze_policy(self, frozen: bool) -> None:
        """While ``frozen``, the policy's weights get no gradient (a fresh value head warms up first)."""
        for p in getattr(self.module, "policy_parameters", list)():
            p.requires_grad_(not frozen)

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state` (tensors moved to this learner's device)."""
        self.module.load_state_dict(state["module"])
        for name in self.optimizer_names:
            getattr(self, name).load_state_dict(state[name])  # copies into its tensors, on their device
        self.load_extra_state(state)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    return value

