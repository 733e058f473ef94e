"""MuJoCo envs (the mujoco extra): train by id with PPO (normalised), SAC and TD3; video off-screen."""

import pytest

pytest.importorskip("mujoco", reason="MuJoCo tests need the mujoco extra: pip install 'herdrl[mujoco]'")

from herdrl import TD3Config  # noqa: E402
from herdrl.registry import get_config_class  # noqa: E402


@pytest.mark.parametrize("algo_name, env", [("PPO", "HalfCheetah-v5"), ("SAC", "Hopper-v5"), ("TD3", "Walker2d-v5")])
def test_mujoco_env_trains_two_iterations(algo_name, env):
    config = get_config_class(algo_name)().environment(env).env_runners(observation_filter="MeanStdFilter")
    if algo_name == "PPO":
        config.env_runners(norm_reward=True, num_envs_per_env_runner=2).training(train_batch_size=256,
                                                                                  minibatch_size=64)
    else:
        config.training(num_steps_sampled_before_learning_starts=100, min_sample_timesteps_per_iteration=200,
                        training_intensity=64.0).evaluation(evaluation_duration=1,
                                                            evaluation_config={"max_steps": 50})
    algo = config.debugging(seed=0).build()
    results = [algo.train() for _ in range(2)]
    assert results[-1]["num_env_steps_sampled_lifetime"] >= 400
    assert algo.normalizer.stats["obs"].count >= 400
    algo.stop()


def test_mujoco_video_records_off_screen(tmp_path):
    from herdrl.evaluation import record_video

    algo = TD3Config().environment("InvertedPendulum-v5").training(num_steps_sampled_before_learning_starts=10,
                                                                   min_sample_timesteps_per_iteration=20).build()
    returns, _ = record_video(algo.policy, "InvertedPendulum-v5", {}, tmp_path / "v.mp4", episodes=1, seed=0)
    assert len(returns) == 1 and (tmp_path / "v.mp4").stat().st_size > 1000
    algo.stop()
