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
    """What both optimizers share: the parameter list, ``zero_grad`` and picking the parameters with gradients."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr = lr
        self.steps = 0

    def zero_grad(self) -> None:
        """Drop the gradients (set them to None)."""
        for p in self.params:
            p.grad = None

    def _live(self) -> list[int]:
        """Indices of the parameters that have a gradient (the others are skipped by ``step``)."""
        return [i for i, p in enumerate(self.params) if p.grad is not None]


class Adam(_Optimizer):
    """Adam (Kingma & Ba, 2015) over a list of parameters; ``lr`` may be changed between steps."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, lr)
        self.betas, self.eps = betas, eps
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update from the parameters' current gradients (parameters without one are skipped)."""
        live = self._live()
        if not live:
            return
        params = [self.params[i] for i in live]
        grads = [self.params[i].grad for i in live]
        exp_avg = [self.exp_avg[i] for i in live]
        exp_avg_sq = [self.exp_avg_sq[i] for i in live]
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

    def state_dict(self) -> dict[str, object]:
        """Moments, step count and hyperparameters (tensors and numbers only: safe to save without pickle)."""
        return {"steps": self.steps, "lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "exp_avg": [t.clone() for t in self.exp_avg], "exp_avg_sq": [t.clone() for t in self.exp_avg_sq]}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if len(state["exp_avg"]) != len(self.params):
            raise ValueError(f"optimizer state has {len(state['exp_avg'])} tensors, expected {len(self.params)}")
        self.steps, self.lr, self.eps = int(state["steps"]), float(state["lr"]), float(state["eps"])
        self.betas = tuple(state["betas"])
        saved = list(state["exp_avg"]) + list(state["exp_avg_sq"])
        for mine, theirs in zip(self.exp_avg + self.exp_avg_sq, saved, strict=True):
            mine.copy_(theirs)


class RMSprop(_Optimizer):
    """RMSprop as ``torch.optim.RMSprop`` with default flags (no momentum, not centered); A2C's optimizer."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-2, alpha: float = 0.99,
                 eps: float = 1e-8) -> None:
        super().__init__(params, lr)
        self.alpha, self.eps = alpha, eps
        self.square_avg = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        """One RMSprop update from the parameters' current gradients."""
        live = self._live()
        if not live:
            return
        params = [self.params[i] for i in live]
        grads = [self.params[i].grad for i in live]
        square_avg = [self.square_avg[i] for i in live]
        self.steps += 1
        torch._foreach_mul_(square_avg, self.alpha)
        torch._foreach_addcmul_(square_avg, grads, grads, 1 - self.alpha)
        denom = torch._foreach_sqrt(square_avg)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, grads, denom, value=-self.lr)

    def state_dict(self) -> dict[str, object]:
        """Averages, step count and hyperparameters (tensors and numbers only)."""
        return {"steps": self.steps, "lr": self.lr, "alpha": self.alpha, "eps": self.eps,
                "square_avg": [t.clone() for t in self.square_avg]}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if len(state["square_avg"]) != len(self.params):
            raise ValueError(f"optimizer state has {len(state['square_avg'])} tensors, expected {len(self.params)}")
        self.steps, self.lr = int(state["steps"]), float(state["lr"])
        self.alpha, self.eps = float(state["alpha"]), float(state["eps"])
        for mine, theirs in zip(self.square_avg, state["square_avg"], strict=True):
            mine.copy_(theirs)
