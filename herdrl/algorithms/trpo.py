"""Trust Region Policy Optimization (Schulman et al. 2015), as in the seed document that parallelises its
rollouts.

Per iteration: one batch from the runners; GAE advantages; a natural-gradient policy step — conjugate
gradient on the Fisher-vector product (the Hessian of the mean KL), scaled to the KL bound ``target_kl`` —
accepted by a backtracking line search only if the surrogate improves and the KL stays within the bound;
then a separate value-function fit (``num_critic_updates`` passes of Adam minibatches).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from herdrl.algorithms.base import Algorithm
from herdrl.config import VALUE_NORMALIZATION, AlgorithmConfig, Field, shared_field
from herdrl.errors import ConfigError
from herdrl.learner import Learner
from herdrl.optim import Adam
from herdrl.rollout import Fragment
from herdrl.rollout.batch import on_policy_batch


class TRPOConfig(AlgorithmConfig):
    """TRPO settings; defaults follow the rl-baselines3-zoo CartPole-v1 settings (sb3-contrib names)."""

    algo_name = "TRPO"
    supports_multi_agent = True
    supports_centralized_critic = True  # MAPPO: critics that see the global state
    multi_agent_old_logp = True  # multi-agent runners record the acting policy's log-probabilities: old_logp
    data_parallel = False  # see TRPOLearner
    FIELDS = {
        "value_normalization": VALUE_NORMALIZATION,
        "num_envs_per_env_runner": shared_field("num_envs_per_env_runner", 8),
        "train_batch_size": shared_field("train_batch_size", 1024),
        "lr": shared_field("lr", 1e-3),  # the value function's Adam
        "gamma": shared_field("gamma", 0.99),
        "lambda_": Field(0.98, (float,), "training", low=0, high=1, doc="GAE lambda"),
        "target_kl": Field(0.01, (float,), "training", low=0, low_open=True, doc="KL bound of a policy step"),
        "cg_max_steps": Field(15, (int,), "training", low=1, doc="conjugate-gradient iterations"),
        "cg_damping": Field(1e-3, (float,), "training", low=0, doc="added to the Fisher-vector product"),
        "line_search_shrinking_factor": Field(0.8, (float,), "training", low=0, low_open=True, high=1),
        "line_search_max_iter": Field(10, (int,), "training", low=1),
        "num_critic_updates": Field(20, (int,), "training", low=1, doc="passes of the value fit per batch"),
        "vf_minibatch_size": Field(512, (int,), "training", low=1),
        "normalize_advantages": Field(True, (bool,), "training"),
    }
    ALIASES = {"lambda": "lambda_", "n_critic_updates": "num_critic_updates", "max_kl": "target_kl"}

    def validate_algorithm(self) -> None:
        """TRPO steps the policy and fits the value function separately: they cannot share layers."""
        if self.model["vf_share_layers"]:
            raise ConfigError("model key 'vf_share_layers' must be False for TRPO (separate policy and value steps)")

    def build_policy_module(self, observation_space: Any, action_space: Any) -> Any:
        """An actor-critic with separate encoders, images included (the value fit could not train a shared CNN)."""
        return self.actor_critic(observation_space, action_space, {**self.model, "vf_share_layers": False})

    @classmethod
    def algo_class(cls) -> type:
        """:class:`TRPO`."""
        return TRPO


def backtracking_line_search(evaluate: Callable[[torch.Tensor], tuple[float, float]], start: torch.Tensor,
                             full_step: torch.Tensor, old_surrogate: float, max_kl: float, shrink: float,
                             max_iter: int) -> tuple[torch.Tensor | None, float, float]:
    """Try ``start + shrink**i * full_step`` for i = 0, 1, ...; accept the first whose KL is within ``max_kl``
    *and* whose surrogate strictly beats ``old_surrogate``. ``evaluate(params) -> (surrogate, kl)``.

    Returns (accepted parameters, their surrogate, their KL), or (None, old_surrogate, 0.0) when no step
    qualifies (the caller keeps the old policy).
    """
    for i in range(max_iter):
        candidate = start + shrink ** i * full_step
        surrogate, kl = evaluate(candidate)
        if kl <= max_kl and surrogate > old_surrogate:
            return candidate, surrogate, kl
    return None, old_surrogate, 0.0


def conjugate_gradient(matvec, b: torch.Tensor, iterations: int, tol: float = 1e-10) -> torch.Tensor:
    """Solve ``A x = b`` for a symmetric positive-definite ``A`` given as ``matvec``."""
    x = torch.zeros_like(b)
    r, p = b.clone(), b.clone()
    rr = r @ r
    for _ in range(iterations):
        ap = matvec(p)
        alpha = rr / (p @ ap + 1e-12)
        x += alpha * p
        r -= alpha * ap
        rr_new = r @ r
        if rr_new < tol:
            break
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def flat(grads: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Gradients as one vector, in parameter order. Not ``parameters_to_vector``: its ``view(-1)`` fails on a
    convolution's gradient when the gradient is not contiguous (channels-last inputs give channels-last ones)."""
    return torch.cat([g.reshape(-1) for g in grads])


