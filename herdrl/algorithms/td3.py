"""TD3 (Fujimoto et al. 2018) and DDPG (Lillicrap et al. 2016): a deterministic actor and Q critics, on the
off-policy loop shared with DQN and SAC (``off_policy.py``).

TD3 is DDPG with three fixes, each a key here: twin critics and the smaller of their targets (``twin_q``), a
delayed actor and target update every ``policy_delay`` critic steps, and clipped Gaussian noise on the target
action (``target_noise``, ``target_noise_clip``). ``DDPGConfig`` is TD3 with all three off, as in SB3. Runners
explore with Gaussian noise of std ``exploration_noise`` (a fraction of each action's half-range, SB3's
``NormalActionNoise``) and act uniformly at random until learning starts (SB3's warm-up).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.algorithms.dqn import polyak_update
from herdrl.algorithms.off_policy import ACTOR_CRITIC_FIELDS, OffPolicyAlgorithm, OffPolicyConfig, OffPolicyLearner
from herdrl.config import MODEL_DEFAULTS, Field, shared_field
from herdrl.models.actor_critic import box_scaling, mlp_blueprint, weight_views
from herdrl.models.encoders import build_encoder, head, module_device, to_torch
from herdrl.models.numpy_policy import MLPBlueprint, NoisyTanh
from herdrl.models.sac_networks import BoxCritics, QCritic, check_bounded_box
from herdrl.optim import Adam


class TD3Config(OffPolicyConfig):
    """TD3 settings (RLlib's and SB3's names). Defaults follow SB3's TD3."""

    algo_name = "TD3"
    FIELDS = {
        **ACTOR_CRITIC_FIELDS,
        "model": shared_field("model", {**MODEL_DEFAULTS, "fcnet_hiddens": [256, 256], "fcnet_activation": "relu"}),
        "policy_delay": Field(2, (int,), "training", low=1, doc="critic steps per actor and target update"),
        "target_noise": Field(0.2, (float,), "training", low=0,
                              doc="std of the noise on target actions, a fraction of the action half-range"),
        "target_noise_clip": Field(0.5, (float,), "training", low=0, doc="the target noise is clipped to +-this"),
        "exploration_noise": Field(0.1, (float,), "training", low=0,
                                   doc="std of the runners' Gaussian action noise, a fraction of the half-range"),
        "twin_q": Field(True, (bool,), "training", doc="two critics, the smaller target (TD3's clipped double Q)"),
    }

    def build_policy_module(self, observation_space: object, action_space: object) -> nn.Module:
        """Deterministic actor and critics (Box actions only)."""
        return TD3Module(observation_space, action_space, self.model, twin_q=self.twin_q,
                         exploration_noise=self.exploration_noise, algo=self.algo_name)

    def runner_policy(self, module: nn.Module, rng: np.random.Generator) -> object:
        """The actor with Gaussian noise (numpy for MLPs, torch for CNNs)."""
        return NoisyActor(module, rng, self.exploration_noise)

    def runner_blueprint(self, module: nn.Module) -> MLPBlueprint | None:
        """The noisy actor's numpy twin as plain data (light runners)."""
        return td3_blueprint(module, self.exploration_noise)

    @classmethod
    def algo_class(cls) -> type:
        """:class:`TD3`."""
        return TD3


class DDPGConfig(TD3Config):
    """DDPG: TD3 with one critic, no policy delay and no target noise (SB3's DDPG)."""

    algo_name = "DDPG"
    FIELDS = {
        "policy_delay": shared_field("policy_delay", 1, TD3Config),
        "target_noise": shared_field("target_noise", 0.0, TD3Config),
        "twin_q": shared_field("twin_q", False, TD3Config),
    }

    @classmethod
    def algo_class(cls) -> type:
        """:class:`DDPG`."""
        return DDPG


class TD3Module(BoxCritics, nn.Module):
    """Actor (``pi_encoder``/``pi_head`` -> tanh, scaled to the Box) and critics ``q1`` (and ``q2``) of actions in
    the Box (seen in [-1, 1] with model ``critic_unit_actions``)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict,
                 twin_q: bool = True, exploration_noise: float = 0.1, algo: str = "TD3") -> None:
        super().__init__()
        check_bounded_box(action_space, algo)
        self.exploration_noise = exploration_noise
        self.discrete = False
        self.action_dim = int(np.prod(action_space.shape))
        self.pi_encoder = build_encoder(observation_space, model_config)
        self.pi_head = head(self.pi_encoder.out_dim, self.action_dim, 0.01)
        self.q1 = QCritic(observation_space, self.action_dim, model_config)
        self.q2 = QCritic(observation_space, self.action_dim, model_config) if twin_q else None
        self.set_action_box(action_space, model_config)

    def greedy(self, obs: Any) -> torch.Tensor:
        """The actor's action, in the Box bounds."""
        return torch.tanh(self.pi_head(self.pi_encoder(obs)).float()) * self.action_scale + self.action_bias

    @torch.no_grad()
    def act(self, obs: Any, explore: bool = False) -> torch.Tensor:
        """The actor's action, with the runners' Gaussian noise (clipped to the Box) when ``explore``."""
        action = self.greedy(obs)
        if not explore:
            return action
        noisy = action + torch.randn_like(action) * self.exploration_noise * self.action_scale
        return torch.max(torch.min(noisy, self.action_bias + self.action_scale), self.action_bias - self.action_scale)

    def actor_parameters(self) -> list[nn.Parameter]:
        """The actor's parameters."""
        return [*self.pi_encoder.parameters(), *self.pi_head.parameters()]

    def critic_parameters(self) -> list[nn.Parameter]:
        """The critics' parameters."""
        return [*self.q1.parameters(), *(self.q2.parameters() if self.q2 is not None else [])]


