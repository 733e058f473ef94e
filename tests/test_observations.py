"""Observations of every kind: encoders chosen from the space, uint8 kept end to end, Dict/Tuple and pixels."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import DictCue, MovingDot

import herdrl
from herdrl import ConfigError, DQNConfig, Policy, PPOConfig
from herdrl.buffers import ReplayBuffer, fragment_transitions
from herdrl.checkpoint import space_from_json, space_to_json
from herdrl.models.encoders import Encoder, ImageEncoder, build_encoder, image_layout
from herdrl.obs import ObsSpec
from herdrl.rollout.batch import on_policy_batch

MODEL = {"fcnet_hiddens": [32], "fcnet_activation": "tanh", "conv_filters": None, "conv_activation": "relu",
         "conv_type": "default", "post_fcnet_hiddens": None}


@pytest.mark.parametrize("shape, dtype, layout", [
    ((84, 84, 4), np.uint8, "HWC"),   # SB3's VecFrameStack layout
    ((4, 84, 84), np.uint8, "CHW"),   # Gymnasium's FrameStackObservation layout, ale-py's
    ((84, 84), np.uint8, "HW"),       # one grayscale frame
    ((10, 10, 4), np.bool_, "HWC"),   # MinAtar
    ((64, 64, 3), np.float32, "HWC"),
    ((4, 84, 84, 3), np.uint8, "SHWC"),  # ale-py with grayscale=False; FrameStackObservation over RGB frames
    ((2, 3, 40, 40), np.uint8, "SCHW"),
])
def test_image_encoder_output_shapes_for_each_layout(shape, dtype, layout):
    space = gym.spaces.Box(0, 1 if dtype != np.uint8 else 255, shape, dtype)
    assert image_layout(space)[3] == layout
    encoder = build_encoder(space, MODEL)
    assert isinstance(encoder.leaves[0], ImageEncoder) and len(encoder.mlp) == 0  # one image: the CNN is the encoder
    small = min(image_layout(space)[1:3]) < 36
    assert encoder.out_dim == (128 if small else 512)
    obs = torch.as_tensor(np.stack([space.sample() for _ in range(3)]))
    assert encoder(obs).shape == (3, encoder.out_dim)
    impala = build_encoder(space, {**MODEL, "conv_type": "impala"})
    assert impala(obs).shape == (3, 256)
    own = build_encoder(space, {**MODEL, "conv_filters": [[8, 3, 2], [8, 3, 1, 1]], "post_fcnet_hiddens": [16]})
    assert own(obs).shape == (3, 16)


def test_nature_stack_is_the_standard_network():
    """84 x 84 x 4 -> 32 8x8/4, 64 4x4/2, 64 3x3/1 -> 3136 -> 512 (Mnih et al. 2015; SB3's NatureCNN)."""
    encoder = build_encoder(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), MODEL)
    convs = [m for m in encoder.leaves[0].convs if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size[0], c.stride[0]) for c in convs] == [(32, 8, 4), (64, 4, 2), (64, 3, 1)]
    assert encoder.leaves[0].dense[0].in_features == 3136 and encoder.out_dim == 512


def test_frames_are_scaled_on_the_device_and_channel_layouts_agree():
    """The same frames, HWC uint8 and CHW uint8, give the same features under the same weights; uint8 is
    divided by 255 inside the encoder (a float copy of frames already in [0, 1] gives the same)."""
    hwc = gym.spaces.Box(0, 255, (36, 36, 2), np.uint8)
    chw = gym.spaces.Box(0, 255, (2, 36, 36), np.uint8)
    floats = gym.spaces.Box(0.0, 1.0, (36, 36, 2), np.float32)
    a, b, c = (build_encoder(s, MODEL) for s in (hwc, chw, floats))
    b.load_state_dict(a.state_dict())
    c.load_state_dict(a.state_dict())
    frames = torch.as_tensor(np.stack([hwc.sample() for _ in range(2)]))
    assert torch.allclose(a(frames), b(frames.permute(0, 3, 1, 2)), atol=1e-5)
    assert torch.allclose(a(frames), c(frames.float() / 255), atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 84, 84), (84, 84, 4), (84, 84), (10, 10, 4), (2, 3, 40, 40), (2, 40, 40, 3)])
