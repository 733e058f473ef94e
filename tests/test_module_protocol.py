"""The module protocol (``herdrl.models.protocol``) changed no result: the reference runs of
``tests/golden/module_protocol.py``, written by the code before it, end in bit-equal weights."""

import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from herdrl import PPOConfig
from herdrl.config import MODEL_DEFAULTS
from herdrl.export import GreedyPolicy, example_obs, input_names, output_names
from herdrl.models.recurrent import RecurrentActorCritic
from herdrl.policy import Policy

sys.path.insert(0, str(Path(__file__).parent / "golden"))
import module_protocol as golden  # noqa: E402


@pytest.mark.parametrize("name", ["ppo_mlp", "ppo_lstm", "ppo_cnn", "impala_lstm", "mappo_lstm", "ma_ppo_lstm",
                                  "qmix_rnn"])
def test_a_few_seeded_updates_end_in_the_weights_written_before_the_protocol(name):
    expected = np.load(golden.GOLDEN)
    weights = golden.run(name)
    assert sorted(weights) == sorted(k for k in expected.files if k.startswith(f"{name}/"))  # same state_dict keys
    differ = [key for key, value in weights.items() if not np.array_equal(value, expected[key])]
    assert not differ, differ


class PairStateLSTM(RecurrentActorCritic):
    """The LSTM with its state as a dict of two tensors ``{"h": (B, H), "c": (B, H)}`` instead of one ``(B, 2,
    H)``: the same numbers, in the shape of state a new module may declare."""

    def initial_state(self, batch):
        zeros = super().initial_state(batch)
        return {"h": zeros[:, 0].clone(), "c": zeros[:, 1].clone()}

    def step(self, obs, state):
        out, packed = super().step(obs, torch.stack([state["h"], state["c"]], 1))
        return out, {"h": packed[:, 0], "c": packed[:, 1]}

    def unroll_features(self, obs, state, starts):
        return super().unroll_features(obs, torch.stack([state["h"], state["c"]], 1), starts)


class PairStatePPO(PPOConfig):
    def actor_critic(self, observation_space, action_space, model):
        module = super().actor_critic(observation_space, action_space, model)
        if isinstance(module, RecurrentActorCritic):
            module.__class__ = PairStateLSTM  # the same weights, drawn in the same order
        return module


def test_runners_and_learners_carry_any_state_the_module_declares():
    """A state of two tensors in a dict goes through runners (reset at episode starts, stored at sequence starts),
    the learner's unroll, the Policy and export exactly as the LSTM's one tensor: the same weights after the same
    updates, the same actions and next states step by step."""
    config = golden._ppo("CartPole-v1", golden.LSTM, config_class=PairStatePPO)
    algo = config.build()
    try:
        for _ in range(3):
            algo.train()
        expected = np.load(golden.GOLDEN)
        weights = algo.get_weights()
        assert all(np.array_equal(value, expected[f"ppo_lstm/{key}"]) for key, value in weights.items())
        module = algo.get_module()
    finally:
        algo.stop()
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    plain = RecurrentActorCritic(space, gym.spaces.Discrete(2), {**MODEL_DEFAULTS, **golden.LSTM})
    plain.load_state_dict(module.state_dict())
    pair, single = Policy(module, space, gym.spaces.Discrete(2)), Policy(plain, space, gym.spaces.Discrete(2))
    assert sorted(pair.initial_state(3)) == ["c", "h"] and single.initial_state(3).shape == (3, 2, 16)
    obs, pair_state, single_state = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32), None, None
    for row in obs:
        a, pair_state = pair.compute_single_action(row, state=pair_state)
        b, single_state = single.compute_single_action(row, state=single_state)
        assert a == b and np.array_equal(np.stack([pair_state["h"], pair_state["c"]]), single_state)
    assert input_names(pair) == ["obs", "state_in/0", "state_in/1"] and input_names(single) == ["obs", "state_in"]
    assert output_names(pair) == ["action", "state_out/0", "state_out/1"]
    obs, state = example_obs(single)
    with torch.no_grad():
        action, h, c = GreedyPolicy(pair)(obs, state[:, 0], state[:, 1])
        same, packed = GreedyPolicy(single)(obs, state)
    assert torch.equal(action, same) and torch.equal(torch.stack([h, c], 1), packed)