def td3_blueprint(module: TD3Module, noise_std: float) -> MLPBlueprint | None:
    """The runners' noisy actor as plain data, for an MLP on a vector."""
    return mlp_blueprint(module, module.pi_encoder, module.pi_head, kind="noisy_tanh", action_dim=module.action_dim,
                         params={**box_scaling(module), "noise_std": float(noise_std)})


class NoisyActor(NoisyTanh):
    """The runners' policy: the actor plus Gaussian noise, clipped to the Box; uniform random actions while
    ``random_actions`` is set (before learning starts). Numpy on views of the weights for an MLP on a vector."""

    def __init__(self, module: TD3Module, rng: np.random.Generator, noise_std: float) -> None:
        self.module = module
        blueprint = td3_blueprint(module, noise_std)
        if blueprint is not None:
            pre = weight_views(module, blueprint).forward
        else:  # CNNs, Dict observations
            device = module_device(module)  # a GPU with num_gpus_per_env_runner (then no numpy twin)

            def pre(obs: Any) -> np.ndarray:
                with torch.inference_mode():
                    return module.pi_head(module.pi_encoder(to_torch(obs, device))).float().cpu().numpy()

        super().__init__(pre, module.action_dim, module.action_scale.cpu().numpy(), module.action_bias.cpu().numpy(),
                         noise_std, rng)


class TD3Learner(OffPolicyLearner):
    """Critics towards the (clipped double-Q, smoothed) target every step; the actor and the targets every
    ``policy_delay`` steps."""

    config: TD3Config
    optimizer_names = ("critic_optimizer", "actor_optimizer")

    def setup(self) -> None:
        """Targets, an Adam each for the critics and the actor, and the step counter of the delay."""
        super().setup()
        self.critics = self.module.critic_parameters()
        self.critic_optimizer = Adam(self.critics, lr=self.hp["lr"])
        self.actor_optimizer = Adam(self.module.actor_parameters(), lr=self.hp["lr"])
        self.critic_steps = 0

    def replay_step(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor]:
        """One critic step; every ``policy_delay``-th also an actor step and a Polyak update of the targets."""
        critic = self.gradient_step(self.critic_optimizer, self._critic_loss, batch)
        self.critic_steps += 1
        metrics = {"critic_loss": float(critic["loss"]), "q_mean": float(critic["q_mean"])}
        if self.critic_steps % self.config.policy_delay == 0:
            with self.frozen(self.critics):  # the actor's loss differentiates through the critic, not into it
                actor = self.gradient_step(self.actor_optimizer, self._actor_loss, batch)
            polyak_update(self.target, self.module, self.config.tau)
            metrics["actor_loss"] = float(actor["loss"])
        return metrics, critic["td_error"]

    def _critic_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        cfg, module = self.config, self.module
        with torch.no_grad():
            action = self.target.greedy(batch["next_obs"])
            if cfg.target_noise > 0:  # target policy smoothing, in units of the half-range
                noise = (torch.randn_like(action) * cfg.target_noise).clamp(-cfg.target_noise_clip,
                                                                          cfg.target_noise_clip)
                low, high = module.action_bias - module.action_scale, module.action_bias + module.action_scale
                action = torch.max(torch.min(action + noise * module.action_scale, high), low)
            tq1, tq2 = self.target.q_values(batch["next_obs"], action)
            target = batch["rewards"] + batch["discounts"] * (torch.min(tq1, tq2) if tq2 is not None else tq1)
        q1, q2 = module.q_values(batch["obs"], batch["actions"])
        loss = (batch["weights"] * (q1 - target).pow(2)).mean()
        if q2 is not None:
            loss = loss + (batch["weights"] * (q2 - target).pow(2)).mean()
        return loss, {"loss": loss.detach(), "td_error": (target - q1).detach(), "q_mean": q1.detach().mean()}

    def _actor_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        module = self.module
        loss = -module.q1(batch["obs"], module.critic_action(module.greedy(batch["obs"]))).mean()
        return loss, {"loss": loss.detach()}

    def extra_state(self) -> dict:
        """The targets and the critic steps so far (the delay's phase)."""
        return {**super().extra_state(), "critic_steps": self.critic_steps}

    def load_extra_state(self, state: dict) -> None:
        """Inverse of :meth:`extra_state`."""
        super().load_extra_state(state)
        self.critic_steps = int(state["critic_steps"])


class TD3(OffPolicyAlgorithm):
    """TD3 on the shared runners: replay in the driver, :class:`TD3Learner` learning from it."""

    config: TD3Config
    learner_class = TD3Learner

    def exploration(self, env_steps: int) -> dict[str, Any] | None:
        """Uniform random actions until learning starts, then the actor with Gaussian noise; in a multi-agent run
        each trained policy for its first ``num_steps_sampled_before_learning_starts`` agent steps (a policy that
        does not learn: never)."""
        if not self.multi_agent:
            return {"random_actions": bool(env_steps < self.config.num_steps_sampled_before_learning_starts)}
        steps = self._policy_steps()
        return {"policies": {pid: {"random_actions": pid in self.streams and steps.get(pid, 0)
                                   < self.streams[pid].config.num_steps_sampled_before_learning_starts}
                             for pid in self.config.policies}}


class DDPG(TD3):
    """DDPG: :class:`TD3` run with a :class:`DDPGConfig`."""
