"""The sizing model (herdrl/sizing.py) against the same arithmetic done here by hand, in both regimes."""

import dataclasses

import pytest

from herdrl.errors import ConfigError
from herdrl.sizing import Costs, Node, Reservations, choose, projection, runner_slots, throughput

GB = 1e9
ONE_NODE = (Node(8, 64 * GB),)


def _costs(env_ms: float, learner_us: float, rss_gb: float = 0.5, nodes=ONE_NODE) -> Costs:
    return Costs(env_step_s=env_ms / 1e3, inference_s={1: 0.0005, 16: 0.002}, learner_s_per_step=learner_us / 1e6,
                 runner_rss_bytes=rss_gb * GB, nodes=tuple(nodes))


def _by_hand(env_s: float, learner_s: float, slots: int, overlap: bool) -> dict:
    """Throughput of every (runners, envs) pair, from the formulas in the docs, computed independently."""
    inference = {1: 0.0005, 4: 0.0005 + 3 * (0.0015 / 15), 16: 0.002}
    table = {}
    for n in range(slots + 1):
        for e in (1, 4, 16):
            sample = max(1, n) * e / (e * env_s + inference[e])
            table[n, e] = min(sample, 1 / learner_s) if overlap and n else 1 / (1 / sample + learner_s)
    return table


def _cheapest_within_5_percent(table: dict) -> tuple:
    best = max(table.values())
    return min(pair for pair, rate in table.items() if rate >= 0.95 * best)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_env_bound_run_takes_every_slot_and_a_learner_bound_one_stops_where_more_runners_stop_paying(overlap):
    env_bound = choose(_costs(env_ms=2.0, learner_us=1.0), overlap=overlap)  # 8 CPUs less the driver's: 7 slots
    assert (env_bound.num_env_runners, env_bound.num_envs_per_env_runner) == _cheapest_within_5_percent(
        _by_hand(0.002, 1e-6, 7, overlap))
    assert env_bound.num_env_runners == 7 and env_bound.bound == "slots" and env_bound.max_runners == 7
    learner_bound = choose(_costs(env_ms=0.1, learner_us=1000.0), overlap=overlap)
    expected = _cheapest_within_5_percent(_by_hand(0.0001, 1e-3, 7, overlap))
    assert (learner_bound.num_env_runners, learner_bound.num_envs_per_env_runner) == expected
    assert learner_bound.num_env_runners < 7 and learner_bound.bound == "learner"
    assert learner_bound.throughput == pytest.approx(_by_hand(0.0001, 1e-3, 7, overlap)[expected])
    assert "learner-bound" in learner_bound.reason and "env 0.10 ms/step" in learner_bound.reason
    assert (f"{expected[0]} runner{'s' if expected[0] > 1 else ''} x {expected[1]} env{'s' if expected[1] > 1 else ''}"
            in learner_bound.reason)


def test_memory_learners_and_a_share_of_the_cluster_bound_the_runners():
    assert runner_slots(_costs(2.0, 1.0), Reservations()) == (7, "slots")
    assert runner_slots(_costs(2.0, 1.0, rss_gb=16), Reservations()) == (4, "memory")  # 64 GB / 16 GB
    assert runner_slots(_costs(2.0, 1.0), Reservations(learners=2)) == (5, "slots")
    assert runner_slots(_costs(2.0, 1.0), Reservations(learners=2, cpus_per_learner=0.5)) == (6, "slots")
    assert runner_slots(_costs(2.0, 1.0), Reservations(share=0.5)) == (3, "slots")  # 4 CPUs, one the driver's
    assert runner_slots(_costs(2.0, 1.0), Reservations(cpus_per_runner=2)) == (3, "slots")
    two_nodes = _costs(2.0, 1.0, nodes=(Node(8, 64 * GB), Node(4, 64 * GB)))
    assert runner_slots(two_nodes, Reservations()) == (11, "slots")  # the driver sits on the first node only
    assert choose(_costs(2.0, 1.0, rss_gb=16)).num_env_runners == 4


