"""A chaos run: `herd train` on fake nodes while runner processes, whole worker nodes, learner actors and the driver
itself are killed at random; what survived, what each fault cost, and that nothing is left behind.

Four raylets on loopback addresses (127.0.0.2 the head, holding no work; three workers), token auth, the health-check
settings herdrl gives the clusters it starts. The driver is a `herd train appo` (or `ppo`) process with runners and
a learner actor on the workers, checkpointing every 2 iterations. Every 20-40 s one fault, at random:

* ``runner``: SIGKILL one env runner's process;
* ``node``: SIGKILL every process of one worker node (a fresh node joins 30 s later: capacity returns);
* ``learner``: SIGKILL the learner actor's process;
* ``driver``: SIGKILL the driver, then start it again with ``--resume``, as a requeued job would.

For each fault: the seconds until the next completed iteration (read from the trial's ``result.json`` as rows
arrive) and the iterations or updates it lost. At the end: every process of the fake nodes is gone.

    python benchmarks/chaos.py --minutes 10
    python benchmarks/chaos.py --minutes 3 --algo ppo --seed 1
    python benchmarks/chaos.py --faults runner,learner,node,driver --runners 3   # each once, in turn (the test's)

With ``--faults``, the faults listed are injected in that order, each once the run has completed an iteration after
the one before (``--minutes`` then bounds the whole run). The last line is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from herdrl.cluster.nodes import NodeSpec, auth_env, node_pids, process_table, start_node, stop_node, write_node_token

KINDS = ("runner", "node", "learner", "driver")


class Cluster:
    """A head and worker raylets on 127.0.0.2, .3, ...; workers can be killed and new ones added."""

    def __init__(self, workers: int, cpus: int) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="hc", dir="/tmp"))
        head = self.root / "h"
        self.env = {**os.environ, **auth_env(write_node_token(head))}
        self.env.pop("RAY_ADDRESS", None)
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("RAY_")})
        self.cpus, self.next_ip = cpus, 3
        self.address, _ = start_node(NodeSpec(head, node_ip_address="127.0.0.2", num_cpus=0,
                                              object_store_memory=300_000_000))
        self.temps = [head]
        self.workers: list[Path] = []
        for _ in range(workers):
            self.add_worker()

    def add_worker(self) -> None:
        """A new worker node on the next loopback address."""
        temp = self.root / f"w{self.next_ip}"
        start_node(NodeSpec(temp, address=self.address, node_ip_address=f"127.0.0.{self.next_ip}",
                            num_cpus=self.cpus, object_store_memory=300_000_000))
        self.next_ip += 1
        self.temps.append(temp)
        self.workers.append(temp)

    def kill_worker(self, rng: random.Random) -> str:
        """SIGKILL every process of one worker node; returns its address."""
        temp = rng.choice(self.workers)
        self.workers.remove(temp)
        stop_node(temp, grace_s=0.0)
        return f"127.0.0.{temp.name[1:]}"

    def pids(self) -> set[int]:
        """Every process of the cluster's nodes (found through their temp dirs)."""
        return set().union(*(node_pids(temp) for temp in self.temps))

    def stop(self) -> None:
        """Stop every node (by PID), remove the files."""
        for temp in reversed(self.temps):
            stop_node(temp)
        shutil.rmtree(self.root, ignore_errors=True)


def actor_pids(name: str) -> list[int]:
    """Processes of Ray actors of class ``name`` (Ray names an actor's process ``ray::Name``)."""
    return sorted(pid for pid, (_, cmd) in process_table(own=True).items() if cmd.startswith(f"ray::{name}"))


class Rows:
    """The trial's ``result.json`` as it grows (a resumed driver first drops the rows after its checkpoint): every
    row ever seen, each with the time it was first seen."""

    def __init__(self, output: Path) -> None:
        self.output, self.rows, self._seen = output, [], set()

    def poll(self) -> list[dict]:
        """Rows new since the last poll."""
        files = list(self.output.glob("*/*/result.json"))
        if not files:
            return []
        new = []
        for line in files[0].read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line being written
            key = (row["training_iteration"], row["num_env_steps_sampled_lifetime"])
            if key not in self._seen:
                self._seen.add(key)
                new.append({**row, "_seen": time.monotonic()})
        self.rows += new
        return new


