"""Conservative Q-Learning (Kumar et al. 2020), offline, on a recorded dataset.

Q-learning on logged data overestimates actions the data never tried; CQL adds a penalty that pushes Q down on
actions in general and up on the dataset's own:

    min_q_weight * mean_s( logsumexp_a Q(s, a) - Q(s, a_data) )

- Continuous actions (CQL(H) on SAC: the squashed-Gaussian actor, twin critics, entropy tuning): the logsumexp
  over all actions is estimated from ``num_actions`` uniform random actions and ``num_actions`` of the actor's at
  s and at s', each corrected by its own density (importance sampling, as in the paper's code and d3rlpy). The
  critics back up min Q(s', a'), a' sampled from the actor, without SAC's entropy term (the paper's Equation 3, as
  its code and RLlib by default: ``deterministic_backup``; False adds SAC's ``- alpha log pi``).
  ``backup_action='mean'`` backs up at the actor's mean action instead, as d3rlpy does.
- Discrete actions (on DQN: double Q, Huber loss, hard target copies every ``target_network_update_freq``
  gradient steps): the logsumexp is exact, over the actions an ``action_mask`` allows.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from herdrl.algorithms.dqn import DQNLearner
from herdrl.algorithms.sac import SACLearner
from herdrl.config import Field
from herdrl.errors import ConfigError
from herdrl.learner import Learner
from herdrl.obs import obs_map
from herdrl.offline.algorithm import ACTOR_CRITIC_OFFLINE_FIELDS, OfflineAlgorithm, OfflineConfig, OfflineUpdates


def soft_backup_era(config: dict[str, Any], spaces: dict[str, Any]) -> bool:
    """Whether a checkpoint's config is a continuous CQL's from before ``deterministic_backup``: its critics backed
    up SAC's soft value."""
    return spaces.get("action", {}).get("type") == "Box" and "deterministic_backup" not in config