def test_every_actor_critic_kind_offers_the_protocol():
    """MLP, CNN, LSTM, and MAPPO's centralised critics (feed-forward and LSTM) answer the protocol's calls; the
    stateless ones declare no state."""
    from herdrl.models.protocol import PolicyModule
    from herdrl.multi_agent import GLOBAL_STATE, OWN_OBSERVATION

    box = gym.spaces.Box(-1, 1, (4,), np.float32)
    image = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
    central = gym.spaces.Dict({OWN_OBSERVATION: box, GLOBAL_STATE: box})
    for space, model, centralized in ((box, {}, False), (image, {}, False), (box, golden.LSTM, False),
                                      (central, {}, True), (central, golden.LSTM, True)):
        config = PPOConfig().training(model=model)
        config.centralized_critic = centralized
        module = config.actor_critic(space, gym.spaces.Discrete(2), {**MODEL_DEFAULTS, **model})
        assert isinstance(module, PolicyModule)
        assert (module.initial_state(2) is None) != module.recurrent


def test_a_one_tensor_state_is_taken_in_any_array_form():
    """RLlib's scripts pass an LSTM's state as ``[h, c]``, a tuple, or lists read back from JSON: each acts as the
    array it holds, one row or a batch."""
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    torch.manual_seed(0)
    policy = Policy(RecurrentActorCritic(space, gym.spaces.Discrete(2), {**MODEL_DEFAULTS, **golden.LSTM}), space,
                    gym.spaces.Discrete(2))
    obs = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    _, state = policy.compute_single_action(obs[0])
    _, state = policy.compute_single_action(obs[1], state=state)  # a state that is not zeros
    expected = policy.compute_single_action(obs[2], state=state)
    for form in (state.tolist(), tuple(state), [state[0], state[1]], state[None]):
        action, next_state = policy.compute_single_action(obs[2], state=form)
        assert action == expected[0] and np.array_equal(next_state, expected[1])
    actions, states = policy.compute_actions(obs, state=np.stack([state] * 3))
    for form in (np.stack([state] * 3).tolist(), [state] * 3):
        same_actions, same_states = policy.compute_actions(obs, state=form)
        assert np.array_equal(same_actions, actions) and np.array_equal(same_states, states)


def test_learner_batches_index_a_state_of_any_structure():
    """Minibatches take rows of every leaf of a nested state (a tuple of a dict and a tensor here), as of the
    observations."""
    from herdrl.rollout.batch import take

    h, c, obs = torch.arange(10.0).reshape(5, 2), torch.arange(15.0).reshape(5, 3), torch.arange(5.0)
    index = torch.tensor([4, 0, 2])
    rows = take({"state": ({"h": h}, c), "obs": obs}, index)
    assert torch.equal(rows["state"][0]["h"], h[index]) and torch.equal(rows["state"][1], c[index])
    assert torch.equal(rows["obs"], obs[index])


def test_state_leaves_cross_to_torch_in_their_own_kind():
    """Float leaves become float32 (the modules' dtype); an integer or bool leaf (a step counter, a mask in a
    memory) keeps its values and kind."""
    from herdrl.models.protocol import state_to_torch

    state = state_to_torch({"memory": np.ones((2, 3)), "position": np.array([3, 7]), "filled": np.array([True,
                            False])}, "cpu")
    assert state["memory"].dtype == torch.float32
    assert state["position"].tolist() == [3, 7] and not state["position"].is_floating_point()
    assert state["filled"].dtype == torch.bool
