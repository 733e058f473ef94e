"""Deep Q-Networks (Mnih et al. 2015) with the usual improvements: double Q (van Hasselt et al. 2016),
dueling heads (Wang et al. 2016), n-step returns, prioritized replay (Schaul et al. 2016), hard or Polyak
target updates, and an epsilon schedule.

Runners act epsilon-greedily with the current weights; the replay buffer and the learner live in the driver.
One iteration samples ``min_sample_timesteps_per_iteration`` env steps in rounds of one fragment per runner,
each round followed by the gradient steps that keep replayed/sampled steps at ``training_intensity``.
Training episodes explore, so "solved" is judged on greedy evaluation episodes (``evaluation/...``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from herdrl.algorithms.base import Algorithm
from herdrl.buffers import REPLAY_DEFAULTS, check_replay_config, fragment_transitions, make_buffer
from herdrl.config import AlgorithmConfig, Field, shared_field
from herdrl.errors import ConfigError
from herdrl.optim import Adam


class DQNConfig(AlgorithmConfig):
    """DQN settings (RLlib's key names). Defaults follow rl-baselines3-zoo's CartPole-v1 DQN."""

    algo_name = "DQN"
    #: Off-policy training episodes explore: stop and "solved" use the greedy evaluation metric.
    stop_metric = "evaluation/episode_return_mean"
    FIELDS = {
        "num_envs_per_env_runner": shared_field("num_envs_per_env_runner", 4),
        "rollout_fragment_length": shared_field("rollout_fragment_length", 64),
        "train_batch_size": shared_field("train_batch_size", 64),  # replayed transitions per gradient step
        "lr": shared_field("lr", 2.3e-3),
        "gamma": shared_field("gamma", 0.99),
        "grad_clip": shared_field("grad_clip", 10.0),
        "model": shared_field("model", {"fcnet_hiddens": [256, 256], "fcnet_activation": "relu",
                                        "vf_share_layers": False, "free_log_std": True}),
        "evaluation_interval": shared_field("evaluation_interval", 1),
        "replay_buffer_config": Field(REPLAY_DEFAULTS, (dict,), "training",
                                      doc="type uniform|prioritized, capacity, alpha, beta"),
        "num_steps_sampled_before_learning_starts": Field(1000, (int,), "training", low=0),
        "min_sample_timesteps_per_iteration": Field(1000, (int,), "training", low=1),
        "training_intensity": Field(32.0, (float,), "training", low=0, low_open=True,
                                    doc="replayed transitions per sampled env step"),
        "target_network_update_freq": Field(256, (int,), "training", low=1, doc="env steps between updates"),
        "tau": Field(1.0, (float,), "training", low=0, low_open=True, high=1, doc="1: hard copy; <1: Polyak"),
        "double_q": Field(True, (bool,), "training"),
        "dueling": Field(False, (bool,), "training"),
        "n_step": Field(1, (int,), "training", low=1),
        "epsilon": Field([[0, 1.0], [8000, 0.04]], (list,), "training",
                         doc="[[env_step, epsilon], ...] piecewise linear"),
    }
    ALIASES = {"target_update_freq": "target_network_update_freq", "learning_starts":
               "num_steps_sampled_before_learning_starts"}

    def validate_algorithm(self) -> None:
        """Replay settings, the epsilon schedule, and Discrete actions (checked at build)."""
        check_replay_config(self.replay_buffer_config, self.train_batch_size)
        points = self.epsilon
        if not points or not all(isinstance(p, (list, tuple)) and len(p) == 2 and 0 <= p[1] <= 1 for p in points):
            raise ConfigError(f"config key 'epsilon' got {points!r}; expected [[env_step, epsilon in [0, 1]], ...]")

    def build_module(self, obs_dim: int, action_space: object) -> nn.Module:
        """A Q-network (dueling if asked)."""
        import gymnasium as gym

        from herdrl.models.q_network import QNetwork

        if not isinstance(action_space, gym.spaces.Discrete):
            raise ConfigError(f"DQN needs Discrete actions; this env has {action_space} (use PPO or SAC)")
        return QNetwork(obs_dim, action_space, self.model, dueling=self.dueling)

    def runner_policy(self, module: nn.Module, rng: np.random.Generator) -> object:
        """Epsilon-greedy in numpy."""
        from herdrl.models.q_network import NumpyQPolicy

        return NumpyQPolicy(module, rng)

    @classmethod
    def algo_class(cls) -> type:
        """:class:`DQN`."""
        return DQN


class DQN(Algorithm):
    """DQN on the shared runners; replay buffer and target network in the driver."""

    config: DQNConfig

    def setup(self) -> None:
        """Target network, optimizer, replay buffer."""
        cfg = self.config
        self.target = cfg.build_module(self.encode.dim, self.action_space).to(self.device)
        self.target.load_state_dict(self.module.state_dict())
        self.target.requires_grad_(False)
        self.optimizer = Adam(self.module.parameters(), lr=cfg.lr)
        self.buffer = make_buffer(cfg.replay_buffer_config, self.encode.dim, self.rng)
        self._since_target_update = 0
        self._replay_debt = 0.0  # replayed transitions owed to keep training_intensity

    def epsilon_at(self, env_steps: int) -> float:
        """The epsilon schedule at ``env_steps``."""
        xs, ys = zip(*self.config.epsilon, strict=True)
        return float(np.interp(env_steps, xs, ys))

    def training_step(self) -> dict[str, float]:
        """Sample rounds and gradient steps until this iteration sampled its share of env steps."""
        cfg = self.config
        sampled, losses, td, updates = 0, [], [], 0
        while sampled < cfg.min_sample_timesteps_per_iteration:
            epsilon = self.epsilon_at(self.env_steps_lifetime + self._iter_steps)
            for fragment in self.sample({"epsilon": epsilon}):
                self.buffer.add(fragment_transitions(fragment, cfg.gamma, cfg.n_step))
            new_steps = self._iter_steps - sampled
            sampled = self._iter_steps
            if self.env_steps_lifetime + sampled < cfg.num_steps_sampled_before_learning_starts:
                continue
            self._replay_debt += cfg.training_intensity * new_steps
            while self._replay_debt >= cfg.train_batch_size:
                self._replay_debt -= cfg.train_batch_size
                loss, mean_td = self._update()
                losses.append(loss)
                td.append(mean_td)
                updates += 1
            self._since_target_update += new_steps
            if self._since_target_update >= cfg.target_network_update_freq:
                self._since_target_update = 0
                self._update_target()
        return {"loss": float(np.mean(losses)) if losses else float("nan"),
                "mean_abs_td_error": float(np.mean(td)) if td else float("nan"),
                "epsilon": self.epsilon_at(self.env_steps_lifetime + sampled),
                "num_gradient_updates": updates, "replay_buffer_size": len(self.buffer)}

    def _update(self) -> tuple[float, float]:
        cfg = self.config
        data, slots, weights = self.buffer.sample(cfg.train_batch_size)
        batch = {k: torch.from_numpy(v).to(self.device) for k, v in data.items()}
        q = self.module(batch["obs"]).gather(1, batch["actions"].unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_target = self.target(batch["next_obs"])
            if cfg.double_q:  # pick with the online net, evaluate with the target net
                best = self.module(batch["next_obs"]).argmax(1, keepdim=True)
                next_q = next_target.gather(1, best).squeeze(1)
            else:
                next_q = next_target.max(1).values
            target = batch["rewards"] + batch["discounts"] * next_q
        td_error = target - q
        loss = (torch.from_numpy(weights).to(self.device)
                * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.module.parameters(), cfg.grad_clip or float("inf"))
        self.optimizer.step()
        td_np = td_error.detach().cpu().numpy()
        self.buffer.update_priorities(slots, td_np)
        return loss.item(), float(np.abs(td_np).mean())

    @torch.no_grad()
    def _update_target(self) -> None:
        tau = self.config.tau
        for target, online in zip(self.target.parameters(), self.module.parameters(), strict=True):
            target.lerp_(online, tau)

    def learner_state(self) -> dict:
        """Module, optimizer and target network (the replay buffer is not saved: it refills after a resume)."""
        return {**super().learner_state(), "target": self.target.state_dict()}

    def load_learner_state(self, state: dict) -> None:
        """Inverse of :meth:`learner_state`."""
        super().load_learner_state(state)
        self.target.load_state_dict(state["target"])