def test_numbers_the_user_gave_win_and_impossible_ones_are_one_line():
    chosen = choose(_costs(env_ms=2.0, learner_us=1.0), runners=2, envs=4)
    assert (chosen.num_env_runners, chosen.num_envs_per_env_runner) == (2, 4)
    assert choose(_costs(env_ms=2.0, learner_us=1.0), envs=1).num_envs_per_env_runner == 1
    with pytest.raises(ConfigError, match="num_env_runners=9 is more than the nodes hold .7 runners by CPUs"):
        choose(_costs(env_ms=2.0, learner_us=1.0), runners=9)
    with pytest.raises(ConfigError, match="inference time"):
        Costs(0.001, {}, 1e-6, GB, (Node(2, GB),))


def test_the_projection_grows_with_nodes_until_the_learner_binds():
    rows = projection(_costs(env_ms=0.5, learner_us=20.0), Reservations(), nodes=6, overlap=False)
    runners = [sizing.num_env_runners for _, sizing in rows]
    rates = [sizing.throughput for _, sizing in rows]
    assert [count for count, _ in rows] == list(range(1, 7))
    assert runners[0] == 7 and runners == sorted(runners) and rates == sorted(rates)
    assert rows[-1][1].bound == "learner" and rows[-1][1].num_env_runners < 6 * 8 - 1


def test_a_measured_runner_rate_replaces_the_formula_for_its_size():
    """An env's own vector version steps copies faster than one by one: the runner's measured rate is used."""
    costs = Costs(0.001, {1: 0.0005, 16: 0.002}, 1e-6, GB, ONE_NODE, runner_step_s={16: 0.0001})
    assert costs.runner_rate(16) == pytest.approx(10_000)  # not 16 / (0.016 + 0.002)
    assert costs.runner_rate(1) == pytest.approx(1 / 0.0015)  # the formula where nothing was measured
    assert choose(costs, envs=16).throughput == pytest.approx(1 / (1 / (7 * 10_000) + 1e-6))