@pytest.mark.parametrize("conv_type", ["default", "impala"])
def test_image_encoder_equals_a_plain_nchw_network_in_values_and_gradients(shape, conv_type):
    """The encoder trains its convolutions on channels-last memory (for speed); what it computes, training or
    acting, must be the network written plainly on a contiguous NCHW float batch with the same weights: the same
    features, in the same flattened order for the dense layers, and (stacks without max-pools) the same
    gradients."""
    torch.manual_seed(0)
    space = gym.spaces.Box(0, 255, shape, np.uint8, seed=0)
    encoder = build_encoder(space, {**MODEL, "conv_type": conv_type})
    leaf = encoder.leaves[0]
    frames = torch.as_tensor(np.stack([space.sample() for _ in range(5)]))
    # The reference layout, written out by hand, scaled as the encoder scales (x * (1/255), not x / 255).
    nchw = frames.float() * (1 / 255)
    if len(shape) == 2:  # HW
        nchw = nchw[:, None]
    elif len(shape) == 3 and shape[-1] == 4:  # HWC
        nchw = nchw.permute(0, 3, 1, 2)
    elif len(shape) == 4 and shape[-1] == 3:  # SHWC: a stack of RGB frames
        nchw = nchw.permute(0, 1, 4, 2, 3)
    nchw = nchw.reshape(5, -1, *nchw.shape[-2:]).contiguous()
    assert nchw.shape[1:] == leaf.shape
    first_conv_input = []
    leaf.convs[0].register_forward_pre_hook(lambda module, args: first_conv_input.append(args[0]))
    features = encoder(frames)
    if leaf.shape[0] > 1:  # training takes the fast path (one channel: both layouts are the same memory)
        assert first_conv_input[0].is_contiguous(memory_format=torch.channels_last)
    reference = leaf.dense(leaf.convs(nchw).view(5, -1))  # view: NCHW order, and fails on any other memory
    with torch.inference_mode():  # inference (runners) keeps the frames' own layout: the same features
        acting = encoder(frames)
    if leaf.layout in ("CHW", "SCHW"):
        assert first_conv_input[1].is_contiguous()
    for computed in (features, acting):
        assert (computed - reference).abs().max() <= 1e-5 * reference.abs().max()  # float32 rounding
    if conv_type == "impala":  # its max-pools route gradients by argmax: a last-bit change flips near-ties
        return
    grads = torch.autograd.grad(features.square().sum(), list(encoder.parameters()))
    ref_grads = torch.autograd.grad(reference.square().sum(), list(encoder.parameters()))
    for grad, ref in zip(grads, ref_grads, strict=True):  # float32 rounding, relative to each tensor's scale
        assert (grad - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_what_is_not_an_image_and_how_integers_are_scaled():
    """Small rank-3 tensors of features stay vectors; integer leaves are scaled by their bounds only where the
    range is small (RAM bytes), never when declared up to 2**63 (a counter would reach the network as 0)."""
    assert image_layout(gym.spaces.Box(-1, 1, (10, 2, 3), np.float32)) is None
    counter = gym.spaces.Box(np.array([0, 0]), np.array([255, np.iinfo(np.int64).max]), (2,), np.int64)
    features = build_encoder(counter, {**MODEL, "fcnet_hiddens": []})(torch.tensor([[51, 1_000_000]]))
    assert features.tolist() == [[pytest.approx(0.2), 1_000_000.0]]
    mask = gym.spaces.Box(0, 1, (16, 16, 1), np.uint8)  # a 0/1 uint8 image: divided by its high, 1
    assert build_encoder(mask, MODEL).leaves[0].scale == 1.0


def test_bad_conv_filters_are_one_line():
    with pytest.raises(ConfigError, match="conv_filters .* do not fit images of 10 x 10 pixels"):
        build_encoder(gym.spaces.Box(0, 255, (10, 10, 1), np.uint8), {**MODEL, "conv_filters": [[8, 8, 4], [8, 4, 2]]})
    with pytest.raises(ConfigError, match="model key 'conv_filters' got"):
        PPOConfig().environment("CartPole-v1").training(model={"conv_filters": [[8, 8]]}).validate()
    with pytest.raises(ConfigError, match="model key 'conv_type' got 'resnet'"):
        PPOConfig().environment("CartPole-v1").training(model={"conv_type": "resnet"}).validate()


def test_dict_and_tuple_leaves_are_encoded_each_and_concatenated():
    state = gym.spaces.Tuple((gym.spaces.Discrete(3, start=1), gym.spaces.MultiDiscrete([2, 4]),
                              gym.spaces.MultiBinary(2), gym.spaces.Box(0, 255, (5,), np.uint8)))
    space = gym.spaces.Dict({"img": gym.spaces.Box(0, 255, (12, 12, 3), np.uint8), "state": state})
    spec = ObsSpec(space)
    assert list(spec.leaves) == ["img", "state/0", "state/1", "state/2", "state/3"]
    assert spec.dtypes["img"] == np.uint8 and spec.dtypes["state/3"] == np.uint8 and spec.dtypes["state/0"] == np.int64
    encoder = Encoder(space, MODEL)
    assert encoder.mlp[0].in_features == 128 + 3 + 6 + 2 + 5
    vec = gym.vector.SyncVectorEnv([lambda: _SpaceEnv(space)] * 2)
    batch = spec.batch(vec.reset(seed=0)[0])
    features = encoder.features({k: torch.as_tensor(v) for k, v in batch.items()})
    assert features.shape == (2, 144)
    one_hot = features[:, 128:131]
    assert torch.equal(one_hot.argmax(1), torch.as_tensor(batch["state/0"] - 1))  # Discrete(3, start=1)
    ram = features[:, 139:144]
    assert torch.allclose(ram, torch.as_tensor(batch["state/3"]).float() / 255)  # uint8 vector scaled by its bounds
    assert space_from_json(space_to_json(space)) == space


class _SpaceEnv(gym.Env):
    def __init__(self, space):
        self.observation_space, self.action_space = space, gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def test_uint8_frames_stay_uint8_from_runner_to_learner_and_replay():
    herdrl.register_env("moving_dot", MovingDot)
    algo = PPOConfig().environment("moving_dot").env_runners(num_envs_per_env_runner=2) \
        .training(train_batch_size=40, minibatch_size=20).build()
    runner = algo.runners.runner
    fragment = runner.sample(5)
    assert fragment.obs.dtype == np.uint8 and fragment.obs.shape == (6, 2, 10, 10, 2)
    batch = on_policy_batch(algo.module, [fragment], 0.99, 0.95, torch.device("cpu"))
    assert batch["obs"].dtype == torch.uint8 and batch["obs"].shape == (10, 10, 10, 2)
    assert type(runner.policy).__name__ == "TorchPolicy"  # CNNs run in torch on runners
    buffer = ReplayBuffer(32, ObsSpec(MovingDot().observation_space), np.random.default_rng(0))
    buffer.add(fragment_transitions(fragment, 0.99))
    frames = buffer.frames[""]  # each distinct frame stored once, as uint8 (tests/test_frame_store.py)
    assert frames.units.dtype == np.uint8 and frames.units.shape[1:] == (10, 10, 2)
    data, _, _ = buffer.sample(4)
    assert data["obs"].dtype == np.uint8 and data["next_obs"].dtype == np.uint8
    algo.stop()


def test_ppo_and_dqn_solve_a_task_only_an_image_encoder_can():
    herdrl.register_env("moving_dot", MovingDot)
    ppo = (PPOConfig().environment("moving_dot").env_runners(num_envs_per_env_runner=8)
           .training(train_batch_size=800, minibatch_size=200, num_epochs=4, lr=1e-3).debugging(seed=0).build())
    result = ppo.train()
    while result["episode_return_mean"] < 9.5 and result["num_env_steps_sampled_lifetime"] < 40_000:
        result = ppo.train()
    assert result["episode_return_mean"] >= 9.5, result["episode_return_mean"]
    ppo.stop()
    dqn = (DQNConfig().environment("moving_dot").env_runners(num_envs_per_env_runner=4)
           .training(lr=1e-3, train_batch_size=64, training_intensity=4, epsilon=[[0, 1.0], [3000, 0.05]],
                     num_steps_sampled_before_learning_starts=500, target_network_update_freq=500,
                     min_sample_timesteps_per_iteration=1000).debugging(seed=0).build())
    result = dqn.train()
    while result["episode_return_mean"] < 9 and result["num_env_steps_sampled_lifetime"] < 20_000:
        result = dqn.train()
    assert result["episode_return_mean"] >= 9, result["episode_return_mean"]
    dqn.stop()


def test_ppo_learns_a_nested_dict_observation_and_policy_takes_it(tmp_path):
    herdrl.register_env("dict_cue", DictCue)
    algo = (PPOConfig().environment("dict_cue").env_runners(num_envs_per_env_runner=8)
            .training(train_batch_size=512, minibatch_size=128, lr=3e-3).debugging(seed=0).build())
    result = algo.train()
    while result["episode_return_mean"] < 7.5 and result["num_env_steps_sampled_lifetime"] < 40_000:
        result = algo.train()
    assert result["episode_return_mean"] >= 7.5, result["episode_return_mean"]
    path = algo.save(tmp_path)
    policy = Policy.from_checkpoint(path)
    env = DictCue()
    obs, _ = env.reset(seed=1)
    correct = 0
    for _ in range(40):
        correct += int(policy.compute_single_action(obs) == (obs["cue"] ^ int(obs["signal"][0][0] > 0)))
        obs, *_ = env.step(0)
    assert correct >= 36
    algo.stop()


@pytest.mark.usefixtures("ray_session")
def test_frames_cross_rays_object_store_as_uint8():
    """A Ray runner's fragment arrives in the driver with its frames still uint8 (4x less than float32)."""
    herdrl.register_env("moving_dot", MovingDot)
    algo = PPOConfig().environment("moving_dot").env_runners(num_env_runners=1, num_envs_per_env_runner=2) \
        .training(train_batch_size=40, minibatch_size=20).build()
    from herdrl.rollout.transport import resolve

    (fragment,), _ = resolve([item.data for item in algo.sample()])
    assert fragment.obs.dtype == np.uint8 and fragment.obs.shape[2:] == (10, 10, 2)
    assert algo.train()["num_env_steps_sampled"] > 0
    algo.stop()


class TinyEncoder(torch.nn.Module):
    """A custom encoder: gets the observation as the env gives it (uint8 frames), returns out_dim features."""

    def __init__(self, space, config):
        super().__init__()
        self.out_dim = config.get("width", 16)
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(space.shape)), self.out_dim),
                                       torch.nn.ReLU())
        self.seen = []

    def forward(self, obs):
        self.seen.append(obs.dtype)
        return self.net(obs.float() / 255)


