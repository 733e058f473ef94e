"""Export the greedy policy of a checkpoint as a standalone file: ``torch.export`` (.pt2) or ONNX.

The exported program takes a batch of *raw* observations as herdrl stores them (``(batch, *obs_shape)``: float32
for a float Box — cast float64 observations first —, the Box's own dtype for integer Boxes such as uint8 frames,
int64 for Discrete and MultiDiscrete, int8 for MultiBinary) and returns env-ready actions (int64 indices,
float32 clipped to the Box bounds, int8 bits for MultiBinary) — no herdrl needed to run it::

    program = torch.export.load("policy.pt2").module();  actions = program(obs)
    session = onnxruntime.InferenceSession("policy.onnx");  actions = session.run(None, {"obs": obs})[0]

Dict and Tuple observations are one input per leaf, in the order ``herdrl.obs.leaf_spaces`` gives (Dict keys
as Gymnasium orders them, Tuple items in order), named ``obs/<path>`` in ONNX (``obs/image``, ``obs/state/pos``,
``obs/0``); Tuple actions are one output per part in the same flattened order, named ``action/<path>``. A
recurrent policy also takes its state ``(batch, 2, lstm_cell_size)`` (``state_in``, zeros at an episode's start)
after the observations and returns the next one (``state_out``) after the actions (a module whose state has
several tensors, ``herdrl.models.protocol``: ``state_in/<i>`` and ``state_out/<i>``, in its leaves' order). A run
with ``observation_filter="MeanStdFilter"`` has its statistics baked into the program: it takes raw observations.
One agent of a QMIX/VDN team can be exported alone (``agent=``, ``herd export --agent``: :class:`AgentGreedy`).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.errors import HerdError
from herdrl.filters import Normalizer
from herdrl.models.distributions import ActionDistribution
from herdrl.models.protocol import from_leaves, map_state, state_leaves
from herdrl.models.q_network import masked_q
from herdrl.obs import leaf_spaces
from herdrl.policy import Policy

FORMATS = ("torch-export", "onnx")


class _EnvAction(nn.Module):
    """One action part's stored columns -> the env's form (shifted indices, clipped floats, int8 bits)."""

    def __init__(self, space: gym.Space) -> None:
        super().__init__()
        self.kind = type(space).__name__
        self.shape = tuple(space.shape or ())
        if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            start = np.asarray(space.start).reshape(-1)
            self.register_buffer("start", torch.as_tensor(start, dtype=torch.int64))
        if isinstance(space, gym.spaces.Box):
            self.register_buffer("low", torch.as_tensor(space.low.reshape(-1), dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(space.high.reshape(-1), dtype=torch.float32))

    def forward(self, columns: torch.Tensor) -> torch.Tensor:
        """``columns``: (batch,) for a lone Discrete space, else (batch, width)."""
        if self.kind == "Box":
            return torch.clamp(columns, self.low, self.high).reshape(columns.shape[0], *self.shape)
        columns = columns.to(torch.int64)  # a Tuple's parts are stored as floats (exact indices)
        if self.kind == "Discrete":
            return columns.reshape(-1) + self.start[0]
        if self.kind == "MultiDiscrete":
            columns = columns + self.start
        elif self.kind == "MultiBinary":
            columns = columns.to(torch.int8)  # the dtype the env takes
        return columns.reshape(columns.shape[0], *self.shape)


class GreedyPolicy(nn.Module):
    """Raw observations in (one tensor per observation leaf), greedy env actions out (one per action part)."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        self.module = policy.module  # any herdrl network: its encoder takes raw observations, greedy() the action
        self.leaf_names = list(policy.obs_spec.leaves)
        # The run's observation filter, baked in: the program takes raw observations.
        self.normalize = None if policy.normalizer is None else ObsNormalizer(policy.normalizer, self.leaf_names)
        self.recurrent = policy.recurrent  # then the last inputs are the state's leaves, the last outputs the next's
        #: The module's state as it declares it (``herdrl.models.protocol``): how many leaves, nested how.
        self.state_structure = map_state(lambda _: None, policy.initial_state(1)) if self.recurrent else None
        self.state_size = len(state_leaves(self.state_structure)) if self.recurrent else 0
        self.single_obs = policy.obs_spec.single
        self.tuple_actions = isinstance(policy.action_space, gym.spaces.Tuple)
        dist = ActionDistribution(policy.action_space)
        self.widths = dist.widths
        self.parts = nn.ModuleList(_EnvAction(space) for space in dist.parts)

    def forward(self, *obs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Greedy env actions for a batch of raw observations (one tensor per leaf, in ``leaf_names`` order);
        a recurrent policy takes its state's leaves after them (an LSTM's one ``(batch, 2, H)``) and returns the
        next state's last."""
        state = None
        if self.recurrent:
            obs, leaves = obs[:len(obs) - self.state_size], list(obs[len(obs) - self.state_size:])
            state = from_leaves(self.state_structure, leaves)
        if self.normalize is not None:
            obs = self.normalize(*obs)
        inputs = obs[0] if self.single_obs else dict(zip(self.leaf_names, obs, strict=True))
        if state is None:
            action = self.module.greedy(inputs)
        else:
            action, state = self.module.greedy_step(inputs, state)
        if not self.tuple_actions:
            outputs = (self.parts[0](action),)
        else:
            columns = torch.split(action, self.widths, dim=-1)
            outputs = tuple(part(c) for part, c in zip(self.parts, columns, strict=True))
        if state is not None:
            return (*outputs, *state_leaves(state))
        return outputs if self.tuple_actions else outputs[0]


