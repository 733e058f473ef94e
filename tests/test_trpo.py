import pytest
import torch

from herdrl import ConfigError, TRPOConfig
from herdrl.algorithms.trpo import backtracking_line_search, conjugate_gradient


def test_trpo_solves_cartpole_within_a_fixed_budget():
    algo = TRPOConfig().environment("CartPole-v1").debugging(seed=1).build()
    result = algo.train()
    assert result["kl"] <= algo.config.target_kl
    while result["episode_return_mean"] < 475 and result["num_env_steps_sampled_lifetime"] < 250_000:
        result = algo.train()
    assert result["episode_return_mean"] >= 475, result
    algo.stop()


def test_trpo_policy_steps_respect_the_kl_bound_on_continuous_actions():
    algo = TRPOConfig().environment("Pendulum-v1").training(train_batch_size=512).debugging(seed=0).build()
    for _ in range(3):
        result = algo.train()
        assert result["kl"] <= 0.01 + 1e-6
        assert result["line_search_accepted"] in (0.0, 1.0)
    algo.stop()


def test_conjugate_gradient_solves_a_spd_system():
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0]])
    b = torch.tensor([1.0, 2.0])
    x = conjugate_gradient(lambda v: a @ v, b, iterations=10)
    assert torch.allclose(a @ x, b, atol=1e-5)


def test_trpo_refuses_shared_layers():
    with pytest.raises(ConfigError, match="'vf_share_layers' must be False for TRPO"):
        TRPOConfig().environment("CartPole-v1").training(model={"vf_share_layers": True}).validate()


def test_line_search_takes_the_longest_step_within_the_kl_bound_that_improves():
    # surrogate -(x - 1)^2 improves towards x = 1; KL x^2 / 2; from x = 0 with a full step of 4 and halving:
    # x = 4 (KL 8) and 2 (KL 2) break the 0.5 bound, x = 1 (KL 0.5) is within it and improves: accepted.
    evaluate = lambda x: (float(-(x - 1) ** 2), float(x ** 2 / 2))  # noqa: E731
    start, step = torch.tensor(0.0), torch.tensor(4.0)
    accepted, surrogate, kl = backtracking_line_search(evaluate, start, step, -1.0, 0.5, 0.5, 10)
    assert float(accepted) == 1.0 and surrogate == 0.0 and kl == 0.5


def test_line_search_rejects_steps_that_do_not_improve_or_break_the_bound():
    worse = lambda x: (float(-(x + 1) ** 2), 0.0)  # noqa: E731  every step lowers the surrogate
    result = backtracking_line_search(worse, torch.tensor(0.0), torch.tensor(1.0), -1.0, 0.5, 0.5, 10)
    assert result == (None, -1.0, 0.0)
    too_far = lambda x: (float(x), 1.0)  # noqa: E731  improves, but the KL is always over the bound
    assert backtracking_line_search(too_far, torch.tensor(0.0), torch.tensor(1.0), 0.0, 0.5, 0.5, 10)[0] is None
