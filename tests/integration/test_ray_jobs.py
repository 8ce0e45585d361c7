"""`ragen-rllib submit` / `ragen-rllib job …` against a real local Ray cluster with token auth.

The module starts its own head (`ray start --head --block`, own process group and session, every
port free and non-default, dashboard on 127.0.0.1, `RAY_AUTH_MODE=token` with a token file under
a private temp dir: the shared ~/.ray/auth_token is never touched), submits tiny training jobs
through the CLI (a subprocess, as a user would), and checks the job outcome, the logs shown to the
user, the uploaded working dir and the MLflow run linked to the job. Teardown stops only that head.
"""

from __future__ import annotations

import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

VENV_BIN = Path(sys.executable).parent
EXPERIMENT = "test-ray-jobs"


@dataclass
class Head:
    address: str      # the job server (dashboard) URL
    token_path: Path  # the token the head was started with
    temp_dir: Path    # Ray's --temp-dir of this head (session logs, uploaded packages)


def _free_ports(n: int) -> list[int]:
    """n distinct ports, bindable on all interfaces now, below the ephemeral range (Ray's gRPC
    servers bind 0.0.0.0, so a port free only on 127.0.0.1 is not enough)."""
    ports: list[int] = []
    while len(ports) < n:
        p = random.randint(20000, 30999)
        if p in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", p))
            except OSError:
                continue
        ports.append(p)
    return ports


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # `python` in a job = this venv's
    return env