def test_a_registered_custom_encoder_replaces_the_default_and_reloads(tmp_path):
    herdrl.register_env("moving_dot", MovingDot)
    herdrl.register_encoder("tiny", TinyEncoder)
    algo = (PPOConfig().environment("moving_dot").training(
        train_batch_size=64, minibatch_size=32, model={"custom_encoder": "tiny", "custom_encoder_config": {"width": 8}})
        .build())
    encoder = algo.module.pi_encoder.net
    assert isinstance(encoder, TinyEncoder) and algo.module.pi_head.in_features == 8
    assert algo.module.vf_encoder is None  # image observations: one encoder under both heads
    algo.train()
    assert set(encoder.seen) == {torch.uint8}  # frames reach it as the env gives them
    policy = Policy.from_checkpoint(algo.save(tmp_path))
    assert isinstance(policy.module.pi_encoder.net, TinyEncoder)
    algo.stop()
    with pytest.raises(ConfigError, match="model key 'custom_encoder' names 'nope', which is not registered"):
        PPOConfig().environment("moving_dot").training(model={"custom_encoder": "nope"}).build()


def test_dqn_learns_a_nested_dict_observation_and_its_buffer_survives_a_checkpoint(tmp_path):
    from herdrl import Algorithm

    herdrl.register_env("dict_cue", DictCue)
    algo = (DQNConfig().environment("dict_cue").env_runners(num_envs_per_env_runner=4)
            .training(lr=1e-3, train_batch_size=64, training_intensity=4, epsilon=[[0, 1.0], [2000, 0.05]],
                      num_steps_sampled_before_learning_starts=256, target_network_update_freq=500,
                      min_sample_timesteps_per_iteration=1000, store_buffer_in_checkpoints=True)
            .debugging(seed=0).build())
    result = algo.train()
    while result["episode_return_mean"] < 7 and result["num_env_steps_sampled_lifetime"] < 20_000:
        result = algo.train()
    assert result["episode_return_mean"] >= 7, result["episode_return_mean"]
    assert set(algo.buffer.obs) == {"cue", "signal/0", "signal/1"} and algo.buffer.obs["signal/1"].dtype == np.int8
    restored = Algorithm.from_checkpoint(algo.save(tmp_path))
    assert len(restored.buffer) == len(algo.buffer)
    assert np.array_equal(restored.buffer.state()["next_obs/cue"], algo.buffer.state()["next_obs/cue"])
    algo.stop()
    restored.stop()