class TRPOLearner(Learner):
    """TRPO's update: a natural-gradient policy step (conjugate gradient, line search) and a value fit (Adam).

    One learner only: every Fisher-vector product of the conjugate gradient would need its own all-reduce
    (``cg_max_steps`` of them per update, each a full pass over the batch), so N learners would spend their time
    synchronising; the batch TRPO learns from is small and sampling, not the update, bounds it.
    """

    config: TRPOConfig

    def setup(self) -> None:
        """Adam for the value function only."""
        self.optimizer = Adam(self.module.value_parameters(), lr=self.hp["lr"])

    def update(self, fragments: list[Fragment], seed: int) -> dict[str, float]:
        """One natural-gradient policy step and one value fit on the batch the fragments make."""
        cfg = self.config
        batch = on_policy_batch(self.module, fragments, cfg.gamma, cfg.lambda_, self.device)
        self.module.observe_value_targets(batch["returns"])
        # While the policy is frozen (a fresh value head warming up under a policy copied by init_from): no step.
        frozen = not all(p.requires_grad for p in self.module.policy_parameters())
        metrics = {} if frozen else self._policy_step(batch)
        metrics["vf_loss"] = self._fit_value(batch, np.random.default_rng(seed))
        return metrics

    def _policy_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        cfg, module = self.config, self.module
        params = module.policy_parameters()
        advantages = batch["advantages"]
        if cfg.normalize_advantages and len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        obs, actions, old_logp = batch["obs"], batch["actions"], batch["old_logp"]

        def surrogate_and_kl(inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            logp, _ = module.log_prob_entropy(inputs, actions)
            return (torch.exp(logp - old_logp) * advantages).mean(), module.kl(old_inputs, inputs).mean()

        with torch.no_grad():
            old_inputs = module.dist_inputs(obs)
            # The line search's baseline, computed as its candidates are, without gradients: a CNN encoder lays
            # out memory differently when training (herdrl.models.encoders), which changes the last bits, and the
            # search needs a strict improvement.
            old_surrogate = surrogate_and_kl(old_inputs)[0].item()
        surrogate, kl = surrogate_and_kl(module.dist_inputs(obs))  # one forward pass for both gradients
        grad = flat(torch.autograd.grad(surrogate, params, retain_graph=True))
        kl_grad = flat(torch.autograd.grad(kl, params, create_graph=True))

        def fisher_vector(v: torch.Tensor) -> torch.Tensor:
            hvp = torch.autograd.grad(kl_grad @ v, params, retain_graph=True)
            return flat(hvp) + cfg.cg_damping * v

        direction = conjugate_gradient(fisher_vector, grad, cfg.cg_max_steps)
        curvature = direction @ fisher_vector(direction)
        full_step = torch.sqrt(2 * cfg.target_kl / (curvature + 1e-12)) * direction
        old_params = parameters_to_vector(params).detach()

        def evaluate(candidate: torch.Tensor) -> tuple[float, float]:
            vector_to_parameters(candidate, params)
            new, kl = surrogate_and_kl(module.dist_inputs(obs))
            return new.item(), kl.item()

        with torch.no_grad():
            accepted, new_surrogate, kl_value = backtracking_line_search(
                evaluate, old_params, full_step, old_surrogate, cfg.target_kl, cfg.line_search_shrinking_factor,
                cfg.line_search_max_iter)
            vector_to_parameters(old_params if accepted is None else accepted, params)
        return {"policy_improvement": new_surrogate - old_surrogate, "kl": kl_value,
                "line_search_accepted": float(accepted is not None), "grad_norm": float(grad.norm())}

    def _fit_value(self, batch: dict[str, torch.Tensor], rng: np.random.Generator) -> float:
        cfg = self.config
        size, total, count = len(batch["returns"]), 0.0, 0
        minibatches = max(1, round(size / cfg.vf_minibatch_size))
        for _ in range(cfg.num_critic_updates):
            for idx in np.array_split(rng.permutation(size), minibatches):
                stats = self.gradient_step(self.optimizer, self._value_loss, batch, idx)
                total, count = total + float(stats["vf_loss"]), count + 1
        return total / count

    def _value_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = 0.5 * (self.module.value(batch["obs"]) - batch["returns"]).pow(2).mean() * self.module.value_loss_scale()
        return loss, {"vf_loss": loss.detach()}


class TRPO(Algorithm):
    """TRPO on the shared runners (:class:`TRPOLearner`)."""

    config: TRPOConfig
    learner_class = TRPOLearner

    def training_step(self) -> dict[str, float]:
        """One natural-gradient policy step and one value fit on a fresh batch."""
        return self.update_on(self.sample(), self.update_seed())
