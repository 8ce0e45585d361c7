"""Ray Jobs adapter: submit ``ragen-rllib train`` to a running Ray cluster, follow, query, stop.

The only module of ragen-rllib that talks to Ray's job server; Ray's job SDK
(``ray.job_submission.JobSubmissionClient``, an HTTP client of the dashboard's job server) is
imported lazily inside functions, so importing this module stays light.

- **Entrypoint.** A job runs ``python -m ragen_rllib.cli train --config … [--profile …] [--set …]
  [--tracking-uri …] [--run-name …]`` in a copy of ``working_dir`` on the cluster. The cluster's
  Python must have ragen-rllib installed (the driver imports it from there): the package folders
  (``ragen_rllib/``, ``algorithms/``, ``env_runners/``) are left out of the upload so the job never
  mixes an uploaded copy with the installed code. What the upload is for: experiment YAMLs and
  other small files that relative paths in a config name. A relative ``run_dir`` (outputs, and the
  default MLflow store) is pinned to ``<working_dir>/<run_dir>`` on the submitting machine, since
  the driver's cwd is a temporary copy: right for a local cluster; a remote one needs absolute
  paths on shared storage (and an MLflow server as ``tracking_uri``).
- **Job id.** The submission id is chosen here, before submitting, and passed to the driver as
  ``RAGEN_RLLIB_RAY_JOB_ID`` so ``train()`` can tag its MLflow run with ``ray_job_id``
  (``current_job_id`` also reads Ray's own job config, so plain ``ray job submit`` works too).
- **Auth.** Ray 2.60 clusters run with token authentication. Unless ``RAY_AUTH_MODE=disabled``,
  the client sends the token Ray itself would use (``RAY_AUTH_TOKEN``, else the file
  ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``) as a bearer header. Unreachable servers
  and rejected/missing tokens become a ``JobsError`` that says what to do.
- **Address.** The explicit ``address`` wins: Ray's client would otherwise silently prefer
  ``RAY_API_SERVER_ADDRESS`` / ``RAY_ADDRESS`` from the environment.
- **What is uploaded.** Ray packs ``working_dir`` minus the ``excludes`` (``DEFAULT_EXCLUDES``
  plus the caller's), Ray's own default excludes, and what ``.gitignore`` / ``.rayignore`` files
  in each folder ignore. Ray skips ``.gitignore`` when ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1``;
  ``submit_training`` clears that variable while it submits, so ``.gitignore`` always counts.
  Credentials (``SECRET_EXCLUDES``: ``.env``, ``*.pem``, ``*.key``, ``.netrc``, Ray's
  ``auth_token`` ...) are excluded whatever ``excludes`` says: they come last in the pattern
  list, so no ``!pattern`` before them re-includes them. ``upload_manifest`` lists the files
  with Ray's own packaging code, without a cluster.

Example::

    sid = submit_training("http://127.0.0.1:8265", "experiments/bandit_starpo_s.yaml", profile="cpu")
    status = follow_logs("http://127.0.0.1:8265", sid, write=sys.stdout.write)   # "SUCCEEDED"
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ragen_rllib.environ import scoped_environ
from ragen_rllib.launch.ray_token import TOKEN_PATH_ENV, mode_problem, token_path

logger = logging.getLogger(__name__)

#: Env var that carries the submission id into the job's driver (read by ``current_job_id``).
JOB_ID_ENV = "RAGEN_RLLIB_RAY_JOB_ID"
GIT_COMMIT_ENV = "RAGEN_RLLIB_GIT_COMMIT"  # the submitting checkout's commit (a job's working dir has no .git)
#: Ray sets this in every job driver; its ``metadata.job_submission_id`` is the submission id.
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
#: Job states after which nothing changes any more.
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "STOPPED")
#: Left out of the working-dir upload (gitignore syntax, relative to working_dir; a leading "/"
#: anchors at its root). Run outputs, stores, weights and VCS data are large and never inputs;
#: the package folders are excluded so the cluster's installed ragen-rllib is what runs.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    ".venv", "venv", ".git", "runs", "mlruns", "mlartifacts", "*.db", "*.db-journal", "__pycache__",
    "*.egg-info", ".cache", ".pytest_cache", "build", "dist",
    "*.safetensors", "*.gguf", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.parquet", "*.arrow",
    "/ragen_rllib", "/algorithms", "/env_runners",
)
#: Never uploaded, whatever ``excludes`` says (appended after them; see the module docstring).
SECRET_EXCLUDES: tuple[str, ...] = (
    ".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx", ".netrc", "_netrc", "auth_token",
    ".git-credentials", ".pypirc", ".ssh", ".aws",
)
#: Set to "1", Ray ignores ``.gitignore`` files when it packs the working dir.
RAY_IGNORE_GITIGNORE_ENV = "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"
#: Read by the job's supervisor actor (it gets the job's env_vars): how `stop_job` ends the driver.
STOP_ENV_DEFAULTS = {"RAY_JOB_STOP_SIGNAL": "SIGINT", "RAY_JOB_STOP_WAIT_TIME_S": "120"}


class JobsError(RuntimeError):
    """A job-server call failed; the message names the address/job and says what to do."""


# --------------------------------------------------------------------------- light helpers


def current_job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The Ray Jobs submission id of the running driver, or None outside a Ray job.

    Reads ``RAGEN_RLLIB_RAY_JOB_ID`` (set by ``submit_training``), else the ``job_submission_id``
    Ray writes into every job driver's ``RAY_JOB_CONFIG_JSON_ENV_VAR``.
    """
    env = os.environ if environ is None else environ
    if env.get(JOB_ID_ENV):
        return env[JOB_ID_ENV]
    try:
        meta = json.loads(env.get(RAY_JOB_CONFIG_ENV) or "{}").get("metadata") or {}
    except (ValueError, AttributeError):  # not ours to validate: just no id
        return None
    return meta.get("job_submission_id") or None


