"""An RLlib 2.x new-stack script around Ray Tune's Tuner, run on herdrl with only its imports changed (the original
imports are in the comments): a learning-rate sweep with tune.Tuner(...).fit(), the best trial's checkpoint and
metrics, then an algorithm restored from it that trains (result["learners"]), evaluates (["env_runners"]), saves
(.checkpoint.path), hands its weights to a second algorithm, and reaches its env runners and its RLModule.

    python examples/rllib/tuner_ppo.py --stop-iters 4
"""

import argparse

import numpy as np
import torch

from herdrl import (
    Algorithm,  # from ray.rllib.algorithms.algorithm import Algorithm
    PPOConfig,  # from ray.rllib.algorithms.ppo import PPOConfig
    tune,  # from ray import tune
)


def build_config(args):
    return (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4)
        .training(lr=tune.grid_search(args.lrs), train_batch_size_per_learner=512, minibatch_size=128, num_epochs=4)
        .evaluation(evaluation_interval=0, evaluation_duration=4)  # no evaluation while training
        .debugging(log_level="WARN", seed=args.seed)
    )


def sweep(args):
    tuner = tune.Tuner(
        "PPO",
        param_space=build_config(args),
        tune_config=tune.TuneConfig(metric="env_runners/episode_return_mean", mode="max"),
        run_config=tune.RunConfig(
            stop={"training_iteration": args.stop_iters},
            storage_path=args.storage_path,
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
            verbose=0,
        ),
    )
    results = tuner.fit()
    best = results.get_best_result(metric="env_runners/episode_return_mean", mode="max")
    print(f"best lr {best.config['lr']}: return {best.metrics['env_runners']['episode_return_mean']:.1f}, "
          f"checkpoint {best.checkpoint.path}")
    return results, best


def continue_best(args, best):
    algo = Algorithm.from_checkpoint(best.checkpoint)
    result = algo.train()
    learner = result["learners"]["default_policy"]
    print(f"iter {result['training_iteration']}: policy_loss {learner['policy_loss']:.4f}, "
          f"vf_loss {learner['vf_loss']:.4f}, entropy {learner['entropy']:.4f}")
    evaluation = algo.evaluate()
    print(f"evaluation return {evaluation['env_runners']['episode_return_mean']:.1f}")
    saved = algo.save()
    print(f"saved to {saved.checkpoint.path}")

    # The trained weights into a fresh algorithm; its module then acts as the trained one does.
    fresh = build_config(args).training(lr=3e-4).debugging(seed=args.seed + 1).build()
    fresh.set_weights(algo.get_weights())
    module = fresh.get_module()
    obs = torch.from_numpy(np.zeros((1, 4), np.float32))
    logits = module.forward_inference({"obs": obs})["action_dist_inputs"]
    print(f"greedy action at the zero state: {int(torch.argmax(logits[0]))}")
    runners = algo.env_runner_group.foreach_env_runner(lambda env_runner: env_runner.num_envs)
    print(f"envs per env runner: {runners}")
    fresh.stop()
    algo.stop()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-iters", type=int, default=4)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 3e-3])
    parser.add_argument("--storage-path", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    _, best = sweep(args)
    continue_best(args, best)


if __name__ == "__main__":
    main()
