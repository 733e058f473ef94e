"""APPO: IMPALA's asynchronous architecture with PPO's clipped surrogate (RLlib's APPO).

Everything about sampling, queues, broadcasts and V-trace is IMPALA's (``impala.py``). The learner keeps an
*old* copy of the policy, refreshed every ``target_network_update_freq`` trained env steps: V-trace corrects
from the behaviour policy to the old one, and the surrogate clips the ratio of the current policy to the old
one (``clip_param``), with the behaviour-to-old importance weight clipped to [0, 2] as RLlib does. An optional
KL penalty (``use_kl_loss``, ``kl_coeff``) keeps the current policy near the old.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from herdrl.algorithms.dqn import polyak_update
from herdrl.algorithms.impala import IMPALA, IMPALAConfig, IMPALALearner, vtrace_batch
from herdrl.config import Field, shared_field
from herdrl.rollout import Fragment
from herdrl.rollout.batch import forward_flat


class APPOConfig(IMPALAConfig):
    """APPO settings (RLlib's names)."""

    algo_name = "APPO"
    FIELDS = {
        "lr": shared_field("lr", 5e-4),
        "circular_buffer_iterations_per_batch": shared_field("circular_buffer_iterations_per_batch", 2,
                                                             IMPALAConfig),
        "clip_param": Field(0.4, (float,), "training", low=0, low_open=True, doc="surrogate clip range"),
        "use_kl_loss": Field(False, (bool,), "training", doc="add kl_coeff * KL(old || current) to the loss"),
        "kl_coeff": Field(1.0, (float,), "training", low=0),
        "target_network_update_freq": Field(
            1600, (int,), "training", low=1, doc="trained env steps between refreshes of the old policy"),
        "tau": Field(1.0, (float,), "training", low=0, low_open=True, high=1,
                     doc="1: the old policy becomes a copy; < 1: Polyak-averaged towards the current one"),
    }

    @classmethod
    def algo_class(cls) -> type:
        """:class:`APPO`."""
        return APPO


class APPOLearner(IMPALALearner):
    """APPO's update: the clipped surrogate on V-trace advantages against the old policy, value regression,
    entropy bonus and an optional KL penalty."""

    config: APPOConfig

    def setup(self) -> None:
        """Adam, and the old policy (a frozen copy of the module)."""
        super().setup()
        self.old = self.config.build_module(self.observation_space, self.action_space).to(self.device)
        self.old.load_state_dict(self.module.state_dict())
        self.old.requires_grad_(False)
        self._trained_since_refresh = 0

    #: Like PPO's epochs: the targets are prepared once per batch, and the clipped ratio to the old policy, computed
    #: afresh in every pass, bounds how far the passes move the policy.
    prepare_each_pass = False

    def after_batch(self, fragments: list[Fragment], passes: int) -> None:
        """Refresh the old policy when ``target_network_update_freq`` trained env steps have passed (between
        batches, so every pass over a batch is clipped against the same old policy; with ``shard_fragments`` the
        env steps of every learner's share count, so the ranks refresh together)."""
        steps = self.global_sums([float(sum(f.env_steps for f in fragments))])[0]
        self._trained_since_refresh += passes * int(round(steps))
        refreshes, self._trained_since_refresh = divmod(self._trained_since_refresh,
                                                        self.config.target_network_update_freq)
        if refreshes:
            polyak_update(self.old, self.module, 1.0 - (1.0 - self.config.tau) ** refreshes)

    def prepare(self, fragments: list[Fragment]) -> dict[str, Any]:
        """V-trace towards the old policy."""
        return vtrace_batch(self.module, fragments, self.config, self.device, target_module=self.old)

    def loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``-mean(min(r A, clip(r) A)) + vf_loss_coeff * 0.5 * MSE(V, vs) - entropy_coeff * H [+ kl_coeff * KL]``
        with ``r = pi / mu * clip(mu / pi_old, 0, 2)`` (``mu`` the behaviour policy)."""
        cfg = self.config
        dist_inputs, values, batch = forward_flat(self.module, batch)
        logp, entropy = self.module.log_prob_entropy(dist_inputs, batch["actions"])
        # min(mu / pi_old, 2) * pi / mu = pi / max(pi_old, mu / 2): the same ratio, without 0 * inf from a far-off
        # behaviour policy.
        ratio = torch.exp(logp - torch.maximum(batch["old_logp"], batch["behaviour_logp"] - math.log(2.0)))
        adv = batch["advantages"]
        policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - cfg.clip_param, 1 + cfg.clip_param) * adv).mean()
        vf_loss = 0.5 * (values - batch["vs"]).pow(2).mean()
        entropy_mean = entropy.mean()
        kl = self.module.kl(batch["old_dist_inputs"], dist_inputs).mean()
        loss = policy_loss + cfg.vf_loss_coeff * vf_loss - self.hp["entropy_coeff"] * entropy_mean
        if cfg.use_kl_loss:
            loss = loss + cfg.kl_coeff * kl
        return loss, {"policy_loss": policy_loss.detach(), "vf_loss": vf_loss.detach(),
                      "entropy": entropy_mean.detach(), "kl": kl.detach(),
                      "clip_fraction": ((ratio - 1).abs() > cfg.clip_param).float().mean().detach()}

    def extra_state(self) -> dict[str, Any]:
        """The old policy and the trained env steps since its refresh."""
        return {"old": self.old.state_dict(), "trained_since_refresh": self._trained_since_refresh}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`extra_state`."""
        self.old.load_state_dict(state["old"])
        self._trained_since_refresh = int(state.get("trained_since_refresh", 0))


class APPO(IMPALA):
    """APPO: IMPALA's asynchronous loop with :class:`APPOLearner`."""

    config: APPOConfig
    learner_class = APPOLearner

