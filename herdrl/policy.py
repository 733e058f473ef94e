"""A trained policy for inference: no envs, no runners, no Ray.

    from herdrl.policy import Policy
    policy = Policy.from_checkpoint("results/CartPole-v1/PPO_.../checkpoint_000060")
    action = policy.compute_single_action(obs)

A recurrent policy (``model={"use_lstm": True}``) takes and returns its state::

    state = policy.initial_state()                     # zeros: an episode's start
    action, state = policy.compute_single_action(obs, state=state)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from herdrl.filters import Normalizer, model_observation_space, policy_slice
from herdrl.models.distributions import ActionDistribution
from herdrl.models.encoders import to_torch
from herdrl.models.protocol import map_state, state_rows, state_to_numpy, state_to_torch
from herdrl.obs import ObsSpec


class Policy:
    """A trained module with the spaces it was trained on, and its observation filter if it had one: it takes raw
    observations and normalises them with the run's statistics (frozen: inference never updates them)."""

    def __init__(self, module: torch.nn.Module, observation_space: gym.Space, action_space: gym.Space,
                 normalizer: Normalizer | None = None) -> None:
        self.module = module
        self.observation_space = observation_space
        self.action_space = action_space
        self.obs_spec = ObsSpec(observation_space)
        self.normalizer = normalizer if normalizer is not None and normalizer.observations else None
        #: Whether the module carries a state (an LSTM): actions then come with the next state.
        self.recurrent = bool(getattr(module, "recurrent", False))
        self._actions = ActionDistribution(action_space)

    def initial_state(self, batch: int = 1) -> Any:
        """The state entering an episode's first step, as the module declares it (``herdrl.models.protocol``):
        an LSTM's ``(batch, 2, lstm_cell_size)`` zeros, a QMIX team's ``(batch, agents, rnn_hidden_dim)``, numpy
        leaves; None when the policy is not recurrent."""
        return state_to_numpy(self.module.initial_state(batch)) if self.recurrent else None

    @classmethod
    def from_checkpoint(cls, path: str | Path, policy_id: str | None = None) -> Policy:
        """Load the policy of a checkpoint (or of the newest valid checkpoint in a trial directory); for a
        multi-agent run's, the policy ``policy_id`` (which may be left out when the run had one policy)."""
        from herdrl.checkpoint import CheckpointError, checkpoint_config, read_meta, read_tensors, space_from_json
        from herdrl.multi_agent import actor_normalizer, actor_observation_space
        from herdrl.registry import get_config_class

        meta = read_meta(Path(path))
        obs_space = space_from_json(meta["spaces"]["observation"])
        action_space = space_from_json(meta["spaces"]["action"])
        config = get_config_class(meta["algorithm"]).from_dict(checkpoint_config(meta, makes_env=False))
        tensors = read_tensors(meta["path"])
        state = tensors["learner"]
        if config.policies is not None:  # multi-agent: the spaces are Dicts by policy id
            ids = sorted(obs_space.spaces)
            if policy_id is None and len(ids) == 1:
                policy_id = ids[0]
            if policy_id not in ids:
                raise CheckpointError(f"checkpoint '{meta['path']}' holds policies {ids}: pass policy_id= (herd: "
                                      "--policy-id) one of them")
            obs_space, action_space = obs_space[policy_id], action_space[policy_id]
            state = state.get("policies", {}).get(policy_id, {})
        elif policy_id is not None:
            raise CheckpointError(f"checkpoint '{meta['path']}' is of a single-agent run: it has no policy "
                                  f"{policy_id!r} (leave policy_id out)")
        module = config.build_module(model_observation_space(obs_space, config), action_space)
        try:
            module.load_state_dict(state["module"])
        except (KeyError, RuntimeError) as exc:
            raise CheckpointError(f"checkpoint '{meta['path']}': weights do not fit its model ({exc})") from None
        module.eval()
        normalizer = Normalizer(obs_space, config)
        filters = tensors.get("filters", {})
        normalizer.load_state(policy_slice(filters, policy_id) if config.policies is not None else filters)
        # A centralised critic's policy (MAPPO) acts on its agent's own observation: the global state is its critic's.
        return cls(module, actor_observation_space(obs_space), action_space, actor_normalizer(normalizer, obs_space))

    def _model_input(self, obs: Any) -> Any:
        """Stored observations -> tensors the module reads (normalised if the run filtered them)."""
        if self.normalizer is not None:
            obs = self.normalizer.normalize(obs)
        return to_torch(obs, self._device())

    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    @torch.no_grad()
    def compute_actions(self, obs_batch: Any, explore: bool = False, state: np.ndarray | None = None) -> Any:
        """Actions for a batch of raw observations (for Dict/Tuple spaces: as a vector env batches them, a dict or
        tuple of batched arrays): env-ready (Discrete offset applied, Box clipped). A recurrent policy returns
        ``(actions, next_state)`` and starts from zeros when ``state`` is None."""
        obs = self._model_input(self.obs_spec.batch(obs_batch))
        if not self.recurrent:
            return self._env_actions(self.module.act(obs, explore=explore).cpu().numpy())
        actions, state = self._recurrent_act(obs, explore, state)
        return self._env_actions(actions), state

    def _recurrent_act(self, obs: Any, explore: bool, state: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        batch = len(next(iter(obs.values())) if isinstance(obs, dict) else obs)
        if state is None:
            state_in = self.module.initial_state(batch)
        else:  # a one-tensor state in any array form (a list of rows, [h, c] per row, ...), as before the protocol
            initial = self.module.initial_state(1)
            state_in = state_to_torch(np.asarray(state, np.float32) if torch.is_tensor(initial) else state,
                                      self._device())
        dist_inputs, state_out = self.module.forward_exploration(obs, state_in)
        actions = self.module.act_with_noise(dist_inputs, self.module.torch_noise(dist_inputs) if explore else None)
        return actions.cpu().numpy(), state_to_numpy(state_out)

    def _env_actions(self, actions: np.ndarray) -> Any:
        return self._actions.to_env(actions)

    @torch.no_grad()
    def compute_single_action(self, obs: Any, explore: bool = False, state: np.ndarray | None = None) -> Any:
        """The action for one observation: an int (Discrete), an array (Box, MultiDiscrete, MultiBinary) or a
        tuple of those (Tuple). A recurrent policy returns ``(action, next_state)`` (state ``(2, H)`` or
        ``(1, 2, H)``; None: an episode's start)."""
        obs = self._model_input(self.obs_spec.one(obs))
        if not self.recurrent:
            return _first(self.action_space, self._env_actions(self.module.act(obs, explore=explore).cpu().numpy()))
        if state is not None:  # one row, with its batch dimension or without
            state = _one_row(state, self.initial_state(1))
        actions, state = self._recurrent_act(obs, explore, state)
        return _first(self.action_space, self._env_actions(actions)), state_rows(state, 0)


def _one_row(state: Any, like: Any) -> Any:
    """A user's state for one row shaped as ``like`` (the module's initial state for one row). A module whose
    state is one tensor takes it in any array form (an array, RLlib's ``[h, c]`` list, a tuple, nested lists from
    JSON); a state of several tensors is given in the module's own structure."""
    if isinstance(like, np.ndarray):
        return np.asarray(state, np.float32).reshape(like.shape)
    return map_state(lambda leaf, shape_of: np.asarray(leaf, np.float32).reshape(shape_of.shape), state, like)


def _first(space: gym.Space, batch: Any) -> Any:
    """Element 0 of a batch of env actions, in the space's own form."""
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_first(sub, part) for sub, part in zip(space.spaces, batch, strict=True))
    return int(batch[0]) if isinstance(space, gym.spaces.Discrete) else batch[0]
