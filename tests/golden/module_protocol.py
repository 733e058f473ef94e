"""Reference runs for the module protocol (issue 63): a few seeded updates of PPO (MLP, LSTM, CNN), IMPALA (LSTM),
multi-agent PPO and MAPPO (LSTM) and recurrent QMIX, in the driver (no Ray runners). ``python
tests/golden/module_protocol.py`` wrote ``module_protocol.npz`` with the code before the protocol;
``tests/test_module_protocol.py`` asserts the same runs end in bit-equal weights now."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).with_name("module_protocol.npz")
LSTM = {"use_lstm": True, "lstm_cell_size": 16, "max_seq_len": 4, "fcnet_hiddens": [16]}


def _register() -> None:
    import herdrl
    from herdrl.env.testing import CueRelay

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from envs import MovingDot

    herdrl.register_env("golden_dot", lambda cfg: MovingDot(cfg))
    herdrl.register_env("golden_relay", lambda cfg: CueRelay(cfg))
    herdrl.register_env("golden_team", lambda cfg: CueRelay({"recall": True, "together": True}))


def _ppo(env, model, config_class=None, **training):
    from herdrl import PPOConfig

    return ((config_class or PPOConfig)().environment(env).env_runners(num_env_runners=0, num_envs_per_env_runner=2,
                                                     rollout_fragment_length=32)
            .training(train_batch_size=64, minibatch_size=32, num_epochs=2, model=model, **training)
            .debugging(seed=0))


def configs() -> dict:
    """Run name -> (config, iterations)."""
    from herdrl import IMPALAConfig, QMIXConfig

    _register()
    separate = {"policies": {"p0", "p1"}, "policy_mapping_fn": lambda agent, episode, **kw: "p" + agent[1]}
    return {
        "ppo_mlp": (_ppo("CartPole-v1", {"fcnet_hiddens": [16]}), 3),
        "ppo_lstm": (_ppo("CartPole-v1", LSTM), 3),
        "ppo_cnn": (_ppo("golden_dot", {"conv_filters": [[4, 3, 2], [4, 3, 1]], "fcnet_hiddens": [8]}), 2),
        "impala_lstm": (IMPALAConfig().environment("CartPole-v1")
                        .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=16)
                        .training(train_batch_size=32, model=LSTM).debugging(seed=0), 3),
        "mappo_lstm": (_ppo("golden_relay", LSTM).multi_agent(**separate, centralized_critic=True), 2),
        "ma_ppo_lstm": (_ppo("golden_relay", LSTM).multi_agent(policies={"shared"}), 2),
        "qmix_rnn": (QMIXConfig().environment("golden_team")
                     .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=8)
                     .training(agent_rnn=True, rnn_hidden_dim=8, train_batch_size=4, training_intensity=8.0,
                               model={"max_seq_len": 8, "fcnet_hiddens": [8]},
                               num_steps_sampled_before_learning_starts=32, min_sample_timesteps_per_iteration=32)
                     .debugging(seed=0), 3),
    }


def run(name: str) -> dict[str, np.ndarray]:
    """The weights after the named run's iterations, by ``<run>/<weight name>``."""
    config, iterations = configs()[name]
    algo = config.build()
    try:
        for _ in range(iterations):
            algo.train()
        return {f"{name}/{key}": np.asarray(value) for key, value in algo.get_weights().items()}
    finally:
        algo.stop()


if __name__ == "__main__":
    arrays = {}
    for run_name in configs():
        arrays.update(run(run_name))
    np.savez_compressed(GOLDEN, **arrays)
    print(f"wrote {len(arrays)} arrays to {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
