"""Env runners as Ray actors on the session's embedded Ray."""

import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from envs import Countdown, TextObsEnv

import herdrl
from herdrl import EnvError, PPOConfig
from herdrl.rollout.group import RunnerFailure
from herdrl.rollout.transport import resolve

pytestmark = pytest.mark.usefixtures("ray_session")


def fetched(sampled):
    """The fragments behind a runner group's references."""
    return resolve([item.data for item in sampled])[0]


def ray_config(runners=2, envs=4, batch=256, **fault):
    return (PPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=runners, num_envs_per_env_runner=envs)
            .training(train_batch_size=batch, minibatch_size=64).fault_tolerance(**fault).debugging(seed=0))


def test_ppo_on_two_ray_runners_solves_cartpole():
    algo = PPOConfig().environment("CartPole-v1").env_runners(num_env_runners=2, num_envs_per_env_runner=8) \
        .debugging(seed=0).build()
    pids = algo.runners.call("pid")
    assert len(set(pids)) == 2 and os.getpid() not in pids
    result = algo.train()
    assert result["num_healthy_env_runners"] == 2 and result["num_env_runner_restarts"] == 0
    assert result["num_env_steps_sampled"] <= 1024
    while result["episode_return_mean"] < 475 and result["num_env_steps_sampled_lifetime"] < 150_000:
        result = algo.train()
    assert result["episode_return_mean"] >= 475
    algo.stop()


def test_killed_runner_is_replaced_and_training_goes_on(caplog, capfd):
    algo = ray_config().build()
    first = algo.train()
    os.kill(algo.runners.call("pid")[0], signal.SIGKILL)
    with caplog.at_level(logging.WARNING, logger="herdrl"):
        during = algo.train()  # completes with the surviving runner sampling the missing fragment too
    assert during["num_env_runner_restarts"] == 1 and during["num_extra_fragments"] == 1
    # One short line says what happened; Ray's ~600-character ActorDiedError text stays out of it.
    lines = [r.getMessage() for r in caplog.records if "env runner" in r.getMessage()]
    assert lines == ["herdrl: env runner 1 failed (its worker process exited); restarting it, 1 restart so far",
                     "herdrl: 1 of 2 env runners in service, 1 starting or waiting for room on the cluster; the "
                     "others sample 1 more fragment per iteration so the train batch keeps its size"]
    assert during["num_env_steps_sampled"] > 128  # the batch kept its size (2 x 64 x 2 envs, less resets)
    results, start = [], time.monotonic()  # the replacement joins once its process has started (a few seconds)
    while time.monotonic() - start < 60 and (len(results) < 15 or results[-1]["num_healthy_env_runners"] < 2):
        results.append(algo.train())
    assert results[-1]["num_healthy_env_runners"] == 2
    assert results[-1]["num_env_steps_sampled"] > 128  # both runners sample again
    assert results[-1]["episode_return_mean"] > first["episode_return_mean"]
    algo.stop()
    # ...and Ray's driver does not echo the raylet's own "A worker died or was killed" text either.
    assert "worker died or was killed" not in capfd.readouterr().out.lower()


def test_without_keep_train_batch_size_a_lost_runners_fragment_is_not_sampled_by_the_others():
    algo = ray_config(keep_train_batch_size=False).build()
    algo.train()
    os.kill(algo.runners.call("pid")[0], signal.SIGKILL)
    during = algo.train()
    assert during["num_extra_fragments"] == 0 and 0 < during["num_env_steps_sampled"] <= 128  # one runner's
    algo.runners.settle(60)
    for pid in algo.runners.call("pid"):  # every runner at once: the iteration waits for a replacement's fragment
        os.kill(pid, signal.SIGKILL)
    after = algo.train()
    assert after["num_env_steps_sampled"] > 0 and after["num_env_runner_restarts"] >= 3
    algo.stop()


