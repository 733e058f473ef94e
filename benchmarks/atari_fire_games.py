"""Which Atari games stand still for an agent that never presses FIRE, with and without ``fire_after_life_loss``.

For each game: its action meanings (does action 1 say FIRE?), then an agent that only plays NOOP (action 0) on
herdrl's env (ale-py's vector env, the default preprocessing, no no-op starts) until game over or ``--steps``
steps, once with FIRE-then-action-2 after each lost life (the default) and once without. Printed: the steps played,
how it ended (game over, or still running at ``--steps``), and the lives lost, as ALE counts them.

    python benchmarks/atari_fire_games.py [--steps 5000] [--games Breakout BeamRider ...]
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

GAMES = ["Breakout", "Pong", "SpaceInvaders", "BeamRider", "Qbert", "Seaquest", "Enduro", "Asteroids", "Assault",
         "Atlantis", "Boxing", "Centipede", "DemonAttack", "Phoenix", "Riverraid", "Tennis", "MsPacman", "Freeway"]


def noop_game(game: str, restart: bool, steps: int) -> str:
    """How a NOOP agent's game goes: steps, end, lives lost."""
    from herdrl.env import make_vector_env

    venv = make_vector_env(f"{game}NoFrameskip-v4", {"fire_after_life_loss": restart, "noop_max": 0,
                                                      "overlap": False}, 1)
    _, info = venv.reset(seed=0)
    start = lives = int(info["lives"][0])
    for t in range(1, steps + 1):
        _, _, terminated, truncated, info = venv.step(np.zeros(1, dtype=np.int64))
        if terminated[0] or truncated[0]:
            venv.close()
            return f"{t:5d} steps, game over, {lives} lives lost" if terminated[0] else f"{t:5d} steps, truncated"
        lives = start - int(info["lives"][0])
    venv.close()
    return f"{steps:5d} steps, still running, {lives} lives lost"


def main() -> None:
    """One line per game."""
    import ale_py

    gym.register_envs(ale_py)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--games", nargs="+", default=GAMES)
    args = parser.parse_args()
    print(f"{'game':14s} {'action 1, 2':18s} {'with FIRE after a lost life':40s} without")
    for game in args.games:
        env = gym.make(f"{game}NoFrameskip-v4")
        meanings = env.unwrapped.get_action_meanings()
        env.close()
        print(f"{game:14s} {', '.join(meanings[1:3]):18s} {noop_game(game, True, args.steps):40s} "
              f"{noop_game(game, False, args.steps)}", flush=True)


if __name__ == "__main__":
    main()
