"""Soft Actor-Critic (Haarnoja et al. 2018): twin Q critics, a tanh-squashed Gaussian actor, automatic
entropy tuning, replay (the off-policy loop is shared with DQN: ``off_policy.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from herdrl.algorithms.dqn import polyak_update
from herdrl.algorithms.off_policy import ACTOR_CRITIC_FIELDS, OffPolicyAlgorithm, OffPolicyConfig, OffPolicyLearner
from herdrl.config import MODEL_DEFAULTS, Field, shared_field
from herdrl.errors import ConfigError
from herdrl.optim import Adam


class SACConfig(OffPolicyConfig):
    """SAC settings (RLlib's key names). Defaults follow rl-baselines3-zoo's Pendulum-v1 SAC."""

    algo_name = "SAC"
    FIELDS = {
        **ACTOR_CRITIC_FIELDS,
        "model": shared_field("model", {**MODEL_DEFAULTS, "fcnet_hiddens": [256, 256], "fcnet_activation": "relu",
                                        "free_log_std": False}),
        "initial_alpha": Field(1.0, (float,), "training", low=0, low_open=True, doc="initial entropy weight"),
        "target_entropy": Field("auto", (str, float), "training",
                                doc="entropy of the squashed action in [-1, 1]^d to hold; 'auto': -d"),
        "twin_q": Field(True, (bool,), "training"),
    }

    @classmethod
    def migrate_checkpoint_config(cls, config: dict[str, Any], format_version: int,
                                  spaces: dict[str, Any]) -> dict[str, Any]:
        """Format 1 held the entropy target in the env's action units; today's is in the squashed [-1, 1]
        space: the same run resumes with the same effective target, target - sum(log(action scale))."""
        if format_version >= 2:
            return config
        action = spaces["action"]
        log_scale = float(np.sum(np.log((np.array(action["high"]) - np.array(action["low"])) / 2)))
        target = config.get("target_entropy", "auto")
        target = -float(np.prod(action["shape"])) if target == "auto" else float(target)
        return {**config, "target_entropy": target - log_scale}

    def validate_algorithm(self) -> None:
        """Replay settings and ``target_entropy``."""
        super().validate_algorithm()
        if isinstance(self.target_entropy, str) and self.target_entropy != "auto":
            raise ConfigError(f"config key 'target_entropy' got {self.target_entropy!r}; expected 'auto' or a float")

    def build_policy_module(self, observation_space: object, action_space: object) -> nn.Module:
        """Actor and twin critics (Box actions only)."""
        from herdrl.models.sac_networks import SACModule

        return SACModule(observation_space, action_space, self.model, twin_q=self.twin_q)

    def runner_policy(self, module: nn.Module, rng: np.random.Generator) -> object:
        """The squashed-Gaussian actor (numpy for MLPs, torch for CNNs)."""
        from herdrl.models.sac_networks import NumpySACPolicy

        return NumpySACPolicy(module, rng)

    def runner_blueprint(self, module: nn.Module) -> object:
        """The squashed-Gaussian actor's numpy twin as plain data (light runners)."""
        from herdrl.models.sac_networks import sac_blueprint

        return sac_blueprint(module)

    @classmethod
    def algo_class(cls) -> type:
        """:class:`SAC`."""
        return SAC


class SACLearner(OffPolicyLearner):
    """SAC's update: critics towards the soft Bellman target, then the actor, then the entropy weight."""

    config: SACConfig
    optimizer_names = ("critic_optimizer", "actor_optimizer", "alpha_optimizer")

    def setup(self) -> None:
        """Target critics, three Adams (critics, actor, entropy weight)."""
        super().setup()
        cfg = self.config
        self.log_alpha = torch.tensor(np.log(cfg.initial_alpha), dtype=torch.float32, device=self.device,
                                      requires_grad=True)
        self.target_entropy = -float(self.module.action_dim) if cfg.target_entropy == "auto" else float(
            cfg.target_entropy)
        self.critics = self.module.critic_parameters()  # looked up once: the update runs every env step
        self.critic_optimizer = Adam(self.critics, lr=self.hp["lr"])
        self.actor_optimizer = Adam(self.module.actor_parameters(), lr=self.hp["lr"])
        self.alpha_optimizer = Adam([self.log_alpha], lr=self.hp["lr"])

    def replay_step(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor]:
        """A step of each of the three losses on the batch (this learner's rows of it, with N learners), then a
        Polyak update of the target critics."""
        alpha = self.log_alpha.exp().detach()
        critic = self.gradient_step(self.critic_optimizer, lambda b: self._critic_loss(b, alpha), batch)
        with self.frozen(self.critics):  # the actor loss differentiates through the critics, not into them
            actor = self.gradient_step(self.actor_optimizer, lambda b: self._actor_loss(b, alpha), batch)
        logp = actor["logp"]  # this learner's rows: the entropy weight's loss is a mean over the same rows
        self.gradient_step(self.alpha_optimizer, lambda _: self._alpha_loss(logp), batch)
        polyak_update(self.target, self.module, self.config.tau)
        return ({"critic_loss": float(critic["loss"]), "actor_loss": float(actor["loss"]), "alpha": alpha.item(),
                 "entropy": -logp.mean().item()}, critic["td_error"])

    def _critic_loss(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor) -> tuple[torch.Tensor, dict]:
        with torch.no_grad():
            next_action, next_logp = self.next_action(batch["next_obs"])
            tq1, tq2 = self.target.q_values(batch["next_obs"], next_action)
            next_q = torch.min(tq1, tq2) if tq2 is not None else tq1
            target = batch["rewards"] + batch["discounts"] * self.next_value(next_q, next_logp, alpha)
        q1, q2 = self.module.q_values(batch["obs"], batch["actions"])
        loss = (batch["weights"] * (q1 - target).pow(2)).mean()
        if q2 is not None:
            loss = loss + (batch["weights"] * (q2 - target).pow(2)).mean()
        return loss, {"loss": loss.detach(), "td_error": (target - q1).detach()}

    def next_action(self, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The action at s' the critics back up, and its log-probability: one sampled from the actor."""
        return self.module.sample(next_obs)

    def next_value(self, next_q: torch.Tensor, next_logp: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """The value of s' the critics back up: SAC's soft value, the target critics' min Q - alpha log pi."""
        return next_q - alpha * next_logp

    def _actor_loss(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor) -> tuple[torch.Tensor, dict]:
        action, logp = self.module.sample(batch["obs"])
        pq1, pq2 = self.module.q_values(batch["obs"], action)
        loss = (alpha * logp - (torch.min(pq1, pq2) if pq2 is not None else pq1)).mean()
        return loss, {"loss": loss.detach(), "logp": logp.detach()}

    def _alpha_loss(self, logp: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return -(self.log_alpha * (logp + self.target_entropy)).mean(), {}

    def extra_state(self) -> dict:
        """The target critics and the entropy weight."""
        return {**super().extra_state(), "log_alpha": self.log_alpha.detach().clone()}

    def load_extra_state(self, state: dict) -> None:
        """Inverse of :meth:`extra_state`."""
        super().load_extra_state(state)
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])


class SAC(OffPolicyAlgorithm):
    """SAC on the shared runners; the replay buffer in the driver, :class:`SACLearner` learning from it."""

    config: SACConfig
    learner_class = SACLearner