def input_names(policy: Policy) -> list[str]:
    """The exported program's input names: ``obs``, or ``obs/<leaf path>`` for Dict/Tuple observations."""
    names = ["obs"] if policy.obs_spec.single else [f"obs/{name}" for name in policy.obs_spec.leaves]
    return names + _state_names(policy, "state_in")


def output_names(policy: Policy) -> list[str]:
    """``action``, or ``action/<part path>`` for Tuple actions."""
    space = policy.action_space
    names = ["action"] if not isinstance(space, gym.spaces.Tuple) else [f"action/{n}" for n in leaf_spaces(space)]
    return names + _state_names(policy, "state_out")


def _state_names(policy: Policy, name: str) -> list[str]:
    """A recurrent policy's state inputs or outputs: ``name`` for a state of one tensor, else ``name/<i>``."""
    if not policy.recurrent:
        return []
    count = len(state_leaves(policy.initial_state(1)))
    return [name] if count == 1 else [f"{name}/{i}" for i in range(count)]


def example_obs(policy: Policy, batch: int = 2) -> tuple[torch.Tensor, ...]:
    """A batch of observations of the stored dtypes (float32, uint8 frames, int64 indices) and shapes, one tensor
    per observation leaf (one tensor for a plain space), and a recurrent policy's initial state after them."""
    space = policy.observation_space
    stored = policy.obs_spec.batch(_stack([space.sample() for _ in range(batch)], space))
    leaves = [stored] if policy.obs_spec.single else [stored[name] for name in policy.obs_spec.leaves]
    state = state_leaves(policy.initial_state(batch)) if policy.recurrent else []
    return tuple(torch.as_tensor(leaf) for leaf in leaves + state)