class CQLConfig(OfflineConfig):
    """CQL settings (RLlib's names where it has them). The conservative weight ``min_q_weight`` is fixed (5.0 for
    Box actions, d3rlpy's); d3rlpy by default tunes it with a Lagrange multiplier (``alpha_learning_rate`` 1e-4) and
    RLlib can (``lagrangian``, off by default); herdrl does not. One ``lr`` drives the actor and the critics
    (d3rlpy's actor default is 1e-4). benchmarks/offline.py runs d3rlpy with the same fixed weight and one rate."""

    algo_name = "CQL"
    FIELDS = {
        **ACTOR_CRITIC_OFFLINE_FIELDS,
        "min_q_weight": Field(None, (float,), "training", low=0, allow_none=True,
                              doc="weight of the conservative penalty; None: 5.0 for continuous actions, 1.0 for "
                                  "discrete (d3rlpy's)"),
        "num_actions": Field(10, (int,), "training", low=1,
                             doc="continuous: actions sampled per state (each kind) to estimate the logsumexp"),
        "deterministic_backup": Field(True, (bool,), "training",
                                      doc="continuous: the critics back up min Q(s', a') alone, as the CQL paper's "
                                          "code and RLlib; False: SAC's soft value, min Q - alpha log pi(a'|s') "
                                          "(checkpoints written before the key keep False)"),
        "backup_action": Field("sample", (str,), "training", choices=("sample", "mean"),
                               doc="continuous, with deterministic_backup: the action a' the critics back up min "
                                   "Q(s', a') at: 'sample' (one drawn from the actor, as the paper's code and "
                                   "RLlib) or 'mean' (the actor's mean action, as d3rlpy)"),
        "initial_alpha": Field(1.0, (float,), "training", low=0, low_open=True,
                               doc="continuous: initial entropy weight (SAC's)"),
        "target_entropy": Field("auto", (str, float), "training", doc="continuous: SAC's; 'auto': -action dims"),
        "target_network_update_freq": Field(8000, (int,), "training", low=1,
                                            doc="discrete: gradient steps between hard copies of the Q-network"),
        "double_q": Field(True, (bool,), "training", doc="discrete: pick the next action with the online network"),
        "dueling": Field(False, (bool,), "training"),
    }
    ALIASES = {"conservative_weight": "min_q_weight", "n_action_samples": "num_actions"}

    def validate_algorithm(self) -> None:
        """The offline keys, and ``target_entropy``."""
        super().validate_algorithm()
        if isinstance(self.target_entropy, str) and self.target_entropy != "auto":
            raise ConfigError(f"config key 'target_entropy' got {self.target_entropy!r}; expected 'auto' or a float")
        if self.backup_action == "mean" and not self.deterministic_backup:
            raise ConfigError("config key 'backup_action' 'mean' needs deterministic_backup=True: SAC's soft value "
                              "backs up a sampled action's log-probability")

    @classmethod
    def migrate_checkpoint_config(cls, config: dict[str, Any], format_version: int,
                                  spaces: dict[str, Any]) -> dict[str, Any]:
        """Before ``deterministic_backup``, continuous CQL backed up SAC's soft value: a run resumed from then
        keeps it."""
        config = super().migrate_checkpoint_config(config, format_version, spaces)
        return {**config, "deterministic_backup": False} if soft_backup_era(config, spaces) else config

    def checkpoint_clash(self, meta: dict[str, Any], action_space: Any) -> str | None:
        """Also a continuous CQL checkpoint written before ``deterministic_backup`` (its critics back up SAC's soft
        value) restored into a run that backs up min Q alone by default: the user must say which."""
        clash = super().checkpoint_clash(meta, action_space)
        if clash:
            return clash
        if (soft_backup_era(meta["config"], meta["spaces"]) and self.deterministic_backup
                and not self.is_explicit("deterministic_backup")):
            return ("its critics back up SAC's soft value (written before deterministic_backup): set "
                    "deterministic_backup=False to continue it so, or True to change it")
        return None

    def penalty_weight(self, discrete: bool) -> float:
        """``min_q_weight``, or its default for the action space."""
        if self.min_q_weight is not None:
            return float(self.min_q_weight)
        return 1.0 if discrete else 5.0

    def build_policy_module(self, observation_space: gym.Space, action_space: gym.Space) -> nn.Module:
        """A Q-network for Discrete actions, SAC's actor and critics for Box actions."""
        if isinstance(action_space, gym.spaces.Discrete):
            from herdrl.models.q_network import QNetwork

            return QNetwork(observation_space, action_space, self.model, dueling=self.dueling)
        if not isinstance(action_space, gym.spaces.Box):
            raise ConfigError(f"CQL needs Discrete or Box actions; this dataset has {action_space}")
        from herdrl.models.sac_networks import SACModule

        return SACModule(observation_space, action_space, self.model, twin_q=self.twin_q)

    @classmethod
    def algo_class(cls) -> type:
        """:class:`CQL`."""
        return CQL


