"""The actor's forward pass and action sampling in numpy.

For the small MLPs RL uses on CPU, a torch call costs more in dispatch than
in arithmetic: stepping 8 CartPoles, a torch actor reaches ~50% of the env's
random-action throughput, this numpy twin ~75%. The arrays are views of the
torch parameters, so ``load_state_dict`` on the module updates this policy too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from torch import nn

from herdrl.models.actor_critic import ActorCritic


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0, out=x)


_ACTIVATIONS = {"tanh": np.tanh, "relu": _relu, "linear": lambda x: x}


def numpy_forward(encoder: nn.Module, head: nn.Linear) -> Callable[[np.ndarray], np.ndarray] | None:
    """``head(encoder(obs))`` in numpy on views of the torch weights, for an MLP on one Box or Discrete leaf with
    a tanh, relu or linear activation, on the CPU; None for anything else (CNNs, Dict observations, a runner's GPU:
    use torch)."""
    prepare = encoder.numpy_input()
    if prepare is None or encoder.activation not in _ACTIVATIONS or head.weight.device.type != "cpu":
        return None
    activation = _ACTIVATIONS[encoder.activation]
    # (W^T, b) pairs; W.T is a view, so updates to the torch weights show through.
    layers = [(m.weight.detach().numpy().T, m.bias.detach().numpy()) for m in encoder.mlp if isinstance(m, nn.Linear)]
    head_weight_t, head_bias = head.weight.detach().numpy().T, head.bias.detach().numpy()

    def forward(obs: np.ndarray) -> np.ndarray:
        x = prepare(obs)
        for weight_t, bias in layers:
            x = activation(x @ weight_t + bias)
        return x @ head_weight_t + head_bias

    return forward


class NumpyPolicy:
    """Sample actions for a batch of observations with numpy only."""

    def __init__(self, module: ActorCritic, rng: np.random.Generator) -> None:
        self.rng = rng
        self.discrete = module.discrete
        self._dist = module.dist
        self.action_dim = module.action_dim
        forward = numpy_forward(module.pi_encoder, module.pi_head)
        if forward is None:
            raise ValueError("NumpyPolicy needs an MLP policy on a vector observation (see supports())")
        self._forward = forward
        self._log_std = None if module.log_std is None else module.log_std.detach().numpy()

    @staticmethod
    def supports(module: ActorCritic) -> bool:
        """Whether this module has a numpy twin: Discrete or Box actions, an MLP on one Box or Discrete observation,
        activation tanh, relu or linear, no action mask."""
        return (isinstance(module, ActorCritic) and not module.masked
                and (module.dist.discrete or not module.dist.num_logits) and len(module.dist.parts) == 1
                and numpy_forward(module.pi_encoder, module.pi_head) is not None)

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
        if self._log_std is not None:
            mean, log_std = out, self._log_std
        else:
            mean, log_std = out[:, : self.action_dim], out[:, self.action_dim:]
        z = (action - mean) * np.exp(-log_std)  # from the action, as the learner computes it (not from the noise)
        logp = (-0.5 * z ** 2 - log_std - 0.5 * np.log(2 * np.pi)).sum(1)
        return action, logp.astype(np.float32)

    def _act(self, out: np.ndarray, explore: bool, noise: np.ndarray | None) -> np.ndarray:
        if self.discrete:
            return (out + noise).argmax(1) if explore else out.argmax(1)
        if self._log_std is not None:
            mean, log_std = out, self._log_std
        else:
            mean, log_std = out[:, : self.action_dim], out[:, self.action_dim:]
        return mean + noise * np.exp(log_std) if explore else mean
