"""The module protocol: what every policy network (:class:`~herdrl.models.actor_critic.ActorCritic`, its LSTM and
centralised-critic kinds, QMIX's teams, and later attention memory, curiosity, a world model's actor or a user's own
module) offers the runners, the learners, :class:`~herdrl.policy.Policy` and export. Internal for now.

**State.** A module that remembers declares it with :meth:`PolicyModule.initial_state`: a *state* is a tensor, or a
tuple, list or dict of them (nested as deep as it likes), each with the batch as its first dimension; any shapes,
any number of tensors. The LSTM's is one tensor ``(batch, 2, lstm_cell_size)``, a QMIX team's ``(batch, agents,
hidden)``. A stateless module's initial state is None. Runners and learners never look inside a state: they stack,
slice, reset and store it leaf by leaf with the functions below (numpy or torch leaves alike), so a new module
needs no change to them.

**Acting** (runners, one step for every env): ``forward_exploration(obs, state) -> (dist_inputs, next_state)``;
the runner samples the action from the distribution inputs with its own seeded noise (``act_with_noise``).
Where an env's episode begins, the runner resets that env's rows to the initial state before the step
(:func:`reset_rows`). ``forward_inference({"obs", "state_in"?})`` is RLlib's dict form of the same step for
scripts, without gradients (``{"action_dist_inputs", "state_out"?}``).

**Training** (learners): ``forward_train(obs, state, starts) -> (dist_inputs, values)``. Stateless: ``obs`` a batch
``(B, ...)``, ``state`` and ``starts`` None, outputs ``(B, D)`` and ``(B,)``. With a state: N sequences of L steps
(``obs`` leaves ``(N, L, ...)``), ``state`` the state entering each sequence (what the runner stored at the
sequence's start, ``Fragment.state_in``), ``starts`` ``(N, L)`` bool: the state is reset before step t where an
episode begins; outputs ``(N, L, D)`` and ``(N, L)``. ``forward_value(obs, state)``: one step's values (a
fragment's bootstrap). Log-probabilities, entropies and KLs come from ``dist_inputs`` through the module's
``dist`` (:class:`~herdrl.models.distributions.ActionDistribution`).

**Checkpoints and export.** A module is a ``torch.nn.Module``: its ``state_dict`` is what checkpoints hold (keys
never renamed: old checkpoints load), and a state is never checkpointed (episodes start from the initial state).
Export calls ``greedy(obs)``, or ``greedy_step(obs, state) -> (action, next_state)`` with the state's leaves as
inputs after the observations (:func:`state_leaves` order) and as outputs after the actions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch

#: A module's recurrent state: a tensor (or numpy array, runner-side), or a tuple/list/dict of states; None: none.
State = Any


@runtime_checkable
class PolicyModule(Protocol):
    """The contract of a policy network (see the module's docstring). ``recurrent``: whether
    :meth:`initial_state` returns a state (then acting and training go through the state-taking calls)."""

    recurrent: bool

    def initial_state(self, batch: int) -> State:
        """The state entering an episode's first step, for ``batch`` rows (None: the module keeps no state)."""

    def forward_exploration(self, obs: Any, state: State) -> tuple[torch.Tensor, State]:
        """One acting step for a batch: (distribution inputs, next state)."""

    def forward_train(self, obs: Any, state: State, starts: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Distribution inputs and values of a batch, or of sequences from their entering states."""

    def forward_value(self, obs: Any, state: State) -> torch.Tensor:
        """One step's values, entering ``state``."""

    def forward_inference(self, batch: dict[str, Any]) -> dict[str, Any]:
        """RLlib's dict call without gradients: ``{"obs", "state_in"?}`` -> ``{"action_dist_inputs",
        "state_out"?}``."""


def map_state(fn: Callable[..., Any], state: State, *others: State) -> State:
    """``fn`` applied leaf by leaf to ``state`` (and the same leaves of ``others``, of the same structure)."""
    if isinstance(state, dict):
        return {key: map_state(fn, value, *(other[key] for other in others)) for key, value in state.items()}
    if isinstance(state, (tuple, list)):
        return type(state)(map_state(fn, value, *(other[i] for other in others)) for i, value in enumerate(state))
    return fn(state, *others)


def state_leaves(state: State) -> list[Any]:
    """The state's tensors in a fixed order (dict keys in their order): export's inputs and outputs."""
    if isinstance(state, dict):
        return [leaf for value in state.values() for leaf in state_leaves(value)]
    if isinstance(state, (tuple, list)):
        return [leaf for value in state for leaf in state_leaves(value)]
    return [state]


def from_leaves(structure: State, leaves: list[Any]) -> State:
    """A state of ``structure``'s shape holding ``leaves`` (the inverse of :func:`state_leaves`)."""
    it = iter(leaves)
    return map_state(lambda _: next(it), structure)


def state_batch(state: State) -> int:
    """How many rows the state holds."""
    return len(state_leaves(state)[0])


def state_rows(state: State, index: Any) -> State:
    """Rows ``index`` of every leaf (an env's, a mask's, a slice's)."""
    return map_state(lambda leaf: leaf[index], state)


def concat_states(states: list[State]) -> State:
    """States concatenated along the batch (numpy leaves)."""
    return map_state(lambda *leaves: np.concatenate(leaves), *states)


def stack_states(states: list[State]) -> State:
    """One-row-less states (an env's, an agent's) stacked into a batch (numpy leaves)."""
    return map_state(lambda *leaves: np.stack(leaves), *states)


def state_to_numpy(state: State) -> State:
    """A torch state as numpy arrays (copies, on the CPU)."""
    return map_state(lambda leaf: leaf.cpu().numpy().copy(), state)


def state_to_torch(state: State, device: Any) -> State:
    """A numpy state as tensors on ``device``: float leaves as float32, integer and bool leaves in their dtype."""
    import torch

    def leaf_to_torch(leaf: Any) -> torch.Tensor:
        leaf = np.asarray(leaf)
        return torch.as_tensor(leaf.astype(np.float32, copy=False) if leaf.dtype.kind == "f" or leaf.dtype == object
                               else leaf, device=device)

    return map_state(leaf_to_torch, state)


def reset_rows(state: State, initial: State, rows: Any) -> State:
    """``state`` with the rows where ``rows`` (a bool tensor ``(batch,)``) is set back to ``initial``'s (a state of
    the same batch)."""
    import torch

    return map_state(lambda leaf, fresh: torch.where(rows.reshape(-1, *[1] * (leaf.dim() - 1)), fresh, leaf),
                     state, initial)
