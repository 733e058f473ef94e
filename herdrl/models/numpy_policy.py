"""The actor's forward pass and action sampling in numpy, without torch.

For the small MLPs RL uses on CPU, a torch call costs more in dispatch than
in arithmetic: stepping 8 CartPoles, a torch actor reaches ~50% of the env's
random-action throughput, this numpy twin ~75%. A policy is described by an
:class:`MLPBlueprint` (plain data: which weights, which activation) and runs on
arrays: views of a torch module's parameters in the driver or a torch runner
(``load_state_dict`` on the module shows through), or arrays of its own in a
light runner, which never imports torch (a runner process then holds ~80 MB
instead of ~320 MB). This module must not import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from herdrl.models.action_layout import ActionLayout


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0, out=x)


def _tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x, out=x)


#: Activations applied in place (to a layer's fresh output: a runner's forward allocates as little as it can).
ACTIVATIONS = {"tanh": _tanh, "relu": _relu, "linear": lambda x: x}


def input_function(spec: tuple) -> Callable[[np.ndarray], np.ndarray]:
    """What an MLP encoder does to stored observations before its first layer, in numpy: ``("Box", dim)``
    flattens to float32, ``("Discrete", n, start)`` one-hot encodes."""
    if spec[0] == "Discrete":
        eye, start = np.eye(int(spec[1]), dtype=np.float32), int(spec[2])
        return lambda obs: eye[obs - start]
    dim = int(spec[1])
    return lambda obs: obs.reshape(len(obs), dim).astype(np.float32, copy=False)


def mlp_forward(input_spec: tuple, activation: str, layers: list[tuple[np.ndarray, np.ndarray]],
                head: tuple[np.ndarray, np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """``head(mlp(obs))`` on (W^T, b) pairs of arrays (views: later updates of the arrays show through)."""
    prepare, act = input_function(input_spec), ACTIVATIONS[activation]
    head_weight_t, head_bias = head

    def forward(obs: np.ndarray) -> np.ndarray:
        x = prepare(obs)
        for weight_t, bias in layers:
            x = x @ weight_t
            x += bias
            x = act(x)
        x = x @ head_weight_t
        x += head_bias
        return x

    return forward


@dataclass(frozen=True)
class MLPBlueprint:
    """A runner's MLP policy as plain data: the driver reads it off the torch module (the algorithm config's
    ``runner_blueprint``) and ships it to light runners, which build the policy from it (:func:`light_policy`).

    Keys are the module's ``state_dict`` keys, so the learner's weights load by name. ``kind`` says what turns the
    MLP's output into actions: ``actor_critic`` (:class:`NumpyPolicy`), ``epsilon_greedy`` (DQN),
    ``squashed_gaussian`` (SAC), ``noisy_tanh`` (TD3/DDPG); ``params`` holds that rule's constants.
    """

    input: tuple  # ("Box", dim) or ("Discrete", n, start)
    activation: str  # a key of ACTIVATIONS
    layers: tuple[tuple[str, str], ...]  # (weight key, bias key) of each hidden layer, in order
    head: tuple[str, str]  # the policy head's (weight key, bias key)
    log_std: str | None  # the free log std's key (Box actions with free_log_std), else None
    action_dim: int  # Discrete: n; Box: its width (the head gives means, then log stds, without a free log std)
    shapes: Mapping[str, tuple[int, ...]]  # each key's shape
    kind: str = "actor_critic"
    params: Mapping[str, Any] = field(default_factory=dict)

    def keys(self) -> list[str]:
        """Every weight key the policy reads."""
        return [*(k for pair in self.layers for k in pair), *self.head, *([self.log_std] if self.log_std else [])]


class MLPWeights:
    """An MLP's weights as numpy arrays and its forward pass on them: views of a torch module's parameters
    (``arrays`` given: loading the module shows through) or arrays of its own (filled by :meth:`load`)."""

    def __init__(self, blueprint: MLPBlueprint, arrays: Mapping[str, np.ndarray] | None = None) -> None:
        self.blueprint = blueprint
        self.arrays = dict(arrays) if arrays is not None else \
            {key: np.zeros(blueprint.shapes[key], np.float32) for key in blueprint.keys()}
        a = self.arrays
        self.forward = mlp_forward(blueprint.input, blueprint.activation, [(a[w].T, a[b]) for w, b in blueprint.layers],
                                   (a[blueprint.head[0]].T, a[blueprint.head[1]]))
        self.log_std = None if blueprint.log_std is None else a[blueprint.log_std]

    def load(self, weights: Mapping[str, Any]) -> None:
        """Copy the learner's weights (numpy arrays; the whole module's, the keys this MLP reads must be there)
        into these arrays, in place."""
        missing = [key for key in self.arrays if key not in weights]
        if missing:
            raise ValueError(f"weights lack {missing}: not this runner's policy")
        for key, own in self.arrays.items():
            value = np.asarray(weights[key])
            if value.shape != own.shape:
                raise ValueError(f"weight '{key}' has shape {value.shape}, expected {own.shape}")
            own[...] = value  # read-only object-store arrays are fine: we copy out of them


class NumpyPolicy:
    """Sample actions of an actor-critic's distribution for a batch of observations with numpy only."""

    def __init__(self, weights: MLPWeights, actions: ActionLayout, rng: np.random.Generator) -> None:
        self.rng = rng
        self.discrete = actions.discrete
        self._dist = actions
        self.action_dim = weights.blueprint.action_dim
        self._forward = weights.forward
        self._log_std = weights.log_std

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Exploration noise for ``steps`` calls of ``act`` on ``batch`` observations (see ``draw_noise``)."""
        return self._dist.draw_noise(self.rng, steps, batch)

    def act(self, obs: np.ndarray, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Actions for a batch of stored observations (``herdrl.obs``): int64 indices or float32 vectors.

        ``noise``: one step of :meth:`noise` (drawn here when None).
        """
        if explore and noise is None:
            noise = self.noise(1, len(obs))[0]
        return self._act(self._forward(obs), explore, noise)

    def act_logp(self, obs: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions and their log-probabilities under this policy (the behaviour policy V-trace needs)."""
        out = self._forward(obs)
        action = self._act(out, True, noise)
        if self.discrete:
            top = out.max(1, keepdims=True)
            log_z = top[:, 0] + np.log(np.exp(out - top).sum(1))
            return action, (out[np.arange(len(out)), action] - log_z).astype(np.float32)
        mean, log_std = self._mean_log_std(out)
        z = (action - mean) * np.exp(-log_std)  # from the action, as the learner computes it (not from the noise)
        logp = (-0.5 * z ** 2 - log_std - 0.5 * np.log(2 * np.pi)).sum(1)
        return action, logp.astype(np.float32)

    def _mean_log_std(self, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self._log_std is not None:
            return out, self._log_std
        return out[:, : self.action_dim], out[:, self.action_dim:]

    def _act(self, out: np.ndarray, explore: bool, noise: np.ndarray | None) -> np.ndarray:
        if self.discrete:
            return (out + noise).argmax(1) if explore else out.argmax(1)
        mean, log_std = self._mean_log_std(out)
        return mean + noise * np.exp(log_std) if explore else mean


class EpsilonGreedy:
    """Epsilon-greedy actions (DQN; ``epsilon`` set per sample call) on ``greedy``: observations -> argmax_a Q
    (over the allowed actions). ``masked``: observations carry an ``action_mask`` leaf, and a random action is
    drawn uniformly among the allowed ones."""

    def __init__(self, greedy: Callable[[Any], np.ndarray], action_dim: int, rng: np.random.Generator,
                 masked: bool = False) -> None:
        self.rng, self.epsilon, self.action_dim, self.masked = rng, 0.0, action_dim, masked
        self._greedy = greedy

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Per step and env: a uniform draw (explore?) and a random action, packed as (steps, batch, 2); with a
        mask, a uniform draw that picks among the allowed actions instead of the action."""
        explore = self.rng.random((steps, batch))  # drawn first: seeded runs act as in earlier releases
        pick = self.rng.random((steps, batch)) if self.masked else self.rng.integers(0, self.action_dim, (steps, batch))
        return np.stack([explore, pick], axis=-1)

    def act(self, obs: Any, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Greedy actions, replaced by random (allowed) ones with probability ``epsilon`` when exploring."""
        greedy = self._greedy(obs)
        if not explore or self.epsilon <= 0:
            return greedy
        if noise is None:
            noise = self.noise(1, len(greedy))[0]
        if self.masked:
            random = random_allowed(np.asarray(obs["action_mask"]), noise[:, 1])
        else:
            random = noise[:, 1].astype(np.int64)
        return np.where(noise[:, 0] < self.epsilon, random, greedy)


def random_allowed(mask: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """For each row of ``mask`` (1: allowed), the allowed action a uniform draw in [0, 1) picks: the
    ``floor(u * allowed)``-th allowed one (a row with none allowed gives action 0)."""
    allowed = mask > 0
    count = allowed.sum(1)
    k = np.minimum((uniform * count).astype(np.int64), np.maximum(count - 1, 0))
    return (allowed.cumsum(1) > k[:, None]).argmax(1)


class SquashedGaussian:
    """SAC's actor: u ~ N(mean, std) from ``mean_log_std`` (observations -> (mean, log std)), a = tanh(u) scaled
    into the Box (``scale``, ``bias``: (high - low) / 2 and (high + low) / 2). ``noise_after_tanh`` (IQL's actor):
    a ~ N(tanh(mean), std) instead, clipped to [-1, 1] before scaling."""

    def __init__(self, mean_log_std: Callable[[Any], tuple[np.ndarray, np.ndarray]], action_dim: int,
                 scale: np.ndarray, bias: np.ndarray, rng: np.random.Generator, noise_after_tanh: bool = False) -> None:
        self.rng, self.action_dim = rng, action_dim
        self._mean_log_std = mean_log_std
        self._scale, self._bias = np.asarray(scale, np.float32), np.asarray(bias, np.float32)
        self.noise_after_tanh = noise_after_tanh

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Standard normal noise for a whole fragment."""
        return self.rng.standard_normal((steps, batch, self.action_dim), dtype=np.float32)

    def act(self, obs: Any, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Scaled actions (float32, within the Box bounds)."""
        mean, log_std = self._mean_log_std(obs)
        if explore and noise is None:
            noise = self.noise(1, len(mean))[0]
        if self.noise_after_tanh:
            unit = np.tanh(mean)
            if explore:
                unit = np.clip(unit + noise * np.exp(log_std), -1.0, 1.0)
            return (unit * self._scale + self._bias).astype(np.float32)
        if explore:
            mean = mean + noise * np.exp(log_std)
        return (np.tanh(mean) * self._scale + self._bias).astype(np.float32)


class NoisyTanh:
    """TD3/DDPG's runner policy: tanh of the actor's output (``pre``: observations -> pre-activations) plus
    Gaussian noise of ``noise_std``, clipped to [-1, 1] and scaled into the Box; uniform random actions while
    ``random_actions`` is set (before learning starts)."""

    def __init__(self, pre: Callable[[Any], np.ndarray], action_dim: int, scale: np.ndarray, bias: np.ndarray,
                 noise_std: float, rng: np.random.Generator) -> None:
        self.rng, self.action_dim, self.noise_std = rng, action_dim, noise_std
        self.random_actions = False
        self._pre = pre
        self._scale, self._bias = np.asarray(scale, np.float32), np.asarray(bias, np.float32)

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Standard normal noise for a whole fragment."""
        return self.rng.standard_normal((steps, batch, self.action_dim), dtype=np.float32)

    def act(self, obs: Any, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Actions in the Box bounds (float32)."""
        unit = np.tanh(self._pre(obs))  # the action in [-1, 1]
        if explore and self.random_actions:
            unit = self.rng.uniform(-1.0, 1.0, unit.shape)
        elif explore:
            noise = self.noise(1, len(unit))[0] if noise is None else noise
            unit = np.clip(unit + self.noise_std * noise, -1.0, 1.0)
        return (unit * self._scale + self._bias).astype(np.float32)


def split_mean_log_std(forward: Callable[[Any], np.ndarray], action_dim: int, low: float, high: float,
                       log_std: np.ndarray | None = None) -> Callable[[Any], tuple[np.ndarray, np.ndarray]]:
    """SAC's head output split into the mean and the log std, clipped to [low, high]; with a free ``log_std`` (IQL's
    actor; read at each call: loaded weights show through) the head gives the mean and that log std serves every
    state."""
    def mean_log_std(obs: Any) -> tuple[np.ndarray, np.ndarray]:
        out = forward(obs)
        if log_std is not None:
            return out, np.broadcast_to(np.clip(log_std, low, high), out.shape)
        return out[:, :action_dim], np.clip(out[:, action_dim:], low, high)

    return mean_log_std


def light_policy(weights: MLPWeights, actions: ActionLayout, rng: np.random.Generator) -> Any:
    """The runner policy its blueprint's ``kind`` names, acting on ``weights``."""
    blueprint = weights.blueprint
    kind, params, dim = blueprint.kind, blueprint.params, blueprint.action_dim
    if kind == "actor_critic":
        return NumpyPolicy(weights, actions, rng)
    forward = weights.forward
    if kind == "epsilon_greedy":
        return EpsilonGreedy(lambda obs: forward(obs).argmax(1), dim, rng)
    if kind == "squashed_gaussian":
        return SquashedGaussian(split_mean_log_std(forward, dim, params["log_std_min"], params["log_std_max"],
                                                   weights.log_std),
                                dim, params["scale"], params["bias"], rng, params.get("noise_after_tanh", False))
    if kind == "noisy_tanh":
        return NoisyTanh(forward, dim, params["scale"], params["bias"], params["noise_std"], rng)
    raise ValueError(f"unknown runner policy kind {kind!r}")
