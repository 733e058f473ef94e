"""Callbacks and a custom metric, RLlib's way: python examples/cartpole_callbacks.py [NUM_ENV_RUNNERS]

The same class from the command line (run in examples/, or with examples/ on PYTHONPATH):

    herd train ppo --env CartPole-v1 --callbacks cartpole_callbacks:PoleAngle --stop-iters 5

The metric is in every result row as ``env_runners/max_pole_angle`` (``result["env_runners"]["max_pole_angle"]``),
in progress.csv, TensorBoard and Tune, and ``herd plot --metric env_runners/max_pole_angle`` draws it.
"""

import sys

from herdrl import PPOConfig, RLlibCallback


class PoleAngle(RLlibCallback):
    """The largest pole angle (radians) of each episode, averaged over the last 50 episodes of all runners."""

    def on_episode_start(self, *, episode, **kwargs):
        episode.custom_data["angles"] = []

    def on_episode_step(self, *, episode, **kwargs):
        episode.custom_data["angles"].append(abs(float(episode.get_observations(-1)[2])))

    def on_episode_end(self, *, episode, metrics_logger, **kwargs):
        metrics_logger.log_value("max_pole_angle", max(episode.custom_data["angles"]), reduce="mean", window=50)
        metrics_logger.log_value("episodes_seen", 1, reduce="lifetime_sum")

    def on_train_result(self, *, algorithm, result, **kwargs):
        result["pole_angle_degrees"] = result["env_runners"]["max_pole_angle"] * 57.2958


if __name__ == "__main__":
    runners = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    config = (PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=runners, num_envs_per_env_runner=8)
              .callbacks(PoleAngle).debugging(seed=0))
    algo = config.build()
    for _ in range(10):
        result = algo.train()
        print(f"iteration {result['training_iteration']}: return {result['episode_return_mean']:.1f}, "
              f"max pole angle {result['pole_angle_degrees']:.1f} degrees over "
              f"{result['env_runners']['episodes_seen']:.0f} episodes")
    algo.stop()