def test_a_replacement_that_cannot_start_is_an_error_not_a_restart_loop(tmp_path):
    """A runner whose env can no longer be built (here: a marker file appears) fails the same way on every
    restart: the first failed start stops training with its reason, instead of up to 1000 restarts."""
    import gymnasium as gym

    marker = str(tmp_path / "broken")

    def creator(cfg):
        if os.path.exists(marker):
            raise EnvError("the simulator licence expired")
        return gym.make("CartPole-v1")

    herdrl.register_env("licensed", creator)
    algo = ray_config().environment("licensed").build()
    algo.train()
    open(marker, "w").close()
    os.kill(algo.runners.call("pid")[0], signal.SIGKILL)
    algo.train()  # runner 1 fails here and is restarted; its replacement fails to start
    with pytest.raises(EnvError, match="the simulator licence expired"):
        algo.runners.settle(60)
    assert algo.runners.num_restarts == 1
    algo.stop()


def test_a_restarted_runner_does_not_replay_its_predecessors_episodes():
    algo = ray_config().build()
    weights = algo.get_weights()
    first = fetched(algo.runners.sample(weights))
    os.kill(algo.runners.call("pid")[0], signal.SIGKILL)
    algo.runners.sample(weights)  # runner 1 fails here and is restarted
    algo.runners.settle(60)
    again = fetched(algo.runners.sample(weights))  # the replacement's first fragment, from its first reset
    algo.stop()
    assert len(again) == 2 and again[0].obs.shape == first[0].obs.shape
    assert not np.allclose(again[0].obs[0], first[0].obs[0])  # other resets (the same seed would replay them)
    assert not np.array_equal(again[0].actions, first[0].actions)


def test_light_runners_hold_no_torch_and_learn_exactly_as_torch_runners(monkeypatch):
    """Runners whose MLP policy runs in numpy never import torch (a replacement neither) and sample what torch
    runners sample: the same seed gives the same learner weights (Box actions, the Gaussian's free log std)."""
    import herdrl.rollout.light as light

    def train(light_runners):
        monkeypatch.setattr(light, "may_run_light", lambda config: light_runners)
        algo = (PPOConfig().environment("Pendulum-v1").env_runners(num_env_runners=2, num_envs_per_env_runner=2)
                .training(train_batch_size=256, minibatch_size=64, model={"free_log_std": True})
                .fault_tolerance(restart_failed_env_runners=True).debugging(seed=3).build())
        algo.train()
        algo.train()
        return algo, algo.runners.call("has_module", "torch"), algo.get_weights()

    algo, torch_loaded, light_weights = train(True)
    assert torch_loaded == [False, False]
    os.kill(algo.runners.call("pid")[0], signal.SIGKILL)
    algo.train()  # runner 1 fails and is replaced by a light one
    algo.runners.settle(60)
    assert algo.runners.call("has_module", "torch") == [False, False] and algo.runners.num_restarts == 1
    algo.stop()
    algo, torch_loaded, torch_weights = train(False)
    algo.stop()
    assert torch_loaded == [True, True]
    assert light_weights.keys() == torch_weights.keys()
    for key, value in light_weights.items():
        assert np.array_equal(np.asarray(value), np.asarray(torch_weights[key])), key


def test_a_config_the_spaces_refuse_is_one_line_and_leaves_no_runner_behind(ray_session):
    """The driver builds the network for the first runner's spaces (to choose the runners' policy): DQN on Box
    actions fails there, in one line, and the runners and their reserved CPUs are given back."""
    from herdrl import DQNConfig

    free = ray_session.available_resources().get("CPU", 0)
    with pytest.raises(herdrl.ConfigError, match="DQN needs Discrete actions"):
        DQNConfig().environment("Pendulum-v1").env_runners(num_env_runners=2).build()
    deadline = time.monotonic() + 30
    while ray_session.available_resources().get("CPU", 0) < free and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray_session.available_resources().get("CPU", 0) >= free


def test_seeded_ray_runs_with_torch_inference_reproduce():
    """An activation without a numpy twin samples with torch on the runners: seeded runs still repeat exactly."""
    from herdrl.logger import GAUGE_KEYS, TIMING_KEYS

    def rows():
        algo = ray_config().training(model={"fcnet_activation": "elu"}).build()
        out = [algo.train() for _ in range(2)]
        algo.stop()
        # (timings and the object store's use are measured, not seeded: its capacity reads differ run to run)
        return [{k: v for k, v in r.items() if k not in TIMING_KEYS + GAUGE_KEYS} for r in out]

    first, second = rows(), rows()
    assert first == second and first[0]["num_env_steps_sampled"] > 0


