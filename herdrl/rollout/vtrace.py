"""V-trace (Espeholt et al. 2018, IMPALA): value targets and policy-gradient advantages for experience sampled
with an older policy, over NEXT_STEP-autoreset fragments.

With truncated importance weights ``rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))`` and ``c_t = min(c_bar, ...)``
(``pi`` the policy being learned, ``mu`` the one that sampled):

    v_t = V(x_t) + rho_t * delta_t + gamma * c_t * (v_{t+1} - V(x_{t+1}))
    delta_t = r_t + gamma * V(x_{t+1}) - V(x_t)
    advantage_t = rho_pg_t * (r_t + gamma * v_{t+1} - V(x_t))

Episode ends follow :func:`herdrl.rollout.advantages.compute_gae`: after a terminated step the next value is 0;
after a truncated one it is the value of the episode's final observation (``values[t + 1]``, which NEXT_STEP
autoreset puts in the next row), and the recursion never crosses an episode end. The row after the fragment's
last step bootstraps from its value. With ``mu = pi`` (no lag) ``v_t`` is the n-step return to the fragment's
end (tested against :func:`compute_gae` with lambda 1).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def vtrace(behaviour_logp: torch.Tensor, target_logp: torch.Tensor, rewards: torch.Tensor, values: torch.Tensor,
           terminateds: torch.Tensor, truncateds: torch.Tensor, gamma: float, clip_rho: float | None = 1.0,
           clip_pg_rho: float | None = 1.0, clip_c: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace value targets ``vs`` and policy-gradient advantages, each (T, B).

    ``behaviour_logp``, ``target_logp``, ``rewards``, ``terminateds``, ``truncateds``: (T, B); ``values``: (T+1, B),
    V of every observation of the fragment, the last one included. ``clip_rho``/``clip_pg_rho`` None: no clipping.
    """
    ratios = torch.exp(target_logp - behaviour_logp)
    rho = ratios if clip_rho is None else torch.clamp(ratios, max=clip_rho)
    pg_rho = ratios if clip_pg_rho is None else torch.clamp(ratios, max=clip_pg_rho)
    c = torch.clamp(ratios, max=clip_c)
    not_terminal = 1.0 - terminateds.float()
    continues = 1.0 - (terminateds | truncateds).float()
    next_values = values[1:] * not_terminal  # V(x_{t+1}), 0 after termination
    deltas = rho * (rewards + gamma * next_values - values[:-1])
    corrections = torch.zeros_like(values)  # v_t - V(x_t); 0 past the fragment's end
    for t in reversed(range(rewards.shape[0])):
        corrections[t] = deltas[t] + gamma * c[t] * continues[t] * corrections[t + 1]
    vs = values[:-1] + corrections[:-1]
    # v_{t+1}: the next target inside an episode; at an episode end, the value of what follows (0 or V(final)).
    next_vs = next_values + continues * corrections[1:]
    advantages = pg_rho * (rewards + gamma * next_vs - values[:-1])
    return vs, advantages
