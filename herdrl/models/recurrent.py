"""Recurrent policies (RLlib's ``use_lstm``): encoder -> LSTM -> policy and value heads.

The state (the module protocol's, ``herdrl.models.protocol``) is an LSTM's (h, c), one tensor
``(batch, 2, lstm_cell_size)``. Runners carry each env's state from step to step
and across fragments, and zero it when an episode begins: after a reset-only step (NEXT_STEP autoreset, see
``herdrl.rollout.runner``) the next step starts a new episode. Fragments record the state entering every
``max_seq_len``-th step; the learner unrolls sequences of ``max_seq_len`` steps from those states (truncated
backpropagation through time), zeroing the state inside a sequence where the runner did, and masks the
padding and reset-only steps out of the loss.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.models.actor_critic import ActorCritic, CentralCriticActorCritic, own_observation, own_wrapper
from herdrl.models.encoders import head, module_device, to_torch
from herdrl.models.protocol import reset_rows, state_to_numpy, state_to_torch
from herdrl.obs import obs_map


class RecurrentActorCritic(ActorCritic):
    """An :class:`ActorCritic` with an LSTM between its encoder and its heads (one encoder and one LSTM for
    both heads, as RLlib's LSTM wrapper)."""

    recurrent = True

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict) -> None:
        super().__init__(observation_space, action_space, {**model_config, "vf_share_layers": True})
        self.cell_size = int(model_config.get("lstm_cell_size", 256))
        self.lstm = nn.LSTMCell(self.pi_encoder.out_dim, self.cell_size)
        self.pi_head = head(self.cell_size, self.pi_head.out_features, 0.01)
        self.vf_head = head(self.cell_size, 1, 1.0)

    def initial_state(self, batch: int) -> torch.Tensor:
        """Zeros: the state entering an episode's first step."""
        return torch.zeros(batch, 2, self.cell_size, device=self.vf_head.weight.device)

    def step(self, obs: Any, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step for a batch: (LSTM output, next state)."""
        h, c = self.lstm(self.pi_encoder(obs), (state[:, 0], state[:, 1]))
        return h, torch.stack([h, c], dim=1)

    def unroll(self, obs: Any, state: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution inputs and values ``(N, L, ...)`` for N sequences of L steps (``obs``: ``(N, L, ...)``)
        from their entering ``state`` ``(N, 2, H)``; where ``starts[n, t]`` the state is zeroed before step t."""
        out = self.unroll_features(obs, state, starts)
        return self.apply_mask(self._with_log_std(self.pi_head(out)), obs), self.values_from_features(out)

    def unroll_features(self, obs: Any, state: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """The LSTM's outputs ``(N, L, H)`` along the sequences (see :meth:`unroll`)."""
        n, steps = starts.shape
        features = self.pi_encoder(obs_map(lambda o: o.reshape(n * steps, *o.shape[2:]), obs))
        features = features.reshape(n, steps, -1)
        h, c = state[:, 0], state[:, 1]
        outputs = []
        for t in range(steps):
            keep = (~starts[:, t]).unsqueeze(-1).to(h.dtype)
            h, c = self.lstm(features[:, t], (h * keep, c * keep))
            outputs.append(h)
        return torch.stack(outputs, dim=1)

    def step_value(self, obs: Any, state: torch.Tensor) -> torch.Tensor:
        """The value of one step's observations entering ``state`` (a fragment's bootstrap value)."""
        return self.values_from_features(self.step(obs, state)[0])

    # The module protocol (herdrl.models.protocol): the state is one tensor, (batch, 2, lstm_cell_size).
    def forward_exploration(self, obs: Any, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One acting step: (distribution inputs, next state)."""
        dist_inputs, _, state = self.step_dist_inputs(obs, state)
        return dist_inputs, state

    def forward_train(self, obs: Any, state: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution inputs and values along sequences (:meth:`unroll`)."""
        return self.unroll(obs, state, starts)

    def forward_value(self, obs: Any, state: torch.Tensor) -> torch.Tensor:
        """One step's values entering ``state`` (:meth:`step_value`)."""
        return self.step_value(obs, state)

    def step_dist_inputs(self, obs: Any, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step for a batch: (distribution inputs, LSTM output, next state)."""
        out, state = self.step(obs, state)
        return self.apply_mask(self._with_log_std(self.pi_head(out)), obs), out, state

    # A recurrent module needs its state: the stateless entry points of ActorCritic do not apply.
    def forward(self, obs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Refused: use :meth:`step` or :meth:`unroll` with a state."""
        raise TypeError("a recurrent module runs with its state: use step() or unroll()")

    def dist_inputs(self, obs: Any) -> torch.Tensor:
        """Refused: use :meth:`step` or :meth:`unroll` with a state."""
        raise TypeError("a recurrent module runs with its state: use step() or unroll()")

    def value(self, obs: Any) -> torch.Tensor:
        """Refused: use :meth:`step` or :meth:`unroll` with a state."""
        raise TypeError("a recurrent module runs with its state: use step() or unroll()")

    def greedy_step(self, obs: Any, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The most likely action and the next state."""
        dist_inputs, _, state = self.step_dist_inputs(obs, state)
        return self.act_with_noise(dist_inputs, None), state


class RecurrentCentralCritic(RecurrentActorCritic):
    """MAPPO with a recurrent actor: the LSTM actor reads the agent's own observation; a feed-forward critic reads
    that and the global state (its own encoder, as :class:`~herdrl.models.actor_critic.CentralCriticActorCritic`'s):
    the state ``(batch, 2, H)`` is the actor's alone. The actor's weights are named as a plain
    :class:`RecurrentActorCritic`'s, so a trained actor acts on its own observations (evaluation, export)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, model_config: dict) -> None:
        from herdrl.models.encoders import build_encoder

        actor_space = CentralCriticActorCritic.own_space(observation_space)
        super().__init__(actor_space, action_space, model_config)
        self.vf_encoder = build_encoder(observation_space, model_config)
        self.vf_head = head(self.vf_encoder.out_dim, 1, 1.0)
        self._wrapped = own_wrapper(actor_space)

    def actor_input(self, obs: Any) -> Any:
        """The agent's own observation (see :meth:`CentralCriticActorCritic.actor_input`)."""
        return own_observation(obs, self._wrapped)

    def step_dist_inputs(self, obs: Any, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step of the actor on the agent's own observation: (distribution inputs, LSTM output, next
        state)."""
        return super().step_dist_inputs(self.actor_input(obs), state)

    def step(self, obs: Any, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of the actor's LSTM on the agent's own observation."""
        return super().step(self.actor_input(obs), state)

    def unroll(self, obs: Any, state: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The actor's distribution inputs along the sequences and the critic's values of every step."""
        own = self.actor_input(obs)
        out = self.unroll_features(own, state, starts)
        n, steps = starts.shape
        flat = obs_map(lambda o: o.reshape(n * steps, *o.shape[2:]), obs)
        values = self.values_from_features(self.vf_encoder(flat)).reshape(n, steps)
        return self.apply_mask(self._with_log_std(self.pi_head(out)), own), values

    def step_value(self, obs: Any, state: torch.Tensor) -> torch.Tensor:
        """V(own observation, global state): the critic needs no state."""
        return self.values_from_features(self.vf_encoder(obs))


class CarriedState:
    """A runner policy's recurrent state: ``self.state``, one row per env, of ``self.module``'s kind (any state of
    the module protocol, ``herdrl.models.protocol``: its leaves on ``self.device``)."""

    state: Any
    device: torch.device
    module: Any

    def zero_state(self, envs: np.ndarray) -> None:
        """A new episode begins at these envs' next step: their rows go back to the module's initial state."""
        if envs.any():
            rows = torch.from_numpy(envs).to(self.device)
            self.state = reset_rows(self.state, self.module.initial_state(len(envs)), rows)

    def get_state(self) -> Any:
        """Every env's state, float32 numpy leaves ``(num_envs, ...)`` (copies)."""
        return state_to_numpy(self.state)

    def set_state(self, state: Any) -> None:
        """Act next from ``state`` (numpy leaves ``(batch, ...)``; multi-agent runners keep a state per agent and
        set the states of the agents deciding before each step)."""
        self.state = state_to_torch(state, self.device)


class RecurrentPolicy(CarriedState):
    """Runner-side policy of a module with a state: torch inference through the module protocol's
    ``forward_exploration``, one state per env, noise from the runner's generator (the interface of
    ``TorchPolicy`` plus the state)."""

    recurrent = True

    def __init__(self, module: Any, rng: np.random.Generator, num_envs: int) -> None:
        self.module, self.rng = module, rng
        self.device = module_device(module)
        self.state = module.initial_state(num_envs)  # on the module's device

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Exploration noise for a whole fragment."""
        return self.module.dist.draw_noise(self.rng, steps, batch)

    @torch.inference_mode()
    def act(self, obs: Any, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Actions for every env's observation; the state moves one step."""
        dist_inputs, self.state = self.module.forward_exploration(to_torch(obs, self.device), self.state)
        if explore and noise is None:
            noise = self.noise(1, len(dist_inputs))[0]
        noise = torch.from_numpy(noise).to(self.device) if explore else None
        return self.module.act_with_noise(dist_inputs, noise).cpu().numpy()

    @torch.inference_mode()
    def act_logp(self, obs: Any, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions and their log-probabilities (V-trace's behaviour policy); the state moves one step."""
        dist_inputs, self.state = self.module.forward_exploration(to_torch(obs, self.device), self.state)
        actions = self.module.act_with_noise(dist_inputs, torch.from_numpy(noise).to(self.device))
        return actions.cpu().numpy(), self.module.log_prob_entropy(dist_inputs, actions)[0].cpu().numpy()
