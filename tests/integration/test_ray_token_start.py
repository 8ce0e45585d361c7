"""A real local Ray start through ``init_ray`` (what train, sweep and eval call) in a fresh HOME:
the auth token file it needs is created by the project with mode 0600, and Ray runs with token
authentication on exactly that token (Ray alone would write it 0644 under the default umask). The
head processes a local run never uses (autoscaler monitor, log monitor, dashboard API server) are
gone, and the cluster still runs tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = """
import json
import psutil
import ray
from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode
from ragen_rllib.algorithms.starpo.experiment import Experiment
from ragen_rllib.algorithms.starpo.train import init_ray

init_ray(Experiment.from_dict({"rllib": {"ray_num_cpus": 1}}))
node = ray._private.worker._global_node
head = sorted(node.all_processes)
script_of = {"monitor": "autoscaler/_private/monitor.py", "log_monitor": "_private/log_monitor.py",
             "dashboard": "dashboard/dashboard.py"}
session = node.get_session_dir_path()
alive = sorted(kind for kind, script in script_of.items()
               for p in psutil.process_iter(["cmdline"])
               if any(script in part for part in p.info["cmdline"] or [])
               and any(session in part for part in p.info["cmdline"] or []))
print(json.dumps({"token_mode": get_authentication_mode() == AuthenticationMode.TOKEN,
                  "token": AuthenticationTokenLoader.instance().get_raw_token(),
                  "cpus": ray.cluster_resources().get("CPU"), "head": head, "alive": alive,
                  "task": ray.get(ray.remote(lambda x: 2 * x).remote(21))}))
ray.shutdown()
"""


def test_local_ray_start_uses_a_private_token_file(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")}
    env.update(HOME=str(tmp_path), PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300,
                          umask=0o022)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    token = tmp_path / ".ray" / "auth_token"
    assert token.stat().st_mode & 0o777 == 0o600
    assert res["token_mode"] and res["cpus"] == 1.0
    assert res["token"] == token.read_text()  # Ray runs on the file the project wrote
    assert res["head"] == ["gcs_server", "raylet"] and res["alive"] == [] and res["task"] == 42