def test_herd_bench_size_measures_the_env_it_is_given_and_prints_the_models_choice(capsys):
    """The env sleeps 5 ms a step: what is measured is at least that (and not far above); one projected row per
    node count."""
    from herdrl.cli import main

    assert main(["bench", "size", "--env", "herd/Latency-v0", "--nodes", "2", "--config",
                 "env_config={step_latency_s: 0.005}", "train_batch_size=256", "minibatch_size=64"]) == 0
    out = capsys.readouterr().out
    measured = float(out.split("measured: env ")[1].split(" ms/step")[0])
    assert 5.0 <= measured < 50.0, out
    lines = [line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(lines) == 2 and out.startswith("herd bench size: env "), out


def test_herd_bench_size_refuses_a_bad_node_count(capsys):
    from herdrl.cli import main

    assert main(["bench", "size", "--env", "CartPole-v1", "--nodes", "0"]) == 2
    assert "--nodes must be >= 1" in capsys.readouterr().err


def test_the_bound_names_what_holds_the_run_back_in_each_regime():
    costs = Costs(0.001, {1: 0.0}, 1e-3, GB, ONE_NODE)  # a runner: 1,000 steps/s; the learner: 1,000 steps/s
    overlapped = choose(costs, overlap=True, envs=1)  # one runner already feeds all the learner takes
    assert (overlapped.num_env_runners, overlapped.bound) == (1, "learner")
    slow_env = Costs(0.002, {1: 0.0}, 1e-6, GB, ONE_NODE)  # all 7 slots used, far below the learner's 1e6/s
    assert (choose(slow_env, envs=1).num_env_runners, choose(slow_env, envs=1).bound) == (7, "slots")
    one_slot = Costs(0.02, {1: 0.0}, 1e-4, GB, (Node(2, GB),))  # in-process is as fast as the one slot's runner
    assert (choose(one_slot, envs=1).num_env_runners, choose(one_slot, envs=1).bound) == (0, "slots")


def test_the_projection_uses_the_measured_runner_rates_and_its_first_row_is_the_choice():
    costs = Costs(0.001, {1: 0.0005, 16: 0.002}, 1e-6, GB, ONE_NODE, runner_step_s={1: 0.0015, 4: 0.0002,
                                                                                     16: 0.0001})
    first = projection(costs, Reservations(), nodes=2, overlap=False)[0][1]
    chosen = choose(costs)
    assert (first.num_env_runners, first.num_envs_per_env_runner, first.throughput) == (
        chosen.num_env_runners, chosen.num_envs_per_env_runner, chosen.throughput)


def test_runners_are_placed_node_by_node_where_cpus_and_memory_both_are():
    mixed = _costs(2.0, 1.0, rss_gb=1, nodes=(Node(33, 4 * GB), Node(2, 64 * GB)))
    assert runner_slots(mixed, Reservations()) == (4 + 2, "memory")  # not min(32 + 2, 4 + 64)
    with pytest.raises(ConfigError, match="num_learners=4 x num_cpus_per_learner=1 do not fit"):
        runner_slots(_costs(2.0, 1.0, nodes=(Node(2, 64 * GB),)), Reservations(learners=4))


def test_herd_bench_size_refuses_what_it_cannot_measure_yet_and_keeps_the_users_numbers(capsys):
    from herdrl.bench_size import run_size
    from herdrl.cli import main

    assert main(["bench", "size", "--env", "CartPole-v1", "--algorithm", "marwil"]) == 2
    assert "cannot size this MARWIL run: it learns from a dataset" in capsys.readouterr().err
    from herdrl import PPOConfig

    config = PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=8).training(
        train_batch_size=256, minibatch_size=64)
    chosen = run_size(config, nodes=1, echo=lambda *_: None)["sizing"]
    assert chosen.num_envs_per_env_runner == 8


@pytest.mark.parametrize("overlap", [False, True])
def test_most_worth_is_where_more_runners_stop_paying_on_unlimited_nodes(overlap):
    """What ``auto`` gives ``max_env_runners`` (runners added as nodes join stop there): the fewest runners within
    5% of the best on as many CPUs as wanted, by hand; a learner that costs nothing lets it grow to the cap."""
    from herdrl.sizing import most_worth

    for env_ms, learner_us, envs in ((2.0, 100.0, 4), (0.1, 1000.0, 1), (20.0, 50.0, 16)):
        table = {n: rate for (n, e), rate in _by_hand(env_ms / 1e3, learner_us / 1e6, 1024, overlap).items()
                 if e == envs and n >= 1}
        expected = min(n for n, rate in table.items() if rate >= 0.95 * max(table.values()))
        assert most_worth(_costs(env_ms, learner_us), overlap, envs) == expected
    assert most_worth(_costs(2.0, 0.0), overlap, 1, cap=64) >= 61  # (sync: 1/(1/(N r)); within 5% of 64 r)