def test_env_raising_mid_sample_restarts_its_runner(tmp_path):
    marker = tmp_path / "failed-once"
    config = (PPOConfig().environment("herd/Faulty-v0", env_config={"fail_at_step": 50, "fail_once_file": str(marker)})
              .env_runners(num_env_runners=2, num_envs_per_env_runner=2)
              .training(train_batch_size=128, minibatch_size=64).debugging(seed=0))
    algo = config.build()
    results = [algo.train() for _ in range(4)]
    algo.runners.settle(60)  # the replacement joins once its process has started
    results.append(algo.train())
    assert marker.exists()
    assert results[-1]["num_env_runner_restarts"] == 1 and results[-1]["num_healthy_env_runners"] == 2
    assert [r["training_iteration"] for r in results] == [1, 2, 3, 4, 5]
    algo.stop()


def test_a_runner_stuck_in_its_env_when_a_resumed_run_reseeds_is_replaced_not_waited_for(tmp_path):
    """A resumed run reseeds every runner (fresh episodes): one whose env hangs in reset counts as failed after
    sample_timeout_s and is restarted, instead of holding the driver forever."""
    hang = tmp_path / "hang"
    config = (PPOConfig().environment("herd/Faulty-v0", env_config={"hang_on_reset_file": str(hang),
                                                                   "fail_at_step": 10**9})
              .env_runners(num_env_runners=2, num_envs_per_env_runner=1, sample_timeout_s=3)
              .training(train_batch_size=128, minibatch_size=64).debugging(seed=0))
    algo = config.build()
    algo.train()
    hang.touch()
    started = time.monotonic()
    algo.runners.reseed(7)
    assert time.monotonic() - started < 30 and (tmp_path / "hang.claimed").exists()
    assert algo.runners.num_restarts == 1
    algo.runners.settle(60)
    assert algo.train()["num_healthy_env_runners"] == 2
    algo.stop()


def test_without_restarts_a_failure_stops_training_with_a_clear_error(tmp_path):
    config = ray_config(restart_failed_env_runners=False)
    config.environment("herd/Faulty-v0", env_config={"fail_at_step": 20})
    algo = config.build()
    with pytest.raises(RunnerFailure, match=r"env runner \d failed: .*injected failure at step 20"):
        algo.train()
    algo.stop()


def test_ignore_failures_goes_on_with_the_runners_left(tmp_path):
    marker = tmp_path / "once"
    config = ray_config(restart_failed_env_runners=False, ignore_worker_failures=True)  # the seed's key
    config.environment("herd/Faulty-v0", env_config={"fail_at_step": 20, "fail_once_file": str(marker)})
    algo = config.build()
    results = [algo.train() for _ in range(3)]
    assert results[-1]["num_healthy_env_runners"] == 1 and results[-1]["num_env_runner_restarts"] == 0
    algo.stop()


def test_spent_restart_budget_and_all_runners_failing_are_clear_errors():
    config = ray_config(runners=1, max_num_env_runner_restarts=1)
    config.environment("herd/Faulty-v0", env_config={"fail_at_step": 10})
    algo = config.build()
    # the only runner fails; the iteration waits for its replacement (none in service), which fails too
    with pytest.raises(RunnerFailure, match=r"restart budget is spent \(max_num_env_runner_restarts=1\)"):
        algo.train()
    assert algo.runners.num_restarts == 1
    algo.stop()


def test_runner_gpus_are_reserved_from_ray_and_missing_ones_are_one_line():
    """``num_gpus_per_env_runner`` (``num_gpus_per_worker`` too): each runner asks Ray for its share of a GPU, in its
    own bundle of a Tune trial; with no GPU to be had a run stops at start-up with one line, in-process (torch sees
    none) as on Ray runners (the cluster has none)."""
    from herdrl import ConfigError, tune
    from herdrl.cluster import ClusterError

    request = {"env": "CartPole-v1", "num_workers": 2, "num_gpus_per_worker": 0.25}
    bundles = tune._trainable("PPO").default_resource_request(request).bundles
    assert bundles == [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 0.25}, {"CPU": 1.0, "GPU": 0.25}]
    if torch.cuda.is_available():
        return
    with pytest.raises(ConfigError, match="num_gpus_per_env_runner=1 but torch sees no GPU"):
        ray_config(runners=0).env_runners(num_gpus_per_env_runner=1).build()
    with pytest.raises(ClusterError, match=r"1 env runners x 0.5 GPU and 0 learners x 0 GPU need 0.5 GPUs but the "
                                           r"Ray cluster .*has 0: "
                                           "set num_gpus_per_env_runner=0"):
        ray_config(runners=1).env_runners(num_gpus_per_env_runner=0.5).build()


