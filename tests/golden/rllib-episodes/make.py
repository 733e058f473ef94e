"""Makes this folder's fixture with RLlib itself (not run by the tests): PPO on CartPole-v1 recording its training
episodes (`.offline_data(output=...)`, RLlib's default episodes format), then `reference.json`: every recorded
episode as RLlib's own reader decodes it (msgpack with msgpack-numpy, `SingleAgentEpisode.from_state`), which the
test compares herdrl's own decoding with.

    /tmp/rllib-venv/bin/pip install msgpack-numpy
    /tmp/rllib-venv/bin/python tests/golden/rllib-episodes/make.py    # (RLlib 2.60.0, 2026-11-26)
"""

import json
import shutil
from pathlib import Path

import msgpack
import msgpack_numpy
import numpy as np
import pyarrow.parquet as pq
import ray
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.env.single_agent_episode import SingleAgentEpisode

HERE = Path(__file__).resolve().parent
OUT = HERE / "output"

ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
shutil.rmtree(OUT, ignore_errors=True)
config = (PPOConfig().environment("CartPole-v1").debugging(seed=0)
          .env_runners(num_env_runners=0, rollout_fragment_length=60, batch_mode="complete_episodes")
          .training(train_batch_size_per_learner=60, minibatch_size=30, num_epochs=1)
          .offline_data(output=str(OUT), output_write_episodes=True))
algo = config.build()
algo.train()
algo.stop()
reference = []
for path in sorted(OUT.rglob("*.parquet")):
    for item in pq.read_table(path).column("item").to_pylist():
        episode = SingleAgentEpisode.from_state(msgpack.unpackb(item, object_hook=msgpack_numpy.decode))
        reference.append({"file": str(path.relative_to(OUT)),
                          "observations": np.asarray(episode.get_observations()).tolist(),
                          "actions": np.asarray(episode.get_actions()).tolist(),
                          "rewards": np.asarray(episode.get_rewards()).tolist(),
                          "terminated": bool(episode.is_terminated), "truncated": bool(episode.is_truncated)})
(HERE / "reference.json").write_text(json.dumps(reference))
print(len(reference), "episodes")
