"""MLflow tracking: the only module of ragen-rllib that imports mlflow (lazily, inside functions).

``MLflowTracker`` turns the project's flat, namespaced metric dicts (``rollout/…``, ``filter/…``,
``actor/…``, ``critic/…``, ``time/…``) into one MLflow run:

- **Store.** Any tracking URI works (``http://host:5000``, ``sqlite:///…``, ``file:///…`` with
  ``MLFLOW_ALLOW_FILE_STORE=true``). With ``tracking_uri=None`` the run goes to
  ``sqlite:///<local_dir>/mlflow.db`` with artifacts in ``<local_dir>/mlartifacts``. For local
  stores the experiment is created with an explicit artifact location, because the sqlite store's
  default artifact root is ``./mlruns`` of the current directory.
- **Client, not fluent API.** Everything goes through one ``MlflowClient`` bound to the URI; no
  global ``mlflow.set_tracking_uri`` or active-run state, so several trackers can coexist.
- **Keys and values.** Metric/param/tag keys are mapped onto MLflow's allowed characters
  (``sanitize_key``); param values longer than MLflow's limit are truncated with a marker;
  non-finite metric values are dropped and counted in ``tracking/dropped_nonfinite``.
- **Outages never stop training.** A call that fails with a transient error (server gone, sqlite
  locked, timeout) is buffered in memory *and* appended to ``<local_dir>/mlflow_pending.jsonl``;
  one warning is logged; every later call first retries the buffer, in order, and ``flush()``
  retries on demand. A tracker started later with the same ``local_dir`` sends what a crashed
  process left behind. Requests the store rejects for good (invalid value, e.g. a param logged
  again with a different value) are not retried: they are written to ``mlflow_rejected.jsonl``
  with the error and a warning. A record that reached the server but whose reply was lost may be
  sent twice after a retry.
- **HTTP stores.** MLflow's own retry defaults (7 retries, exponential backoff, 120 s timeout) can
  block a training step for minutes while a server is down; unless the environment already sets
  them, the tracker sets ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=2``, ``..._BACKOFF_FACTOR=1`` and
  ``..._TIMEOUT=10`` (``HTTP_ENV_DEFAULTS``).
- **Lineage.** ``log_dataset`` records a file (an iteration's trajectory Parquet) as a dataset
  input of the run: source = the file's path, digest = the first 32 hex digits of its SHA-256
  (MLflow allows 36 characters), read in chunks and never parsed. ``register_model`` adds the
  exported model to the Model Registry as a new version whose source is the run's logged
  artifact (``runs:/<run_id>/hf_model``), or the local folder when it was not logged;
  ``resolve_model_uri`` turns ``models:/<name>/<version>`` back into a local folder. Both go
  through the same buffer as metrics, so a registration waits for its artifact upload.

Example::

    with MLflowTracker(None, "bandit", run_name="starpo-s", local_dir=run_dir) as tracker:
        tracker.log_params(config)                 # nested dataclasses -> dotted keys
        for step in range(n):
            tracker.log_metrics(metrics, step=step)
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import logging
import math
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

logger = logging.getLogger(__name__)

#: Files and folders the tracker keeps under ``local_dir``.
DB_FILE = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"
PENDING_FILE = "mlflow_pending.jsonl"
REJECTED_FILE = "mlflow_rejected.jsonl"
STAGED_ARTIFACTS_DIR = "mlflow_staged_artifacts"

#: Cumulative count of metric values dropped because they were NaN or ±inf.
DROPPED_NONFINITE_KEY = "tracking/dropped_nonfinite"

# MLflow 3.x limits (mlflow.utils.validation): MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH,
# MAX_ENTITY_KEY_LENGTH, MAX_METRICS_PER_BATCH, MAX_PARAMS_TAGS_PER_BATCH.
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
MAX_KEY_LENGTH = 250
METRICS_PER_BATCH = 1000
PARAMS_TAGS_PER_BATCH = 100
#: Appended to a truncated value; ``{n}`` is the original length.
TRUNCATION_MARKER = "...[truncated, {n} chars]"

#: Applied with ``os.environ.setdefault`` for http(s) tracking URIs (see the module docstring).
HTTP_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
RUN_STATUSES = ("FINISHED", "KILLED", "FAILED")
GIT_COMMIT_TAG = "mlflow.source.git.commit"
#: MLflow's input tag holding a dataset's role (``mlflow.utils.mlflow_tags.MLFLOW_DATASET_CONTEXT``).
DATASET_CONTEXT_TAG = "mlflow.data.context"
#: Hex digits of the SHA-256 kept as a dataset digest (MLflow stores at most 36 characters).
DATASET_DIGEST_CHARS = 32
#: Run tag set by ``register_model``: the ``models:/<name>/<version>`` URI of the registered model.
REGISTERED_MODEL_TAG = "registered_model"
_HASH_CHUNK = 1 << 20  # bytes read at a time when hashing a file

# MlflowException error codes that retrying cannot fix; anything else counts as transient.
_PERMANENT_ERROR_CODES = frozenset({
    "INVALID_PARAMETER_VALUE", "BAD_REQUEST", "MALFORMED_REQUEST", "RESOURCE_DOES_NOT_EXIST",
    "RESOURCE_ALREADY_EXISTS", "INVALID_STATE",
})
# MLflow accepts [/\w.\- :] (no ':' on Windows); we keep to ASCII and drop ':' so keys are portable.
_INVALID_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")
_LOCAL_SCHEMES = ("", "sqlite", "file")


def default_tracking_uri(local_dir: str | os.PathLike) -> str:
    """Return ``sqlite:///<abs local_dir>/mlflow.db``, the store used when no URI is given."""
    return "sqlite:///" + str((Path(local_dir) / DB_FILE).resolve())


