"""MARWIL: Monotonic Advantage Re-Weighted Imitation Learning (Wang et al. 2018), offline, on a recorded dataset.

The policy imitates the dataset's actions, each weighted by ``exp(beta * advantage / c)``: actions that did better
than the value estimate count more. The advantage is the discounted return-to-go recorded in the episode minus a
learned value ``V(s)``; ``c`` is the root of a running mean of the squared advantages (RLlib's update rate and
start by default). A weight is capped at ``max_weight`` (100, as IQL's; RLlib's has no cap, and its weights
overflow to inf on dense-reward data while the value is still near 0). ``beta = 0`` is behaviour cloning
(:mod:`herdrl.algorithms.bc`). The loss:

    -mean(min(exp(beta * (R - V(s)) / c), max_weight) * log pi(a|s)) + vf_coeff * 0.5 * mean((R - V(s))^2)

``R`` is the discounted reward-to-go to where the recorded episode stops, plus, where it stopped without
terminating (truncated, or cut short by the recording), ``gamma ** (T - t)`` times the current value of the
observation it stopped at (no gradient through it): a lambda = 1 advantage, as RLlib's MARWIL bootstraps. Batches
carry that observation beside each row (``tail_obs``: a third observation per row in memory).
"""

from __future__ import annotations

from typing import Any

import torch

from herdrl.config import Field, shared_field
from herdrl.learner import Learner
from herdrl.offline.algorithm import OfflineAlgorithm, OfflineConfig, OfflineUpdates
from herdrl.optim import Adam


class MARWILConfig(OfflineConfig):
    """MARWIL settings (RLlib's names and advantage-normalisation defaults)."""

    algo_name = "MARWIL"
    FIELDS = {
        "beta": Field(1.0, (float,), "training", low=0,
                      doc="advantage weighting: 0 is behaviour cloning; larger imitates the better actions more"),
        "vf_coeff": Field(1.0, (float,), "training", low=0, doc="weight of the value loss"),
        "max_weight": Field(100.0, (float,), "training", low=0, low_open=True,
                            doc="cap on an advantage weight (exp overflows float32 past 88: inf, then NaN weights)"),
        "moving_average_sqd_adv_norm_start": Field(100.0, (float,), "training", low=0, low_open=True,
                                                   doc="the running mean of squared advantages starts here"),
        "moving_average_sqd_adv_norm_update_rate": Field(
            1e-8, (float,), "training", low=0, high=1, doc="how fast that running mean follows each batch's"),
        "gamma": shared_field("gamma", 0.99),
    }

    @property
    def reads_tails(self) -> bool:
        """Advantages (``beta > 0``) bootstrap truncated episodes: rows carry their episode's tail."""
        return self.beta > 0

    @classmethod
    def algo_class(cls) -> type:
        """:class:`MARWIL`."""
        return MARWIL


class MARWILLearner(OfflineUpdates, Learner):
    """MARWIL's loss and update on the shared Learner (N data-parallel learners split each batch)."""

    config: MARWILConfig

    def setup(self) -> None:
        """Adam over the actor-critic; the running mean of squared advantages."""
        self.optimizer = Adam(self.module.parameters(), lr=self.hp["lr"])
        self.sqd_adv_norm = torch.tensor(float(self.config.moving_average_sqd_adv_norm_start))

    def replay_step(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], None]:
        """One gradient step on the MARWIL loss of the batch (this learner's share of it, with N learners)."""
        stats = self.gradient_step(self.optimizer, self.loss, batch, None, self.config.grad_clip)
        return {key: float(value) for key, value in stats.items()}, None

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The MARWIL loss of the rows given (see the module docstring) and its parts."""
        cfg = self.config
        if cfg.beta == 0.0:  # behaviour cloning: no advantages, no value to learn (nor to compute)
            logp, entropy = self.module.log_prob_entropy(self.module.dist_inputs(batch["obs"]), batch["actions"])
            loss = -logp.mean()
            return loss, {"entropy": entropy.mean().detach(), "policy_loss": loss.detach()}
        dist_inputs, values = self.module(batch["obs"])
        logp, entropy = self.module.log_prob_entropy(dist_inputs, batch["actions"])
        stats = {"entropy": entropy.mean().detach()}
        returns = batch["returns"]
        if "tail_obs" in batch:  # a truncated episode's returns go on from where it stopped, at today's value
            with torch.no_grad():
                returns = returns + batch["tail_discounts"] * self.module.value(batch["tail_obs"])
        advantages = returns - values
        if self.module.training and torch.is_grad_enabled():  # (one update per gradient step, not per evaluation)
            rate = cfg.moving_average_sqd_adv_norm_update_rate
            self.sqd_adv_norm += rate * (self._batch_mean(advantages.detach().pow(2)) - self.sqd_adv_norm)
        weights = torch.exp(cfg.beta * advantages.detach() / (1e-8 + self.sqd_adv_norm.to(values.device).sqrt())
                            ).clamp(max=cfg.max_weight)
        policy_loss = -(weights * logp).mean()
        vf_loss = 0.5 * advantages.pow(2).mean()
        loss = policy_loss + cfg.vf_coeff * vf_loss
        return loss, {**stats, "policy_loss": policy_loss.detach(), "vf_loss": vf_loss.detach(),
                      "mean_weight": weights.mean(), "sqd_adv_norm": self.sqd_adv_norm.clone()}

    def _batch_mean(self, values: torch.Tensor) -> torch.Tensor:
        """The mean of ``values`` over the whole batch: with N learners, over every learner's rows (an all-reduce
        of sums and counts), so every rank's normaliser stays the same."""
        if self.world_size == 1:
            return values.mean().cpu()
        import torch.distributed as dist

        totals = torch.stack([values.sum(), torch.tensor(float(len(values)), device=values.device)])
        dist.all_reduce(totals)
        return (totals[0] / totals[1]).cpu()

    def extra_state(self) -> dict[str, Any]:
        """The running mean of squared advantages."""
        return {"sqd_adv_norm": self.sqd_adv_norm.clone()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`extra_state`."""
        self.sqd_adv_norm = state["sqd_adv_norm"].clone().cpu()


class MARWIL(OfflineAlgorithm):
    """MARWIL (and, with ``beta=0``, behaviour cloning) on a recorded dataset."""

    config: MARWILConfig
    learner_class = MARWILLearner
