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


def test_state_dict_round_trip_and_lr_change():
    p = torch.nn.Parameter(torch.ones(3))
    opt = Adam([p], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    clone_p = torch.nn.Parameter(p.detach().clone())
    clone = Adam([clone_p], lr=0.5)
    clone.load_state_dict(opt.state_dict())
    assert clone.lr == 0.1 and clone.steps == 1
    for o, q in ((opt, p), (clone, clone_p)):
        q.grad = torch.full((3,), 2.0)
        o.step()
    assert torch.equal(p, clone_p)


def test_building_an_algorithm_does_not_import_torch_dynamo():
    code = ("import sys; from herdrl import PPOConfig; a = PPOConfig().environment('CartPole-v1')"
            ".training(train_batch_size=64, minibatch_size=32).build(); a.train(); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