def _layers(module):
    return {name: layer for name, layer in module.named_modules()
            if isinstance(layer, (torch.nn.Linear, torch.nn.Conv2d))}


def test_model_init_pytorch_draws_herdrls_layers_as_pytorch_does_and_leaves_a_custom_encoders_alone():
    from herdrl import SACConfig

    herdrl.register_encoder("tiny", TinyEncoder)
    pendulum = gym.make("Pendulum-v1")
    frames = gym.spaces.Box(0, 255, (10, 10, 2), np.uint8)
    built = {}
    for init in ("orthogonal", "pytorch"):
        torch.manual_seed(0)
        sac = SACConfig().training(model={"fcnet_hiddens": [256, 256], "init": init}).build_module(
            pendulum.observation_space, pendulum.action_space)
        image = PPOConfig().training(model={"init": init}).build_module(frames, gym.spaces.Discrete(2))
        torch.manual_seed(1)
        custom = PPOConfig().training(model={"custom_encoder": "tiny", "init": init}).build_module(
            frames, gym.spaces.Discrete(2))
        built[init] = (sac, image, custom)
    sac, image, _ = built["orthogonal"]
    for name, layer in {**_layers(sac), **_layers(image)}.items():
        weight = layer.weight.detach().flatten(1)
        assert not layer.bias.detach().any(), name
        # orthonormal rows (or columns, for a layer wider than its input) times the gain
        gram = weight @ weight.T if weight.shape[0] <= weight.shape[1] else weight.T @ weight
        gain = gram.diagonal().mean().sqrt()
        torch.testing.assert_close(gram, gain**2 * torch.eye(len(gram)), atol=1e-4 * max(1.0, gain**2), rtol=0,
                                   msg=name)
    sac, image, _ = built["pytorch"]
    for name, layer in {**_layers(sac), **_layers(image)}.items():
        # PyTorch's default: weights and biases uniform in +-1/sqrt(fan_in) (Kaiming-uniform with a = sqrt 5)
        bound = 1 / np.sqrt(layer.weight[0].numel())
        for values in (layer.weight.detach(), layer.bias.detach()):
            spread = values.abs().max()
            assert spread <= bound and (spread > 0.8 * bound if values.numel() >= 50 else spread > 0), name
        if layer.weight.numel() >= 500:  # enough draws for the uniform's std, bound / sqrt 3, within 10%
            assert abs(layer.weight.detach().std() / (bound / np.sqrt(3)) - 1) < 0.1, name
    # the custom encoder's own layers are as its factory drew them (same seed, same draws), herdrl's heads are not
    ortho, default = (dict(built[init][2].named_parameters()) for init in ("orthogonal", "pytorch"))
    custom_keys = [key for key in ortho if ".net." in key]
    assert custom_keys and all(torch.equal(ortho[key], default[key]) for key in custom_keys)
    assert not torch.equal(ortho["pi_head.weight"], default["pi_head.weight"])
    with pytest.raises(ConfigError, match="model key 'init' got 'xavier'; expected 'orthogonal'"):
        PPOConfig().environment("CartPole-v1").training(model={"init": "xavier"}).validate()
