"""Soft Actor-Critic (Haarnoja et al. 2018): twin Q critics, a tanh-squashed Gaussian actor, automatic
entropy tuning, replay (the off-policy loop is shared with DQN: ``off_policy.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from herdrl.algorithms.dqn import polyak_update
from herdrl.algorithms.off_policy import OffPolicyAlgorithm, OffPolicyConfig
from herdrl.config import MODEL_DEFAULTS, Field, shared_field
from herdrl.errors import ConfigError
from herdrl.optim import Adam


class SACConfig(OffPolicyConfig):
    """SAC settings (RLlib's key names). Defaults follow rl-baselines3-zoo's Pendulum-v1 SAC."""

    algo_name = "SAC"
    FIELDS = {
        "num_envs_per_env_runner": shared_field("num_envs_per_env_runner", 1),
        "rollout_fragment_length": shared_field("rollout_fragment_length", 16),
        "train_batch_size": shared_field("train_batch_size", 256),
        "lr": shared_field("lr", 1e-3),
        "gamma": shared_field("gamma", 0.99),
        "model": shared_field("model", {**MODEL_DEFAULTS, "fcnet_hiddens": [256, 256], "fcnet_activation": "relu",
                                        "free_log_std": False}),
        "training_intensity": shared_field("training_intensity", 256.0, OffPolicyConfig),  # a step per env step
        "num_steps_sampled_before_learning_starts": shared_field("num_steps_sampled_before_learning_starts", 100,
                                                                 OffPolicyConfig),
        "tau": Field(0.005, (float,), "training", low=0, low_open=True, high=1, doc="Polyak factor of the targets"),
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

    def build_module(self, observation_space: object, action_space: object) -> nn.Module:
        """Actor and twin critics (Box actions only)."""
        from herdrl.models.sac_networks import SACModule

        return SACModule(observation_space, action_space, self.model, twin_q=self.twin_q)

    def runner_policy(self, module: nn.Module, rng: np.random.Generator) -> object:
        """The squashed-Gaussian actor (numpy for MLPs, torch for CNNs)."""
        from herdrl.models.sac_networks import NumpySACPolicy

        return NumpySACPolicy(module, rng)

    @classmethod
    def algo_class(cls) -> type:
        """:class:`SAC`."""
        return SAC


class SAC(OffPolicyAlgorithm):
    """SAC on the shared runners; replay, critics' targets and entropy weight in the driver."""

    config: SACConfig

    def setup(self) -> None:
        """Replay buffer, target critics, three Adams (critics, actor, entropy weight)."""
        super().setup()
        cfg = self.config
        self.log_alpha = torch.tensor(np.log(cfg.initial_alpha), dtype=torch.float32, device=self.device,
                                      requires_grad=True)
        self.target_entropy = -float(self.module.action_dim) if cfg.target_entropy == "auto" else float(
            cfg.target_entropy)
        self.critics = self.module.critic_parameters()  # looked up once: the update runs every env step
        self.critic_optimizer = Adam(self.critics, lr=cfg.lr)
        self.actor_optimizer = Adam(self.module.actor_parameters(), lr=cfg.lr)
        self.alpha_optimizer = Adam([self.log_alpha], lr=cfg.lr)

    def update(self, batch: dict[str, torch.Tensor], weights: torch.Tensor) -> tuple[dict[str, float], np.ndarray]:
        """Critics towards the soft Bellman target, then the actor, then the entropy weight."""
        module, alpha = self.module, self.log_alpha.exp().detach()
        with torch.no_grad():
            next_action, next_logp = module.sample(batch["next_obs"])
            tq1, tq2 = self.target.q_values(batch["next_obs"], next_action)
            next_q = torch.min(tq1, tq2) if tq2 is not None else tq1
            target = batch["rewards"] + batch["discounts"] * (next_q - alpha * next_logp)
        q1, q2 = module.q_values(batch["obs"], batch["actions"])
        td_error = (target - q1).detach()
        critic_loss = (weights * (q1 - target).pow(2)).mean()
        if q2 is not None:
            critic_loss = critic_loss + (weights * (q2 - target).pow(2)).mean()
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()

        critics = self.critics
        for p in critics:  # the actor loss differentiates through the critics, not into their weights
            p.requires_grad_(False)
        action, logp = module.sample(batch["obs"])
        pq1, pq2 = module.q_values(batch["obs"], action)
        actor_loss = (alpha * logp - (torch.min(pq1, pq2) if pq2 is not None else pq1)).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        for p in critics:
            p.requires_grad_(True)

        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.alpha_optimizer.zero_grad()
        alpha_loss.backward()
        self.alpha_optimizer.step()
        polyak_update(self.target, module, self.config.tau)
        return ({"critic_loss": critic_loss.item(), "actor_loss": actor_loss.item(), "alpha": alpha.item(),
                 "entropy": -logp.mean().item()}, td_error.cpu().numpy())

    def learner_state(self) -> dict:
        """Module, targets, the three optimizers and the entropy weight (the replay buffer is a separate file:
        ``store_buffer_in_checkpoints``)."""
        return {**super().learner_state(), "target": self.target.state_dict(),
                "log_alpha": self.log_alpha.detach().clone(), "critic_optimizer": self.critic_optimizer.state_dict(),
                "actor_optimizer": self.actor_optimizer.state_dict(),
                "alpha_optimizer": self.alpha_optimizer.state_dict()}

    def load_learner_state(self, state: dict) -> None:
        """Inverse of :meth:`learner_state`."""
        super().load_learner_state(state)
        self.target.load_state_dict(state["target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        for name in ("critic_optimizer", "actor_optimizer", "alpha_optimizer"):
            getattr(self, name).load_state_dict(state[name])