def main() -> None:
    """Run the chaos loop; print one row per fault and the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--algo", default="appo", choices=("appo", "ppo"))
    parser.add_argument("--runners", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", default="20,40", help="seconds between faults: LOW,HIGH (uniform)")
    parser.add_argument("--faults", help="inject these kinds in this order (comma-separated), none at random")
    parser.add_argument("--out", default="results/bench-chaos")
    args = parser.parse_args()
    planned = args.faults.split(",") if args.faults else None
    if planned and not set(planned) <= set(KINDS):
        parser.error(f"--faults: choose among {', '.join(KINDS)}")
    rng = random.Random(args.seed)
    low, high = (float(x) for x in args.every.split(","))
    output = Path(args.out).resolve() / time.strftime("%Y-%m-%d_%H-%M-%S")
    cluster = Cluster(workers=3, cpus=3)
    herd = str(Path(sys.executable).parent / "herd")
    command = [herd, "train", args.algo, "--env", "herd/Latency-v0", "--num-env-runners", str(args.runners),
               "--num-learners", "1", "--stop-iters", "1000000", "--checkpoint-every", "2", "--output",
               str(output), "--trial", "chaos", "--address", cluster.address, "--node-ip-address", "127.0.0.2",
               "--no-tensorboard", "--config", "train_batch_size=600", "sample_timeout_s=60",
               "learner_state_interval=5"]
    output.parent.mkdir(parents=True, exist_ok=True)
    log = open(output.parent / f"{output.name}-driver.log", "w")  # the driver's console, for a look after

    def start_driver(resume: bool) -> subprocess.Popen:
        return subprocess.Popen([*command, *(["--resume"] if resume else [])], env=cluster.env, stdout=log,
                                stderr=subprocess.STDOUT)

    rows, faults, pending_node = Rows(output), [], None
    driver = start_driver(False)
    try:
        deadline = time.monotonic() + args.minutes * 60
        while not rows.poll() and time.monotonic() < deadline:  # wait for the first iteration
            assert driver.poll() is None, f"the driver exited with {driver.returncode} before its first iteration"
            time.sleep(0.5)
        next_fault = time.monotonic() + rng.uniform(low, high)
        while time.monotonic() < deadline:
            time.sleep(0.2)
            rows.poll()
            if driver.poll() is not None:  # not a fault we injected: a failure; started again, as a requeued job
                faults.append({"kind": "driver exited", "at": time.monotonic(), "rc": driver.returncode})
                print(f"{time.strftime('%H:%M:%S')} the driver exited with {driver.returncode}: resuming", flush=True)
                driver = start_driver(True)
                continue
            if pending_node is not None and time.monotonic() >= pending_node:
                cluster.add_worker()  # capacity returns
                pending_node = None
            if planned is not None:  # the next planned fault once an iteration completed after the last one
                if not planned:
                    if not faults or rows.rows[-1]["_seen"] > faults[-1]["at"]:
                        break  # the last one survived
                    continue
                if faults and rows.rows[-1]["_seen"] <= faults[-1]["at"]:
                    continue
                kind = planned.pop(0)
            elif time.monotonic() < next_fault:
                continue
            else:
                next_fault = time.monotonic() + rng.uniform(low, high)
                kind = rng.choice(KINDS)
            fault = {"kind": kind, "at": time.monotonic(), "rows_before": len(rows.rows),
                     "iteration_before": rows.rows[-1]["training_iteration"] if rows.rows else 0}
            if kind == "runner":
                pids = actor_pids("RemoteEnvRunner")
                if not pids:
                    continue
                os.kill(rng.choice(pids), signal.SIGKILL)
            elif kind == "learner":
                pids = actor_pids("LearnerActor")
                if not pids:
                    continue
                os.kill(pids[0], signal.SIGKILL)
            elif kind == "node":
                if len(cluster.workers) < 2:
                    continue
                fault["node"] = cluster.kill_worker(rng)
                pending_node = time.monotonic() + 30
            else:
                driver.send_signal(signal.SIGKILL)
                driver.wait()
                driver = start_driver(True)
            faults.append(fault)
            print(f"{time.strftime('%H:%M:%S')} fault: {kind}{' ' + fault.get('node', '') if 'node' in fault else ''}",
                  flush=True)
        driver.send_signal(signal.SIGTERM)  # the end: a checkpoint, as at a job's end
        rc = driver.wait(timeout=180)
        rows.poll()
    finally:
        if driver.poll() is None:
            driver.kill()
        cluster.stop()
        time.sleep(1.0)
        left = sorted(pid for pid, (_, cmd) in process_table(own=True).items() if str(cluster.root) in cmd)
    final = [json.loads(line) for path in output.glob("*/*/result.json") for line in path.read_text().splitlines()]
    report(faults, rows.rows, rc, left, final)


def report(faults: list[dict], rows: list[dict], rc: int, left: list[int], final: list[dict]) -> None:
    """One line per fault: seconds to the next completed iteration, and what it lost; then the totals (``final``:
    the trial's rows as its result file has them at the end)."""
    print("\n| fault | recovered in (s) | lost |\n|---|---|---|")
    survived = 0
    injected = [fault for fault in faults if fault["kind"] != "driver exited"]
    for number, fault in enumerate(faults):
        until = faults[number + 1]["at"] if number + 1 < len(faults) else float("inf")
        before = [r for r in rows if r["_seen"] <= fault["at"]]
        after = [r for r in rows if r["_seen"] > fault["at"]]
        between = [r for r in after if r["_seen"] <= until]
        if not after or fault["kind"] == "driver exited":
            exit_code = f" (exit {fault['rc']})" if "rc" in fault else ""
            resumed = f": resumed in {after[0]['_seen'] - fault['at']:.1f} s" if after else ""
            print(f"| {fault['kind']}{exit_code} | not survived{resumed} | |")
            continue
        survived += 1
        first = after[0]
        if fault["kind"] == "driver":
            lost = f"{fault['iteration_before'] - first['training_iteration'] + 1} iterations"
        else:  # the learner's updates lost (the counter runs for the driver's life), the fragments sampled again
            updates = max((r.get("num_learner_updates_lost", 0) for r in between), default=0) - (
                before[-1].get("num_learner_updates_lost", 0) if before else 0)
            fragments = sum(r.get("num_fragments_lost", 0) for r in between)
            lost = f"{max(updates, 0)} updates, {fragments} fragments (sampled again)"
        print(f"| {fault['kind']}{' ' + fault['node'] if 'node' in fault else ''} | "
              f"{first['_seen'] - fault['at']:.1f} | {lost} |")
    iterations = [r["training_iteration"] for r in rows]
    print(f"\nfaults injected {len(injected)}, survived {survived}; iterations {iterations[0] if iterations else 0}.."
          f"{iterations[-1] if iterations else 0}; driver's last exit {rc}; Ray processes left: {len(left)}")
    print("RESULT " + json.dumps({"injected": [f["kind"] for f in injected], "survived": survived,
                                  "other_exits": len(faults) - len(injected), "rc": rc, "left": len(left),
                                  "iterations": [r["training_iteration"] for r in final],
                                  "steps": [r["num_env_steps_sampled_lifetime"] for r in final]}))


if __name__ == "__main__":
    main()