def test_the_train_batch_bounds_the_envs_a_choice_may_have():
    """A sample-then-learn batch of 1,024 steps in fragments of at least 16 holds 64 envs: an env-bound run with 7
    slots takes no pair past that (7 x 16 would cut its batch into 10-step fragments); IMPALA's batch holds one
    runner's fragment (1,024 / 50 = 20 envs per runner); off-policy runs replay, unbounded. Nothing fitting is one
    line."""
    from types import SimpleNamespace

    from herdrl.sizing import batch_bounds

    def config(**keys):
        return SimpleNamespace(**{"stores_raw_transitions": False, "samples_while_learning": False,
                                  "rollout_fragment_length": "auto", "train_batch_size": 1024, **keys})

    assert batch_bounds(config()) == (64, None) and batch_bounds(config(rollout_fragment_length=128)) == (8, None)
    assert batch_bounds(config(samples_while_learning=True, rollout_fragment_length=50)) == (None, 20)
    assert batch_bounds(config(stores_raw_transitions=True)) == (None, None)
    chosen = choose(_costs(env_ms=2.0, learner_us=1.0), bounds=(64, None))
    assert max(1, chosen.num_env_runners) * chosen.num_envs_per_env_runner <= 64
    assert chosen.num_env_runners == 7 and chosen.num_envs_per_env_runner == 4  # (16 would not fit 7 runners)
    assert choose(_costs(env_ms=2.0, learner_us=1.0), overlap=True, bounds=(None, 4)).num_envs_per_env_runner <= 4
    with pytest.raises(ConfigError, match="the train batch holds at most 64 envs"):
        choose(_costs(env_ms=2.0, learner_us=1.0), runners=7, envs=16, bounds=(64, None))


def _shared(host_cores: float, hosts=("box",) * 4, round_ms: float = 6.0) -> Costs:
    """4 nodes of 16 CPUs (one host: fake nodes on loopback, or 4 hosts) for an env that sleeps 2 ms a step."""
    return Costs(0.002, {1: 0.0}, 70e-6, 0.0, tuple(Node(16, 64 * GB, host) for host in hosts),
                 runner_cpu_s={1: 1e-4}, round_cpu_s=round_ms / 1e3, host_cores={"box": host_cores},
                 train_batch=1024)


def _where_stepping_meets_cpu(cores: float, round_ms: float = 6.0) -> float:
    """The runner count N where stepping (1 / (N x 500 steps/s)) and CPU on the shared cores ((0.1 ms + N x round
    / 1024) per step / cores) take as long, solved by hand: (k / B) N^2 + c N - cores / r = 0."""
    k_over_b, c = round_ms / 1e3 / 1024, 1e-4
    return (-c + (c * c + 4 * k_over_b * cores / 500) ** 0.5) / (2 * k_over_b)


def test_runners_that_share_a_hosts_cores_stop_where_a_runner_more_costs_the_others_more_than_it_samples():
    """Sampling takes the longer of the runners' stepping and their CPU on the 2 cores 4 fake nodes share: the
    best runner count is where the two meet (18.95 here)."""
    best = _where_stepping_meets_cpu(2)
    chosen = choose(_shared(2), bounds=(64, None))
    assert chosen.num_env_runners in (int(best), int(best) + 1) and chosen.num_envs_per_env_runner == 1
    assert chosen.bound == "cores" and "share 2 real cores" in chosen.reason
    # a dearer round, fewer runners
    assert choose(_shared(2, round_ms=24), bounds=(64, None)).num_env_runners < chosen.num_env_runners
    # 4 hosts with the 16 cores each advertises (or one host with all 64): nothing shared, the CPU costs unused
    for costs in (_shared(16, hosts=("box", "b", "c", "d")), _shared(64)):
        assert costs.shared_cores() is None
        alone = choose(costs, bounds=(64, None))
        assert alone.bound != "cores" and alone.num_env_runners > 2 * best
    # "how many nodes": each node like the first (16 CPUs on 2 cores) on a host of its own, with its 2 cores
    rows = projection(_shared(2, hosts=("box",)), Reservations(driver_cpus=0), nodes=3, overlap=False,
                      bounds=(64, None))
    assert rows[0][1].bound == "slots" and rows[0][1].num_env_runners <= 16  # (stepping binds below 18.95)
    best = _where_stepping_meets_cpu(4)  # 29.4 of 32 slots: the peak within 5% of all 32 (the learner's half)...
    assert rows[1][1].bound != "cores" and rows[1][1].num_env_runners <= int(best) + 1
    best = _where_stepping_meets_cpu(6)  # ...37.5 of 48: the cores bind
    assert rows[2][1].bound == "cores" and rows[2][1].num_env_runners in (int(best), int(best) + 1)