def new_submission_id(prefix: str = "ragen") -> str:
    """A fresh, readable submission id, e.g. ``ragen-20261130-113700-3f9a1c``."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def check_address(address: str) -> None:
    """Refuse an address the job client cannot use, before any connection is tried.

    Accepted: the dashboard URL ``http(s)://host[:port]`` (what ``--address`` documents), and
    Ray's own cluster forms ``ray://host:port``, ``host:port`` and ``auto``.

    Raises:
        ValueError: one line naming the address and the expected form.
    """
    parsed = urlparse(address) if "://" in address else None
    if address == "auto" or (parsed is None and re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:\d{1,5}", address)):
        return
    try:
        ok = parsed is not None and parsed.scheme in ("http", "https", "ray") and bool(parsed.hostname)
        ok = ok and (parsed.port is not None or parsed.scheme != "ray")  # .port raises on a bad port
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"address {address!r} is not a Ray dashboard URL; give e.g. --address "
                         "http://127.0.0.1:8265 (the head node's dashboard, port 8265 by default)")


def training_entrypoint(config: str, profile: str | None = None, overrides: Sequence[str] = (),
                        tracking_uri: str | None = None, run_name: str | None = None,
                        python: str = "python") -> str:
    """The shell command a training job runs (every argument shell-quoted)."""
    argv = [python, "-m", "ragen_rllib.cli", "train", "--config", config]
    if profile:
        argv += ["--profile", profile]
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"overrides: expected key=value, got {item!r}")
        argv += ["--set", item]
    if tracking_uri:
        argv += ["--tracking-uri", tracking_uri]
    if run_name:
        argv += ["--run-name", run_name]
    return shlex.join(argv)


def training_runtime_env(working_dir: str | Path, submission_id: str, env_vars: Mapping[str, str] | None = None,
                         excludes: Sequence[str] = DEFAULT_EXCLUDES) -> dict[str, Any]:
    """Ray ``runtime_env`` for a training job: the working dir to upload and the driver's env vars.

    ``env_vars`` values must be strings (Ray's rule); they override ``STOP_ENV_DEFAULTS`` (graceful
    stop: SIGINT, then SIGKILL after 120 s). ``RAGEN_RLLIB_RAY_JOB_ID`` is always set.
    """
    wd = Path(working_dir).expanduser().resolve()
    if not wd.is_dir():
        raise ValueError(f"working_dir {str(working_dir)!r} is not a directory")
    env = {}
    for k, v in (env_vars or {}).items():
        if not isinstance(v, str):
            raise ValueError(f"env_vars[{k!r}] must be a string, got {v!r}")
        env[k] = v
    # `job stop` sends SIGINT, which `train()` handles: finish the iteration, checkpoint, export,
    # close the MLflow run as KILLED. Ray's default (SIGTERM, SIGKILL after 3 s) loses all that.
    env = {**STOP_ENV_DEFAULTS, **env, JOB_ID_ENV: submission_id}
    from ragen_rllib.tracking.mlflow_logger import get_git_commit  # light: subprocess git, mlflow imported lazily

    commit = get_git_commit(wd)  # the upload has no .git: the driver tags its MLflow run from this
    if commit and GIT_COMMIT_ENV not in env:
        env[GIT_COMMIT_ENV] = commit
    return {"working_dir": str(wd), "excludes": [*excludes, *secret_excludes(wd)], "env_vars": env}


def secret_excludes(working_dir: str | Path) -> list[str]:
    """``SECRET_EXCLUDES``, plus the Ray token file (``RAY_AUTH_TOKEN_PATH``, else
    ``~/.ray/auth_token``) anchored at its path when it lies inside ``working_dir``."""
    out = list(SECRET_EXCLUDES)
    token = token_path()
    with contextlib.suppress(ValueError, OSError):  # ValueError: outside working_dir
        out.append("/" + token.resolve().relative_to(Path(working_dir).expanduser().resolve()).as_posix())
    return out


@contextlib.contextmanager
def _gitignore_honoured() -> Iterator[None]:
    """Clear ``RAY_RUNTIME_ENV_IGNORE_GITIGNORE`` for the block, so Ray's packing reads ``.gitignore``."""
    if os.environ.get(RAY_IGNORE_GITIGNORE_ENV) == "1":
        logger.warning("%s=1 is ignored by ragen-rllib submit: .gitignore always applies to the upload",
                       RAY_IGNORE_GITIGNORE_ENV)
    with scoped_environ(unset=[RAY_IGNORE_GITIGNORE_ENV]):
        yield