def check_tracking_uri(uri: str, open_store: bool = False) -> None:
    """Refuse a tracking URI whose scheme MLflow has no store for (``bogus://x``).

    Looks the scheme up in MLflow's tracking-store registry (built-in stores and plugins). Nothing
    is opened or created, so this runs before anything heavy starts. ``open_store=True`` also
    builds the store (for readers of an existing store: a folder store MLflow refuses fails here).

    Raises:
        ValueError: one line naming the URI and the supported schemes (or MLflow's reason).
    """
    from mlflow.exceptions import MlflowException

    try:  # MLflow's registry is not public API: when it moves, skip the check rather than refuse
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry as registry

        schemes = sorted(s for s in registry._registry if s)
    except (ImportError, AttributeError):
        return
    try:
        registry.get_store_builder(uri)
    except MlflowException:
        raise ValueError(f"tracking URI {uri!r}: MLflow has no store for it; use sqlite:///<path>/mlflow.db, a "
                         f"folder, or http(s)://<server> (schemes: {schemes})") from None
    if open_store:
        try:
            registry.get_store(uri)
        except MlflowException as e:
            raise ValueError(f"tracking URI {uri!r}: {' '.join(str(e).split())}") from None


def experiment_names(tracking_uri: str) -> list[str]:
    """Return the names of the active experiments in the store, sorted."""
    from mlflow.tracking import MlflowClient

    return sorted(e.name for e in MlflowClient(tracking_uri=tracking_uri).search_experiments())


def sanitize_key(key: str) -> str:
    """Map a metric/param/tag key onto MLflow's allowed names; valid keys come back unchanged.

    Characters outside ``[A-Za-z0-9_-. /]`` become ``_`` (``rollout/pass@4`` ->
    ``rollout/pass_4``). Empty path segments (leading, trailing or double ``/``) are removed and
    ``.``/``..`` segments become underscores, because MLflow rejects names that change under
    ``posixpath.normpath``. Keys longer than 250 characters are cut and end in ``_<sha1[:8]>`` of
    the original key, so distinct long keys stay distinct.
    """
    s = _INVALID_KEY_CHARS.sub("_", str(key))
    parts = [("_" * len(p)) if set(p) <= {"."} else p for p in s.split("/") if p]
    s = "/".join(parts) or "_"
    if len(s) > MAX_KEY_LENGTH:
        s = s[: MAX_KEY_LENGTH - 9] + "_" + hashlib.sha1(str(key).encode()).hexdigest()[:8]
    return s


def truncate_value(value: str, limit: int = MAX_PARAM_VALUE_LENGTH) -> str:
    """Return ``value`` cut to at most ``limit`` characters, ending in ``TRUNCATION_MARKER`` if cut."""
    if len(value) <= limit:
        return value
    marker = TRUNCATION_MARKER.format(n=len(value))
    return value[: limit - len(marker)] + marker


def flatten_config(obj: Any, prefix: str = "") -> dict[str, str]:
    """Flatten nested dataclasses/mappings into ``{"dotted.key": "string value"}``.

    Dataclass instances (frozen or not) and mappings recurse; objects with a ``to_dict()`` method
    (RLlib's ``AlgorithmConfig``) are flattened through it. Leaves become strings: enums by value,
    classes and functions by ``module.qualname``, lists/tuples as JSON, everything else by
    ``str``. An empty nested mapping/dataclass is kept as ``"{}"`` so it stays visible.

    Args:
        obj: a dataclass instance, a mapping, or an object with ``to_dict()``.
        prefix: key prefix for every entry (without the trailing dot).

    Raises:
        TypeError: if ``obj`` is not one of the above.
    """
    if _children(obj) is None:
        raise TypeError(f"flatten_config expects a dataclass instance or a mapping, got {type(obj).__name__}")
    out: dict[str, str] = {}
    _flatten(obj, prefix, out)
    return out