def test_an_overlapping_run_held_back_by_its_learners_intake_gets_an_aggregator():
    """IMPALA-like (learning beside sampling): an update of 50 us and an intake of 100 us per env step. The
    learner alone takes 1 / 150 us = 6,667 steps/s (7 runners of 1,000 feed it); with an aggregator taking the
    intake in beside the update, 1 / max(50, 100) us = 10,000 (10 runners), by hand: 1.5x, past the 5% tolerance,
    on a node with a core for the learner actor and one for the aggregator. Sample-then-learn runs (the intake is
    not beside the update), runners with no intake, or an intake the aggregator would not beat: none."""
    costs = Costs(0.001, {1: 0.0}, 50e-6, 0.0, (Node(64, 64 * GB),), intake_s_per_step=100e-6)
    plain = choose(costs, overlap=True)
    assert (plain.num_env_runners, plain.aggregators, round(plain.throughput)) == (7, 0, 6667)
    chosen = choose(costs, overlap=True, aggregators_allowed=True)
    assert (chosen.num_env_runners, chosen.num_envs_per_env_runner, chosen.aggregators) == (10, 1, 1)
    assert chosen.throughput == pytest.approx(10_000) and "1 learner actor with 1 aggregator" in chosen.reason
    assert choose(costs, overlap=False, aggregators_allowed=True).aggregators == 0
    light = dataclasses.replace(costs, intake_s_per_step=1e-6)  # (an MLP's fragments: nothing to rebuild)
    assert choose(light, overlap=True, aggregators_allowed=True).aggregators == 0
    crowded = dataclasses.replace(costs, nodes=(Node(3, 64 * GB),))  # driver, learner, aggregator: no runner left
    assert choose(crowded, overlap=True, aggregators_allowed=True).aggregators == 0
    # on 2 shared cores the aggregator's intake is CPU like the update's: 10 runners of 0.1 ms CPU a step beside
    # 150 us of learning cap the run at 2 / 250 us = 8,000 steps/s, aggregator or not (by hand)
    shared = dataclasses.replace(costs, nodes=(Node(64, 64 * GB, "box"),), host_cores={"box": 2},
                                 runner_cpu_s={1: 1e-4})
    assert throughput(shared, 10, 1, True, aggregators=True) == pytest.approx(8_000)


def test_the_learners_intake_is_measured_on_frames_packed_as_runners_ship_them():
    """A frame-stacked fragment (4 x 84 x 84 uint8) is rebuilt from its packed frames: at least as long per env
    step as writing its stack's bytes once (timed here with numpy); a vector fragment has nothing to rebuild."""
    import time

    import gymnasium as gym
    import numpy as np

    import herdrl
    from herdrl import APPOConfig
    from herdrl.bench_size import _intake_seconds_per_step
    from herdrl.rollout import EnvRunner

    herdrl.register_env("stacked_latency", lambda config: gym.wrappers.FrameStackObservation(
        gym.make("herd/Latency-v0", step_latency_s=0.0, pixels=True), 4))
    fragments = {}
    for env in ("stacked_latency", "CartPole-v1"):
        config = APPOConfig().environment(env).env_runners(num_envs_per_env_runner=4, rollout_fragment_length=16)
        config.validate()
        runner = EnvRunner(config)
        fragments[env] = runner.sample()
        runner.stop()
    stack = np.empty((4, 84, 84, 4), np.uint8)
    start = time.perf_counter()
    for _ in range(200):
        stack[...] = 7
    write_s = (time.perf_counter() - start) / 200
    assert _intake_seconds_per_step(fragments["stacked_latency"]) > 0.5 * write_s
    assert _intake_seconds_per_step(fragments["CartPole-v1"]) < 0.1 * _intake_seconds_per_step(
        fragments["stacked_latency"])
