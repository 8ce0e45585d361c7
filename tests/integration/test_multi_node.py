"""StarPO on a real two-node Ray cluster simulated on this machine: a head and a second
``ray start`` node, one env runner placed on each, the driver connecting with ``address=``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pytest

pytestmark = pytest.mark.integration

GROUPS, GROUP_SIZE, ITERATIONS = 3, 2, 2

# The driver runs in its own process so that its Ray connection (address, token) is separate
# from any local Ray the test process has started.
DRIVER = r"""
import json, sys, time
import ray
from ragen_rllib.algorithms.starpo.config import StarPOConfig
from ragen_rllib.algorithms.starpo.params import PRESETS
from ragen_rllib.trajectory import TrajectoryStore

args = json.loads(sys.argv[1])
ray.init(address=args["address"], log_to_driver=False)
end = time.monotonic() + 120
while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < end:
    time.sleep(1)
params = PRESETS["starpo"](model=args["model"], engine="hf", env="bandit", env_groups=args["groups"],
                           group_size=args["group_size"], response_length=6, enable_think=False,
                           adv_estimator="grpo", test_freq=0, ppo_mini_batch_size=args["groups"] * args["group_size"])
algo = (StarPOConfig().training(starpo=params)
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5,
                     custom_resources_per_env_runner={"env_runner_slot": 1})  # one slot per node
        .storage(run_dir=args["run_dir"], run_name="mn").debugging(seed=0).build_algo())
try:
    results = [algo.train() for _ in range(args["iterations"])]
    infos = algo.env_runner_group.foreach_env_runner(lambda r: r.policy_info(), local_env_runner=False)
finally:
    algo.stop()
nodes = {n["NodeID"]: sorted(k for k in n["Resources"] if k.startswith("node_")) for n in ray.nodes() if n["Alive"]}
print("RESULT " + json.dumps({"infos": infos, "nodes": nodes, "driver_node": ray.get_runtime_context().get_node_id(),
                              "policy_version": [r["policy_version"] for r in results],
                              "rows": TrajectoryStore(args["run_dir"], "mn").read().num_rows}))
ray.shutdown()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_ports() -> list[str]:
    """Explicit free ports for every per-node service, so two raylets on one machine (and other
    Ray instances of other users) never collide on a default port."""
    out = []
    for flag in ("--node-manager-port", "--object-manager-port", "--metrics-export-port",
                 "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port"):
        out += [flag, str(_free_port())]
    return out


def _stop(proc: subprocess.Popen, temp_dir: str) -> None:
    """SIGKILL the process group of a ``ray start --block`` (raylet, GCS, agents, workers).

    SIGTERM would make the node drain for up to 30 s; nothing of this throw-away cluster needs
    to survive. Any process still naming our temp dir (one that left the group) is killed by pid.
    """
    import psutil

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)
    for p in psutil.process_iter(["pid", "cmdline"]):
        if any(temp_dir in arg for arg in (p.info["cmdline"] or [])):
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[dict[str, str]]:
    """A head (1 CPU, resource node_a) and a worker node (1 CPU, node_b), both with one
    ``env_runner_slot``, token auth with a fresh token, no dashboard, free ports, own temp dir."""
    ray_bin = str(Path(sys.executable).parent / "ray")
    temp_dir = tempfile.mkdtemp(prefix="rr_", dir="/tmp")  # short: Ray socket paths must stay < 107 chars
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex}
    port = _free_port()
    common = ["--block", "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    head_cmd = [ray_bin, "start", "--head", "--port", str(port), "--temp-dir", temp_dir, "--include-dashboard", "false",
                "--ray-client-server-port", str(_free_port()),
                "--resources", json.dumps({"node_a": 1, "env_runner_slot": 1}), *common, *_node_ports()]
    worker_cmd = [ray_bin, "start", "--address", f"127.0.0.1:{port}",
                  "--resources", json.dumps({"node_b": 1, "env_runner_slot": 1}), *common, *_node_ports()]
    procs: list[subprocess.Popen] = []
    logs = [open(Path(temp_dir) / name, "w") for name in ("head.out", "worker.out")]
    try:
        procs.append(subprocess.Popen(head_cmd, env=env, start_new_session=True, stdout=logs[0],
                                      stderr=subprocess.STDOUT))
        # The worker node retries its GCS connection until the head is up.
        procs.append(subprocess.Popen(worker_cmd, env=env, start_new_session=True, stdout=logs[1],
                                      stderr=subprocess.STDOUT))
        yield {"address": f"127.0.0.1:{port}", "temp_dir": temp_dir, "env": env}
    finally:
        for proc in reversed(procs):
            _stop(proc, temp_dir)
        for f in logs:
            f.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_env_runners_on_two_nodes(two_node_cluster, tiny_model_dir, tmp_path) -> None:
    args = {"address": two_node_cluster["address"], "model": str(tiny_model_dir), "run_dir": str(tmp_path),
            "groups": GROUPS, "group_size": GROUP_SIZE, "iterations": ITERATIONS}
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(args)], env=two_node_cluster["env"],
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        logs = "".join((Path(two_node_cluster["temp_dir"]) / n).read_text()[-2000:] for n in ("head.out", "worker.out"))
        pytest.fail(f"driver failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}\n--- ray start logs ---\n{logs}")
    out = json.loads(lines[-1][len("RESULT "):])

    assert len(out["nodes"]) == 2
    runner_nodes = {i["worker_index"]: i["node_id"] for i in out["infos"]}
    assert sorted(runner_nodes) == [1, 2]
    # One runner on each node: the head (node_a) and the second `ray start` node (node_b).
    assert len(set(runner_nodes.values())) == 2
    assert sorted(out["nodes"][n][0] for n in runner_nodes.values()) == ["node_a", "node_b"]
    assert {i["policy_version"] for i in out["infos"]} == {ITERATIONS}
    assert out["policy_version"][-1] == float(ITERATIONS)
    assert out["rows"] == ITERATIONS * GROUPS * GROUP_SIZE
