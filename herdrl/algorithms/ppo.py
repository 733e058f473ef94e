"""Proximal Policy Optimization (Schulman et al. 2017), clipped-surrogate variant.

Everything PPO-specific is in this file: its config keys and defaults, and its learner (the batch
preparation — values, old log-probs, GAE — and the minibatch update), which runs in the driver or as N
data-parallel learners unchanged. Sampling, result rows and the train loop are shared (``base.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from herdrl.algorithms.base import Algorithm
from herdrl.config import VALUE_NORMALIZATION, AlgorithmConfig, Field, migrate_value_loss_coeff, shared_field
from herdrl.learner import Learner
from herdrl.optim import Adam
from herdrl.rollout import Fragment
from herdrl.rollout.batch import forward_flat, learner_batch, minibatches, normalize_advantages, real_steps


class PPOConfig(AlgorithmConfig):
    """PPO settings. Defaults solve CartPole-v1 fast on a CPU in one process."""

    algo_name = "PPO"
    supports_lstm = True
    supports_multi_agent = True
    supports_centralized_critic = True  # MAPPO: critics that see the global state
    multi_agent_old_logp = True  # multi-agent runners record the acting policy's log-probabilities: old_logp
    FIELDS = {
        "value_normalization": VALUE_NORMALIZATION,
        # Shared keys with PPO's defaults.
        "num_envs_per_env_runner": shared_field("num_envs_per_env_runner", 16),
        "train_batch_size": shared_field("train_batch_size", 1024),
        "lr": shared_field("lr", 2e-3),
        "gamma": shared_field("gamma", 0.98),
        "grad_clip": shared_field("grad_clip", 0.5),
        # PPO's own keys (RLlib's names).
        "minibatch_size": Field(256, (int,), "training", low=1, doc="samples per gradient step"),
        "num_epochs": Field(10, (int,), "training", low=1, doc="passes over each train batch"),
        "lambda_": Field(0.9, (float,), "training", low=0, high=1, doc="GAE lambda"),
        "clip_param": Field(0.2, (float,), "training", low=0, low_open=True, doc="surrogate clip range"),
        "vf_clip_param": Field(None, (float,), "training", low=0, low_open=True, allow_none=True,
                               doc="clip value predictions to old value +- this (off when None)"),
        "vf_loss_coeff": Field(0.25, (float,), "training", low=0,
                               doc="weight of the value loss, the mean squared error (RLlib's formula)"),
        "entropy_coeff": Field(0.0, (float,), "training", low=0, schedule=True),
        "normalize_advantages": Field(True, (bool,), "training"),
    }
    ALIASES = {"sgd_minibatch_size": "minibatch_size", "num_sgd_iter": "num_epochs", "lambda": "lambda_"}
    #: An LSTM learns from inputs on one scale and at a gentler rate than PPO's MLP defaults: with these, the
    #: README's `herd train ppo --env herd/StatelessCartPole-v1 --config model.use_lstm=true` solves (475) on seeds
    #: 0-4 within 500k env steps (benchmarks/memory.py --defaults); with 2e-3 and raw inputs some seeds never did,
    #: with 1e-3 one of five did not.
    LSTM_DEFAULTS = {"lr": 7e-4, "observation_filter": "MeanStdFilter"}

    @classmethod
    def migrate_checkpoint_config(cls, config: dict[str, Any], format_version: int,
                                  spaces: dict[str, Any]) -> dict[str, Any]:
        """Format 1's value-loss weight, kept (see :func:`migrate_value_loss_coeff`)."""
        return migrate_value_loss_coeff(config, format_version)

    def validate_algorithm(self) -> None:
        """Minibatches must fit in the train batch (:meth:`check_minibatch_fits`)."""
        self.check_minibatch_fits()

    @classmethod
    def algo_class(cls) -> type:
        """:class:`PPO`."""
        return PPO