def get_git_commit(repo_dir: str | os.PathLike) -> str | None:
    """Return the ``HEAD`` commit hash of the git work tree containing ``repo_dir``, or None.

    None when git is missing, ``repo_dir`` is not inside a repository, or git fails in any way.
    """
    try:
        out = subprocess.run(["git", "-C", str(repo_dir), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


def find_runs(tracking_uri: str, experiment: str | Sequence[str] | None, filter_string: str = "",
              max_results: int = 1000, order_by: list[str] | None = None) -> list[dict[str, Any]]:
    """Search the runs of one experiment (or several, or all); return plain dicts, newest first.

    Args:
        tracking_uri: the store (``default_tracking_uri(run_dir)`` for a local run folder).
        experiment: experiment name, a list of names, or None for every active experiment of the
            store; unknown names are skipped (only unknown names: ``[]``).
        filter_string: MLflow search syntax, e.g. ``"params.env = 'bandit' and metrics.rollout/success > 0.5"``
            or ``"tags.`ragen.kind` = 'trial'"`` (backticks quote keys with dots).
        max_results: at most this many runs.
        order_by: MLflow ``order_by`` clauses; default start time, newest first.

    Returns:
        One dict per run: ``run_id``, ``run_name``, ``experiment_id``, ``status``, ``start_time`` and
        ``end_time`` (ms since the epoch, or None), ``artifact_uri``, ``params``, ``metrics`` (latest
        value per key) and ``tags``.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    if experiment is None:
        ids = [e.experiment_id for e in client.search_experiments()]  # active ones only
    else:
        names = [experiment] if isinstance(experiment, str) else list(experiment)
        ids = [e.experiment_id for e in map(client.get_experiment_by_name, names) if e is not None]
    if not ids:
        return []
    runs = client.search_runs(ids, filter_string=filter_string, max_results=max_results,
                              order_by=order_by or ["attributes.start_time DESC"])
    return [{
        "run_id": r.info.run_id,
        "run_name": r.info.run_name,
        "experiment_id": r.info.experiment_id,
        "status": r.info.status,
        "start_time": r.info.start_time,
        "end_time": r.info.end_time,
        "artifact_uri": r.info.artifact_uri,
        "params": dict(r.data.params),
        "metrics": dict(r.data.metrics),
        "tags": dict(r.data.tags),
    } for r in runs]


def get_metric_history(tracking_uri: str, run_id: str, keys: list[str]) -> dict[str, list[tuple[int, float]]]:
    """Return ``{key: [(step, value), ...]}`` sorted by step (then time), for ``plots.plot_curves``.

    Keys are sanitized as the tracker logged them; a key the run never logged maps to ``[]``.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    out: dict[str, list[tuple[int, float]]] = {}
    for key in keys:
        hist = sorted(client.get_metric_history(run_id, sanitize_key(key)), key=lambda m: (m.step, m.timestamp))
        out[key] = [(int(m.step), float(m.value)) for m in hist]
    return out


def get_timed_metric_history(tracking_uri: str, run_id: str, key: str) -> list[tuple[int, int, float]]:
    """Return ``[(step, timestamp_ms, value), ...]`` of one metric, sorted by step then time.

    Like ``get_metric_history`` but with MLflow's wall-clock timestamp (ms since the epoch) of each
    value, for curves against wall time (``tracking.compare``). An unknown key gives ``[]``.
    """
    from mlflow.tracking import MlflowClient

    hist = MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, sanitize_key(key))
    return [(int(m.step), int(m.timestamp), float(m.value)) for m in sorted(hist, key=lambda m: (m.step, m.timestamp))]


def log_artifact_to_run(tracking_uri: str, run_id: str, path: str | os.PathLike,
                        artifact_path: str | None = None) -> None:
    """Upload a local file into an existing run's artifacts without touching its status or end time.

    ``MLflowTracker(run_id=...)`` would mark a finished run RUNNING and end it again (a new end
    time); this is for adding e.g. a comparison plot to a finished sweep run. Not buffered: raises
    the store's error if it is unreachable.
    """
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=tracking_uri).log_artifact(run_id, str(path), artifact_path)


def file_sha256(path: str | os.PathLike) -> str:
    """Return the hex SHA-256 of a file's bytes, read in 1 MiB chunks (the file is not parsed)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def registered_model_name(experiment: str) -> str:
    """Map an experiment name onto a valid Model Registry name (no ``/`` or ``:``).

    ``ragen-bandit`` stays as it is; ``/Users/me/exp`` becomes ``Users-me-exp``.
    """
    name = re.sub(r"[/:]+", "-", str(experiment)).strip("-").strip()
    return name if name and set(name) != {"."} else "model"


def parse_models_uri(uri: str) -> tuple[str, str]:
    """Split a registry URI into ``(name, reference)``.

    Accepted forms: ``models:/<name>/<version>`` (reference ``"3"``), ``models:/<name>/latest``
    (``"latest"``, the highest version) and ``models:/<name>@<alias>`` (``"@<alias>"``).

    Raises:
        ValueError: anything else (stages such as ``/Production`` are not supported).
    """
    rest = uri[len("models:/"):] if uri.startswith("models:/") else None
    if rest is not None and "@" in rest:
        name, _, alias = rest.partition("@")
        ref = "@" + alias
    elif rest is not None and "/" in rest:
        name, _, ref = rest.rpartition("/")
    else:
        name, ref = "", ""
    ok_ref = ref == "latest" or ref.isdigit() or (ref.startswith("@") and len(ref) > 1)
    if not name or "/" in name or "'" in name or not ok_ref:
        raise ValueError(f"model URI {uri!r}: expected models:/<name>/<version>, models:/<name>/latest or "
                         "models:/<name>@<alias>")
    return name, ref


def resolve_model_uri(model_uri: str, tracking_uri: str, download_dir: str | os.PathLike) -> Path:
    """Turn ``models:/<name>/<version|latest>`` or ``models:/<name>@<alias>`` into a local model folder.

    A version whose source is on this machine (a local artifact store, or a local folder
    registered without uploading it) is used in place: nothing is copied. Anything else (an
    artifact proxied by a tracking server, object storage) is downloaded once to
    ``<download_dir>/<name>/v<version>-<hash of the source>`` and reused by later calls.

    Args:
        model_uri: the registry URI (``parse_models_uri``).
        tracking_uri: the store holding the registry (also its registry URI).
        download_dir: parent folder for downloads of non-local sources.

    Returns:
        The model folder (with ``config.json``).

    Raises:
        ValueError: a malformed URI.
        FileNotFoundError: no such registered model, version or alias (the message lists the
            versions that exist), or the registered local folder is gone.
        RuntimeError: the registry cannot be read (e.g. the tracking server is unreachable).
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    name, ref = parse_models_uri(model_uri)
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    try:
        if ref == "latest":
            found = client.search_model_versions(f"name = '{name}'", max_results=1,
                                                 order_by=["version_number DESC"])
            if not found:
                raise FileNotFoundError(f"{model_uri}: no versions of registered model {name!r} at {tracking_uri}")
            mv = found[0]
        elif ref.startswith("@"):
            mv = client.get_model_version_by_alias(name, ref[1:])
        else:
            mv = client.get_model_version(name, ref)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise RuntimeError(f"{model_uri}: cannot read the model registry at {tracking_uri}: "
                               f"{_short(e)}") from None
        try:
            versions = sorted(int(v.version) for v in client.search_model_versions(f"name = '{name}'"))
        except MlflowException:
            versions = []
        known = f"versions of {name!r}: {versions}" if versions else f"no registered model {name!r}"
        raise FileNotFoundError(f"{model_uri} not found at {tracking_uri} ({known})") from None
    uri = mv.source
    if uri.startswith("runs:/"):
        from mlflow.store.artifact.runs_artifact_repo import RunsArtifactRepository

        uri = RunsArtifactRepository.get_underlying_uri(uri, tracking_uri)
    elif uri.startswith("models:/"):  # an MLflow 3 logged model
        uri = client.get_model_version_download_uri(name, mv.version)
    local = _local_path(uri)
    if local is not None:
        if not (local / "config.json").is_file():
            raise FileNotFoundError(f"{model_uri} (version {mv.version}) points at {local}, which holds no "
                                    "config.json (moved or deleted?)")
        return local
    dest = Path(download_dir) / name / f"v{mv.version}-{hashlib.sha1(mv.source.encode()).hexdigest()[:8]}"
    if dest.is_dir():  # published by a rename: complete
        return dest
    import shutil

    import mlflow.artifacts

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        got = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp),
                                                       tracking_uri=tracking_uri))
        try:
            got.rename(dest)  # same filesystem: the finished folder appears at once
        except OSError:
            if not dest.is_dir():  # else another process published the same download first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _local_path(uri: str) -> Path | None:
    """The filesystem path of a ``file://`` URI or a plain path; None for any other scheme."""
    from urllib.request import url2pathname

    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(url2pathname(parsed.path))
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):  # a Windows drive letter
        return Path(uri)
    return None


