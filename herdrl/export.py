"""Export the greedy policy of a checkpoint as a standalone file: ``torch.export`` (.pt2) or ONNX.

The exported program takes a batch of *raw* observations as herdrl stores them (``(batch, *obs_shape)``: float32
for a float Box — cast float64 observations first —, the Box's own dtype for integer Boxes such as uint8 frames,
int64 for Discrete and MultiDiscrete, int8 for MultiBinary) and returns env-ready actions (int64 indices,
float32 clipped to the Box bounds, int8 bits for MultiBinary) — no herdrl needed to run it::

    program = torch.export.load("policy.pt2").module();  actions = program(obs)
    session = onnxruntime.InferenceSession("policy.onnx");  actions = session.run(None, {"obs": obs})[0]
"""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from herdrl.errors import HerdError
from herdrl.policy import Policy

FORMATS = ("torch-export", "onnx")


class GreedyPolicy(nn.Module):
    """Raw observations in, greedy env actions out."""

    def __init__(self, policy: Policy) -> None:
        super().__init__()
        if not policy.obs_spec.single:
            raise HerdError(f"export takes one observation array; this policy's observations are "
                            f"{type(policy.observation_space).__name__} ({len(policy.obs_spec.leaves)} parts): use "
                            "herdrl.Policy.from_checkpoint in Python instead")
        self.module = policy.module  # any herdrl network: its encoder takes raw observations, greedy() the action
        action_space = policy.action_space
        if isinstance(action_space, gym.spaces.Tuple):
            raise HerdError(f"export gives one action array; this policy's actions are {action_space}: use "
                            "herdrl.Policy.from_checkpoint in Python instead")
        self.kind = type(action_space).__name__
        self.action_shape = tuple(action_space.shape or ())
        if isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            start = np.asarray(action_space.start).reshape(-1)
            self.register_buffer("start", torch.as_tensor(start, dtype=torch.int64))
        if isinstance(action_space, gym.spaces.Box):
            self.register_buffer("low", torch.as_tensor(action_space.low.reshape(-1), dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high.reshape(-1), dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy env actions for a batch of raw observations."""
        action = self.module.greedy(obs)
        if self.kind == "Discrete":
            return action + self.start[0]
        if self.kind == "Box":
            action = torch.clamp(action, self.low, self.high)
        elif self.kind == "MultiDiscrete":
            action = action + self.start
        elif self.kind == "MultiBinary":
            action = action.to(torch.int8)  # the dtype the env takes
        return action.reshape(obs.shape[0], *self.action_shape)


def example_obs(policy: Policy, batch: int = 2) -> torch.Tensor:
    """A batch of observations of the stored dtype (float32, uint8 frames, int64 indices) and shape."""
    space = policy.observation_space
    return torch.as_tensor(policy.obs_spec.batch(np.stack([space.sample() for _ in range(batch)])))


def export_policy(checkpoint: str | Path, fmt: str, out: str | Path) -> Path:
    """Write the checkpoint's greedy policy to ``out`` in ``fmt`` (``torch-export`` or ``onnx``)."""
    if fmt not in FORMATS:
        raise HerdError(f"unknown export format '{fmt}'; choose one of {list(FORMATS)}")
    policy = Policy.from_checkpoint(checkpoint)
    model = GreedyPolicy(policy).eval().requires_grad_(False)
    obs = example_obs(policy)
    batch = torch.export.Dim("batch", min=1)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "torch-export":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch-internal deprecations, not ours to fix
            program = torch.export.export(model, (obs,), dynamic_shapes={"obs": {0: batch}})
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
            torch.onnx.export(model, (obs,), out, input_names=["obs"], output_names=["action"], dynamo=True,
                              dynamic_shapes={"obs": {0: batch}}, external_data=False, verbose=False)
    finally:
        quiet.setLevel(level)
    return out