def test_registered_env_is_shipped_to_runners_and_bad_spaces_fail_at_build():
    herdrl.register_env("countdown", lambda cfg: Countdown(cfg))
    algo = (PPOConfig().environment("countdown", env_config={"length": 4})
            .env_runners(num_env_runners=2, num_envs_per_env_runner=2).training(train_batch_size=64, minibatch_size=32)
            .build())
    result = algo.train()
    assert result["episode_len_mean"] == 4
    algo.stop()
    herdrl.register_env("text_obs", TextObsEnv)
    with pytest.raises(EnvError, match="observation space Dict"):
        PPOConfig().environment("text_obs").env_runners(num_env_runners=1).build()
    with pytest.raises(EnvError, match="did you mean 'CartPole-v1'"):
        PPOConfig().environment("CartPol-v1").env_runners(num_env_runners=1).build()


def test_unreachable_address_fails_fast_with_one_line(tmp_path):
    start = time.monotonic()
    out = subprocess.run(
        [str(os.path.join(os.path.dirname(sys.executable), "herd")), "train", "ppo", "--env", "CartPole-v1",
         "--num-env-runners", "1", "--address", "127.0.0.1:9", "--ray-connect-timeout", "2",
         "--output", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "Ray head at 127.0.0.1:9 did not answer within 2 s" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert time.monotonic() - start < 30


def test_a_service_that_is_not_ray_at_the_address_is_one_line_within_seconds(tmp_path):
    """An HTTP server at RAY_ADDRESS: Ray alone retries for minutes, printing its C++ client's warnings."""
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    start = time.monotonic()
    try:
        out = subprocess.run(
            [str(os.path.join(os.path.dirname(sys.executable), "herd")), "train", "ppo", "--env", "CartPole-v1",
             "--num-env-runners", "1", "--stop-iters", "1", "--output", str(tmp_path)],
            env={**os.environ, "RAY_ADDRESS": f"127.0.0.1:{server.server_address[1]}"},
            capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert out.returncode == 2, out.stderr[-2000:]
    assert "answers, but not as a Ray head" in out.stderr and "gcs_client" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2  # "starting 1 env runner(s) on ..." and the error
    assert time.monotonic() - start < 30


def test_wait_for_port_rejects_bad_addresses_and_bounds_the_wait():
    from herdrl.cluster import ClusterError
    from herdrl.cluster.connect import wait_for_port

    with pytest.raises(ClusterError, match="bad Ray address 'nohost'"):
        wait_for_port("nohost", 1)
    start = time.monotonic()
    with pytest.raises(ClusterError, match="did not answer within 0.5 s"):
        wait_for_port("127.0.0.1:9", 0.5)
    assert time.monotonic() - start < 5


def test_bench_scaling_writes_table_csv_and_plot(tmp_path, capsys):
    from herdrl.cli import main

    code = main(["bench", "scaling", "--env", "herd/Latency-v0", "--runners", "1,2", "--iters", "2",
                 "--fragment", "20", "--config", "env_config={step_latency_s: 0.02}", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "| in-process | 1 |" in out and "| 2 | 1 |" in out
    rows = (tmp_path / "scaling.csv").read_text().splitlines()
    assert rows[0].startswith("runners,") and len(rows) == 4
    two = dict(zip(rows[0].split(","), rows[3].split(","), strict=True))
    # 2 latency-bound runners sample clearly faster than 1 (20 ms a step: 2 ms was not latency-bound enough
    # beside another pytest worker on 2 cores, 0.86x once)
    assert float(two["speedup_vs_1"]) > 1.3
    assert (tmp_path / "scaling.png").stat().st_size > 1000


def test_bench_scaling_rejects_bad_runner_lists(capsys):
    from herdrl.cli import main

    assert main(["bench", "scaling", "--env", "CartPole-v1", "--runners", "1,x"]) == 2
    assert "--runners expects comma-separated integers" in capsys.readouterr().err


def test_address_auto_pointing_at_a_dead_head_fails_within_the_bound(tmp_path):
    """A stale ray_current_cluster file (the head is gone) must not hang `--address auto`."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")
    env = {**os.environ, "RAY_TMPDIR": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)
    start = time.monotonic()
    out = subprocess.run(
        [str(os.path.join(os.path.dirname(sys.executable), "herd")), "train", "ppo", "--env", "CartPole-v1",
         "--num-env-runners", "1", "--address", "auto", "--ray-connect-timeout", "2", "--output", str(tmp_path)],
        capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Ray head at 127.0.0.1:9 did not answer within 2 s" in out.stderr
    assert time.monotonic() - start < 30


def test_a_runner_stuck_past_sample_timeout_counts_as_failed():
    config = (PPOConfig().environment("herd/Latency-v0", env_config={"step_latency_s": 0.05})
              .env_runners(num_env_runners=1, num_envs_per_env_runner=1, rollout_fragment_length=40,
                           sample_timeout_s=0.5)
              .training(train_batch_size=40, minibatch_size=20).fault_tolerance(restart_failed_env_runners=False))
    algo = config.build()
    start = time.monotonic()
    with pytest.raises(RunnerFailure, match=r"no fragment within sample_timeout_s=0.5 s"):
        algo.train()  # 40 steps x 50 ms = 2 s > 0.5 s
    assert time.monotonic() - start < 10
    algo.stop()


@pytest.mark.parametrize("name, env, training, loss_key", [
    ("A2C", "CartPole-v1", {"train_batch_size": 320}, "policy_loss"),
    ("TRPO", "CartPole-v1", {"train_batch_size": 256}, "vf_loss"),
    ("DQN", "CartPole-v1", {"min_sample_timesteps_per_iteration": 200, "num_steps_sampled_before_learning_starts": 64},
     "loss"),
    ("SAC", "Pendulum-v1", {"min_sample_timesteps_per_iteration": 200, "num_steps_sampled_before_learning_starts": 64,
                            "model": {"fcnet_hiddens": [32, 32]}}, "critic_loss"),
])
def test_every_algorithm_trains_on_two_ray_runners(name, env, training, loss_key):
    from herdrl.registry import get_config_class

    config = (get_config_class(name)().environment(env).env_runners(num_env_runners=2, num_envs_per_env_runner=2)
              .training(**training).debugging(seed=0))
    algo = config.build()
    try:
        assert len(set(algo.runners.call("pid"))) == 2 and os.getpid() not in algo.runners.call("pid")
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    last = results[-1]
    assert last["num_healthy_env_runners"] == 2
    assert last["num_env_steps_sampled_lifetime"] > results[0]["num_env_steps_sampled_lifetime"] > 0
    assert loss_key in last and last[loss_key] == last[loss_key], f"{name} learned on runner data: {last}"


def test_the_grpc_probe_fails_only_on_a_definite_wrong_answer(monkeypatch):
    """A closed connection or HTTP/1 bytes: not Ray. Silence (a loaded head) or TLS: left to ray.init."""
    import socket
    import threading

    from herdrl.cluster import ClusterError
    from herdrl.cluster.connect import check_speaks_grpc

    def serve(behaviour):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()

        def run():
            conn, _ = server.accept()
            if behaviour == "close":
                conn.close()
            elif behaviour == "http1":
                conn.recv(100)
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
                conn.close()
            elif behaviour == "settings":
                conn.recv(100)
                conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                time.sleep(0.5)
                conn.close()
            else:  # silent
                time.sleep(2)
                conn.close()

        threading.Thread(target=run, daemon=True).start()
        return f"127.0.0.1:{server.getsockname()[1]}"

    for behaviour in ("close", "http1"):
        with pytest.raises(ClusterError, match="not as a Ray head"):
            check_speaks_grpc(serve(behaviour), timeout_s=1.0)
    check_speaks_grpc(serve("settings"), timeout_s=1.0)
    check_speaks_grpc(serve("silent"), timeout_s=0.5)
    monkeypatch.setenv("RAY_USE_TLS", "1")
    check_speaks_grpc(serve("http1"), timeout_s=1.0)  # not probed: TLS speaks first


def test_runners_the_cluster_cannot_place_in_time_are_one_line(monkeypatch):
    """Resources that exist but stay taken (the runners' placement group never becomes ready) stop the run with one
    line naming what was asked and what is free, GPUs too when runners ask for them."""
    import ray

    from herdrl.cluster import ClusterError
    from herdrl.rollout import group

    real_get = ray.get

    def never_ready(refs, *args, timeout=None, **kwargs):  # the wait for the placement group times out
        if timeout is not None and timeout >= 60:
            raise ray.exceptions.GetTimeoutError("placement group not ready")
        return real_get(refs, *args, timeout=timeout, **kwargs)

    monkeypatch.setattr(ray, "get", never_ready)
    monkeypatch.setattr(group, "_check_room", lambda *args: None)  # as if the cluster had room, all of it taken
    with pytest.raises(ClusterError, match=r"cannot place 2 env runners x 1 CPU \(available: [\d.]+ CPU\); "
                                           r"lower num_env_runners or num_cpus_per_env_runner$"):
        ray_config(runners=2).build()
    with pytest.raises(ClusterError, match=r"cannot place 2 env runners x 1 CPU \+ 0.5 GPU \(available: [\d.]+ CPU, "
                                           r"0 GPU\); lower num_env_runners or num_cpus_per_env_runner, "
                                           r"num_gpus_per_env_runner$"):
        ray_config(runners=2).env_runners(num_gpus_per_env_runner=0.5).build()


def test_a_runner_larger_than_every_node_fails_at_once_naming_the_key(ray_session, monkeypatch, caplog):
    """A runner's CPUs are reserved on one node: asking for more than the largest node has fails at once with one
    line (key, value, the largest node's CPUs), even when the cluster's total would hold it (two 4-CPU nodes and a
    6-CPU runner: the placement group used to wait a minute, then name 8 CPUs free). A private Ray is sized to hold
    the runners: they start, and the note says what happens and what to do."""
    import ray

    from herdrl.cluster import ClusterError
    from herdrl.rollout import group

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # joined (this process is on the session's Ray already)
    node_cpus = ray_session.cluster_resources()["CPU"]  # one node: the session's
    started = time.monotonic()
    with pytest.raises(ClusterError, match=rf"^num_cpus_per_env_runner={node_cpus + 1:g} is more than the largest "
                                           rf"node of the Ray cluster at 10.0.0.1:6379 offers \({node_cpus:g} CPU\)"
                                           rf".*; set num_cpus_per_env_runner to {node_cpus:g} or less"):
        ray_config(runners=1).env_runners(num_cpus_per_env_runner=node_cpus + 1).build()
    assert time.monotonic() - started < 10
    nodes = [{"Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0}}, {"Alive": True, "Resources": {"CPU": 4.0,
                                                                                           "GPU": 1.0}},
             {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}}]  # a dead node offers nothing
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 8.0, "GPU": 2.0})
    with pytest.raises(ClusterError, match=r"^num_cpus_per_env_runner=6 is more than .* offers \(4 CPU\)"):
        group._check_room(ray_config(runners=1).env_runners(num_cpus_per_env_runner=6), 1, 6.0)
    group._check_room(ray_config(runners=2).env_runners(num_cpus_per_env_runner=4), 2, 4.0)  # one per node: fits
    with pytest.raises(ClusterError, match=r"^num_gpus_per_env_runner=2 is more than .* offers \(1 GPU\)"):
        group._check_room(ray_config(runners=1).env_runners(num_gpus_per_env_runner=2), 1, 1.0)
    monkeypatch.undo()  # the session's Ray again, as a private one (no address)
    monkeypatch.setitem(group._said, "oversubscribed", False)
    cores = os.cpu_count() or 1
    with caplog.at_level("WARNING", logger="herdrl"):
        group._check_room(ray_config(runners=1).env_runners(num_cpus_per_env_runner=cores + 1), 1, cores + 1.0)
    assert (f"num_cpus_per_env_runner={cores + 1} is more than this machine's {cores} cores: the private Ray starts "
            f"the runners anyway" in caplog.text and f"set it to {cores} or less" in caplog.text)
