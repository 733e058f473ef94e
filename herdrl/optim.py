"""Adam and RMSprop, the optimizers herdrl algorithms use.

Why not ``torch.optim.Adam``: constructing any ``torch.optim`` optimizer imports
``torch._dynamo`` (0.7 s here, about a sixth of the time PPO takes to solve
CartPole from process start). This is the same update as ``torch.optim.Adam``
with default flags (tests check it matches step for step), in multi-tensor
``foreach`` form, on whatever device the parameters live.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


class _Optimizer:
    """What both optimizers share: the parameter list, per-parameter state tensors, ``zero_grad``, and a
    pickle-free ``state_dict`` (tensors and numbers only)."""

    #: Hyperparameter attributes saved with the state (besides ``lr``).
    hyperparameters: tuple[str, ...] = ()
    #: Attributes holding one state tensor per parameter (e.g. Adam's moments).
    buffers: tuple[str, ...] = ()

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr = lr
        self.steps = 0
        for name in self.buffers:
            setattr(self, name, [torch.zeros_like(p) for p in self.params])

    def zero_grad(self) -> None:
        """Drop the gradients (set them to None)."""
        for p in self.params:
            p.grad = None

    def _live(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[list[torch.Tensor]]] | None:
        """Parameters that have a gradient, their gradients, and their slices of every buffer; None if none."""
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not live:
            return None
        state = [[getattr(self, name)[i] for i in live] for name in self.buffers]
        return [self.params[i] for i in live], [self.params[i].grad for i in live], state

    def state_dict(self) -> dict[str, object]:
        """Step count, hyperparameters and state tensors (safe to save without pickle)."""
        hyper = {name: getattr(self, name) for name in self.hyperparameters}
        return {"steps": self.steps, "lr": self.lr,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in hyper.items()},
                **{name: [t.clone() for t in getattr(self, name)] for name in self.buffers}}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore the step count and state tensors of what :meth:`state_dict` returned.

        The saved hyperparameters (``lr``, ``betas``, ``eps``, ``alpha``) are not used: the run's config decides
        them (a run resumed with another ``lr``, or a PBT trial given a mutated one, trains with that value);
        the checkpoint gives only what was learned (moments, step counts).
        """
        for name in self.buffers:
            if len(state[name]) != len(self.params):
                raise ValueError(f"optimizer state has {len(state[name])} tensors, expected {len(self.params)}")
        self.steps = int(state["steps"])
        for name in self.buffers:
            for mine, theirs in zip(getattr(self, name), state[name], strict=True):
                mine.copy_(theirs)


class Adam(_Optimizer):
    """Adam (Kingma & Ba, 2015) over a list of parameters; ``lr`` may be changed between steps."""

    hyperparameters = ("betas", "eps")
    buffers = ("exp_avg", "exp_avg_sq")

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, lr)
        self.betas, self.eps = tuple(betas), eps

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update from the parameters' current gradients (parameters without one are skipped)."""
        live = self._live()
        if live is None:
            return
        params, grads, (exp_avg, exp_avg_sq) = live
        beta1, beta2 = self.betas
        self.steps += 1
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, 1 - beta2)
        bias_correction1 = 1 - beta1 ** self.steps
        bias_correction2 = 1 - beta2 ** self.steps
        denom = torch._foreach_sqrt(exp_avg_sq)
        torch._foreach_div_(denom, math.sqrt(bias_correction2))
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, exp_avg, denom, value=-self.lr / bias_correction1)


class RMSprop(_Optimizer):
    """RMSprop as ``torch.optim.RMSprop`` with default flags (no momentum, not centered); A2C's optimizer."""

    hyperparameters = ("alpha", "eps")
    buffers = ("square_avg",)

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-2, alpha: float = 0.99,
                 eps: float = 1e-8) -> None:
        super().__init__(params, lr)
        self.alpha, self.eps = alpha, eps

    @torch.no_grad()
    def step(self) -> None:
        """One RMSprop update from the parameters' current gradients."""
        live = self._live()
        if live is None:
            return
        params, grads, (square_avg,) = live
        self.steps += 1
        torch._foreach_mul_(square_avg, self.alpha)
        torch._foreach_addcmul_(square_avg, grads, grads, 1 - self.alpha)
        denom = torch._foreach_sqrt(square_avg)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, grads, denom, value=-self.lr)
