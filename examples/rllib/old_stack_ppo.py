"""An older RLlib 2.x script (the old API stack), run on herdrl with only its imports changed (the originals are in
the comments): .rollouts(...), lr_schedule, a DefaultCallbacks subclass with episode.custom_metrics,
evaluation_num_workers, result["episode_reward_mean"] and ["timesteps_total"], tune.run(...).get_best_trial(...).

    python examples/rllib/old_stack_ppo.py --stop-iters 6
"""

import argparse

from herdrl import (
    DefaultCallbacks,  # from ray.rllib.algorithms.callbacks import DefaultCallbacks
    PPOConfig,  # from ray.rllib.algorithms.ppo import PPOConfig
    tune,  # from ray import tune
)


class PoleCallbacks(DefaultCallbacks):
    def on_episode_start(self, *, worker, base_env, policies, episode, env_index, **kwargs):
        episode.user_data["angles"] = []

    def on_episode_step(self, *, worker, base_env, policies=None, episode, env_index, **kwargs):
        episode.user_data["angles"].append(abs(episode.last_observation_for()[2]))

    def on_episode_end(self, *, worker, base_env, policies, episode, env_index, **kwargs):
        episode.custom_metrics["max_pole_angle"] = max(episode.user_data["angles"])


def build_config(args):
    return (
        PPOConfig()
        .framework("torch")
        .rollouts(num_rollout_workers=args.num_workers, num_envs_per_worker=4)
        .environment(env="CartPole-v1")
        .training(lr_schedule=[[0, 3e-3], [20_000, 3e-4]], train_batch_size=1000, sgd_minibatch_size=250,
                  num_sgd_iter=6)
        .evaluation(evaluation_interval=2, evaluation_num_workers=1, evaluation_duration=5)
        .callbacks(PoleCallbacks)
        .debugging(seed=args.seed)
    )


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-iters", type=int, default=6)
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    algo = build_config(args).build()
    for _ in range(args.stop_iters):
        result = algo.train()
        print(f"iter {result['training_iteration']}: episode_reward_mean {result['episode_reward_mean']:.1f}, "
              f"timesteps_total {result['timesteps_total']}, "
              f"max_pole_angle_mean {result['custom_metrics']['max_pole_angle_mean']:.3f}")
    algo.stop()
    analysis = tune.run("PPO", config={"env": "CartPole-v1", "num_workers": 0, "train_batch_size": 1000,
                                       "sgd_minibatch_size": 250, "lr": tune.grid_search([1e-3, 3e-3])},
                        stop={"timesteps_total": 2000}, verbose=0)
    best = analysis.get_best_trial("episode_reward_mean", mode="max", scope="last")
    print(f"best lr {best.config['lr']}: episode_reward_mean {best.last_result['episode_reward_mean']:.1f}")


if __name__ == "__main__":
    main()