def _stack(samples: list, space: gym.Space):
    """Single observations batched as a vector env batches them (nested dicts/tuples of arrays)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _stack([s[k] for s in samples], sub) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_stack([s[i] for s in samples], sub) for i, sub in enumerate(space.spaces))
    return np.stack(samples)


def export_policy(checkpoint: str | Path, fmt: str, out: str | Path, policy_id: str | None = None,
                  agent: int | None = None) -> Path:
    """Write the checkpoint's greedy policy to ``out`` in ``fmt`` (``torch-export`` or ``onnx``); ``policy_id``:
    which policy of a multi-agent checkpoint; ``agent``: one agent of a QMIX/VDN team alone (:class:`AgentGreedy`)."""
    if fmt not in FORMATS:
        raise HerdError(f"unknown export format '{fmt}'; choose one of {list(FORMATS)}")
    policy = Policy.from_checkpoint(checkpoint, policy_id)
    if agent is None:
        model, obs = GreedyPolicy(policy).eval().requires_grad_(False), example_obs(policy)
        names = input_names(policy), output_names(policy)
    else:
        model = AgentGreedy(policy, agent).eval().requires_grad_(False)
        obs = (torch.ones(2, model.choices, dtype=torch.int8), torch.zeros(2, model.width))
        names = ["action_mask", "obs"], ["action"]
        if model.recurrent:  # its state in and out: (batch, rnn_hidden_dim [+ actions]), zeros at an episode's start
            obs, names = (*obs, torch.zeros(2, model.state_width)), (names[0] + ["state_in"], names[1] + ["state_out"])
    batch = torch.export.Dim("batch", min=1)
    dynamic = {"obs": tuple({0: batch} for _ in obs)} if agent is None else \
        {"action_mask": {0: batch}, "obs": {0: batch}, **({"state": {0: batch}} if len(obs) > 2 else {})}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "torch-export":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch-internal deprecations, not ours to fix
            program = torch.export.export(model, obs, dynamic_shapes=dynamic)
            torch.export.save(program, out)
        return out
    try:
        import onnxscript  # noqa: F401  (torch's ONNX exporter needs it)
    except ImportError:
        raise HerdError("ONNX export needs the export extra: pip install 'herdrl[export]'") from None
    import contextlib
    import io
    import logging

    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the exporter logs progress and optional-dependency notes as warnings
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            # external_data=False: one self-contained file (our policies are far below ONNX's 2 GB limit)
            torch.onnx.export(model, obs, out, input_names=names[0], output_names=names[1],
                              dynamo=True, dynamic_shapes=dynamic, external_data=False, verbose=False)
    finally:
        quiet.setLevel(level)
    return out


class AgentGreedy(nn.Module):
    """One agent of a QMIX/VDN team alone, for decentralised execution: its own flattened observation ``(batch, D)``
    float32 and action mask ``(batch, A)`` in (that order), its greedy allowed action out (int64 from 0, as the
    team's; ``herdrl.env.team`` adds a Discrete space's ``start``). The agent network reads only its own row and id,
    so this is exactly the team's choice for that agent; the team's observation filter's row for it is baked in.
    Recurrent agents (``agent_rnn``) also take the agent's state ``(batch, rnn_hidden_dim)`` last and return
    ``(action, next state)``; agents reading their last action (``agent_last_action``) carry it after the GRU's
    state, ``(batch, rnn_hidden_dim + actions)``, zeros at an episode's start as the rest."""

    def __init__(self, policy: Policy, index: int) -> None:
        super().__init__()
        module = policy.module
        if not hasattr(module, "mix"):
            raise HerdError("--agent exports one agent of a QMIX/VDN team; this checkpoint is not one (use --policy-id "
                            "for a policy of a multi-agent run)")
        if not 0 <= index < module.agents:
            raise HerdError(f"--agent {index}: the team has agents 0 .. {module.agents - 1}")
        self.recurrent = bool(getattr(module, "recurrent", False))
        if not self.recurrent:
            self.agent = module.agent
        else:
            self.fc_in, self.rnn, self.fc_out, self.hidden = module.fc_in, module.rnn, module.fc_out, module.hidden
            self.last_action, self.state_width = module.last_action, module.state_width
        self.choices, self.width = module.choices, policy.observation_space["obs"].shape[1]
        self.register_buffer("agent_id", torch.eye(module.agents)[index:index + 1].clone())  # (its own storage)
        scales = policy.normalizer._obs_scales() if policy.normalizer is not None and \
            policy.normalizer.observations else {}
        self.filtered = "obs" in scales
        if self.filtered:
            self.clip = policy.normalizer.clip_obs
            self.register_buffer("mean", torch.as_tensor(scales["obs"][0][index].copy()))
            self.register_buffer("inv_std", torch.as_tensor(scales["obs"][1][index].copy()))

    def forward(self, action_mask: torch.Tensor, obs: torch.Tensor,
                state: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """This agent's greedy allowed actions, ``(batch,)`` (and its next state, recurrent agents)."""
        x = obs.float()
        if self.filtered:
            x = torch.clamp((x - self.mean) * self.inv_std, -self.clip, self.clip)
        x = torch.cat([x, self.agent_id.expand(x.shape[0], -1)], -1)
        if not self.recurrent:
            return masked_q(self.agent(x), action_mask).argmax(-1)
        if self.last_action:
            x = torch.cat([x, state[:, self.hidden:]], -1)
        h = self.rnn(torch.relu(self.fc_in(x)), state[:, :self.hidden])
        action = masked_q(self.fc_out(h), action_mask).argmax(-1)
        if self.last_action:
            h = torch.cat([h, nn.functional.one_hot(action, self.choices).to(h.dtype)], -1)
        return action, h


class ObsNormalizer(nn.Module):
    """The observation filter in torch, for exported graphs: raw leaves in, normalised leaves out."""

    def __init__(self, normalizer: Normalizer, leaf_names: list[str]) -> None:
        super().__init__()
        scales = normalizer._obs_scales() if normalizer.observations else {}
        self.clip = normalizer.clip_obs
        self.filtered = [name in scales for name in leaf_names]
        for i, name in enumerate(leaf_names):
            if name in scales:
                self.register_buffer(f"mean{i}", torch.as_tensor(scales[name][0]))
                self.register_buffer(f"inv_std{i}", torch.as_tensor(scales[name][1]))

    def forward(self, *leaves: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each filtered leaf normalised and clipped, the others as they are."""
        return tuple(torch.clamp((x.float() - getattr(self, f"mean{i}")) * getattr(self, f"inv_std{i}"),
                                 -self.clip, self.clip) if filtered else x
                     for i, (x, filtered) in enumerate(zip(leaves, self.filtered, strict=True)))
