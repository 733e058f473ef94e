"""An RLlib 2.x new-stack script, run on herdrl with only its imports changed (the original imports are in the
comments): piecewise lr and entropy_coeff schedules, a callbacks class logging a custom metric at each episode's
end, evaluation every 2 iterations on 1 evaluation runner in parallel with training.

    python examples/rllib/new_stack_ppo.py --stop-iters 10
"""

import argparse

from herdrl import (
    PPOConfig,  # from ray.rllib.algorithms.ppo import PPOConfig
    RLlibCallback,  # from ray.rllib.callbacks.callbacks import RLlibCallback
)


class EpisodeStats(RLlibCallback):
    def on_episode_end(self, *, episode, env_runner, metrics_logger, **kwargs):
        metrics_logger.log_value("episode_length", len(episode), reduce="mean", window=100)
        metrics_logger.log_value("episodes_per_runner", env_runner.worker_index, reduce="sum")


def build_config(args):
    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .environment("CartPole-v1")
        .env_runners(num_env_runners=args.num_env_runners, num_envs_per_env_runner=4)
        .training(
            lr=[[0, 3e-3], [args.decay_steps, 3e-4]],
            entropy_coeff=[[0, 0.01], [args.decay_steps, 0.0]],
            train_batch_size_per_learner=1000,
            minibatch_size=250,
            num_epochs=6,
        )
        .callbacks(EpisodeStats)
        .evaluation(
            evaluation_interval=2,
            evaluation_num_env_runners=1,
            evaluation_parallel_to_training=True,
            evaluation_duration=5,
            evaluation_duration_unit="episodes",
            evaluation_config={"explore": False},
        )
        .debugging(seed=args.seed)
    )


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-iters", type=int, default=10)
    parser.add_argument("--num-env-runners", type=int, default=2)
    parser.add_argument("--decay-steps", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    algo = build_config(args).build()
    for _ in range(args.stop_iters):
        result = algo.train()
        line = (f"iter {result['training_iteration']}: return {result['env_runners']['episode_return_mean']:.1f}, "
                f"episode_length {result['env_runners']['episode_length']:.1f}, lr {result['lr']:.2e}")
        if "evaluation" in result:
            line += f", evaluation return {result['evaluation']['env_runners']['episode_return_mean']:.1f}"
        print(line)
    algo.stop()


if __name__ == "__main__":
    main()
