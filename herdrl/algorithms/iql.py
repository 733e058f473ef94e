"""Implicit Q-Learning (Kostrikov et al. 2021), offline, on a recorded dataset (continuous and discrete actions).

IQL never evaluates an action the dataset did not take. Each gradient step:

1. V(s) regresses towards the target critics' ``min Q(s, a_data)`` with the expectile loss
   ``|expectile - 1(Q - V < 0)| * (Q - V)^2`` (an expectile near 1: V approaches the best in-data action's value);
2. the actor imitates the dataset's actions weighted by ``min(exp(beta * (Q(s, a) - V(s))), max_weight)``
   (advantage-weighted regression on the log-density of the action under N(tanh(mean), std), as in the paper's
   code: one learned log std per action dimension, whatever the state, clipped to [-5, 2] and starting at
   ``log_std_init`` (0, the paper's; d3rlpy's maps its parameter through a sigmoid into [-5, 2], starting at
   -1.5); ``free_log_std=False``: a log std per state, from the actor's head, as SAC's); greedy actions are
   tanh(mean), scaled to the bounds;
3. both critics regress towards ``r + discount * V(s')``, and the target critics follow by Polyak averaging.

Defaults are the paper's (and d3rlpy's) for locomotion: expectile 0.7, beta 3, max weight 100.

Discrete actions (:class:`DiscreteIQLModule`): the same three losses with a categorical actor (its log-probability
of the dataset's action, masked by an ``action_mask`` leaf if the observation has one) and critics that give every
action's Q value at once (the dataset's action picked out); greedy actions are the actor's most likely ones.
Offline only.

Online (``online=True``, one config change; with ``--init-from`` an offline IQL run's checkpoint it continues that
run): runners sample the env with IQL's actor (a ~ N(tanh(mean), std), clipped to the bounds), the replay buffer
starts full of the dataset's transitions and the new ones join them (the oldest leave once it is full), and the
same three losses learn from replayed batches, ``training_intensity`` replayed transitions per sampled env step:
IQL's online fine-tuning as in the paper (section 5.3).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from herdrl.algorithms.dqn import polyak_update
from herdrl.algorithms.off_policy import ACTOR_CRITIC_FIELDS, OffPolicyAlgorithm, OffPolicyConfig, OffPolicyLearner
from herdrl.buffers import REPLAY_DEFAULTS, check_replay_config
from herdrl.config import AlgorithmConfig, Field, shared_field
from herdrl.errors import ConfigError
from herdrl.models.actor_critic import ActorCritic
from herdrl.models.encoders import build_encoder, head
from herdrl.models.sac_networks import SACModule
from herdrl.offline.algorithm import ACTOR_CRITIC_OFFLINE_FIELDS, OfflineAlgorithm, OfflineConfig, OfflineUpdates
from herdrl.optim import Adam

logger = logging.getLogger("herdrl")


class IQLConfig(OfflineConfig):
    """IQL settings (the paper's names; RLlib's where it has them)."""

    algo_name = "IQL"
    #: Online, runners ship raw observations and each replayed batch is normalised (as every off-policy run does:
    #: the dataset's transitions sit raw in the same buffer); offline, runners only evaluate.
    stores_raw_transitions = True
    FIELDS = {
        **ACTOR_CRITIC_OFFLINE_FIELDS,
        # (the paper's actor: one learned log std per action dimension, whatever the state)
        "model": shared_field("model", {**ACTOR_CRITIC_OFFLINE_FIELDS["model"].default, "free_log_std": True}),
        "expectile": Field(0.7, (float,), "training", low=0.5, high=0.999,
                           doc="the value's expectile of Q over the dataset's actions (0.5: their mean)"),
        "beta": Field(3.0, (float,), "training", low=0, doc="inverse temperature of the actor's advantage weights"),
        "max_weight": Field(100.0, (float,), "training", low=0, low_open=True, doc="cap on an advantage weight"),
        # Online fine-tuning (the replay loop's keys, as SAC's).
        "online": Field(False, (bool,), "training",
                        doc="learn in the env too: runners sample, the dataset's transitions fill the replay buffer "
                            "first (continue an offline run with --init-from)"),
        "replay_buffer_config": shared_field("replay_buffer_config", {**REPLAY_DEFAULTS, "capacity": 1_000_000},
                                             OffPolicyConfig),
        **{key: OffPolicyConfig.FIELDS[key] for key in ("min_sample_timesteps_per_iteration", "n_step",
                                                        "store_buffer_in_checkpoints")},
        **{key: ACTOR_CRITIC_FIELDS[key] for key in ("training_intensity", "num_steps_sampled_before_learning_starts",
                                                     "num_envs_per_env_runner", "rollout_fragment_length")},
    }
    ALIASES = {"weight_temp": "beta", "temperature": "beta"}

    @property
    def learns_offline(self) -> bool:  # type: ignore[override]
        """Offline unless ``online``."""
        return not self.online

    def validate_algorithm(self) -> None:
        """The offline keys; online, the replay's (uniform replay of one-step transitions, as the dataset's)."""
        super().validate_algorithm()
        if self.online:
            check_replay_config(self.replay_buffer_config, self.train_batch_size)
            if self.replay_buffer_config.get("type", "uniform") != "uniform" or self.n_step != 1:
                raise ConfigError("online IQL replays uniformly one-step transitions (as its dataset's): leave "
                                  "replay_buffer_config type 'uniform' and n_step 1")

    def _discrete(self, module: nn.Module) -> bool:
        return isinstance(module, DiscreteIQLModule)

    def build(self, logger: Any = None) -> Any:
        """:class:`IQL`, or :class:`IQLOnline` with ``online=True``."""
        if not self.online:
            return super().build(logger)
        self.validate()
        return IQLOnline(self.copy(), logger=logger)

    def runner_policy(self, module: nn.Module, rng: Any) -> object:
        """(Online) IQL's actor on the runners: a ~ N(tanh(mean), std), log std in [-5, 2], clipped to the Box
        (discrete actions: the categorical actor, as any actor-critic's)."""
        from herdrl.models.sac_networks import NumpySACPolicy

        if self._discrete(module):
            return AlgorithmConfig.runner_policy(self, module, rng)
        return NumpySACPolicy(module, rng, (IQL_LOG_STD_MIN, IQL_LOG_STD_MAX), noise_after_tanh=True)

    def runner_blueprint(self, module: nn.Module) -> object:
        """(Online) that actor's numpy twin as plain data (light runners)."""
        from herdrl.models.actor_critic import numpy_blueprint
        from herdrl.models.sac_networks import sac_blueprint

        if self._discrete(module):
            return numpy_blueprint(module)
        return sac_blueprint(module, (IQL_LOG_STD_MIN, IQL_LOG_STD_MAX), noise_after_tanh=True)

    def build_policy_module(self, observation_space: gym.Space, action_space: gym.Space) -> nn.Module:
        """SAC's actor and critics plus a state-value network (Box actions); a categorical actor, critics of every
        action and a state-value network (Discrete actions, offline)."""
        if isinstance(action_space, gym.spaces.Discrete):
            if self.online:
                raise ConfigError(f"online IQL learns continuous (Box) actions; this dataset has {action_space}: "
                                  "fine-tune with online=False, or learn online with PPO/DQN (--init-from)")
            return DiscreteIQLModule(observation_space, action_space, self.model, twin_q=self.twin_q)
        if not isinstance(action_space, gym.spaces.Box):
            raise ConfigError(f"IQL learns Box or Discrete actions; this dataset has {action_space}: use BC/MARWIL")
        return IQLModule(observation_space, action_space, self.model, twin_q=self.twin_q)

    @classmethod
    def algo_class(cls) -> type:
        """:class:`IQL`."""
        return IQL


#: IQL's actor: the bounds of its log std (the paper's code and d3rlpy).
IQL_LOG_STD_MIN, IQL_LOG_STD_MAX = -5.0, 2.0


class IQLModule(SACModule):
    """SAC's actor and twin critics, and ``value``: V(s). With ``free_log_std`` (IQL's default) the actor's head
    gives the mean only and ``log_std`` is one learned value per action dimension, whatever the state (the paper's
    code); without it, SAC's head gives a log std per state too."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict,
                 twin_q: bool = True) -> None:
        super().__init__(observation_space, action_space, model_config, twin_q=twin_q)
        self.free_log_std = bool(model_config["free_log_std"])
        if self.free_log_std:
            self.pi_head = head(self.pi_encoder.out_dim, self.action_dim, 0.01)
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(model_config["log_std_init"])))
        self.value_encoder = build_encoder(observation_space, model_config)
        self.value_head = head(self.value_encoder.out_dim, 1, 1.0)

    def mean_log_std(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's mean and log std (the free one broadcast over the batch), the log std clamped to [-5, 2]."""
        if not self.free_log_std:
            return super().mean_log_std(obs)
        mean = self.pi_head(self.pi_encoder(obs)).float()
        return mean, self.log_std.clamp(IQL_LOG_STD_MIN, IQL_LOG_STD_MAX).expand_as(mean)

    def actor_parameters(self) -> list[nn.Parameter]:
        """The actor's parameters (the free log std included)."""
        return [*super().actor_parameters(), *([self.log_std] if self.free_log_std else [])]

    @torch.no_grad()
    def act(self, obs: Any, explore: bool = False) -> torch.Tensor:
        """Scaled actions: tanh(mean), or (``explore``) a ~ N(tanh(mean), std) clipped to [-1, 1], as the runners
        sample IQL's actor (not SAC's tanh of a Gaussian sample)."""
        if not explore:
            return self.greedy(obs)
        mean, log_std = self.mean_log_std(obs)
        std = log_std.clamp(IQL_LOG_STD_MIN, IQL_LOG_STD_MAX).exp()
        unit = (torch.tanh(mean) + torch.randn_like(mean) * std).clamp(-1.0, 1.0)
        return unit * self.action_scale + self.action_bias

    @torch.no_grad()
    def project_log_std(self) -> None:
        """Keep the free log std inside [-5, 2] (after each actor step): beyond a bound the clamp passes no
        gradient, and a log std stepped past one would stay there for good, online fine-tuning included."""
        if self.free_log_std:
            self.log_std.clamp_(IQL_LOG_STD_MIN, IQL_LOG_STD_MAX)

    def log_prob(self, obs: Any, action: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
        """The log-density of a recorded action (scaled to [-1, 1]) under N(tanh(mean), std), log std clamped to
        [-5, 2]: IQL's actor as in the paper's code and d3rlpy (no tanh Jacobian, so actions on the bounds stay
        finite and the weighted likelihood cannot drive the std to zero for them)."""
        mean, log_std = self.mean_log_std(obs)
        log_std = log_std.clamp(IQL_LOG_STD_MIN, IQL_LOG_STD_MAX)
        scaled = self.unit_action(action)
        return (-0.5 * ((scaled - torch.tanh(mean)) / log_std.exp()).pow(2) - log_std
                - 0.5 * math.log(2 * math.pi)).sum(-1)

    def value(self, obs: Any) -> torch.Tensor:
        """V(s)."""
        return self.value_head(self.value_encoder(obs)).squeeze(-1).float()

    def value_parameters(self) -> list[nn.Parameter]:
        """The value network's parameters."""
        return [*self.value_encoder.parameters(), *self.value_head.parameters()]


class DiscreteIQLModule(ActorCritic):
    """IQL for Discrete actions: an actor-critic's categorical actor and state-value network (separate encoders),
    and one or two critics giving every action's Q value (the dataset's action picked out by :meth:`q_values`).
    Runners, ``Policy`` and export use it as any actor-critic: greedy is the actor's most likely action."""

    def __init__(self, observation_space: gym.Space, action_space: gym.spaces.Discrete, model_config: dict,
                 twin_q: bool = True) -> None:
        super().__init__(observation_space, action_space, {**model_config, "vf_share_layers": False})
        self.q_encoders = nn.ModuleList(build_encoder(observation_space, model_config) for _ in range(1 + twin_q))
        self.q_heads = nn.ModuleList(head(encoder.out_dim, int(action_space.n), 1.0) for encoder in self.q_encoders)

    def all_q_values(self, obs: Any) -> list[torch.Tensor]:
        """Each critic's Q values of every action, ``(batch, actions)``."""
        return [q_head(encoder(obs)).float() for encoder, q_head in zip(self.q_encoders, self.q_heads, strict=True)]

    def q_values(self, obs: Any, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The critics' Q values of the stored ``actions`` (the second None without twin critics)."""
        picked = [q.gather(-1, actions.long().reshape(-1, 1)).squeeze(-1) for q in self.all_q_values(obs)]
        return picked[0], picked[1] if len(picked) > 1 else None

    def log_prob(self, obs: Any, actions: torch.Tensor) -> torch.Tensor:
        """The actor's log-probability of the stored ``actions`` (masked actions have none)."""
        return self.log_prob_entropy(self.dist_inputs(obs), actions)[0]

    def actor_parameters(self) -> list[nn.Parameter]:
        """The actor's parameters."""
        return self.policy_parameters()

    def critic_parameters(self) -> list[nn.Parameter]:
        """The critics' parameters."""
        return [*self.q_encoders.parameters(), *self.q_heads.parameters()]


class IQLLearner(OfflineUpdates, OffPolicyLearner):
    """IQL's three losses, one optimizer each, and the target critics."""

    config: IQLConfig
    optimizer_names = ("value_optimizer", "actor_optimizer", "critic_optimizer")

    def setup(self) -> None:
        """Target networks; Adam for the value, the actor and the critics."""
        super().setup()
        self.value_optimizer = Adam(self.module.value_parameters(), lr=self.hp["lr"])
        self.actor_optimizer = Adam(self.module.actor_parameters(), lr=self.hp["lr"])
        self.critic_optimizer = Adam(self.module.critic_parameters(), lr=self.hp["lr"])

    def _target_q(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            q1, q2 = self.target.q_values(batch["obs"], batch["actions"])
            return torch.min(q1, q2) if q2 is not None else q1

    def replay_step(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor]:
        """Value, actor, critics, then the targets."""
        value = self.gradient_step(self.value_optimizer, self.value_loss, batch)
        actor = self.gradient_step(self.actor_optimizer, self.actor_loss, batch)
        if isinstance(self.module, IQLModule):
            self.module.project_log_std()
        critic = self.gradient_step(self.critic_optimizer, self.critic_loss, batch)
        polyak_update(self.target, self.module, self.config.tau)
        return ({"value_loss": float(value["loss"]), "actor_loss": float(actor["loss"]),
                 "critic_loss": float(critic["loss"]), "mean_weight": float(actor["weight"])}, critic["td_error"])

    def value_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The expectile loss of V(s) under the target critics' min Q(s, a)."""
        difference = self._target_q(batch) - self.module.value(batch["obs"])
        weight = torch.abs(self.config.expectile - (difference < 0).float())
        loss = (weight * difference.pow(2)).mean()
        return loss, {"loss": loss.detach()}

    def actor_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Advantage-weighted log-likelihood of the dataset's actions."""
        cfg = self.config
        with torch.no_grad():
            advantage = self._target_q(batch) - self.module.value(batch["obs"])
            weight = torch.exp(cfg.beta * advantage).clamp(max=cfg.max_weight)
        loss = -(weight * self.module.log_prob(batch["obs"], batch["actions"])).mean()
        return loss, {"loss": loss.detach(), "weight": weight.mean()}

    def critic_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Both critics' squared error to ``r + discount * V(s')``."""
        with torch.no_grad():
            target = batch["rewards"] + batch["discounts"] * self.module.value(batch["next_obs"])
        q1, q2 = self.module.q_values(batch["obs"], batch["actions"])
        loss = (q1 - target).pow(2).mean() + ((q2 - target).pow(2).mean() if q2 is not None else 0.0)
        return loss, {"loss": loss.detach(), "td_error": (target - q1).detach()}


class IQL(OfflineAlgorithm):
    """IQL on a recorded dataset."""

    config: IQLConfig
    learner_class = IQLLearner


class OnlineIQLLearner(IQLLearner):
    """IQL's losses on replayed batches: one gradient step per call, as every replay learner takes."""

    update = OffPolicyLearner.update


class IQLOnline(OffPolicyAlgorithm):
    """IQL fine-tuning online: SAC's sampling and replay loop, the buffer filled with the dataset's transitions
    first (again on a resume whose checkpoint holds no buffer)."""

    config: IQLConfig
    learner_class = OnlineIQLLearner

    def setup(self) -> None:
        """The replay buffer, filled with the dataset's transitions."""
        super().setup()
        self._fill_from_dataset()

    def _fill_from_dataset(self) -> None:
        from herdrl.offline.dataset import open_dataset
        from herdrl.offline.reader import episode_transitions, fit_observation_filter
        from herdrl.offline.source import check_spaces

        cfg = self.config
        dataset = open_dataset(cfg.input_)
        check_spaces(dataset, cfg.env, cfg.env_config)
        episodes = list(dataset.episodes())
        transitions = episode_transitions(episodes, dataset.observation_space, dataset.action_space, cfg.gamma)
        transitions.pop("returns")
        # (replay normalises with the dataset's statistics and the env's observations' after)
        fit_observation_filter(self.normalizer, episodes, dataset.observation_space)
        self.buffer.add(transitions)
        self.dataset_transitions = len(transitions["rewards"])
        if self.dataset_transitions > self.buffer.capacity:
            logger.warning("herdrl: the dataset's %d transitions exceed the replay buffer's capacity (%d): only the "
                           "newest stay; raise replay_buffer_config capacity", self.dataset_transitions,
                           self.buffer.capacity)

    def load_checkpoint_arrays(self, path: Any) -> None:
        """The checkpoint's buffer, or (none in it) the dataset's transitions again."""
        super().load_checkpoint_arrays(path)
        if not len(self.buffer):
            self._fill_from_dataset()
