"""Start a real ``mlflow server`` as a separate process: for integration tests and local setups.

``start_mlflow_server`` runs ``<python> -m mlflow server`` in its own session (so the server and
everything it spawns -- the uvicorn worker, and MLflow's job runner if enabled -- form one
process group), waits until ``GET /health`` answers 200, and returns an ``MlflowServer`` handle
whose ``stop()`` ends the whole group. Nothing here imports mlflow: the server is a subprocess.

Example::

    with start_mlflow_server(f"sqlite:///{run_dir}/mlflow.db", run_dir / "mlartifacts") as server:
        train(cfg, tracking_uri=server.uri)        # http://127.0.0.1:<free port>

Choices:

- **Artifacts are proxied.** The server runs with ``--artifacts-destination <artifacts_dir>``
  (``--serve-artifacts`` is MLflow's default), so new experiments get ``mlflow-artifacts:/`` and
  clients upload over HTTP, as with a remote server.
- **One worker, no job runner.** ``--workers 1`` (MLflow's default is 4) and
  ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`` (unless the caller's ``env`` sets it): MLflow 3.x
  otherwise starts a job runner with ~7 huey consumer processes, which tracking does not use
  and a 2-core machine cannot spare. Startup then takes ~4-7 s instead of ~11 s (2 cores).
- **Restartable.** ``restart()`` starts a new server on the same host, port and stores (an
  outage followed by recovery); the log file is appended to, not truncated.
- **Local by default.** The server binds ``127.0.0.1`` (``DEFAULT_HOST``) unless a ``host`` is
  given: MLflow's server has no authentication, so reaching it from other machines is a
  decision to make explicitly (``host="0.0.0.0"``, behind a firewall or a proxy with auth).
  ``server_command`` builds the command line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

#: Set in the server's environment unless ``env`` overrides it (see the module docstring).
SERVER_ENV_DEFAULTS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
#: Interface the server binds unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"
#: How many trailing characters of the server log a startup error shows.
LOG_TAIL_CHARS = 4000


def server_command(backend_uri: str, artifacts_dir: str | os.PathLike, port: int, host: str = DEFAULT_HOST,
                   workers: int = 1, python: str = sys.executable) -> list[str]:
    """The ``mlflow server`` command line (argv) that ``MlflowServer.start`` runs.

    Args:
        backend_uri: the backend store (``--backend-store-uri``).
        artifacts_dir: the proxied artifact folder (``--artifacts-destination``).
        port: TCP port. host: interface to bind (default ``127.0.0.1``: this machine only).
        workers: uvicorn workers. python: the interpreter that has mlflow installed.
    """
    return [python, "-m", "mlflow", "server", "--backend-store-uri", backend_uri,
            "--artifacts-destination", str(artifacts_dir), "--host", host, "--port", str(port),
            "--workers", str(workers)]


def free_port(host: str = DEFAULT_HOST) -> int:
    """Return a TCP port on ``host`` that was free a moment ago (the OS picks it).

    Another process may take it before the caller binds it; ``start_mlflow_server`` checks again.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as uvicorn binds with it: a port in TIME_WAIT after a stopped server is usable.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is already gone
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class MlflowServer:
    """Handle of a running ``mlflow server`` process group (returned by ``start_mlflow_server``).

    Attributes:
        host: the interface the server binds (``127.0.0.1`` by default).
        port: its TCP port.
        backend_uri: the backend store (``sqlite:///...``).
        artifacts_dir: where proxied artifact uploads land.
        log_path: the file holding the server's stdout and stderr.
    """

    def __init__(self, backend_uri: str, artifacts_dir: Path, host: str, port: int, log_path: Path,
                 workers: int, env: Mapping[str, str], startup_timeout_s: float) -> None:
        self.backend_uri = backend_uri
        self.artifacts_dir = artifacts_dir
        self.host = host
        self.port = port
        self.log_path = log_path
        self.workers = workers
        self.startup_timeout_s = startup_timeout_s
        self._env = dict(env)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        """The tracking URI clients use, e.g. ``http://127.0.0.1:5000``."""
        # A wildcard bind address is not something a client can connect to.
        connect = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://[{connect}]:{self.port}" if ":" in connect else f"http://{connect}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id (= process group id) of the ``mlflow server`` process, None when stopped."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the ``mlflow server`` process is alive (it may still be starting up)."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> MlflowServer:
        """Launch the server and wait for ``/health``; a no-op when already running.

        Raises:
            RuntimeError: the port is taken, or the server exited or did not answer ``/health`` within
                ``startup_timeout_s``; the message ends with the tail of the server log.
        """
        if self.running:
            return self
        if not _port_is_free(self.host, self.port):
            raise RuntimeError(f"mlflow server: port {self.port} on {self.host} is already in use")
        self.artifacts_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = server_command(self.backend_uri, self.artifacts_dir, self.port, self.host, self.workers)
        env = {**os.environ, **SERVER_ENV_DEFAULTS, **self._env}
        with open(self.log_path, "ab") as log:
            log.write(f"\n$ {' '.join(cmd)}\n".encode())
            log.flush()
            # Own session: stop() signals the whole group (uvicorn worker, job runner) in one call.
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop(timeout_s=5.0)
            raise
        return self

    def restart(self) -> MlflowServer:
        """Stop (if running) and start again on the same port, stores and log file."""
        self.stop()
        return self.start()

    def stop(self, timeout_s: float = 10.0, kill: bool = False) -> None:
        """End the server's whole process group; safe to call twice.

        Args:
            timeout_s: how long to wait after SIGTERM before sending SIGKILL.
            kill: send SIGKILL at once (simulates a crash: no graceful shutdown).
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session=True: the group id is the leader's pid
        _signal_group(pgid, signal.SIGKILL if kill else signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        # Children (the uvicorn worker) can outlive the leader for a moment: wait for the group to empty.
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid) or proc.poll() is None:
            _signal_group(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The last ``chars`` characters of the server log ('' if there is none yet)."""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-chars:].decode("utf-8", errors="replace")

    def __enter__(self) -> MlflowServer:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"MlflowServer({self.uri}, backend={self.backend_uri!r}, {state})"

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        url = self.uri + "/health"
        last_err = "no answer yet"
        while time.monotonic() < deadline:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                raise RuntimeError(f"mlflow server exited with code {code} before answering {url}; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2.0) as resp:
                    if resp.status == 200:
                        return
                    last_err = f"HTTP {resp.status}"
            except (urllib.error.URLError, OSError) as e:  # refused while starting up
                last_err = f"{type(e).__name__}: {e}"
            time.sleep(0.25)
        raise RuntimeError(f"mlflow server did not answer {url} within {self.startup_timeout_s:g} s "
                           f"(last: {last_err}); log {self.log_path}:\n{self.log_tail()}")


def start_mlflow_server(backend_uri: str, artifacts_dir: str | os.PathLike, host: str = DEFAULT_HOST,
                        port: int | None = None, *, log_path: str | os.PathLike | None = None, workers: int = 1,
                        env: Mapping[str, str] | None = None, startup_timeout_s: float = 120.0) -> MlflowServer:
    """Launch ``mlflow server`` as a separate process group and wait until it is healthy.

    Args:
        backend_uri: the backend store, e.g. ``sqlite:////abs/path/mlflow.db`` (created if missing;
            the schema migration takes a few seconds on a new file).
        artifacts_dir: local folder served as the artifact store (``--artifacts-destination``).
        host: interface to bind; the default keeps the server local to this machine.
        port: TCP port; None picks a free one (``free_port``).
        log_path: file for the server's stdout/stderr (appended); None: a new file in the temp dir.
        workers: uvicorn worker processes.
        env: extra environment variables for the server (override ``SERVER_ENV_DEFAULTS``).
        startup_timeout_s: how long to wait for ``/health`` (seconds).

    Returns:
        A running ``MlflowServer``; use it as a context manager or call ``stop()``.

    Raises:
        ValueError: ``workers`` < 1 or ``port`` outside 1..65535.
        RuntimeError: the server did not come up (the message ends with its log tail).
    """
    if workers < 1:
        raise ValueError(f"start_mlflow_server: workers must be >= 1, got {workers}")
    if port is not None and not 0 < int(port) < 65536:
        raise ValueError(f"start_mlflow_server: port must be in 1..65535, got {port}")
    port = free_port(host) if port is None else int(port)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"mlflow-server-{port}-", suffix=".log")
        os.close(fd)
        log_path = name
    server = MlflowServer(backend_uri, Path(artifacts_dir).resolve(), host, port, Path(log_path), int(workers),
                          env or {}, float(startup_timeout_s))
    return server.start()