def flush_pending(local_dir: str | os.PathLike, tracking_uri: str | None = None) -> int:
    """Send what ``<local_dir>/mlflow_pending.jsonl`` holds (left by a crashed or offline run).

    Args:
        local_dir: the run folder the tracker used.
        tracking_uri: the store; None means ``default_tracking_uri(local_dir)``.

    Returns:
        How many records are still pending (0 when everything was sent or there was nothing).
    """
    tracker = MLflowTracker(tracking_uri, experiment="", local_dir=Path(local_dir))
    tracker._connect()
    tracker.flush()
    return tracker.pending_count


class MLflowTracker:
    """Log one training run to MLflow, surviving tracking-server outages without losing data.

    Args:
        tracking_uri: the MLflow store; None means ``sqlite:///<local_dir>/mlflow.db``.
        experiment: experiment name, created if missing (with artifact location
            ``<local_dir>/mlartifacts`` for local stores, unless ``artifact_location`` is given).
        run_name: display name of a new run.
        run_id: resume this existing run instead of creating one (its status goes back to RUNNING;
            ``last_step`` tells where its metrics stopped).
        tags: tags of a new run (also set on a resumed run). A new run also gets
            ``mlflow.source.git.commit`` from this source tree when git knows it and ``tags`` does not
            set it.
        local_dir: the project's run folder: the default sqlite store, artifacts, pending buffer.
        artifact_location: artifact root for a *new* experiment; overrides the default above.
        retry_interval_s: while records are pending, a logging call retries the buffer only if at
            least this many seconds passed since the last attempt (0: every call). ``flush()``
            always retries.
        sender: for tests and custom backends only: a callable that delivers one record (a dict in
            the pending-file format, see ``_MlflowSender``) and raises on failure. With a sender,
            ``start()`` does not contact MLflow and ``run_id`` must be given.

    Raises (from ``start``):
        MlflowException: if the store cannot be reached or the run cannot be created/resumed.
            Only *logging* calls are made failure-tolerant.
    """

    def __init__(self, tracking_uri: str | None, experiment: str, run_name: str | None = None,
                 run_id: str | None = None, tags: Mapping[str, Any] | None = None, *,
                 local_dir: str | os.PathLike, artifact_location: str | None = None,
                 retry_interval_s: float = 0.0, sender: Callable[[dict[str, Any]], None] | None = None) -> None:
        if sender is not None and not run_id:
            raise ValueError("MLflowTracker(sender=...) needs run_id: a custom sender cannot create runs")
        self.local_dir = Path(local_dir).resolve()
        self.tracking_uri = tracking_uri or default_tracking_uri(self.local_dir)
        self.experiment = experiment
        self.run_name = run_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.retry_interval_s = float(retry_interval_s)
        scheme = urlparse(self.tracking_uri).scheme
        if artifact_location is None and scheme in _LOCAL_SCHEMES:
            artifact_location = (self.local_dir / ARTIFACTS_DIR).as_uri()
        self.artifact_location = artifact_location
        self.pending_path = self.local_dir / PENDING_FILE
        self.rejected_path = self.local_dir / REJECTED_FILE
        #: Metric values dropped so far because they were NaN/inf (also logged as DROPPED_NONFINITE_KEY).
        self.dropped_nonfinite = 0
        self._resume_run_id = run_id
        self._run_id: str | None = None
        self._client: Any = None
        self._sender = sender
        self._custom_sender = sender is not None
        self._ended = False
        self._last_step: int | None = None
        self._pending: list[dict[str, Any]] = []
        self._degraded = False
        self._last_attempt = 0.0
        self._lock = threading.RLock()
        self._key_cache: dict[str, str] = {}
        self._key_owner: dict[str, str] = {}
        self._warned_keys: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (None before ``start``, unless resuming)."""
        return self._run_id or self._resume_run_id

    @property
    def last_step(self) -> int | None:
        """The largest metric step in the run so far (read back from the store on resume)."""
        return self._last_step

    @property
    def pending_count(self) -> int:
        """How many records wait in the buffer for the store to come back."""
        return len(self._pending)

    def start(self) -> MLflowTracker:
        """Create (or resume) the run, then send anything a previous process left pending.

        Returns:
            self, so ``tracker = MLflowTracker(...).start()`` works.
        """
        if self._run_id is not None:
            return self
        if self._custom_sender:  # nothing to create or resume
            self.local_dir.mkdir(parents=True, exist_ok=True)
            self._pending = self._read_pending()
            self._run_id = self._resume_run_id
            self.flush()
            return self
        if not self._resume_run_id and not self.experiment:
            raise ValueError("MLflowTracker: experiment must be a non-empty name (or pass run_id to resume)")
        self._connect()
        client = self._client
        tags = dict(self.tags)
        if GIT_COMMIT_TAG not in tags and not self._resume_run_id:  # a resumed run keeps its original commit
            commit = get_git_commit(Path(__file__).resolve().parent)
            if commit:
                tags[GIT_COMMIT_TAG] = commit
        tags = {sanitize_key(k): truncate_value(v, MAX_TAG_VALUE_LENGTH) for k, v in tags.items()}
        if self._resume_run_id:
            run = client.get_run(self._resume_run_id)
            if run.info.status != "RUNNING":
                client.update_run(run.info.run_id, status="RUNNING")
            exp = client.get_experiment(run.info.experiment_id)
            if self.experiment and exp.name != self.experiment:
                logger.warning("resuming run %s of experiment %r (not %r as configured)",
                               run.info.run_id, exp.name, self.experiment)
            steps = [m.step for m in getattr(run.data, "_metric_objs", [])]
            self._last_step = max(steps) if steps else None
            self._run_id = run.info.run_id
            if tags:
                self.set_tags(tags)
        else:
            run = client.create_run(self._ensure_experiment(), run_name=self.run_name, tags=tags)
            self._run_id = run.info.run_id
        self.flush()
        return self

    def end(self, status: str = "FINISHED") -> None:
        """Mark the run ended with ``status`` (``FINISHED``, ``KILLED`` or ``FAILED``).

        Pending records are retried first; if the store is still unreachable, the end marker joins
        them in the buffer file, to be sent by ``flush_pending`` or the next tracker on this folder.
        """
        if status not in RUN_STATUSES:
            raise ValueError(f"end(status={status!r}): status must be one of {RUN_STATUSES}")
        if self._run_id is None or self._ended:
            return
        self._submit({"kind": "end", "run_id": self._run_id, "status": status, "end_time": _now_ms()})
        self._ended = True
        if self._pending:
            logger.warning("MLflow run %s ended with %d records still pending in %s; they are sent by the next "
                           "tracker started on this folder or by flush_pending(%r)", self._run_id,
                           len(self._pending), self.pending_path, str(self.local_dir))

    def __enter__(self) -> MLflowTracker:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.end("FINISHED")
        else:
            self.end("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")

    # -- logging -----------------------------------------------------------------------------

    def log_params(self, params: Any) -> None:
        """Log a config as params: nested dataclasses/mappings flatten to dotted keys (``flatten_config``).

        Values longer than ``MAX_PARAM_VALUE_LENGTH`` are truncated with ``TRUNCATION_MARKER``.
        MLflow params are immutable: re-logging a key with a *different* value is rejected (warned
        and written to ``mlflow_rejected.jsonl``, not raised).
        """
        self._require_run()
        flat = {self._key(k): truncate_value(v, MAX_PARAM_VALUE_LENGTH) for k, v in flatten_config(params).items()}
        items = sorted(flat.items())
        for i in range(0, len(items), PARAMS_TAGS_PER_BATCH):
            self._submit(self._batch(params=items[i: i + PARAMS_TAGS_PER_BATCH]))

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log one step's metrics (floats, ints, bools, numpy/torch scalars).

        NaN/inf values are dropped and counted: the cumulative count is logged as
        ``tracking/dropped_nonfinite`` at every step that dropped something. Values that are not
        numbers are skipped with a one-time warning per key.

        Args:
            metrics: ``{"namespace/name": value}``; keys go through ``sanitize_key``.
            step: the training iteration (MLflow's metric step).
        """
        self._require_run()
        step = int(step)
        ts = _now_ms()
        values: dict[str, float] = {}
        dropped = 0
        for k, v in metrics.items():
            try:
                x = float(v)
            except (TypeError, ValueError):
                self._warn_once(f"nonnumeric:{k}", "metric %r = %r is not a number; not logged", k, v)
                continue
            if not math.isfinite(x):
                dropped += 1
                self._warn_once(f"nonfinite:{k}", "metric %r is %s at step %d; dropped (counted in %s)",
                                k, x, step, DROPPED_NONFINITE_KEY)
                continue
            values[self._key(k)] = x
        if dropped:
            self.dropped_nonfinite += dropped
            values[DROPPED_NONFINITE_KEY] = float(self.dropped_nonfinite)
        if not values:
            return
        self._last_step = step if self._last_step is None else max(self._last_step, step)
        items = [[k, v, ts, step] for k, v in values.items()]
        for i in range(0, len(items), METRICS_PER_BATCH):
            self._submit(self._batch(metrics=items[i: i + METRICS_PER_BATCH]))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        """Set run tags (values stringified, cut to ``MAX_TAG_VALUE_LENGTH``)."""
        self._require_run()
        items = [[self._key(k), truncate_value(str(v), MAX_TAG_VALUE_LENGTH)] for k, v in tags.items()]
        for i in range(0, len(items), PARAMS_TAGS_PER_BATCH):
            self._submit(self._batch(tags=items[i: i + PARAMS_TAGS_PER_BATCH]))

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        """Log a dict (or dataclass) as a JSON artifact, or YAML if ``artifact_file`` ends in .yaml/.yml."""
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            obj = dataclasses.asdict(obj)
        if artifact_file.endswith((".yaml", ".yml")):
            import yaml  # a dependency of mlflow

            text = yaml.safe_dump(json.loads(json.dumps(obj, default=str)), sort_keys=False)
        else:
            text = json.dumps(obj, indent=2, default=str)
        self.log_text(text, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        """Log ``text`` as the artifact ``artifact_file`` (a relative path inside the run's artifacts)."""
        self._require_run()
        rel = Path(artifact_file)
        if rel.is_absolute() or ".." in rel.parts or not rel.name:
            raise ValueError(f"artifact_file must be a relative file path, got {artifact_file!r}")
        # Staged on local disk first, so a failed upload can be retried from the file.
        path = self.local_dir / STAGED_ARTIFACTS_DIR / uuid.uuid4().hex[:12] / rel.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        parent = rel.parent.as_posix()
        self._submit({"kind": "artifact", "run_id": self._run_id, "local_path": str(path),
                      "artifact_path": None if parent == "." else parent, "staged": True})

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Log a local file (or a directory's contents) under ``artifact_path`` in the run's artifacts.

        Raises:
            FileNotFoundError: if ``path`` does not exist.
        """
        self._require_run()
        p = Path(path).resolve()
        if not p.exists():
            raise FileNotFoundError(f"log_artifact: no such file or directory: {p}")
        self._submit({"kind": "artifact", "run_id": self._run_id, "local_path": str(p),
                      "artifact_path": artifact_path, "staged": False})

    def log_dataset(self, path: str | os.PathLike, *, name: str | None = None, context: str = "training",
                    tags: Mapping[str, Any] | None = None, profile: Mapping[str, Any] | None = None) -> str:
        """Record a local file as a dataset input of the run (lineage); the file is not uploaded.

        The dataset's source is the file's absolute path (MLflow source type ``local``); its digest
        is the first ``DATASET_DIGEST_CHARS`` hex digits of the SHA-256 of the file's bytes, hashed
        now (a later rewrite of the file does not change what was recorded). Logging the same
        name and digest twice to a run adds nothing.

        Args:
            path: the file, e.g. ``<run>/trajectories/iter_000003.parquet``.
            name: dataset name (default: the file name).
            context: the input's role, as MLflow's ``mlflow.data.context`` input tag.
            tags: more input tags, e.g. ``{"iteration": 3}`` (values stringified).
            profile: summary shown with the dataset, e.g. ``{"num_rows": 64}``; ``sha256`` and
                ``num_bytes`` are added.

        Returns:
            The digest.

        Raises:
            FileNotFoundError: if ``path`` is not a file.
        """
        self._require_run()
        p = Path(path).resolve()
        if not p.is_file():
            raise FileNotFoundError(f"log_dataset: no such file: {p}")
        sha = file_sha256(p)
        digest = sha[:DATASET_DIGEST_CHARS]
        prof = {**dict(profile or {}), "sha256": sha, "num_bytes": p.stat().st_size}
        input_tags = [[DATASET_CONTEXT_TAG, str(context)]] + [[str(k), str(v)] for k, v in (tags or {}).items()]
        self._submit({"kind": "dataset", "run_id": self._run_id, "name": name or p.name, "digest": digest,
                      "source_type": "local", "source": json.dumps({"uri": str(p)}),
                      "profile": json.dumps(prof, default=str), "tags": input_tags})
        return digest

    def register_model(self, name: str, *, artifact_path: str | None = None,
                       local_path: str | os.PathLike | None = None,
                       tags: Mapping[str, Any] | None = None) -> str | None:
        """Register a model folder of this run as a new version of registered model ``name``.

        The version's source is ``runs:/<run_id>/<artifact_path>`` when the folder was logged as
        that artifact (``log_artifact``; nothing is copied again), else the local folder
        ``local_path`` as a ``file://`` URI (nothing is uploaded: fine for a local store; a tracking
        server refuses local sources outside the run's artifacts, and the refusal is written to
        ``mlflow_rejected.jsonl``). The registered model is created if missing; the run gets the
        tag ``registered_model = models:/<name>/<version>``.

        Args:
            name: registered model name; made valid with ``registered_model_name``.
            artifact_path: the folder's artifact path in this run (e.g. ``"hf_model"``).
            local_path: the folder on this machine (used when ``artifact_path`` is None).
            tags: model version tags.

        Returns:
            ``models:/<name>/<version>``, or None while the store is unreachable (the registration
            is buffered and sent, in order, after the pending artifact uploads).

        Raises:
            ValueError: neither ``artifact_path`` nor ``local_path`` given.
        """
        self._require_run()
        if artifact_path:
            source = f"runs:/{self._run_id}/{artifact_path.strip('/')}"
        elif local_path is not None:
            source = Path(local_path).resolve().as_uri()
        else:
            raise ValueError("register_model needs artifact_path (a logged folder) or local_path")
        return self._submit({"kind": "register", "run_id": self._run_id, "name": registered_model_name(name),
                             "source": source, "tags": [[str(k), str(v)] for k, v in (tags or {}).items()]})

    def flush(self) -> bool:
        """Retry all pending records now. Returns True when nothing is left pending."""
        with self._lock:
            return self._flush_pending(force=True)

    # -- internals ---------------------------------------------------------------------------

    def _connect(self) -> None:
        from mlflow.tracking import MlflowClient

        if urlparse(self.tracking_uri).scheme in ("http", "https"):
            for name, value in HTTP_ENV_DEFAULTS.items():
                os.environ.setdefault(name, value)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        self._sender = _MlflowSender(self._client)
        self._pending = self._read_pending()

    def _ensure_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        client = self._client
        exp = client.get_experiment_by_name(self.experiment)
        if exp is None:
            try:
                return client.create_experiment(self.experiment, artifact_location=self.artifact_location)
            except MlflowException as e:  # another process created it between our get and create
                if e.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                exp = client.get_experiment_by_name(self.experiment)
        if exp.lifecycle_stage == "deleted":
            raise ValueError(f"MLflow experiment {self.experiment!r} is deleted; restore it or use another name")
        return exp.experiment_id

    def _require_run(self) -> None:
        if self._run_id is None:
            raise RuntimeError("MLflowTracker: call start() (or use it as a context manager) before logging")
        if self._ended:
            raise RuntimeError(f"MLflowTracker: run {self._run_id} has ended; no more logging")

    def _batch(self, metrics=(), params=(), tags=()) -> dict[str, Any]:
        self._require_run()
        return {"kind": "batch", "run_id": self._run_id, "metrics": list(metrics), "params": [list(p) for p in params],
                "tags": list(tags)}

    def _key(self, key: str) -> str:
        """Sanitize ``key``, warning once when it changes or collides with another key."""
        out = self._key_cache.get(key)
        if out is None:
            out = self._key_cache[key] = sanitize_key(key)
            owner = self._key_owner.setdefault(out, key)
            if out != key:
                logger.info("MLflow key %r logged as %r", key, out)
            if owner != key:
                logger.warning("MLflow keys %r and %r both map to %r; the later value wins", owner, key, out)
        return out

    def _submit(self, record: dict[str, Any]) -> Any:
        """Send one record now, or buffer it (keeping order) if the store is unreachable.

        Returns what the sender returned (``register``: the ``models:/`` URI), None when buffered.
        """
        with self._lock:
            if self._pending and not self._flush_pending(force=False):
                self._buffer(record)
                return None
            try:
                result = self._send(record)
            except Exception as exc:  # noqa: BLE001 - never let tracking stop training
                self._on_failure(record, exc)
                return None
            self._cleanup(record)
            return result

    def _send(self, record: dict[str, Any]) -> Any:
        return self._sender(record)

    def _flush_pending(self, force: bool) -> bool:
        if not self._pending:
            return True
        now = time.monotonic()
        if not force and now - self._last_attempt < self.retry_interval_s:
            return False
        self._last_attempt = now
        sent = 0
        while self._pending:
            record = self._pending[0]
            try:
                self._send(record)
            except Exception as exc:  # noqa: BLE001
                if not self._is_permanent(record, exc):
                    self._write_pending()
                    logger.debug("MLflow still unreachable (%s); %d records pending", exc, len(self._pending))
                    return False
                self._reject(record, exc)
            else:
                sent += 1
                self._cleanup(record)
            self._pending.pop(0)
        self._write_pending()
        if self._degraded:
            logger.warning("MLflow at %s is reachable again: sent %d buffered records", self.tracking_uri, sent)
            self._degraded = False
        return True

    def _on_failure(self, record: dict[str, Any], exc: BaseException) -> None:
        if self._is_permanent(record, exc):
            self._reject(record, exc)
            return
        if not self._degraded:
            logger.warning("MLflow logging to %s failed (%s: %s); training continues. Buffering in memory and in "
                           "%s; retrying on each logging call and on flush().", self.tracking_uri,
                           type(exc).__name__, _short(exc), self.pending_path)
            self._degraded = True
        self._last_attempt = time.monotonic()
        self._buffer(record)

    def _buffer(self, record: dict[str, Any]) -> None:
        self._pending.append(record)
        try:
            with open(self.pending_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # e.g. disk full: the record is still kept in memory
            self._warn_once("pending-write", "cannot write %s (%s); pending MLflow records are kept in memory only",
                            self.pending_path, exc)

    def _reject(self, record: dict[str, Any], exc: BaseException) -> None:
        logger.warning("MLflow rejected a %s record for run %s (%s: %s); not retried, kept in %s",
                       record.get("kind"), record.get("run_id"), type(exc).__name__, _short(exc), self.rejected_path)
        try:
            with open(self.rejected_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"error": f"{type(exc).__name__}: {exc}", "record": record}) + "\n")
        except OSError as write_exc:
            logger.warning("cannot write %s (%s); rejected record: %s", self.rejected_path, write_exc,
                           _short(json.dumps(record), 2000))

    @staticmethod
    def _is_permanent(record: dict[str, Any], exc: BaseException) -> bool:
        if record.get("kind") == "artifact" and not Path(record["local_path"]).exists():
            return True
        return getattr(exc, "error_code", None) in _PERMANENT_ERROR_CODES

    def _cleanup(self, record: dict[str, Any]) -> None:
        """Delete a staged artifact file once it has been uploaded."""
        if record.get("kind") == "artifact" and record.get("staged"):
            path = Path(record["local_path"])
            path.unlink(missing_ok=True)
            for folder in (path.parent, path.parent.parent):  # <staged>/<id>/ then <staged>/ if empty
                try:
                    folder.rmdir()
                except OSError:
                    break

    def _read_pending(self) -> list[dict[str, Any]]:
        if not self.pending_path.exists():
            return []
        records = []
        for n, line in enumerate(self.pending_path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a crash mid-write leaves at most one partial line
                logger.warning("skipping unreadable line %d of %s", n, self.pending_path)
        if records:
            logger.warning("found %d MLflow records left pending in %s; sending them", len(records), self.pending_path)
        return records

    def _write_pending(self) -> None:
        """Rewrite the pending file to match the in-memory buffer (atomic replace; removed when empty)."""
        if not self._pending:
            with contextlib.suppress(OSError):
                self.pending_path.unlink(missing_ok=True)
            return
        tmp = self.pending_path.with_name(f".{PENDING_FILE}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in self._pending)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.pending_path)
        except OSError as exc:
            self._warn_once("pending-write", "cannot write %s (%s); pending MLflow records are kept in memory only",
                            self.pending_path, exc)

    def _warn_once(self, token: str, msg: str, *args: Any) -> None:
        if token not in self._warned_keys:
            self._warned_keys.add(token)
            logger.warning(msg, *args)


class _MlflowSender:
    """Deliver one record through an ``MlflowClient``; the only place records become MLflow entities.

    Records (JSON-serialisable, also the lines of ``mlflow_pending.jsonl``):

    - ``{"kind": "batch", "run_id", "metrics": [[key, value, timestamp_ms, step], ...],
      "params": [[key, value], ...], "tags": [[key, value], ...]}``
    - ``{"kind": "artifact", "run_id", "local_path", "artifact_path", "staged"}`` (``staged``: a
      copy the tracker wrote under ``mlflow_staged_artifacts/`` and deletes once uploaded)
    - ``{"kind": "end", "run_id", "status", "end_time"}``
    - ``{"kind": "dataset", "run_id", "name", "digest", "source_type", "source", "profile",
      "tags": [[key, value], ...]}`` (the fields of ``mlflow.entities.Dataset``, input tags)
    - ``{"kind": "register", "run_id", "name", "source", "tags": [[key, value], ...]}``; returns
      ``models:/<name>/<version>``
    """

    def __init__(self, client: Any) -> None:
        self.client = client

    def __call__(self, record: dict[str, Any]) -> Any:
        from mlflow.entities import Metric, Param, RunTag

        client, run_id, kind = self.client, record["run_id"], record["kind"]
        if kind == "batch":
            # synchronous=True: errors must raise here (async logging would swallow them).
            client.log_batch(run_id, metrics=[Metric(k, v, ts, s) for k, v, ts, s in record["metrics"]],
                             params=[Param(k, v) for k, v in record["params"]],
                             tags=[RunTag(k, v) for k, v in record["tags"]], synchronous=True)
        elif kind == "artifact":
            path = Path(record["local_path"])
            if path.is_dir():
                client.log_artifacts(run_id, str(path), record["artifact_path"])
            else:
                client.log_artifact(run_id, str(path), record["artifact_path"])
        elif kind == "end":
            client.set_terminated(run_id, status=record["status"], end_time=record["end_time"])
        elif kind == "dataset":
            from mlflow.entities import Dataset, DatasetInput, InputTag

            dataset = Dataset(name=record["name"], digest=record["digest"], source_type=record["source_type"],
                              source=record["source"], profile=record.get("profile"))
            client.log_inputs(run_id, datasets=[DatasetInput(dataset, [InputTag(k, v) for k, v in record["tags"]])])
        elif kind == "register":
            return self._register(record)
        else:
            raise ValueError(f"unknown tracking record kind {kind!r}")
        return None

    def _register(self, record: dict[str, Any]) -> str:
        from mlflow.exceptions import MlflowException

        client, name = self.client, record["name"]
        try:
            client.create_registered_model(name)
        except MlflowException as e:  # registered by an earlier run (or an earlier attempt of this one)
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        mv = client.create_model_version(name, record["source"], run_id=record["run_id"],
                                         tags=dict(record["tags"]) or None)
        uri = f"models:/{name}/{mv.version}"
        client.set_tag(record["run_id"], REGISTERED_MODEL_TAG, uri)
        return uri


def _children(obj: Any):
    """Return ``(name, value)`` pairs of a dataclass/mapping/``to_dict`` object, else None."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    if isinstance(obj, Mapping):
        return list(obj.items())
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict) and not isinstance(obj, type):
        try:
            d = to_dict()
        except Exception:  # noqa: BLE001 - fall back to str(obj)
            return None
        return list(d.items()) if isinstance(d, Mapping) else None
    return None


def _flatten(obj: Any, key: str, out: dict[str, str]) -> None:
    children = _children(obj)
    if children is None:
        out[key or "value"] = _leaf_str(obj)
        return
    if not children and key:
        out[key] = "{}"
    for k, v in children:
        _flatten(v, f"{key}.{k}" if key else str(k), out)


def _leaf_str(v: Any) -> str:
    if isinstance(v, enum.Enum):
        return str(v.value)
    if isinstance(v, type) or callable(v) and hasattr(v, "__qualname__"):
        return f"{getattr(v, '__module__', '')}.{v.__qualname__}"
    if isinstance(v, (list, tuple)):
        try:
            return json.dumps(v, default=str)
        except (TypeError, ValueError):
            return str(v)
    return str(v)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _short(exc: object, limit: int = 300) -> str:
    s = str(exc).replace("\n", " ")
    return s if len(s) <= limit else s[:limit] + "..."
