"""Deep Q-Networks (Mnih et al. 2015) with the usual improvements: double Q (van Hasselt et al. 2016),
dueling heads (Wang et al. 2016), n-step returns, prioritized replay (Schaul et al. 2016), hard or Polyak
target updates, and an epsilon schedule.

Runners act epsilon-greedily with the current weights; the replay buffer lives in the driver, the learner in
the driver or as N data-parallel learners (the sampling/replay loop is shared with SAC: ``off_policy.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from herdrl.algorithms.off_policy import OffPolicyAlgorithm, OffPolicyConfig, OffPolicyLearner
from herdrl.config import MODEL_DEFAULTS, Field, shared_field
from herdrl.errors import ConfigError
from herdrl.optim import Adam


class DQNConfig(OffPolicyConfig):
    """DQN settings (RLlib's key names). Defaults follow rl-baselines3-zoo's CartPole-v1 DQN."""

    algo_name = "DQN"
    FIELDS = {
        "num_envs_per_env_runner": shared_field("num_envs_per_env_runner", 4),
        "rollout_fragment_length": shared_field("rollout_fragment_length", 64),
        "train_batch_size": shared_field("train_batch_size", 64),  # replayed transitions per gradient step
        "lr": shared_field("lr", 2.3e-3),
        "gamma": shared_field("gamma", 0.99),
        "grad_clip": shared_field("grad_clip", 10.0),
        "model": shared_field("model", {**MODEL_DEFAULTS, "fcnet_hiddens": [256, 256], "fcnet_activation": "relu"}),
        "target_network_update_freq": Field(256, (int,), "training", low=1, doc="env steps between updates"),
        "tau": Field(1.0, (float,), "training", low=0, low_open=True, high=1, doc="1: hard copy; <1: Polyak"),
        "double_q": Field(True, (bool,), "training"),
        "dueling": Field(False, (bool,), "training"),
        "epsilon": Field([[0, 1.0], [8000, 0.04]], (float,), "training", low=0, high=1, schedule=True,
                         doc="exploration: [[env_step, epsilon], ...] piecewise linear (a schedule), or a constant"),
    }
    ALIASES = {"target_update_freq": "target_network_update_freq"}

    def build_policy_module(self, observation_space: object, action_space: object) -> nn.Module:
        """A Q-network (dueling if asked)."""
        import gymnasium as gym

        from herdrl.models.q_network import QNetwork

        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"DQN needs Discrete actions; this env has {action_space} (use PPO or SAC)")
        return QNetwork(observation_space, action_space, self.model, dueling=self.dueling)

    def runner_policy(self, module: nn.Module, rng: np.random.Generator) -> object:
        """Epsilon-greedy (numpy for MLPs, torch for CNNs)."""
        from herdrl.models.q_network import EpsilonGreedyPolicy

        return EpsilonGreedyPolicy(module, rng)

    def runner_blueprint(self, module: nn.Module) -> object:
        """The epsilon-greedy policy's numpy twin as plain data (light runners)."""
        from herdrl.models.q_network import q_blueprint

        return q_blueprint(module)

    @classmethod
    def algo_class(cls) -> type:
        """:class:`DQN`."""
        return DQN


class DQNLearner(OffPolicyLearner):
    """DQN's update: a Huber-loss step towards the (double) Q target, and target updates on schedule."""

    config: DQNConfig

    def setup(self) -> None:
        """Target network and optimizer."""
        super().setup()
        self.optimizer = Adam(self.module.parameters(), lr=self.hp["lr"])
        self._since_target_update = 0

    def replay_step(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], torch.Tensor]:
        """One step on :meth:`loss` over the batch (this learner's rows of it, with N learners)."""
        stats = self.gradient_step(self.optimizer, self.loss, batch, None,
                                   self.config.grad_clip)
        return {"loss": float(stats["loss"]), "mean_abs_td_error": float(stats["td_error"].abs().mean())}, \
            stats["td_error"]

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Huber loss towards r + discount * Q_target(s', a*) (a* by the online net with double Q; both over the
        actions an ``action_mask`` of s' allows), weighted by the importance weights; the TD errors in the stats."""
        q = self.module(batch["obs"]).gather(1, batch["actions"].unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_obs = batch["next_obs"]
            next_target = self.target.allowed(self.target(next_obs), next_obs)  # actions s' allows only
            if self.config.double_q:  # pick with the online net, evaluate with the target net
                best = self.module.allowed(self.module(next_obs), next_obs).argmax(1, keepdim=True)
                next_q = next_target.gather(1, best).squeeze(1)
            else:
                next_q = next_target.max(1).values
            target = batch["rewards"] + batch["discounts"] * next_q
        loss = (batch["weights"] * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()
        return loss, {"loss": loss.detach(), "td_error": (target - q).detach()}

    def advance_learning_clock(self, env_steps: int) -> None:
        """Update the target network every ``target_network_update_freq`` env steps, exactly: as many updates
        as fell due (``k`` Polyak updates with ``tau`` in one, as ``1 - (1 - tau)**k``), the remainder kept."""
        self._since_target_update += env_steps
        due, self._since_target_update = divmod(self._since_target_update, self.config.target_network_update_freq)
        if due:
            polyak_update(self.target, self.module, 1.0 - (1.0 - self.config.tau) ** due)

    def extra_state(self) -> dict:
        """The target network and the env steps since its last update."""
        return {**super().extra_state(), "since_target_update": self._since_target_update}

    def load_extra_state(self, state: dict) -> None:
        """Inverse of :meth:`extra_state`."""
        super().load_extra_state(state)
        self._since_target_update = int(state.get("since_target_update", 0))  # format 1 did not save it


class DQN(OffPolicyAlgorithm):
    """DQN on the shared runners; the replay buffer in the driver, :class:`DQNLearner` learning from it."""

    config: DQNConfig
    learner_class = DQNLearner

    def exploration(self, env_steps: int) -> dict[str, Any]:
        """The epsilon schedule at ``env_steps``; in a multi-agent run each policy's own, at its agent steps."""
        if not self.multi_agent:
            return {"epsilon": self.schedules["epsilon"](env_steps)}
        return {"policies": {pid: {"epsilon": epsilon} for pid, epsilon in self._epsilons().items()}}

    def exploration_metrics(self) -> dict[str, Any]:
        """``epsilon`` now (``epsilon/<policy>`` for each trained policy of a multi-agent run)."""
        if not self.multi_agent:
            return super().exploration_metrics()
        return {f"epsilon/{pid}": epsilon for pid, epsilon in self._epsilons().items() if pid in self.streams}

    def _epsilons(self) -> dict[str, float]:
        """Each policy's epsilon: a trained one's schedule at its agent steps; one that does not learn (a
        self-play snapshot) plays at its schedule's end, as the policy it copies had come to play."""
        steps = self._policy_steps()
        return {pid: schedules["epsilon"](steps.get(pid, 0) if pid in self.streams else 2**62)
                for pid, schedules in self._policy_schedules.items()}


@torch.no_grad()
def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- tau * online + (1 - tau) * target (tau 1: a hard copy), in one multi-tensor call."""
    torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)
