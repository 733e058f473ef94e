"""Multi-agent (issue 17): a cooperative MPE env and a competitive board game with action masks.

    python benchmarks/multi_agent.py spread --seeds 1 2 3 --steps 150000
    python benchmarks/multi_agent.py spread --modes shared mappo --seeds 1 2 3 --steps 300000
    python benchmarks/multi_agent.py spread --modes shared-vn mappo-no-vn --seeds 1 2 3 --steps 300000
    python benchmarks/multi_agent.py spread --modes shared-vn-paper mappo-paper --seeds 1 2 3 --steps 300000
    python benchmarks/multi_agent.py spread --modes qmix vdn --seeds 1 2 3 --steps 300000
    python benchmarks/multi_agent.py spread --modes qmix-rnn vdn-rnn qmix vdn --local-ratio 0 --steps 300000
    python benchmarks/multi_agent.py tictactoe --seeds 1 2 3 --steps 150000
    python benchmarks/multi_agent.py tictactoe --modes random dqn-self-play --seeds 1 2 3
    python benchmarks/multi_agent.py throughput

``spread``: MPE ``simple_spread_v3`` (mpe2; 3 agents cover 3 landmarks, 25 steps, a shared reward plus
collision penalties), PPO with one policy shared by the 3 agents (IPPO: each agent's critic sees its own
observation; ``shared-vn``: with value normalisation) vs one policy per agent (independent PPO per agent) vs
MAPPO (``mappo``: the shared policy with a centralised critic that sees the env's global state, and value
normalisation; ``mappo-no-vn``: without; ``shared-vn-paper``, ``mappo-paper``: IPPO and MAPPO with settings after
the MAPPO paper's for MPE, ``PAPER_SETTINGS``), QMIX and VDN (``qmix``, ``vdn``:
the three agents as one team, value decomposition; their team reward is the agents' mean, so their score is
multiplied by 3 to be summed over agents as the others'; ``qmix-rnn``, ``vdn-rnn``: the paper's GRU agents learned
on replayed whole episodes), each for the same env-step budget, beside a uniformly random policy.
``--local-ratio 0``: the shared-reward variant (every agent is paid the team's global reward only; default 0.5,
the env's and BenchMARL's). The score is the greedy return (summed over agents) of 100 evaluation episodes after
training.

``tictactoe``: PettingZoo's ``classic/tictactoe-v3`` (turn-based, action masks), PPO trained by self-play (the
learning policy plays both sides in turn against its last 3 snapshots, refreshed every 5 iterations), by one
policy shared by both sides, and by a separate policy per side; DQN by self-play (``dqn-self-play``: masked
targets, a replay buffer of the learner's own moves). The score is each trained side against a
uniformly random legal opponent, over 400 games per side (+1 win, 0 draw, -1 loss), played by this script's own
loop with the PettingZoo env: the same score for a random player is the baseline.

``throughput``: env steps per second of ``spread`` sampling alone (no learning), in-process and on 1 and 2 Ray
runners, 8 env copies each.

Each run is its own subprocess; results print as a table and as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np

SPREAD = "mpe2.simple_spread_v3"
TICTACTOE = "pettingzoo/classic/tictactoe-v3"
PPO_SETTINGS = {"train_batch_size": 4000, "minibatch_size": 500, "num_epochs": 10, "lr": 3e-4, "gamma": 0.99,
                "lambda_": 0.95, "entropy_coeff": 0.01, "vf_loss_coeff": 0.5, "clip_param": 0.2}


#: ``-paper`` modes: after the MAPPO paper's recipe for MPE (its code's ``train_mpe.sh``): lr 7e-4, 64-wide layers,
#: 128 env copies x 25 steps per batch (3,200 env steps, 9,600 agent rows), 10 epochs, gradient norm clipped at 10;
#: minibatches of 3,200 rows (3 per epoch, where the paper takes 1). What else differs from the paper (its GRU,
#: ReLU, value loss, optimisers, team reward, 20M steps, ...): benchmarks/results/multi-agent.md, the MAPPO vs IPPO
#: section.
PAPER_SETTINGS = {"train_batch_size": 3200, "minibatch_size": 3200, "num_epochs": 10, "lr": 7e-4, "grad_clip": 10.0,
                  "model": {"fcnet_hiddens": [64, 64]}}


def spread_config(mode: str, seed: int, local_ratio: float = 0.5):
    from herdrl import PPOConfig

    if mode.endswith("-paper"):
        return (spread_config(mode.removesuffix("-paper"), seed, local_ratio)
                .env_runners(num_envs_per_env_runner=128, rollout_fragment_length=25).training(**PAPER_SETTINGS))
    config = (PPOConfig().environment(SPREAD, env_config={"max_cycles": 25, "continuous_actions": False,
                                                          "local_ratio": local_ratio})
              .env_runners(num_envs_per_env_runner=16).training(**PPO_SETTINGS,
                                                                model={"fcnet_hiddens": [128, 128]})
              .debugging(seed=seed))
    if mode in ("shared", "shared-vn"):  # IPPO; -vn: with MAPPO's value normalisation, the fair comparison
        return config.multi_agent(policies={"shared"}).training(value_normalization=mode == "shared-vn")
    if mode in ("mappo", "mappo-no-vn"):  # the shared actor, a critic that sees the env's global state, normalised
        return (config.multi_agent(policies={"shared"}, centralized_critic=True)  # values (-no-vn: not)
                .training(value_normalization=mode == "mappo"))
    return config.multi_agent(policies={"agent_0", "agent_1", "agent_2"}, policy_mapping_fn="per_agent")


#: QMIX/VDN on spread: MLP agents on replayed transitions (BenchMARL's setup), epsilon over the first 100k steps.
QMIX_SPREAD = {"lr": 5e-4, "gamma": 0.99, "train_batch_size": 128, "training_intensity": 4.0,
               "epsilon": [[0, 1.0], [100_000, 0.05]], "target_network_update_freq": 5000,
               "num_steps_sampled_before_learning_starts": 1000, "model": {"fcnet_hiddens": [128, 128]}}


#: The paper's GRU agents (64 wide, as pymarl's) on replayed whole episodes (25 steps: no burn-in needed), batches
#: of 32 episodes, 8 replayed steps per sampled step; the rest as QMIX_SPREAD.
QMIX_RNN_SPREAD = {**QMIX_SPREAD, "agent_rnn": True, "rnn_hidden_dim": 64, "train_batch_size": 32,
                   "training_intensity": 8.0, "model": {"max_seq_len": 25}}


def qmix_config(mode: str, seed: int, local_ratio: float = 0.5):
    from herdrl import QMIXConfig

    settings = QMIX_RNN_SPREAD if mode.endswith("-rnn") else QMIX_SPREAD
    return (QMIXConfig().environment(SPREAD, env_config={"max_cycles": 25, "continuous_actions": False,
                                                         "local_ratio": local_ratio})
            .env_runners(num_envs_per_env_runner=16, rollout_fragment_length=25)
            .training(mixer=mode.removesuffix("-rnn"), **settings).evaluation(evaluation_interval=None)
            .debugging(seed=seed))


def run_spread(mode: str, seed: int, steps: int, local_ratio: float = 0.5) -> dict:
    if mode == "random":
        return {"score": _random_spread(seed, local_ratio)}
    team = mode.removesuffix("-rnn") in ("qmix", "vdn")  # (a team's return is the agents' mean: x 3 to sum)
    config = qmix_config(mode, seed, local_ratio) if team else spread_config(mode, seed, local_ratio)
    algo = config.evaluation(evaluation_duration=100).build()
    start = time.perf_counter()
    while (result := algo.train())["num_env_steps_sampled_lifetime"] < steps:
        pass
    seconds = time.perf_counter() - start
    agents = 3 if team else 1
    score = agents * algo.evaluate()["evaluation/episode_return_mean"]
    algo.stop()
    return {"score": score, "train_return": agents * result["episode_return_mean"], "seconds": seconds,
            "steps": result["num_env_steps_sampled_lifetime"]}


def _random_spread(seed: int, local_ratio: float = 0.5, episodes: int = 100) -> float:
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(max_cycles=25, continuous_actions=False, local_ratio=local_ratio)
    rng = np.random.default_rng(seed)
    totals = []
    for episode in range(episodes):
        env.reset(seed=seed * 1000 + episode)
        total = 0.0
        while env.agents:
            _, rewards, _, _, _ = env.step({a: int(rng.integers(5)) for a in env.agents})
            total += sum(rewards.values())
        totals.append(total)
    return float(np.mean(totals))


#: DQN by self-play on tic-tac-toe (issue 33's target): epsilon decays over the learner's own moves.
DQN_TICTACTOE = {"gamma": 1.0, "lr": 1e-3, "train_batch_size": 64, "model": {"fcnet_hiddens": [128, 128]},
                 "epsilon": [[0, 1.0], [20_000, 0.05]], "target_network_update_freq": 500,
                 "num_steps_sampled_before_learning_starts": 1000, "training_intensity": 8.0,
                 "min_sample_timesteps_per_iteration": 2000}


def tictactoe_config(mode: str, seed: int):
    from herdrl import DQNConfig, PPOConfig

    if mode == "dqn-self-play":
        return (DQNConfig().environment(TICTACTOE).env_runners(num_envs_per_env_runner=8)
                .training(**DQN_TICTACTOE).debugging(seed=seed)
                .multi_agent(policies={"main", "main_v1", "main_v2", "main_v3"}, policy_mapping_fn="self_play",
                             self_play={"main": ["main_v1", "main_v2", "main_v3"]}, self_play_interval=5))
    config = (PPOConfig().environment(TICTACTOE).env_runners(num_envs_per_env_runner=16)
              .training(**{**PPO_SETTINGS, "gamma": 1.0}, model={"fcnet_hiddens": [128, 128]}).debugging(seed=seed))
    if mode == "self-play":
        return config.multi_agent(policies={"main", "main_v1", "main_v2", "main_v3"}, policy_mapping_fn="self_play",
                                  self_play={"main": ["main_v1", "main_v2", "main_v3"]}, self_play_interval=5)
    if mode == "shared":
        return config.multi_agent(policies={"main"})
    return config.multi_agent(policies={"player_1", "player_2"}, policy_mapping_fn="per_agent")


def run_tictactoe(mode: str, seed: int, steps: int) -> dict:
    if mode == "random":
        return {side: _score_vs_random(None, side, seed) for side in ("player_1", "player_2")}
    algo = tictactoe_config(mode, seed).build()
    start = time.perf_counter()
    while algo.train()["num_env_steps_sampled_lifetime"] < steps:
        pass
    seconds = time.perf_counter() - start
    sides = {"self-play": {"player_1": "main", "player_2": "main"}, "shared": {"player_1": "main", "player_2": "main"},
             "separate": {"player_1": "player_1", "player_2": "player_2"},
             "dqn-self-play": {"player_1": "main", "player_2": "main"}}[mode]
    scores = {side: _score_vs_random(algo.get_policy(pid), side, seed) for side, pid in sides.items()}
    algo.stop()
    return {**scores, "seconds": seconds}


def _score_vs_random(policy, side: str, seed: int, games: int = 400) -> float:
    """Mean outcome for ``side`` (+1 win, 0 draw, -1 loss) with ``policy`` (None: random) against random moves."""
    import pettingzoo

    env = pettingzoo.make("aec", "classic/tictactoe-v3")
    rng = np.random.default_rng(seed)
    total = 0.0
    for game in range(games):
        env.reset(seed=seed * 10_000 + game)
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            if agent == side:
                total += reward if terminated or truncated else 0.0
            if terminated or truncated:
                env.step(None)
                continue
            if agent == side and policy is not None:
                action = policy.compute_single_action(obs)
            else:
                action = int(rng.choice(np.flatnonzero(obs["action_mask"])))
            env.step(action)
    return total / games


def run_throughput(runners: int) -> dict:
    from herdrl import PPOConfig

    config = (PPOConfig().environment(SPREAD, env_config={"max_cycles": 25})
              .env_runners(num_env_runners=runners, num_envs_per_env_runner=8, rollout_fragment_length=100)
              .multi_agent(policies={"shared"}).debugging(seed=0))
    algo = config.build()
    weights = algo.runner_weights()
    algo.runners.sample(weights)  # warm-up: actors started, envs made
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < 20:
        steps += sum(item.info.env_steps for item in algo.runners.sample(weights))
    rate = steps / (time.perf_counter() - start)
    algo.stop()
    return {"env_steps_per_s": rate}


def _subprocess(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "_run", *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["spread", "tictactoe", "throughput", "_run"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=150_000)
    parser.add_argument("--modes", nargs="+", help="only these modes (default: all of the task's)")
    parser.add_argument("--local-ratio", type=float, default=0.5,
                        help="spread: the local share of each agent's reward (0: the shared-reward variant)")
    opts = parser.parse_args()
    if opts.what == "_run":
        kind, mode, seed, steps, *rest = opts.args
        run = {"spread": run_spread, "tictactoe": run_tictactoe}.get(kind)
        extra = [float(rest[0])] if rest else []
        result = run_throughput(int(mode)) if kind == "throughput" else run(mode, int(seed), int(steps), *extra)
        print(json.dumps(result))
        return
    if opts.what == "throughput":
        for runners in (0, 1, 2):
            result = _subprocess(["throughput", str(runners), "0", "0"])
            print(json.dumps({"runners": runners, **result}), flush=True)
        return
    modes = ["random", "shared", "separate"] + (["self-play", "dqn-self-play"] if opts.what == "tictactoe" else
                                                ["shared-vn", "mappo", "mappo-no-vn", "shared-vn-paper",
                                                 "mappo-paper", "qmix", "vdn", "qmix-rnn",
                                                 "vdn-rnn"])
    modes = [mode for mode in modes if mode in (opts.modes or modes)]
    rows = {}
    for mode in modes:
        for seed in opts.seeds:
            extra = [str(opts.local_ratio)] if opts.what == "spread" else []
            result = _subprocess([opts.what, mode, str(seed), str(opts.steps), *extra])
            print(json.dumps({"mode": mode, "seed": seed, **result}), flush=True)
            rows.setdefault(mode, []).append(result)
    ratio = f", local_ratio {opts.local_ratio}" if opts.what == "spread" else ""
    print(f"\n{opts.what}, {opts.steps} env steps{ratio}, seeds {opts.seeds} (median):")
    for mode, results in rows.items():
        keys = [k for k in results[0] if k != "steps"]
        print(f"  {mode:12s} " + "  ".join(f"{k} {np.median([r[k] for r in results]):8.2f}" for k in keys))


if __name__ == "__main__":
    main()
