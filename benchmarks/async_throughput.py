"""APPO (asynchronous) vs synchronous PPO: env steps trained per second on 1, 2, 4, 8 Ray runners.

``herd/Latency-v0`` sleeps 2 ms per step (a simulator waiting on something else), so sampling scales with runners
even on 2 cores; each runner steps 1 env. Both algorithms learn on batches of 400 env steps with the same
network; two learner settings:

* **cheap**: the default 64x64 MLP; PPO 4 epochs x 2 minibatches per batch, APPO one step per batch;
* **costly**: a 512x512 MLP with the same rows learned on per batch on both sides (PPO 8 epochs of 2 minibatches
  of 200, APPO 8 passes over the batch of 400: ``circular_buffer_iterations_per_batch``), so an update costs
  about as much real compute as one round of sampling on 8 runners.

For each (setting, algorithm, runners): build, one warm-up iteration, then iterations for ``--seconds``; the rate
is trained env steps / wall-clock time (PPO trains each sampled step ``num_epochs`` times, APPO
``circular_buffer_iterations_per_batch`` times: both counted once per batch, as "env steps trained" means steps
learned on). Scaling is the rate over the 1-runner rate of the same algorithm.

    python benchmarks/async_throughput.py [--runners 1 2 4 8] [--seconds 20] [--settings cheap costly]
"""

from __future__ import annotations

import argparse
import time

from herdrl import APPOConfig, PPOConfig

BATCH = 400
SETTINGS = {
    "cheap": {"model": {"fcnet_hiddens": [64, 64]}, "ppo": {"num_epochs": 4, "minibatch_size": 200},
              "appo": {"circular_buffer_iterations_per_batch": 1}},
    "costly": {"model": {"fcnet_hiddens": [512, 512]}, "ppo": {"num_epochs": 8, "minibatch_size": 200},
               "appo": {"circular_buffer_iterations_per_batch": 8}},
}


def build(algo: str, setting: str, runners: int):
    spec = SETTINGS[setting]
    common = {"model": spec["model"], "train_batch_size": BATCH}
    if algo == "PPO":
        config = PPOConfig().training(**common, **spec["ppo"]).env_runners(
            num_env_runners=runners, num_envs_per_env_runner=1, rollout_fragment_length=BATCH // runners)
    else:
        config = APPOConfig().training(**common, **spec["appo"], num_updates_per_iteration=4).env_runners(
            num_env_runners=runners, num_envs_per_env_runner=1, rollout_fragment_length=50)
    return config.environment("herd/Latency-v0").debugging(seed=0).build()


def rate(algo_name: str, setting: str, runners: int, seconds: float) -> tuple[float, float]:
    """(env steps trained per second, learner busy fraction or nan)."""
    algo = build(algo_name, setting, runners)
    algo.train()  # warm-up: actors started, first weights out
    start, trained, busy = time.perf_counter(), 0, []
    while time.perf_counter() - start < seconds:
        result = algo.train()
        per_batch = (SETTINGS[setting]["appo"]["circular_buffer_iterations_per_batch"] if algo_name == "APPO"
                     else 1)
        trained += result.get("num_env_steps_trained", result["num_env_steps_sampled"]) / per_batch
        busy.append(result.get("learner_busy_fraction", result["learn_time_s"] / result["time_this_iter_s"]))
    elapsed = time.perf_counter() - start
    algo.stop()
    return trained / elapsed, sum(busy) / len(busy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS))
    args = parser.parse_args()
    print("| learner | runners | PPO steps/s | PPO scaling | PPO learner busy | APPO steps/s | APPO scaling | "
          "APPO learner busy | APPO / PPO |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for setting in args.settings:
        first: dict[str, float] = {}
        for runners in args.runners:
            ppo, ppo_busy = rate("PPO", setting, runners, args.seconds)
            appo, appo_busy = rate("APPO", setting, runners, args.seconds)
            first.setdefault("PPO", ppo)
            first.setdefault("APPO", appo)
            print(f"| {setting} | {runners} | {ppo:,.0f} | {ppo / first['PPO']:.2f}x | {ppo_busy:.0%} | {appo:,.0f} | "
                  f"{appo / first['APPO']:.2f}x | {appo_busy:.0%} | {appo / ppo:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