def upload_manifest(working_dir: str | Path, excludes: Sequence[str] = DEFAULT_EXCLUDES) -> list[str]:
    """The files a training job's upload of ``working_dir`` would hold, sorted (``/``-separated,
    relative to ``working_dir``).

    Built with Ray's own code: the runtime env of ``training_runtime_env``, Ray's exclude
    resolution (``upload_working_dir_if_needed``) and its packer (``create_package``), into a
    temporary zip whose names are read back. Nothing is sent anywhere.
    """
    import tempfile
    import zipfile

    from ray._private.runtime_env.packaging import create_package
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    runtime_env = training_runtime_env(working_dir, "manifest", excludes=excludes)
    names: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, _gitignore_honoured():
        # Read as Ray's job client reads it when it packs (JobSubmissionClient._upload_working_dir_if_needed).
        include_gitignore = os.environ.get(RAY_IGNORE_GITIGNORE_ENV, "0") != "1"

        def pack(path: str, excludes: list[str] | None = None, is_file: bool = False) -> None:
            target = Path(tmp) / "upload.zip"
            create_package(path, target, include_gitignore=include_gitignore, excludes=excludes)
            with zipfile.ZipFile(target) as z:
                names.extend(n for n in z.namelist() if not n.endswith("/"))

        upload_working_dir_if_needed(runtime_env, include_gitignore=include_gitignore, upload_fn=pack)
    return sorted(names)


def _resolve_config(config: str | Path, working_dir: Path) -> str:
    """The config path as the driver sees it: relative to the uploaded working dir when inside it."""
    p = Path(config).expanduser()
    full = p if p.is_absolute() else working_dir / p
    if not full.is_file():
        raise ValueError(f"config {str(config)!r} does not exist (looked for {full}); relative paths are "
                         f"relative to the working dir {str(working_dir)!r}, which is what the job gets")
    try:
        return str(full.resolve().relative_to(working_dir.resolve()))
    except ValueError:  # outside the upload: only a cluster sharing this filesystem can read it
        logger.warning("config %s is outside the working dir %s: the job reads it by absolute path, which works "
                       "only on a cluster that shares this filesystem", full, working_dir)
        return str(full.resolve())


def _absolute_path_overrides(config: Path, profile: str | None, overrides: Sequence[str],
                             working_dir: Path) -> list[str]:
    """``--set`` items that pin the experiment's relative paths to ``working_dir`` on this machine.

    The driver runs in Ray's temporary copy of the working dir: a relative ``run_dir`` would put
    checkpoints, trajectories and the default MLflow store there (deleted with the session), and a
    relative local model folder is not uploaded (weights are excluded). Absolute paths are kept
    as they are (a remote cluster needs absolute paths on storage it shares).

    Raises:
        ValueError: the config cannot be read (bad YAML, unknown profile, bad override).
    """
    from ragen_rllib.algorithms.starpo.experiment import Experiment

    try:  # the same loader and checks as `train`: a bad key or value fails here, not on the cluster
        cfg = dict(Experiment.load(config, profile=profile, sets=overrides).config)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    extra = []
    run_dir = str(cfg.get("run_dir") or "runs")
    if not Path(run_dir).is_absolute():
        extra.append(f"run_dir={working_dir / run_dir}")
    model = (cfg.get("starpo") or {}).get("model")
    if isinstance(model, str) and not Path(model).is_absolute() and (working_dir / model).exists():
        extra.append(f"starpo.model={working_dir / model}")
    return extra


