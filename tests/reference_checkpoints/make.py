"""Write the reference checkpoints of tests/test_reference_checkpoints.py, and what each did on fixed inputs.

Each case trains a very few iterations (tiny networks and batches, a fixed seed, no Ray), saves with
``Algorithm.save`` into ``tests/reference_checkpoints/<case>/`` and records into ``<case>/expected.npz`` the probe
inputs and, on them, the greedy (``explore=False``) actions and the raw outputs (logits, Q values, Gaussian means and
log stds, recurrent states). The test restores the committed checkpoints and asserts the same numbers: they were
written by herdrl before issue 63's split (commit a40fc24), so the test proves that checkpoints of older code still
restore and act as they did.

Re-run only when a checkpoint format change is intended (then say so in the CHANGELOG): from the repository root,

    PYTHONPATH=$PWD python -m tests.reference_checkpoints.make            # every case
    PYTHONPATH=$PWD python -m tests.reference_checkpoints.make sac-pendulum

Each case is deterministic (one process, seeded): ``--check`` trains every case again without writing and says
whether the learner state (weights, target networks, optimizer states) is bit for bit the committed one, for a
refactor that must leave training unchanged (a few seconds in all; bit for bit only with the torch version and CPU
that wrote them, torch 2.13 (CPU) on x86-64 here):

    PYTHONPATH=$PWD python -m tests.reference_checkpoints.make --check

The probes (what is recorded, and how) are :func:`probe` here, shared with the test: a refactor that renames the
modules' calls updates :func:`probe`, never the recorded numbers.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: envs.py

# ------------------------------------------------------------------------------------------------- envs


def register_envs() -> None:
    """The envs the checkpoints name that herdrl does not register itself (the test registers them too)."""
    from envs import MovingDot

    import herdrl
    from herdrl.env.testing import CueRelay, TwoStepGame

    herdrl.register_env("moving_dot", MovingDot)
    herdrl.register_env("relay", lambda cfg: CueRelay(cfg))
    herdrl.register_env("two_step", lambda cfg: TwoStepGame(cfg))


def pendulum_dataset(path: Path, seed: int = 0) -> None:
    """One Pendulum episode of a noisy swing-up controller (tests/test_offline.py's), as CQL's dataset."""
    from herdrl.offline.record import record_controller

    rng = np.random.default_rng(seed)

    def controller(obs: np.ndarray) -> np.ndarray:
        angle, speed = np.arctan2(obs[1], obs[0]), obs[2]
        torque = -(10 * angle + 2 * speed) if obs[0] > 0.85 else 2.0 * (np.sign(speed) or 1.0)
        return np.clip([torque + rng.normal(0, 0.3)], -2, 2).astype(np.float32)

    record_controller(controller, "Pendulum-v1", path, 1, seed)


# ------------------------------------------------------------------------------------------------- cases


def _ppo_lstm(_: Path) -> Any:
    from herdrl import PPOConfig

    return (PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2)
            .training(train_batch_size=64, minibatch_size=32, num_epochs=2, lr=1e-2,
                      model={"use_lstm": True, "lstm_cell_size": 8, "fcnet_hiddens": [8], "max_seq_len": 8}))


def _sac(_: Path) -> Any:
    from herdrl import SACConfig

    return (SACConfig().environment("Pendulum-v1")
            .training(train_batch_size=16, num_steps_sampled_before_learning_starts=32,
                      min_sample_timesteps_per_iteration=64, training_intensity=2.0, lr=1e-2,
                      replay_buffer_config={"capacity": 256}, model={"fcnet_hiddens": [8]}))


def _dqn_image(_: Path) -> Any:
    from herdrl import DQNConfig

    return (DQNConfig().environment("moving_dot").env_runners(num_envs_per_env_runner=2)
            .training(train_batch_size=16, num_steps_sampled_before_learning_starts=32,
                      min_sample_timesteps_per_iteration=64, training_intensity=2.0, lr=1e-2,
                      replay_buffer_config={"capacity": 256}, target_network_update_freq=32,
                      model={"conv_filters": [[4, 3, 2], [8, 3, 2]], "fcnet_hiddens": [8]}))


def _mappo(_: Path) -> Any:
    from herdrl import PPOConfig

    return (PPOConfig().environment("relay").env_runners(num_envs_per_env_runner=2)
            .training(train_batch_size=64, minibatch_size=32, num_epochs=2, lr=1e-2, model={"fcnet_hiddens": [8]})
            .multi_agent(policies={"a0", "a1"}, policy_mapping_fn="per_agent", centralized_critic=True))


def _qmix(_: Path, rnn: bool = False) -> Any:
    from herdrl import QMIXConfig

    recurrent = {"agent_rnn": True, "rnn_hidden_dim": 8, "agent_last_action": True} if rnn else {}
    return (QMIXConfig().environment("two_step").env_runners(num_envs_per_env_runner=4, rollout_fragment_length=8)
            .training(train_batch_size=16, num_steps_sampled_before_learning_starts=32,
                      min_sample_timesteps_per_iteration=64, training_intensity=4.0, target_network_update_freq=32,
                      lr=1e-2, mixing_embed_dim=4, hypernet_embed_dim=8, replay_buffer_config={"capacity": 256},
                      model={"fcnet_hiddens": [8], "max_seq_len": 4}, **recurrent))


def _cql(data: Path) -> Any:
    from herdrl.algorithms.cql import CQLConfig

    pendulum_dataset(data)
    return (CQLConfig().offline_data(input_=str(data)).environment("Pendulum-v1")
            .training(train_batch_size=16, updates_per_iteration=8, num_actions=4, lr=1e-2,
                      model={"fcnet_hiddens": [8]}))


#: case -> (its config from a scratch folder, iterations to train, the probe's kind).
CASES: dict[str, tuple[Callable[[Path], Any], int, str]] = {
    "ppo-lstm-cartpole": (_ppo_lstm, 6, "recurrent"),
    "sac-pendulum": (_sac, 2, "sac"),
    "dqn-movingdot": (_dqn_image, 8, "q"),
    "mappo-relay": (_mappo, 2, "actor_critic"),
    "qmix-two-step": (_qmix, 2, "team_q"),
    "qmix-rnn-two-step": (lambda data: _qmix(data, rnn=True), 2, "recurrent"),
    "cql-pendulum": (_cql, 2, "sac"),
}

# ------------------------------------------------------------------------------------------------- probe inputs


def probe_inputs(case: str) -> dict[str, np.ndarray]:
    """The fixed inputs a case is probed on (drawn from a seeded generator: written into expected.npz, never
    drawn again by the test). ``obs`` (a batch; ``obs.<leaf>`` for a Dict), ``starts`` ``(T, B)`` for a
    recurrent case (its ``obs`` then ``(T, B, ...)``), ``actions`` for critics of Box actions."""
    rng = np.random.default_rng(63)
    if case == "ppo-lstm-cartpole":
        starts = np.zeros((8, 3), bool)
        starts[0] = True
        starts[3, 0] = starts[5, 1] = True  # episodes that begin mid-sequence: their state starts from zeros
        return {"obs": rng.normal(scale=3.0, size=(8, 3, 4)).astype(np.float32), "starts": starts}
    if case in ("sac-pendulum", "cql-pendulum"):
        angle = rng.uniform(-np.pi, np.pi, 6)
        obs = np.stack([np.cos(angle), np.sin(angle), rng.uniform(-8, 8, 6)], -1).astype(np.float32)
        return {"obs": obs, "actions": rng.uniform(-2, 2, (6, 1)).astype(np.float32)}
    if case == "dqn-movingdot":
        from envs import MovingDot

        env = MovingDot()
        frames = [env.reset(seed=seed)[0] for seed in range(6)]  # and noise: inputs the net has not seen
        return {"obs": np.concatenate([np.stack(frames), rng.integers(0, 256, (6, 10, 10, 2), np.uint8)])}
    if case == "mappo-relay":
        cues = rng.choice([-1.0, 0.0, 1.0], 8)
        return {"obs": np.stack([cues, np.arange(8) % 2], -1).astype(np.float32)}
    if case in ("qmix-two-step", "qmix-rnn-two-step"):
        states = np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 2]]  # first step, 2A, 2B, ...
        masks = np.ones((5, 2, 2), np.int8)
        masks[3, 1, 1] = masks[4, 0, 0] = 0  # an action ruled out: never greedy
        team = {"action_mask": masks, "obs": np.repeat(states[:, None], 2, 1), "state": states}
        if case == "qmix-two-step":
            return {f"obs.{key}": value for key, value in team.items()}
        # Recurrent: the same five team observations as 5 steps of 2 sequences (the second one step behind).
        seq = {key: np.stack([value, np.roll(value, 1, 0)], 1) for key, value in team.items()}
        starts = np.zeros((5, 2), bool)
        starts[0] = True
        starts[2, 1] = True
        return {**{f"obs.{key}": value for key, value in seq.items()}, "starts": starts}
    raise KeyError(case)


def _obs(inputs: dict[str, np.ndarray]) -> Any:
    """The ``obs`` of probe inputs: an array, or a dict of a Dict space's leaves."""
    if "obs" in inputs:
        return inputs["obs"]
    return {key[4:]: value for key, value in inputs.items() if key.startswith("obs.")}


def _step(obs: Any, t: int) -> Any:
    return {key: value[t] for key, value in obs.items()} if isinstance(obs, dict) else obs[t]


# ------------------------------------------------------------------------------------------------- probe


@torch.no_grad()
def probe(policy: Any, kind: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What ``policy`` (a :class:`herdrl.policy.Policy`) does on ``inputs``: its greedy actions through the
    public ``compute_actions``, and the module's raw outputs beside them."""
    module, obs = policy.module, _obs(inputs)
    if kind == "recurrent":  # a sequence of steps, each row's state carried, zeros where an episode starts
        out: dict[str, list] = {"actions": [], "dist_inputs": [], "state": []}
        state = policy.initial_state(inputs["starts"].shape[1])
        for t, starts in enumerate(inputs["starts"]):
            state = np.where(starts.reshape(-1, *[1] * (state.ndim - 1)), policy.initial_state(len(starts)), state)
            x = policy._model_input(policy.obs_spec.batch(_step(obs, t)))
            dist_inputs = module.step_dist_inputs(x, torch.as_tensor(state))[0]
            actions, state = policy.compute_actions(_step(obs, t), explore=False, state=state)
            out["actions"].append(np.asarray(actions))
            out["dist_inputs"].append(dist_inputs.numpy())
            out["state"].append(state)
        return {key: np.stack(value) for key, value in out.items()}
    x = policy._model_input(policy.obs_spec.batch(obs))
    result = {"actions": np.asarray(policy.compute_actions(obs, explore=False))}
    if kind == "actor_critic":
        result["dist_inputs"] = module.dist_inputs(x).numpy()
    elif kind == "q":
        result["q_values"] = module(x).numpy()
    elif kind == "team_q":
        q = module(x)
        taken = q.gather(-1, torch.as_tensor(result["actions"]).long()[..., None])[..., 0]
        result["q_values"], result["q_total"] = q.numpy(), module.mix(taken, x).numpy()
    elif kind == "sac":
        mean, log_std = module.mean_log_std(x)
        q1, q2 = module.q_values(x, torch.as_tensor(inputs["actions"]))
        result.update(mean=mean.numpy(), log_std=log_std.numpy(), q1=q1.numpy(), q2=q2.numpy())
    else:
        raise KeyError(kind)
    return result


def policy_ids(path: Path) -> list[str | None]:
    """The policies of a checkpoint ([None]: a single-agent run's one)."""
    from herdrl.checkpoint import read_meta

    meta = read_meta(path)
    return sorted(meta["config"]["policies"]) if meta["config"].get("policies") else [None]


def expected(policy: Any, kind: str, inputs: dict[str, np.ndarray], pid: str | None) -> dict[str, np.ndarray]:
    """The probe's outputs, keyed as expected.npz holds them (``<policy>/<name>`` for a multi-agent policy)."""
    return {(name if pid is None else f"{pid}/{name}"): value for name, value in probe(policy, kind, inputs).items()}


# ------------------------------------------------------------------------------------------------- writing


def train(case: str, out: Path) -> None:
    """Train ``case`` from its fixed seed (in this process, no Ray) and save it to ``out`` (replaced)."""
    build, iterations, _ = CASES[case]
    with tempfile.TemporaryDirectory() as scratch:
        config = build(Path(scratch) / "data").env_runners(num_env_runners=0).debugging(seed=0)
        algo = config.build()
        for _ in range(iterations):
            algo.train()
        shutil.rmtree(out, ignore_errors=True)
        algo.save(out)
        algo.stop()


def make(case: str) -> None:
    """Train ``case`` and write its checkpoint and expected.npz (replacing what was there)."""
    from herdrl.policy import Policy

    out = HERE / case
    train(case, out)
    inputs = probe_inputs(case)
    outputs = {}
    for pid in policy_ids(out):
        outputs.update(expected(Policy.from_checkpoint(out, pid), kind=CASES[case][2], inputs=inputs, pid=pid))
    _check_margins(case, outputs)
    np.savez(out / "expected.npz", **{f"input/{k}": v for k, v in inputs.items()}, **outputs)
    print(f"{case}: {sorted(p.name for p in out.iterdir())}")


def check(case: str) -> bool:
    """Train ``case`` again with today's code and compare its learner state (weights, target networks, optimizer
    states, counters) with the committed checkpoint's, bit for bit: whether a refactor left training unchanged."""
    from herdrl.checkpoint import read_tensors

    with tempfile.TemporaryDirectory() as scratch:
        train(case, Path(scratch) / case)
        differences = _differences(read_tensors(HERE / case), read_tensors(Path(scratch) / case))
    print(f"{case}: {'the same learner state, bit for bit' if not differences else 'DIFFERS'}")
    for line in differences[:10]:
        print(f"  {line}")
    return not differences


def _differences(committed: Any, today: Any, where: str = "") -> list[str]:
    """Where two loaded tensor files differ (keys, types, shapes, values)."""
    if isinstance(committed, dict) and isinstance(today, dict):
        if committed.keys() != today.keys():
            return [f"{where or '/'}: keys {sorted(map(str, committed))} != {sorted(map(str, today))}"]
        return [line for key in committed for line in _differences(committed[key], today[key], f"{where}/{key}")]
    if isinstance(committed, (list, tuple)) and isinstance(today, (list, tuple)):
        if len(committed) != len(today):
            return [f"{where}: {len(committed)} items != {len(today)}"]
        pairs = enumerate(zip(committed, today, strict=True))
        return [line for i, (a, b) in pairs for line in _differences(a, b, f"{where}/{i}")]
    if isinstance(committed, torch.Tensor) and isinstance(today, torch.Tensor):
        same = committed.shape == today.shape and committed.dtype == today.dtype and torch.equal(committed, today)
        return [] if same else [f"{where}: tensors differ ({tuple(committed.shape)} vs {tuple(today.shape)})"]
    return [] if type(committed) is type(today) and committed == today else [f"{where}: {committed!r} != {today!r}"]


def _check_margins(case: str, outputs: dict[str, np.ndarray]) -> None:
    """Refuse a probe whose greedy discrete action is nearly a tie (best and second-best logit or Q value within
    1e-4): rounding on another machine could then flip it. Pick other probe inputs or train on."""
    for name, value in outputs.items():
        if name.rsplit("/", 1)[-1] in ("dist_inputs", "q_values"):
            top = np.sort(value.reshape(-1, value.shape[-1]), -1)  # (a masked action's -1e9 is never a tie)
            gap = float(np.min(top[..., -1] - top[..., -2]))
            print(f"  {name}: smallest gap between the best two {gap:.2e}")
            if gap < 1e-4:
                raise SystemExit(f"{case}: {name} has a near tie ({gap:.1e}): its greedy action is not robust")


def main(argv: list[str]) -> None:
    """Write the cases named (all without names); ``--check``: train them again and compare instead (exit 1 if
    one differs)."""
    register_envs()
    checking = "--check" in argv
    cases = [arg for arg in argv if arg != "--check"] or list(CASES)
    if checking:
        sys.exit(0 if all([check(case) for case in cases]) else 1)
    for case in cases:
        make(case)


if __name__ == "__main__":
    main(sys.argv[1:])
