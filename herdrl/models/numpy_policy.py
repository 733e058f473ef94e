"""The actor's forward pass and action sampling in numpy.

For the small MLPs RL uses on CPU, a torch call costs more in dispatch than
in arithmetic: stepping 8 CartPoles, a torch actor reaches ~50% of the env's
random-action throughput, this numpy twin ~75%. The arrays are views of the
torch parameters, so ``load_state_dict`` on the module updates this policy too.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from herdrl.models.actor_critic import ActorCritic, draw_noise


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0, out=x)


_ACTIVATIONS = {"tanh": np.tanh, "relu": _relu, "linear": lambda x: x}


class NumpyPolicy:
    """Sample actions for a batch of encoded observations with numpy only."""

    def __init__(self, module: ActorCritic, rng: np.random.Generator) -> None:
        self.rng = rng
        self.discrete = module.discrete
        self.action_dim = module.action_dim
        self._activation = _ACTIVATIONS[module.activation]
        # (W^T, b) pairs; W.T is a view, so updates to the torch weights show through.
        self._layers = [(m.weight.detach().numpy().T, m.bias.detach().numpy())
                        for m in module.pi_body if isinstance(m, nn.Linear)]
        self._head = (module.pi_head.weight.detach().numpy().T, module.pi_head.bias.detach().numpy())
        self._log_std = None if module.log_std is None else module.log_std.detach().numpy()

    @staticmethod
    def supports(module: ActorCritic) -> bool:
        """Whether this module's activation has a numpy twin (tanh, relu, linear)."""
        return isinstance(module, ActorCritic) and module.activation in _ACTIVATIONS

    def noise(self, steps: int, batch: int) -> np.ndarray:
        """Exploration noise for ``steps`` calls of ``act`` on ``batch`` observations (see ``draw_noise``)."""
        return draw_noise(self.rng, self.discrete, steps, batch, self.action_dim)

    def act(self, obs: np.ndarray, explore: bool = True, noise: np.ndarray | None = None) -> np.ndarray:
        """Actions for ``obs`` of shape (batch, obs_dim): int64 indices or float32 vectors.

        ``noise``: one step of :meth:`noise` (drawn here when None).
        """
        x = obs
        for weight_t, bias in self._layers:
            x = self._activation(x @ weight_t + bias)
        out = x @ self._head[0] + self._head[1]
        if explore and noise is None:
            noise = self.noise(1, len(obs))[0]
        if self.discrete:
            return (out + noise).argmax(1) if explore else out.argmax(1)
        if self._log_std is not None:
            mean, log_std = out, self._log_std
        else:
            mean, log_std = out[:, : self.action_dim], out[:, self.action_dim:]
        return mean + noise * np.exp(log_std) if explore else mean