class PPOLearner(Learner):
    """PPO's update: GAE, advantage normalisation, optional value clipping, entropy bonus and grad clipping."""

    config: PPOConfig
    supports_sharded_fragments = True

    def setup(self) -> None:
        """Adam over the actor-critic's parameters."""
        self.optimizer = Adam(self.module.parameters(), lr=self.hp["lr"], eps=1e-5)

    def update(self, fragments: list[Fragment], seed: int) -> dict[str, float]:
        """``num_epochs`` passes of minibatch steps over the batch the fragments make (``seed``: the minibatch
        order, the same on every learner)."""
        cfg = self.config
        batch = learner_batch(self.module, fragments, cfg, self.device)
        gae_values = batch["old_values"]  # (what GAE used: the explained variance below reads them)
        # With shard_fragments, this rank's batch is its share: statistics and minibatches over every share.
        batch["old_values"] = self.module.observe_value_targets(real_steps(batch, "returns"), gae_values,
                                                                self.global_sums)
        if cfg.normalize_advantages:
            normalize_advantages(batch, self.global_sums if self.rows_sharded else None)
        rng = np.random.default_rng(seed)
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}  # (a share may have no rows in a minibatch: that step reports nothing here)
        updates = 0
        for _ in range(cfg.num_epochs):
            for idx in minibatches(batch, cfg.minibatch_size, rng, self.share_layout if self.rows_sharded else None):
                stats = self.gradient_step(self.optimizer, self.loss, batch, idx, cfg.grad_clip or float("inf"))
                for key, value in stats.items():
                    sums[key] = sums.get(key, 0.0) + float(value)
                    counts[key] = counts.get(key, 0) + 1
                updates += 1
        metrics = {key: value / counts[key] for key, value in sums.items()}
        returns = real_steps(batch, "returns").double()
        residual = returns - real_steps({**batch, "old_values": gae_values}, "old_values").double()
        # (over every share's rows with shard_fragments: variances from summed moments)
        n, r1, r2, d1, d2 = self.global_sums([float(len(returns)), float(returns.sum()), float((returns ** 2).sum()),
                                              float(residual.sum()), float((residual ** 2).sum())])
        spread = r2 - r1 * r1 / n if n > 1 else 0.0
        metrics["vf_explained_var"] = 1 - (d2 - d1 * d1 / n) / spread if spread > 0 else float("nan")
        metrics["num_gradient_updates"] = updates
        return metrics

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """PPO's loss on a minibatch of :func:`on_policy_batch` keys (advantages already normalised):
        ``-clipped surrogate + vf_loss_coeff * value MSE - entropy_coeff * entropy``, and its parts."""
        cfg = self.config
        dist_inputs, values, batch = forward_flat(self.module, batch)
        logp, entropy = self.module.log_prob_entropy(dist_inputs, batch["actions"])
        log_ratio = logp - batch["old_logp"]
        ratio = log_ratio.exp()
        adv = batch["advantages"]
        policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - cfg.clip_param, 1 + cfg.clip_param) * adv).mean()
        vf_loss = self._value_loss(values, batch["old_values"], batch["returns"])
        entropy_mean = entropy.mean()
        loss = policy_loss + cfg.vf_loss_coeff * vf_loss - self.hp["entropy_coeff"] * entropy_mean
        with torch.no_grad():
            stats = {"policy_loss": policy_loss, "vf_loss": vf_loss, "entropy": entropy_mean,
                     "kl": ((ratio - 1) - log_ratio).mean(),
                     "clip_fraction": ((ratio - 1).abs() > cfg.clip_param).float().mean()}
        return loss, {key: value.detach() for key, value in stats.items()}

    def _value_loss(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
        clip = self.config.vf_clip_param
        loss = (values - returns).pow(2)
        if clip is not None:
            clipped = old_values + (values - old_values).clamp(-clip, clip)
            loss = torch.max(loss, (clipped - returns).pow(2))
        return loss.mean() * self.module.value_loss_scale()


class PPO(Algorithm):
    """PPO: sample one train batch, then :class:`PPOLearner` learns from it."""

    config: PPOConfig
    learner_class = PPOLearner

    def training_step(self) -> dict[str, float]:
        """Sample one train batch, then run ``num_epochs`` passes of minibatch updates over it."""
        return self.update_on(self.sample(), self.update_seed())
