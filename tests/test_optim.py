import subprocess
import sys

import pytest
import torch

from herdrl.optim import Adam, RMSprop


@pytest.mark.parametrize("ours_class, ref_class, kwargs", [
    (Adam, torch.optim.Adam, {"lr": 3e-3, "eps": 1e-5}),
    (RMSprop, torch.optim.RMSprop, {"lr": 1e-2, "alpha": 0.99, "eps": 1e-5}),
])
def test_matches_torch_step_for_step(ours_class, ref_class, kwargs):
    torch.manual_seed(0)
    ours_net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    ref_net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    ref_net.load_state_dict(ours_net.state_dict())
    ours = ours_class(ours_net.parameters(), **kwargs)
    ref = ref_class(ref_net.parameters(), **kwargs)
    for _step in range(20):
        x = torch.randn(16, 4)
        for net, opt in ((ours_net, ours), (ref_net, ref)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
    for a, b in zip(ours_net.parameters(), ref_net.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("make", [lambda ps, lr: Adam(ps, lr=lr, betas=(0.8, 0.99), eps=1e-6),
                                  lambda ps, lr: RMSprop(ps, lr=lr, alpha=0.9, eps=1e-6)])
def test_state_dict_round_trip_keeps_the_hyperparameters_it_was_built_with(make):
    """The state (moments, step count) comes from the saved optimizer; lr, betas, eps, alpha from construction
    (the run's config): a clone built with the same values steps exactly as the original, one built with another
    lr moves by that lr's step."""
    p = torch.nn.Parameter(torch.ones(3))
    opt = make([p], 0.1)
    p.grad = torch.ones(3)
    opt.step()
    same_p, other_p = (torch.nn.Parameter(p.detach().clone()) for _ in range(2))
    same, other = make([same_p], 0.1), make([other_p], 1e-9)
    other.eps = 1.0  # a hyperparameter the saved state must not overwrite either
    for clone in (same, other):
        clone.load_state_dict(opt.state_dict())
        assert clone.steps == 1
    assert other.lr == 1e-9 and other.eps == 1.0
    before = other_p.detach().clone()
    for o, q in ((opt, p), (same, same_p), (other, other_p)):
        q.grad = torch.full((3,), 2.0)
        o.step()
    assert torch.equal(p, same_p)
    assert (other_p - before).abs().max() < 1e-8 < (p - before).abs().max()


def test_building_an_algorithm_does_not_import_torch_dynamo():
    code = ("import sys; from herdrl import PPOConfig; a = PPOConfig().environment('CartPole-v1')"
            ".training(train_batch_size=64, minibatch_size=32).build(); a.train(); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
