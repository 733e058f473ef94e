"""IMPALA (Espeholt et al. 2018): asynchronous actor-learner training with V-trace off-policy correction.

Runners sample all the time with the weights they have; the learner takes fragments as they arrive, learns on
every ``train_batch_size`` env steps, and broadcasts its weights every ``broadcast_interval`` updates. Fragments
carry the version of the weights that sampled them and the behaviour policy's log-probabilities, and V-trace
(``herdrl.rollout.vtrace``) turns the lagging experience into value targets and advantages for the current
policy. Where the two meet: :class:`AsyncSampler` (requests in flight, backpressure) and :meth:`IMPALA.training_step`.

The learner is the driver's (or N learner actors): while it updates, Ray runners keep sampling in their own
processes on the requests they hold, so learning and sampling overlap without a learner thread. In-process
(``num_env_runners=0``) the same algorithm samples and learns in turn, with no lag.
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial
from typing import Any

import numpy as np
import torch

from herdrl.algorithms.base import Algorithm
from herdrl.config import AlgorithmConfig, Field, shared_field
from herdrl.errors import ConfigError
from herdrl.learner import Learner
from herdrl.models.encoders import to_torch
from herdrl.multi_agent import trained_policies
from herdrl.obs import obs_map
from herdrl.optim import Adam
from herdrl.rollout import Fragment
from herdrl.rollout.async_sampling import AsyncSampler, LocalSampler
from herdrl.rollout.batch import (
    forward_flat,
    from_sequences,
    minibatches,
    sequence_batch,
    sequence_logp,
    side_by_side,
    to_sequences,
)
from herdrl.rollout.group import RayRunnerGroup
from herdrl.rollout.transport import FragmentInput, FragmentsLost, Sampled, side_by_side_field
from herdrl.rollout.vtrace import vtrace


class IMPALAConfig(AlgorithmConfig):
    """IMPALA settings (RLlib's names); defaults solve CartPole-v1 on a CPU."""

    algo_name = "IMPALA"
    supports_lstm = True
    supports_multi_agent = True  # V-trace on each policy's rows, in its agents' own time
    behaviour_logp = True  # runners record the sampling policy's log-probabilities
    samples_while_learning = True
    FIELDS = {
        "num_envs_per_env_runner": shared_field("num_envs_per_env_runner", 8),
        "rollout_fragment_length": shared_field("rollout_fragment_length", 50),
        "train_batch_size": shared_field("train_batch_size", 800),
        "lr": shared_field("lr", 1e-3),
        "gamma": shared_field("gamma", 0.99),
        "grad_clip": shared_field("grad_clip", 40.0),
        "vtrace": Field(True, (bool,), "training", doc="off-policy correction (False: treat samples as on-policy)"),
        "vtrace_clip_rho_threshold": Field(1.0, (float,), "training", low=0, low_open=True,
                                           doc="rho-bar: clip of the importance weights in the value targets"),
        "vtrace_clip_pg_rho_threshold": Field(1.0, (float,), "training", low=0, low_open=True,
                                              doc="clip of the importance weights in the policy gradient"),
        "vf_loss_coeff": Field(0.5, (float,), "training", low=0, doc="weight of the value loss, 0.5 * MSE"),
        "entropy_coeff": Field(0.01, (float,), "training", low=0, schedule=True),
        "broadcast_interval": Field(1, (int,), "training", low=1, doc="learner updates between weight broadcasts"),
        "max_requests_in_flight_per_env_runner": Field(2, (int,), "training", low=1,
                                                       doc="sample calls each Ray runner holds at once"),
        "circular_buffer_num_batches": Field(4, (int,), "training", low=1,
                                             doc="train batches of fragments waiting or in flight, at most "
                                                 "(beyond it runners wait: backpressure)"),
        "circular_buffer_iterations_per_batch": Field(1, (int,), "training", low=1,
                                                      doc="updates (passes) on each train batch"),
        "minibatch_size": Field(None, (int,), "training", low=1, allow_none=True,
                                doc="env steps per gradient step within a pass (None: the whole batch, one step)"),
        "num_updates_per_iteration": Field(4, (int,), "training", low=1,
                                           doc="an iteration (one result row) ends after this many updates"),
        "min_time_s_per_iteration": Field(None, (float,), "training", low=0, allow_none=True,
                                          doc="... or after this many seconds, whichever comes first"),
    }

    def validate_algorithm(self) -> None:
        """A train batch holds at least one fragment, and at least one minibatch."""
        self.check_minibatch_fits()
        fragment = self.num_envs_per_env_runner * self.fragment_length()
        if self.train_batch_size < fragment:
            raise ConfigError(f"config key 'train_batch_size' got {self.train_batch_size}; expected >= one "
                              f"fragment ({self.num_envs_per_env_runner} envs x {self.fragment_length()} steps)")

    def fragment_length(self) -> int:
        """Steps per env per fragment (``auto``: 50)."""
        return 50 if self.rollout_fragment_length == "auto" else int(self.rollout_fragment_length)

    def fragments_per_update(self) -> int:
        """The fragments each update learns on (whichever runners they come from): ``train_batch_size`` over the
        env steps of one fragment, rounded up."""
        return -(-self.train_batch_size // (self.num_envs_per_env_runner * self.fragment_length()))

    def unshardable_updates(self) -> str | None:
        """(``shard_fragments``) Each update must hold a fragment for every learner, from Ray runners."""
        if self.num_env_runners < 1:
            return "shards the fragments of Ray runners: set num_env_runners >= 1"
        count = self.fragments_per_update()
        if count < self.num_learners:
            return (f"learns on {count} fragment(s) per update (train_batch_size {self.train_batch_size} over "
                    f"{self.num_envs_per_env_runner * self.fragment_length()} env steps per fragment), fewer than "
                    f"num_learners={self.num_learners}: raise train_batch_size or shorten rollout_fragment_length")
        return None

    @classmethod
    def algo_class(cls) -> type:
        """:class:`IMPALA`."""
        return IMPALA


@torch.no_grad()
def vtrace_batch(module: Any, fragments: list[Fragment], config: IMPALAConfig, device: torch.device,
                 target_module: Any = None) -> dict[str, Any]:
    """Flat rows of the fragments' real steps with V-trace value targets (``vs``) and advantages.

    The fragments are laid side by side (T, sum of B). V-trace's "target" policy is ``target_module`` when given
    (APPO's old policy), else ``module``; its distribution inputs come back as ``old_dist_inputs`` and the
    log-probabilities of the actions under it as ``old_logp``.
    """
    if getattr(module, "recurrent", False):
        return recurrent_vtrace_batch(module, fragments, config, device, target_module)
    cat = partial(side_by_side_field, fragments)
    obs = side_by_side(fragments)
    actions = cat("actions")
    steps, envs = actions.shape[:2]
    n = steps * envs
    flat_obs = to_torch(obs_map(lambda a: a.reshape(-1, *a.shape[2:]), obs), device)
    dist_inputs, values = module(flat_obs)
    if target_module is not None:
        dist_inputs = target_module.dist_inputs(flat_obs)
    flat_actions = torch.from_numpy(actions.reshape(n, *actions.shape[2:])).to(device)
    old_logp, _ = module.log_prob_entropy(dist_inputs[:n], flat_actions)
    behaviour = torch.from_numpy(cat("logp")).to(device) if config.vtrace else old_logp.reshape(steps, envs)
    grid = lambda name: torch.from_numpy(cat(name)).to(device)  # noqa: E731
    vs, advantages = vtrace(behaviour, old_logp.reshape(steps, envs), grid("rewards"),
                            values.reshape(steps + 1, envs), grid("terminateds"), grid("truncateds"), config.gamma,
                            config.vtrace_clip_rho_threshold, config.vtrace_clip_pg_rho_threshold)
    valid = grid("valid").reshape(-1)
    return {"obs": obs_map(lambda o: o[:n][valid], flat_obs), "actions": flat_actions[valid],
            "behaviour_logp": behaviour.reshape(-1)[valid], "old_logp": old_logp[valid],
            "old_dist_inputs": dist_inputs[:n][valid], "vs": vs.reshape(-1)[valid],
            "advantages": advantages.reshape(-1)[valid]}


def recurrent_vtrace_batch(module: Any, fragments: list[Fragment], config: IMPALAConfig, device: torch.device,
                           target_module: Any = None) -> dict[str, Any]:
    """:func:`vtrace_batch` for a recurrent module: sequences of ``max_seq_len`` steps (:func:`sequence_batch`),
    the module (and ``target_module``) unrolled from the states the runner held, V-trace on the fragments' grid,
    its targets and advantages laid out per sequence step."""
    batch, dist_inputs, values = sequence_batch(module, fragments, int(config.model["max_seq_len"]), device)
    if target_module is not None:
        dist_inputs, _ = target_module.forward_train(batch["obs"], batch["state"], batch["starts"])
    old_logp = sequence_logp(module, dist_inputs, batch["actions"])
    cat = partial(side_by_side_field, fragments)
    steps, envs = cat("valid").shape
    target = torch.from_numpy(from_sequences(batch, old_logp.cpu().numpy(), steps, envs)).to(device)
    behaviour = torch.from_numpy(cat("logp")).to(device) if config.vtrace else target
    grid = lambda name: torch.from_numpy(cat(name)).to(device)  # noqa: E731
    vs, advantages = vtrace(behaviour, target, grid("rewards"), torch.from_numpy(values).to(device),
                            grid("terminateds"), grid("truncateds"), config.gamma, config.vtrace_clip_rho_threshold,
                            config.vtrace_clip_pg_rho_threshold)
    index = batch["seq_index"].cpu().numpy()
    batch.update({"behaviour_logp": to_sequences(index, behaviour.cpu().numpy(), device), "old_logp": old_logp,
                  "old_dist_inputs": dist_inputs, "vs": to_sequences(index, vs.cpu().numpy(), device),
                  "advantages": to_sequences(index, advantages.cpu().numpy(), device)})
    return batch


class IMPALALearner(Learner):
    """IMPALA's update: one gradient step of policy gradient on V-trace advantages + value regression on V-trace
    targets - entropy bonus, per train batch."""

    config: IMPALAConfig
    seed_arg = 1  # update(fragments, passes, seed)
    #: V-trace runs along each env's own steps, so a share of the fragments gets the targets the whole batch gives
    #: its rows; minibatches are drawn over every share (``share_layout``), as PPO's.
    supports_sharded_fragments = True

    def setup(self) -> None:
        """Adam over the actor-critic (RLlib's IMPALA default optimizer)."""
        self.optimizer = Adam(self.module.parameters(), lr=self.hp["lr"])

    def update(self, fragments: list[Fragment], passes: int = 1, seed: int = 0) -> dict[str, float]:
        """``passes`` passes over the train batch these fragments make (V-trace prepared per pass, or once:
        :attr:`prepare_each_pass`), each one gradient step, or one per ``minibatch_size`` steps in an order drawn
        from ``seed`` (the same on every learner); metrics averaged over the gradient steps."""
        cfg = self.config
        rng = np.random.default_rng(seed)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}  # (a share may have no rows in a minibatch: that step reports nothing here)
        batch = None
        steps = 0
        layout = self.share_layout if self.rows_sharded else None  # (with shard_fragments: over every share)
        for _ in range(passes):
            if batch is None or self.prepare_each_pass:
                batch = self.prepare(fragments)
            for i, index in enumerate(minibatches(batch, cfg.minibatch_size, rng, layout)):
                if i and self.prepare_each_pass:
                    batch = self.prepare(fragments)  # the same rows, V-trace under the policy as it is now
                stats = self.gradient_step(self.optimizer, self.loss, batch, index, cfg.grad_clip or float("inf"))
                for key, value in stats.items():
                    sums[key] = sums.get(key, 0.0) + float(value)
                    counts[key] = counts.get(key, 0) + 1
                steps += 1
        self.after_batch(fragments, passes)
        return {**{key: value / counts[key] for key, value in sums.items()}, "num_gradient_steps": steps}

    #: IMPALA's policy gradient has no clipping: V-trace's importance weights must follow the policy as it moves,
    #: so each gradient step (each pass, or each minibatch) recomputes them (RLlib does so in every loss too).
    prepare_each_pass = True

    def after_batch(self, fragments: list[Fragment], passes: int) -> None:
        """Called after the passes over a batch (APPO refreshes its old policy here)."""

    def prepare(self, fragments: list[Fragment]) -> dict[str, Any]:
        """The batch with V-trace targets (see :func:`vtrace_batch`)."""
        return vtrace_batch(self.module, fragments, self.config, self.device)

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``-mean(log pi * advantage) + vf_loss_coeff * 0.5 * mean((V - vs)^2) - entropy_coeff * entropy``."""
        cfg = self.config
        dist_inputs, values, batch = forward_flat(self.module, batch)
        logp, entropy = self.module.log_prob_entropy(dist_inputs, batch["actions"])
        policy_loss = -(logp * batch["advantages"]).mean()
        vf_loss = 0.5 * (values - batch["vs"]).pow(2).mean()
        entropy_mean = entropy.mean()
        loss = policy_loss + cfg.vf_loss_coeff * vf_loss - self.hp["entropy_coeff"] * entropy_mean
        return loss, {"policy_loss": policy_loss.detach(), "vf_loss": vf_loss.detach(),
                      "entropy": entropy_mean.detach()}


class IMPALA(Algorithm):
    """IMPALA: asynchronous sampling on Ray runners (in turn in-process), :class:`IMPALALearner` learning."""

    config: IMPALAConfig
    learner_class = IMPALALearner

    def setup(self) -> None:
        """The sampler, the fragment queue and the learner's version (updates so far)."""
        cfg = self.config
        self.sampler: AsyncSampler | LocalSampler = (
            AsyncSampler(self.runners, cfg.max_requests_in_flight_per_env_runner)
            if isinstance(self.runners, RayRunnerGroup) else LocalSampler(self.runners))
        self.queue: deque[Sampled] = deque()  # fragments' infos, and the fragments or references to them
        self.num_updates = 0  # the learner's version: fragments carry the version that sampled them
        # Multi-agent runs: each trained policy's own version (its updates so far; a policy with no rows in a batch
        # is not updated on it), stamped on fragments as a dict, so each policy's lag is its own.
        self.policy_updates: dict[str, int] = (dict.fromkeys(trained_policies(self.config), 0) if self.multi_agent
                                               else {})
        self.num_env_steps_trained_lifetime = 0
        self.num_broadcasts = 0
        self._broadcast()

    def _version(self) -> int | dict[str, int]:
        """What runners stamp on their fragments: the update count, or each trained policy's."""
        return dict(self.policy_updates) if self.multi_agent else self.num_updates

    def _broadcast(self) -> None:
        self.sampler.set_weights(self.runner_weights(), self._version())
        self.num_broadcasts += 1

    def _lags(self, batch: list[Sampled], lags: dict[str, list[int]]) -> None:
        """Add each fragment's policy lag (updates since its weights) to ``lags``: under ``""``, and in multi-agent
        runs per trained policy with rows in it (a policy's own updates since its weights)."""
        for item in batch:
            version = item.info.weights_version
            if not isinstance(version, dict):
                lags.setdefault("", []).append(self.num_updates - version)
                continue
            for pid, rows in item.info.policy_steps.items():
                if rows and pid in version:
                    lag = self.policy_updates[pid] - version[pid]
                    lags.setdefault(pid, []).append(lag)
                    lags.setdefault("", []).append(lag)

    def training_step(self) -> dict[str, float]:
        """Fetch fragments as they arrive and learn on every full train batch, until ``num_updates_per_iteration``
        updates (or ``min_time_s_per_iteration`` seconds) are done."""
        cfg = self.config
        start, learn_time = time.perf_counter(), 0.0
        per_batch = cfg.fragments_per_update()
        capacity = cfg.circular_buffer_num_batches * per_batch
        updates, gradient_steps, trained = 0, 0, 0
        broadcasts, dropped = self.num_broadcasts, self.sampler.num_dropped
        lags: dict[str, list[int]] = {}  # "" -> every fragment's; policy id -> its own (multi-agent)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}  # updates that reported each metric (a policy with no rows reports none)
        max_queue = 0
        deadline = None if cfg.min_time_s_per_iteration is None else start + cfg.min_time_s_per_iteration
        while updates < cfg.num_updates_per_iteration and (deadline is None or time.perf_counter() < deadline):
            fetched = time.perf_counter()
            fragments = self.sampler.fetch(capacity - len(self.queue) - self.sampler.num_in_flight)
            self._iter_sample_time += time.perf_counter() - fetched
            self.record(fragments)
            self.queue.extend(fragments)
            max_queue = max(max_queue, len(self.queue))
            while len(self.queue) >= per_batch:
                batch = [self.queue.popleft() for _ in range(per_batch)]
                learning = time.perf_counter()
                passes = cfg.circular_buffer_iterations_per_batch
                metrics = self.learners.update(FragmentInput(item.data for item in batch), passes,
                                               self.update_seed())
                if isinstance(metrics, FragmentsLost):  # lost with their node: the rest wait for new ones
                    lost = set(metrics.indices)
                    self._iter_fragments_lost += len(lost)
                    self.queue.extendleft(reversed([item for i, item in enumerate(batch) if i not in lost]))
                    learn_time += time.perf_counter() - learning
                    continue
                self._lags(batch, lags)
                for key in [key for key in metrics if key.rsplit("/", 1)[-1] == "num_gradient_steps"]:
                    gradient_steps += int(metrics.pop(key))  # (per policy in multi-agent runs)
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value * passes
                    counts[key] = counts.get(key, 0) + passes
                for pid in self.policy_updates:  # the policies this batch updated: those with rows in it
                    if any(item.info.policy_steps.get(pid) for item in batch):
                        self.policy_updates[pid] += passes
                before, self.num_updates = self.num_updates, self.num_updates + passes
                updates += passes
                if self.num_updates // cfg.broadcast_interval > before // cfg.broadcast_interval:
                    self._broadcast()  # an interval's worth of updates passed
                learn_time += time.perf_counter() - learning
                steps = sum(item.info.env_steps for item in batch)
                trained += steps * cfg.circular_buffer_iterations_per_batch
        self.num_env_steps_trained_lifetime += trained
        elapsed = time.perf_counter() - start
        lag_rows = {}
        for pid, values in sorted(lags.items()):
            suffix = f"/{pid}" if pid else ""
            lag_rows.update({f"policy_lag_mean{suffix}": float(np.mean(values)),
                             f"policy_lag_max{suffix}": max(values)})
        return {**{k: v / counts[k] for k, v in sums.items()},
                "num_gradient_updates": gradient_steps, "num_env_steps_trained": trained,
                "num_env_steps_trained_lifetime": self.num_env_steps_trained_lifetime,
                "policy_lag_mean": 0.0, "policy_lag_max": 0, **lag_rows,
                "learner_busy_fraction": learn_time / elapsed if elapsed > 0 else 0.0,
                "queue_depth": len(self.queue), "queue_depth_max": max_queue,
                "queue_bytes": sum(item.info.nbytes for item in self.queue),
                "num_requests_in_flight": self.sampler.num_in_flight,
                "num_fragments_dropped": self.sampler.num_dropped - dropped,
                "num_weight_broadcasts": self.num_broadcasts - broadcasts}

    def learner_state(self) -> dict[str, Any]:
        """The learner's state plus the update count (the weights' version) and the trained env steps."""
        return {**super().learner_state(), "num_updates": self.num_updates,
                "num_env_steps_trained_lifetime": self.num_env_steps_trained_lifetime,
                **({"policy_updates": dict(self.policy_updates)} if self.multi_agent else {})}

    def load_learner_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`learner_state`; fragments of the old timeline (queued or in flight) are dropped and
        the restored weights broadcast."""
        super().load_learner_state(state)
        self.num_updates = int(state.get("num_updates", 0))
        self.num_env_steps_trained_lifetime = int(state.get("num_env_steps_trained_lifetime", 0))
        saved = state.get("policy_updates", {})
        self.policy_updates = {pid: int(saved.get(pid, 0)) for pid in self.policy_updates}
        self.queue.clear()
        self.sampler.forget_in_flight()
        self._broadcast()