def _auth_token() -> tuple[str | None, str]:
    """(token, where it came from), in the order Ray's own loader uses; (None, searched) if none."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return os.environ["RAY_AUTH_TOKEN"].strip(), "$RAY_AUTH_TOKEN"
    path = token_path()
    try:
        token = path.read_text().strip()
    except OSError:
        token = ""
    where = f"${TOKEN_PATH_ENV}={path}" if os.environ.get(TOKEN_PATH_ENV) else str(path)
    return (token or None), where


def _auth_help(address: str, detail: str) -> str:
    token, where = _auth_token()
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        state = "RAY_AUTH_MODE=disabled is set in this shell, so no token was sent"
    elif token is None:
        state = f"no token was found (looked in $RAY_AUTH_TOKEN and {where})"
    else:
        state = f"the token from {where} was rejected: it is not the token this cluster was started with"
    return (f"the Ray job server at {address} refused the request ({detail}): {state}. The cluster runs with token "
            "authentication; give this shell the cluster's token: print it on the head node with "
            "`ray get-auth-token` (stored in ~/.ray/auth_token there), then `export RAY_AUTH_TOKEN=<token>` or "
            "`export RAY_AUTH_TOKEN_PATH=<file>`, and unset RAY_AUTH_MODE or set RAY_AUTH_MODE=token "
            "(Ray's own `ray job` CLI needs RAY_AUTH_MODE=token).")


# --------------------------------------------------------------------------- job server calls


@contextlib.contextmanager
def _job_server(address: str, what: str) -> Iterator[Any]:
    """A connected ``JobSubmissionClient``; Ray/HTTP errors become ``JobsError`` naming ``address``."""
    from ray.exceptions import AuthenticationError

    try:
        import requests
        from ray.job_submission import JobSubmissionClient
    except ImportError as e:  # ray[rllib] without ray[default]: the job SDK needs requests/aiohttp
        raise JobsError(f"the Ray job SDK is not importable ({e}); install ray[default]") from None
    headers: dict[str, str] = {}
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "disabled":
        token, where = _auth_token()
        if token and where != "$RAY_AUTH_TOKEN" and (problem := mode_problem(token_path())):
            logger.warning(problem)
        if token:
            headers["Authorization"] = f"Bearer {token}"
            host = urlparse(address).hostname or ""
            if address.startswith("http://") and host not in ("127.0.0.1", "localhost", "::1"):
                logger.warning("sending the Ray auth token to %s over plain HTTP; use https or an SSH tunnel "
                               "to 127.0.0.1 on untrusted networks", address)
    try:
        # Ray's client lets these env vars override the address argument; ours is explicit.
        with scoped_environ({"RAY_API_SERVER_ADDRESS": address}, unset=["RAY_ADDRESS"]):
            client = JobSubmissionClient(address, headers=headers or None)
        yield client
    except AuthenticationError as e:
        raise JobsError(_auth_help(address, str(e).splitlines()[0])) from None
    except (ConnectionError, requests.exceptions.ConnectionError):
        raise JobsError(f"cannot reach a Ray job server at {address} ({what}). Is a cluster running with its "
                        "dashboard (`ray start --head --dashboard-host 127.0.0.1 --include-dashboard true`, needs "
                        "ray[default])? `--address` is the dashboard URL, e.g. http://127.0.0.1:8265.") from None
    except RuntimeError as e:
        if isinstance(e, JobsError):
            raise
        raise JobsError(f"Ray job server at {address} ({what}): {e}") from None


def submit_training(address: str, config: str | Path, profile: str | None = None, overrides: Sequence[str] = (),
                    working_dir: str | Path = ".", env_vars: Mapping[str, str] | None = None,
                    submission_id: str | None = None, tracking_uri: str | None = None, run_name: str | None = None,
                    python: str = "python", excludes: Sequence[str] = DEFAULT_EXCLUDES) -> str:
    """Submit ``ragen-rllib train`` as a Ray job; returns the submission id.

    Args:
        address: the job server (the dashboard URL), e.g. ``http://127.0.0.1:8265``.
        config: experiment YAML, relative to ``working_dir`` (or absolute on a shared filesystem).
        profile, overrides, tracking_uri, run_name: as for ``ragen-rllib train``.
        working_dir: uploaded to the cluster (minus ``excludes``); the driver's cwd. The experiment's
            relative ``run_dir`` (and a relative local model folder) are pinned to this folder on
            this machine (``--set run_dir=<working_dir>/runs``), as if ``train`` ran here.
        env_vars: extra env vars for the driver and its workers (strings).
        submission_id: default: ``new_submission_id()``; must be unused on the cluster.
        python: the interpreter on the cluster that has ragen-rllib installed.

    Raises:
        ValueError: bad local input (missing config, bad override). JobsError: the server said no.
    """
    wd = Path(working_dir).expanduser().resolve()
    sid = submission_id or new_submission_id()
    runtime_env = training_runtime_env(wd, sid, env_vars, excludes)
    cfg_path = _resolve_config(config, wd)
    overrides = [*overrides, *_absolute_path_overrides(wd / cfg_path, profile, overrides, wd)]
    entrypoint = training_entrypoint(cfg_path, profile, overrides, tracking_uri, run_name, python)
    with _job_server(address, "submit") as client, _gitignore_honoured():  # submit_job packs and uploads
        return client.submit_job(entrypoint=entrypoint, submission_id=sid, runtime_env=runtime_env,
                                 metadata={"ragen_rllib_config": str(config)})


def job_info(address: str, job_id: str) -> dict[str, Any]:
    """``{submission_id, status, message, entrypoint, start_time, end_time, driver_exit_code, error_type}``.

    ``start_time``/``end_time`` are ms since the epoch (or None); ``status`` is one of PENDING,
    RUNNING, STOPPED, SUCCEEDED, FAILED.
    """
    with _job_server(address, f"job {job_id!r}") as client:
        info = client.get_job_info(job_id)
    return {"submission_id": info.submission_id or job_id, "status": str(info.status), "message": info.message or "",
            "entrypoint": info.entrypoint, "start_time": info.start_time, "end_time": info.end_time,
            "driver_exit_code": info.driver_exit_code, "error_type": info.error_type}


def job_status(address: str, job_id: str) -> str:
    """The job's state: PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED."""
    with _job_server(address, f"job {job_id!r}") as client:
        return str(client.get_job_status(job_id))


