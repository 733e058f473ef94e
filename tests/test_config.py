import pytest

from herdrl import ConfigError, PPOConfig


def test_builder_names_and_legacy_aliases_set_the_same_values():
    new = (PPOConfig().environment("CartPole-v1", env_config={"a": 1})
           .env_runners(num_env_runners=2, num_envs_per_env_runner=4, rollout_fragment_length=32)
           .resources(num_gpus=0).training(minibatch_size=64, num_epochs=5, lambda_=0.9).debugging(seed=3))
    old = (PPOConfig().framework("torch").environment(env="CartPole-v1", env_config={"a": 1})
           .rollouts(num_rollout_workers=2, num_envs_per_worker=4, rollout_fragment_length=32)
           .resources(num_gpus=0).training(sgd_minibatch_size=64, num_sgd_iter=5, **{"lambda": 0.9})
           .debugging(seed=3))
    as_dict = PPOConfig.from_dict({"env": "CartPole-v1", "env_config": {"a": 1}, "num_workers": 2,
                                   "num_envs_per_worker": 4, "rollout_fragment_length": 32, "num_gpus": 0,
                                   "sgd_minibatch_size": 64, "num_sgd_iter": 5, "lambda": 0.9, "seed": 3,
                                   "framework": "torch"})
    assert new == old == as_dict
    assert new.num_env_runners == 2 and new.num_workers == 2
    assert new.minibatch_size == 64 and new.sgd_minibatch_size == 64


def test_attribute_access_and_to_dict_round_trip():
    config = PPOConfig().environment("CartPole-v1")
    config.lr = 3e-4
    assert config.lr == 3e-4
    assert PPOConfig.from_dict(config.to_dict()) == config
    copy = config.copy()
    copy.lr = 1.0
    assert config.lr == 3e-4


def test_model_dict_merges_with_defaults_and_rejects_unknown_keys():
    config = PPOConfig().training(model={"fcnet_hiddens": [32]})
    assert config.model["fcnet_hiddens"] == [32]
    assert config.model["fcnet_activation"] == "tanh"
    with pytest.raises(ConfigError, match="unknown model key 'fcnet_hidden'.*did you mean 'fcnet_hiddens'"):
        PPOConfig().training(model={"fcnet_hidden": [32]})


@pytest.mark.parametrize("kwargs, message", [
    ({"lrr": 1e-3}, r"unknown config key 'lrr' for PPO \(did you mean 'lr'\?\)"),
    ({"minibatch": 64}, r"did you mean 'minibatch_size'"),
    ({"entropy_coef": 0.01}, r"did you mean 'entropy_coeff'"),
])
def test_unknown_key_names_the_nearest_valid_key(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PPOConfig().training(**kwargs)


def test_an_unknown_key_is_named_as_typed_with_the_algorithms_that_have_it():
    """`lambda` (a Python keyword, stored as `lambda_`) given to DQN, which has none: the message says `lambda`."""
    from herdrl.algorithms.dqn import DQNConfig

    for build in (lambda: DQNConfig().update_from_dict({"lambda": 0.9}), lambda: DQNConfig().training(
            **{"lambda": 0.9})):
        with pytest.raises(ConfigError, match=r"^unknown config key 'lambda' for DQN \(a key of PPO, A2C, TRPO\)$"):
            build()
    assert PPOConfig().update_from_dict({"lambda": 0.5}).lambda_ == 0.5
    assert PPOConfig().training(**{"lambda": 0.25}).lambda_ == 0.25


def test_key_given_to_the_wrong_builder_method_names_the_right_one():
    with pytest.raises(ConfigError, match=r"'num_env_runners' is set with .env_runners\(\), not .training\(\)"):
        PPOConfig().training(num_env_runners=2)


@pytest.mark.parametrize("key, value, message", [
    ("lr", -1e-3, r"'lr' got -0.001; expected float >= 0, or a schedule"),
    ("lr", "fast", r"'lr' got str 'fast'; expected float"),
    ("gamma", 1.5, r"'gamma' got 1.5; expected float in \[0, 1\]"),
    ("num_epochs", 0, r"'num_epochs' got 0; expected int >= 1"),
    ("num_epochs", 2.5, r"'num_epochs' got float 2.5; expected int"),
    ("train_batch_size", True, r"'train_batch_size' got True"),
    ("minibatch_size", 5000, r"'minibatch_size' got 5000; expected <= train_batch_size \(1024\)"),
    ("clip_param", 0.0, r"'clip_param' got 0.0; expected float > 0"),
    ("model", {"fcnet_hiddens": [0]}, r"'fcnet_hiddens' got \[0\]"),
    ("model", {"fcnet_activation": "sigmoidal"}, r"'fcnet_activation' got 'sigmoidal'"),
])
def test_bad_values_name_the_key_and_the_allowed_range_at_build_time(key, value, message):
    config = PPOConfig().environment("CartPole-v1").training(**{key: value})  # accepted until validated
    with pytest.raises(ConfigError, match=message):
        config.build()


def test_bad_env_runner_values():
    with pytest.raises(ConfigError, match="'num_env_runners' got -1; expected int >= 0"):
        PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=-1).validate()
    with pytest.raises(ConfigError, match="'gym_env_vectorize_mode' got 'threads'; expected one of"):
        PPOConfig().environment("CartPole-v1").env_runners(gym_env_vectorize_mode="threads").validate()
    with pytest.raises(ConfigError, match="expected 'auto' or int"):
        PPOConfig().environment("CartPole-v1").env_runners(rollout_fragment_length="long").validate()


def test_other_frameworks_are_a_clear_error():
    with pytest.raises(ConfigError, match="framework 'tf2' is not supported: herdrl runs on PyTorch"):
        PPOConfig().framework("tf2")
    with pytest.raises(ConfigError, match="framework 'tf' is not supported"):
        PPOConfig.from_dict({"framework": "tf"})


def test_missing_env_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"no env set: use .environment\('CartPole-v1'\)"):
        PPOConfig().build()


def test_integers_are_accepted_where_floats_are_expected():
    config = PPOConfig().environment("CartPole-v1").training(lr=1, grad_clip=1)
    config.validate()
    assert isinstance(config.lr, float) and config.lr == 1.0


def test_fragment_length_auto_covers_the_train_batch():
    config = PPOConfig().env_runners(num_envs_per_env_runner=16).training(train_batch_size=1000)
    assert config.fragment_length() == 63  # ceil(1000 / 16)
    config.env_runners(rollout_fragment_length=10)
    assert config.fragment_length() == 10
