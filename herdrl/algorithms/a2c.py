"""Advantage Actor-Critic (synchronous A2C, Mnih et al. 2016).

Each update uses one short fragment from every env (``rollout_fragment_length`` steps, 5 by default): GAE
advantages (lambda 1: n-step returns), one gradient step on policy loss + value loss - entropy bonus, RMSprop.
An iteration runs updates until it has sampled ``train_batch_size`` env steps, so result rows, logging and
checkpoints happen per iteration, not per tiny update.
"""

from __future__ import annotations

from typing import Any

import torch

from herdrl.algorithms.base import Algorithm
from herdrl.config import VALUE_NORMALIZATION, AlgorithmConfig, Field, migrate_value_loss_coeff, shared_field
from herdrl.errors import ConfigError
from herdrl.learner import Learner
from herdrl.optim import RMSprop
from herdrl.rollout import Fragment
from herdrl.rollout.batch import forward_flat, learner_batch, normalize_advantages, real_steps


class A2CConfig(AlgorithmConfig):
    """A2C settings; defaults follow the rl-baselines3-zoo CartPole-v1 settings (8 envs x 5 steps per update)."""

    algo_name = "A2C"
    supports_lstm = True
    supports_multi_agent = True
    supports_centralized_critic = True  # MAPPO: critics that see the global state
    FIELDS = {
        "value_normalization": VALUE_NORMALIZATION,
        "num_envs_per_env_runner": shared_field("num_envs_per_env_runner", 8),
        "rollout_fragment_length": shared_field("rollout_fragment_length", 5),
        "train_batch_size": shared_field("train_batch_size", 2000),
        "lr": shared_field("lr", 7e-4),
        "gamma": shared_field("gamma", 0.99),
        "grad_clip": shared_field("grad_clip", 0.5),
        "lambda_": Field(1.0, (float,), "training", low=0, high=1, doc="GAE lambda (1: n-step returns)"),
        "vf_loss_coeff": Field(0.25, (float,), "training", low=0,
                               doc="weight of the value loss, the mean squared error (SB3's vf_coef formula)"),
        "entropy_coeff": Field(0.0, (float,), "training", low=0, schedule=True),
        "rmsprop_alpha": Field(0.99, (float,), "training", low=0, high=1),
        "rmsprop_eps": Field(1e-5, (float,), "training", low=0, low_open=True),
        "normalize_advantages": Field(False, (bool,), "training"),
    }
    ALIASES = {"lambda": "lambda_", "vf_coeff": "vf_loss_coeff", "entropy_coef": "entropy_coeff"}

    @classmethod
    def migrate_checkpoint_config(cls, config: dict[str, Any], format_version: int,
                                  spaces: dict[str, Any]) -> dict[str, Any]:
        """Format 1's value-loss weight, kept (see :func:`migrate_value_loss_coeff`)."""
        return migrate_value_loss_coeff(config, format_version)

    def validate_algorithm(self) -> None:
        """An iteration must hold at least one update."""
        if self.train_batch_size < self.total_envs * self.fragment_length():
            raise ConfigError(f"config key 'train_batch_size' got {self.train_batch_size}; expected >= one update's "
                              f"steps ({self.total_envs} envs x {self.fragment_length()} = "
                              f"{self.total_envs * self.fragment_length()})")

    @classmethod
    def algo_class(cls) -> type:
        """:class:`A2C`."""
        return A2C


class A2CLearner(Learner):
    """A2C's update: one RMSprop step on policy loss + value loss - entropy bonus per batch of fragments."""

    config: A2CConfig
    supports_sharded_fragments = True

    def setup(self) -> None:
        """RMSprop over the actor-critic's parameters."""
        cfg = self.config
        self.optimizer = RMSprop(self.module.parameters(), lr=self.hp["lr"], alpha=cfg.rmsprop_alpha,
                                 eps=cfg.rmsprop_eps)

    def update(self, fragments: list[Fragment]) -> dict[str, float]:
        """One gradient step on the batch the fragments make."""
        cfg = self.config
        batch = learner_batch(self.module, fragments, cfg, self.device)
        self.module.observe_value_targets(real_steps(batch, "returns"), global_sums=self.global_sums)
        if cfg.normalize_advantages:  # (with shard_fragments, over every share's rows)
            normalize_advantages(batch, self.global_sums if self.rows_sharded else None)
        stats = self.gradient_step(self.optimizer, self.loss, batch, None,
                                   cfg.grad_clip or float("inf"))
        return {key: float(value) for key, value in stats.items()}

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """A2C's loss on a batch of :func:`on_policy_batch` keys:
        ``-mean(log pi * advantage) + vf_loss_coeff * value MSE - entropy_coeff * entropy``, and its parts."""
        cfg = self.config
        dist_inputs, values, batch = forward_flat(self.module, batch)
        logp, entropy = self.module.log_prob_entropy(dist_inputs, batch["actions"])
        policy_loss = -(logp * batch["advantages"]).mean()
        vf_loss = (values - batch["returns"]).pow(2).mean() * self.module.value_loss_scale()
        entropy_mean = entropy.mean()
        loss = policy_loss + cfg.vf_loss_coeff * vf_loss - self.hp["entropy_coeff"] * entropy_mean
        return loss, {"policy_loss": policy_loss.detach(), "vf_loss": vf_loss.detach(),
                      "entropy": entropy_mean.detach()}


class A2C(Algorithm):
    """Synchronous advantage actor-critic on the shared runners."""

    config: A2CConfig
    learner_class = A2CLearner

    def training_step(self) -> dict[str, float]:
        """Sample-and-update until ``train_batch_size`` env steps were sampled this iteration."""
        cfg = self.config
        updates = max(1, cfg.train_batch_size // (cfg.total_envs * cfg.fragment_length()))
        sums: dict[str, float] = {}
        for _ in range(updates):
            for key, value in self.update_on(self.sample()).items():
                sums[key] = sums.get(key, 0.0) + value
        return {**{k: v / updates for k, v in sums.items()}, "num_gradient_updates": updates}
