"""Two policies for the two agents of your own PettingZoo-style env, trained with PPO, then used for inference.

    python examples/multi_agent.py

``CueRelay`` (herdrl/env/testing.py) has PettingZoo's Parallel API: agent a0 plays 8 steps; a1 joins at step 2
and leaves after step 4. Each agent earns 1 a step for naming a cue's side (a1: the other side), so the best
episode return, summed over both, is 11.
"""

import herdrl
from herdrl import PPOConfig
from herdrl.env.testing import CueRelay
from herdrl.policy import Policy

herdrl.register_env("cue_relay", lambda env_config: CueRelay(env_config))


def mapping(agent_id, episode, **kwargs):
    """a0 -> p0, a1 -> p1 (called when an agent first appears in an episode)."""
    return "p" + agent_id[1]


config = (
    PPOConfig()
    .environment("cue_relay")
    .env_runners(num_envs_per_env_runner=4)
    .training(train_batch_size=256, minibatch_size=64, lr=3e-3)
    .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=mapping)
    .evaluation(evaluation_interval=10, evaluation_duration=20)
    .debugging(seed=0)
)
algo = config.build()
for _ in range(20):
    result = algo.train()
    print(f"iter {result['training_iteration']:3d}  return {result['episode_return_mean']:5.2f}  "
          f"p0 {result['policy_return_mean/p0']:5.2f}  p1 {result['policy_return_mean/p1']:5.2f}")
print("greedy evaluation:", result["evaluation/episode_return_mean"])
path = algo.save("/tmp/herdrl-multi-agent-example")
algo.stop()

p1 = Policy.from_checkpoint(path, policy_id="p1")
print("p1, cue +1:", p1.compute_single_action([1.0, 1.0]), "(0: a1 names the other side)")