class CQLLearner(OfflineUpdates, SACLearner):
    """Continuous CQL: SAC's update with the conservative penalty added to each critic's loss."""

    config: CQLConfig

    def replay_step(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor]:
        """SAC's three steps (the critics' with the penalty); the penalty among the metrics."""
        metrics, td_errors = super().replay_step(batch)
        return {**metrics, "cql_loss": self._penalty}, td_errors

    def next_action(self, next_obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's mean action (``backup_action='mean'``; its log-probability unused, zeros), else a sampled
        one."""
        if self.config.backup_action == "mean":
            action = self.module.greedy(next_obs)
            return action, torch.zeros(len(action), device=action.device)
        return super().next_action(next_obs)

    def next_value(self, next_q: torch.Tensor, next_logp: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        """The target critics' min Q alone (``deterministic_backup``); else SAC's soft value."""
        return next_q if self.config.deterministic_backup else super().next_value(next_q, next_logp, alpha)

    def _critic_loss(self, batch: dict[str, torch.Tensor], alpha: torch.Tensor) -> tuple[torch.Tensor, dict]:
        loss, stats = super()._critic_loss(batch, alpha)
        penalty = self.conservative_penalty(batch)
        self._penalty = float(penalty.detach())  # (this learner's rows: a metric)
        return loss + self.config.penalty_weight(False) * penalty, stats

    def conservative_penalty(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Summed over the critics: the mean over states of logsumexp over sampled actions (each corrected by its
        density) minus Q of the dataset's action."""
        module, n = self.module, self.config.num_actions
        rows = len(batch["rewards"])
        obs = obs_map(lambda t: t.repeat_interleave(n, dim=0), batch["obs"])
        dim = module.action_dim
        with torch.no_grad():  # per state: n uniform actions, n of the actor's at s, n of its at s' (actor run once)
            uniform = torch.rand(rows * n, dim, device=module.action_scale.device) * 2 - 1
            random_actions = uniform * module.action_scale + module.action_bias
            current, current_logp = module.sample_n(batch["obs"], n)
            following, following_logp = module.sample_n(batch["next_obs"], n)
        # Densities in the squashed [-1, 1] units the actor's log-probabilities are in: uniform is 2^-dim there.
        corrections = (torch.full((rows * n,), dim * math.log(2.0), device=uniform.device), -current_logp,
                       -following_logp)
        q_data = module.q_values(batch["obs"], batch["actions"])
        inputs = [module.critic_action(actions) for actions in (random_actions, current, following)]
        total = torch.zeros((), device=uniform.device)
        for i, critic in enumerate(c for c in (module.q1, module.q2) if c is not None):
            # Every sample scored at s (those drawn at s' too), (rows * n) of each kind, row-major by state.
            sampled = [(critic(obs, actions) + correction).view(rows, n)
                       for actions, correction in zip(inputs, corrections, strict=True)]
            lse = torch.logsumexp(torch.cat(sampled, dim=1), dim=1)
            total = total + (lse - q_data[i]).mean()
        return total


class DiscreteCQLLearner(OfflineUpdates, DQNLearner):
    """Discrete CQL: DQN's loss plus the exact conservative penalty."""

    config: CQLConfig

    def advance_learning_clock(self, env_steps: int) -> None:
        """A hard copy of the Q-network every ``target_network_update_freq`` gradient steps."""
        from herdrl.algorithms.dqn import polyak_update

        self._since_target_update += env_steps
        if self._since_target_update >= self.config.target_network_update_freq:
            self._since_target_update = 0
            polyak_update(self.target, self.module, 1.0)

    def replay_step(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor]:
        """One step on DQN's loss plus the penalty."""
        stats = self.gradient_step(self.optimizer, self.loss, batch, None, self.config.grad_clip)
        return {"loss": float(stats["loss"]), "cql_loss": float(stats["cql_loss"]),
                "mean_abs_td_error": float(stats["td_error"].abs().mean())}, stats["td_error"]

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """DQN's Huber loss + ``min_q_weight * mean(logsumexp_a Q(s, a) - Q(s, a_data))``."""
        td_loss, stats = super().loss(batch)
        q_all = self.module(batch["obs"])
        q_data = q_all.gather(1, batch["actions"].unsqueeze(1)).squeeze(1)
        penalty = (torch.logsumexp(self.module.allowed(q_all, batch["obs"]), dim=1) - q_data).mean()
        loss = td_loss + self.config.penalty_weight(True) * penalty
        return loss, {**stats, "loss": loss.detach(), "cql_loss": penalty.detach()}


class CQL(OfflineAlgorithm):
    """CQL on a recorded dataset: :class:`CQLLearner` for Box actions, :class:`DiscreteCQLLearner` for Discrete."""

    config: CQLConfig
    learner_class = CQLLearner

    def learner_class_for(self, action_space: gym.Space) -> type[Learner]:
        """The discrete learner for Discrete actions."""
        return DiscreteCQLLearner if isinstance(action_space, gym.spaces.Discrete) else CQLLearner