def job_logs(address: str, job_id: str) -> str:
    """Everything the job's driver has printed so far (stdout and stderr)."""
    with _job_server(address, f"job {job_id!r}") as client:
        return client.get_job_logs(job_id)


def stop_job(address: str, job_id: str) -> bool:
    """Ask the cluster to stop the job (SIGTERM, then SIGKILL); False if it had already ended."""
    with _job_server(address, f"job {job_id!r}") as client:
        return bool(client.stop_job(job_id))


def list_jobs(address: str) -> list[dict[str, Any]]:
    """All jobs the cluster knows, oldest first, as ``{submission_id, status, start_time, entrypoint}``."""
    with _job_server(address, "list") as client:
        jobs = client.list_jobs()
    rows = [{"submission_id": j.submission_id or j.job_id, "status": str(j.status), "start_time": j.start_time,
             "entrypoint": j.entrypoint} for j in jobs]
    return sorted(rows, key=lambda r: r["start_time"] or 0)


def follow_logs(address: str, job_id: str, write: Callable[[str], Any], poll_s: float = 1.0) -> str:
    """Stream the job's logs to ``write`` until it ends; returns its final state.

    A Ctrl-C (KeyboardInterrupt) propagates and leaves the job running.
    """
    import asyncio

    with _job_server(address, f"job {job_id!r}") as client:
        logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)  # "WebSocket closed" noise
        async def tail() -> None:
            async for chunk in client.tail_job_logs(job_id):
                write(chunk)

        try:
            asyncio.run(tail())
        except RuntimeError as e:  # the log stream closed early; the state below still tells the outcome
            write(f"[log stream ended early: {e}; waiting for the job to finish]\n")
        while True:  # the stream closes at the end; the state may lag it by a moment
            status = str(client.get_job_status(job_id))
            if status in TERMINAL_STATES:
                return status
            time.sleep(poll_s)


def failure_summary(info: Mapping[str, Any], logs: str, last_lines: int = 30) -> str:
    """What to show for a failed/stopped job: its state, Ray's message (first line), lines naming an
    error, and the last ``last_lines`` log lines."""
    lines = logs.rstrip().splitlines()
    # Ray's message repeats the whole log after this phrase; the tail below shows it once
    first = (info.get("message") or "").split(", last available logs")[0].strip().splitlines()
    errors = [ln for ln in lines if ln.startswith("error:") or "Error:" in ln][-5:]
    out = [f"job {info.get('submission_id')} {info.get('status')}: {first[0] if first else '(no message)'}"]
    if errors:
        out += ["errors:"] + [f"  {ln}" for ln in errors]
    if lines:
        out += [f"last {min(last_lines, len(lines))} log lines:"] + [f"  {ln}" for ln in lines[-last_lines:]]
    return "\n".join(out)