def _stop_head(proc: subprocess.Popen) -> None:
    """SIGTERM `ray start --block` (it shuts its own processes down), then SIGKILL whatever of its
    session is left (workers get their own process groups, but stay in its session)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    import psutil

    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == proc.pid:
                p.kill()
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def ray_head():
    import requests

    root = Path(tempfile.mkdtemp(prefix="rr_", dir="/tmp"))  # Ray's socket paths must stay < 107 chars
    token = root / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    (gcs, dash, client, agent_http, agent_grpc, rt_env, metrics, obj_mgr, node_mgr) = _free_ports(9)
    env = {**_clean_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    cmd = [str(VENV_BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--port", str(gcs), "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dash),
           "--include-dashboard", "true", "--num-cpus", "2", "--object-store-memory", str(256 * 1024**2),
           "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent_http),
           "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(rt_env),
           "--metrics-export-port", str(metrics), "--object-manager-port", str(obj_mgr),
           "--node-manager-port", str(node_mgr), "--temp-dir", str(root / "t"), "--disable-usage-stats"]
    log_path = root / "head.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        up = False
        for _ in range(240):  # wait for the job server; give up after ~2 min (or when the head exits)
            if proc.poll() is not None:
                break
            try:
                up = requests.get(f"{address}/api/version", timeout=2,
                                  headers={"Authorization": f"Bearer {token.read_text()}"}).status_code == 200
            except requests.ConnectionError:
                pass
            if up:
                break
            time.sleep(0.5)
        if not up:
            pytest.fail(f"the Ray head's job server did not come up at {address} (ray start exit code "
                        f"{proc.poll()}):\n{log_path.read_text()[-4000:]}")
        yield Head(address=address, token_path=token, temp_dir=root / "t")
    finally:
        _stop_head(proc)
        shutil.rmtree(root, ignore_errors=True)


def _cli(head: Head, *args: str, timeout: float = 600, **env_over: str) -> subprocess.CompletedProcess:
    env = {**_clean_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(head.token_path), **env_over}
    return subprocess.run([sys.executable, "-m", "ragen_rllib.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _tiny_experiment(model_dir: Path, tmp_path: Path, iterations: int) -> dict:
    return {"preset": "starpo_s", "iterations": iterations, "run_dir": str(tmp_path / "runs"),
            "starpo": {"model": str(model_dir), "engine": "hf", "env": "bandit", "env_groups": 2, "group_size": 2,
                       "response_length": 6, "enable_think": False, "critic_type": "value_head", "test_freq": 0,
                       "actor_lr": 1.0e-4},
            "tracking": {"experiment": EXPERIMENT}}


def _submitted_id(stdout: str) -> str:
    m = re.search(r"^submitted (\S+) to ", stdout, re.M)
    assert m, stdout[-2000:]
    return m.group(1)


def test_submit_training_job_succeeds_and_links_mlflow_run(ray_head, tiny_model_dir, tmp_path) -> None:
    from ragen_rllib.tracking.mlflow_logger import find_runs

    wd = tmp_path / "wd"
    (wd / "experiments").mkdir(parents=True)
    exp = {**_tiny_experiment(tiny_model_dir, tmp_path, 1), "run_dir": "out"}  # relative: pinned to wd/out
    (wd / "experiments" / "tiny.yaml").write_text(yaml.safe_dump(exp))
    (wd / "notes.txt").write_text("shipped")
    (wd / "runs").mkdir()
    (wd / "runs" / "old_output.txt").write_text("not shipped")
    (wd / "weights.safetensors").write_bytes(b"\0" * 16)

    p = _cli(ray_head, "submit", "--address", ray_head.address, "--config", "experiments/tiny.yaml",
             "--working-dir", str(wd), "--run-name", "jobrun")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    sid = _submitted_id(p.stdout)
    assert "[1/1]" in p.stdout and f"job {sid} succeeded" in p.stdout  # logs were followed to the end

    st = _cli(ray_head, "job", "status", sid, "--address", ray_head.address)
    assert st.returncode == 0 and f"{sid}: SUCCEEDED" in st.stdout, st.stdout + st.stderr
    logs = _cli(ray_head, "job", "logs", sid, "--address", ray_head.address)
    assert "[1/1]" in logs.stdout and "mlflow run:" in logs.stdout
    lst = _cli(ray_head, "job", "list", "--address", ray_head.address)
    assert re.search(rf"^{re.escape(sid)}\s+SUCCEEDED", lst.stdout, re.M), lst.stdout

    runs = find_runs(f"sqlite:///{wd / 'out' / 'mlflow.db'}", EXPERIMENT)  # the default store, in run_dir
    assert len(runs) == 1 and runs[0]["status"] == "FINISHED" and runs[0]["run_name"] == "jobrun"
    assert runs[0]["tags"]["ray_job_id"] == sid
    assert (wd / "out" / "jobrun" / "hf_model" / "model.safetensors").is_file()

    # what was uploaded: the config and small files, not run outputs or weights
    unpacked = ray_head.temp_dir.glob("session_2*/runtime_resources/working_dir_files/*")  # not session_latest
    pkgs = [d for d in unpacked if (d / "experiments" / "tiny.yaml").is_file()]
    assert len(pkgs) == 1, list(ray_head.temp_dir.glob("session_2*/runtime_resources/working_dir_files/*"))
    assert (pkgs[0] / "notes.txt").is_file()
    assert not (pkgs[0] / "runs").exists() and not (pkgs[0] / "weights.safetensors").exists()


def test_bad_config_job_fails_with_a_clear_message(ray_head, tmp_path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    # A bad value is refused before anything is sent: one line naming the field and value.
    (wd / "bad.yaml").write_text(yaml.safe_dump({"preset": "starpo_s", "starpo": {"rollout_filter_ratio": 1.5}}))
    p = _cli(ray_head, "submit", "--address", ray_head.address, "--config", "bad.yaml", "--working-dir", str(wd))
    assert p.returncode != 0 and "submitted" not in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    assert re.search(r"error: .*rollout_filter_ratio.*1\.5", p.stderr), p.stderr
    # What only the cluster can find (here: a model folder it does not have) fails the job, with the
    # driver's one-line error in the summary and in `job status`.
    (wd / "nomodel.yaml").write_text(yaml.safe_dump({"preset": "starpo_s", "starpo": {"model": "/no/such/model"}}))
    p = _cli(ray_head, "submit", "--address", ray_head.address, "--config", "nomodel.yaml", "--working-dir", str(wd))
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    sid = _submitted_id(p.stdout)
    assert f"job {sid} FAILED" in p.stderr
    assert re.search(r"error: starpo.model: .*/no/such/model", p.stderr), p.stderr
    st = _cli(ray_head, "job", "status", sid, "--address", ray_head.address)
    assert f"{sid}: FAILED" in st.stdout and "exit code 1" in st.stdout


def test_stop_is_graceful_and_closes_the_mlflow_run(ray_head, tiny_model_dir, tmp_path) -> None:
    from ragen_rllib.tracking.mlflow_logger import find_runs

    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "long.yaml").write_text(yaml.safe_dump(_tiny_experiment(tiny_model_dir, tmp_path, 1000)))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    p = _cli(ray_head, "submit", "--address", ray_head.address, "--config", "long.yaml", "--working-dir", str(wd),
             "--tracking-uri", uri, "--run-name", "stopped", "--submission-id", "ragen-stop-test", "--no-follow")
    assert p.returncode == 0 and _submitted_id(p.stdout) == "ragen-stop-test", p.stdout + p.stderr
    for _ in range(240):  # until the first iteration is logged (the job is then really training)
        logs = _cli(ray_head, "job", "logs", "ragen-stop-test", "--address", ray_head.address).stdout
        if "[1/1000]" in logs:
            break
        time.sleep(1)
    else:
        pytest.fail(f"no training iteration logged:\n{logs[-3000:]}")
    stop = _cli(ray_head, "job", "stop", "ragen-stop-test", "--address", ray_head.address)
    assert stop.returncode == 0 and "stop requested" in stop.stdout, stop.stdout + stop.stderr
    follow = _cli(ray_head, "job", "logs", "ragen-stop-test", "--address", ray_head.address, "--follow")
    assert follow.returncode == 3 and "job ragen-stop-test stopped" in follow.stderr, follow.stderr[-2000:]
    assert "interrupted: saving a checkpoint" in follow.stdout  # SIGINT reached train()'s handler
    runs = find_runs(uri, EXPERIMENT)
    assert len(runs) == 1 and runs[0]["status"] == "KILLED" and runs[0]["tags"]["ray_job_id"] == "ragen-stop-test"
    assert (tmp_path / "runs" / "stopped" / "checkpoint").is_dir()


def test_auth_and_address_errors_say_what_to_do(ray_head, tmp_path) -> None:
    wrong = _cli(ray_head, "job", "list", "--address", ray_head.address, RAY_AUTH_TOKEN="not-the-token")
    assert (wrong.returncode == 1 and "$RAY_AUTH_TOKEN was rejected" in wrong.stderr
            and "ray get-auth-token" in wrong.stderr)
    missing = _cli(ray_head, "job", "list", "--address", ray_head.address, RAY_AUTH_MODE="disabled")
    assert missing.returncode == 1 and "no token was sent" in missing.stderr
    (port,) = _free_ports(1)
    down = _cli(ray_head, "job", "status", "x", "--address", f"http://127.0.0.1:{port}")
    assert down.returncode == 1 and f"cannot reach a Ray job server at http://127.0.0.1:{port}" in down.stderr
    unknown = _cli(ray_head, "job", "status", "no-such-job", "--address", ray_head.address)
    assert unknown.returncode == 1 and "no-such-job does not exist" in unknown.stderr
    no_cfg = _cli(ray_head, "submit", "--address", ray_head.address, "--config", "nope.yaml", "--working-dir",
                  str(tmp_path))
    assert no_cfg.returncode == 1 and "'nope.yaml' does not exist" in no_cfg.stderr


def test_current_job_id_prefers_ours_then_rays_job_config() -> None:
    from ragen_rllib.launch.jobs import current_job_id, training_entrypoint

    ray_cfg = '{"runtime_env": {}, "metadata": {"job_submission_id": "raysubmit_abc", "job_name": "x"}}'
    assert current_job_id({"RAGEN_RLLIB_RAY_JOB_ID": "ragen-1", "RAY_JOB_CONFIG_JSON_ENV_VAR": ray_cfg}) == "ragen-1"
    assert current_job_id({"RAY_JOB_CONFIG_JSON_ENV_VAR": ray_cfg}) == "raysubmit_abc"  # plain `ray job submit`
    assert current_job_id({}) is None and current_job_id({"RAY_JOB_CONFIG_JSON_ENV_VAR": "not json"}) is None
    assert training_entrypoint("exp s.yaml", "cpu", ["starpo.env=bandit:test"], "sqlite:////tmp/m.db") == (
        "python -m ragen_rllib.cli train --config 'exp s.yaml' --profile cpu --set starpo.env=bandit:test "
        "--tracking-uri sqlite:////tmp/m.db")


def test_runtime_env_carries_the_submitting_checkout_commit(tmp_path) -> None:
    """The uploaded working dir has no .git, so the commit travels as an env var for the MLflow tag."""
    from pathlib import Path

    from ragen_rllib.launch.jobs import GIT_COMMIT_ENV, training_runtime_env
    from ragen_rllib.tracking.mlflow_logger import get_git_commit

    repo = Path(__file__).resolve().parents[2]
    commit = get_git_commit(repo)
    env = training_runtime_env(repo, "ragen-x")["env_vars"]
    if commit is None:
        pytest.skip("the test checkout is not a git work tree (no commit to carry)")
    assert env[GIT_COMMIT_ENV] == commit and env["RAGEN_RLLIB_RAY_JOB_ID"] == "ragen-x"
    assert GIT_COMMIT_ENV not in training_runtime_env(tmp_path, "ragen-y")["env_vars"]  # not a repo
