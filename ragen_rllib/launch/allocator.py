"""Run the heavy commands under jemalloc, the allocator that Ray already ships.

Why: glibc's malloc keeps the freed activation buffers of every update in its arenas, so a
Bandit training process grew by 0.9 GB over its first iterations. Under jemalloc (the copy in
``ray/core/libjemalloc.so``, installed with Ray, so present wherever training runs) the same
process is 1.1 GB smaller at the same speed (``benchmarks/memory.py``; README § Performance).
PyTorch's and vLLM's CPU guides recommend a non-glibc allocator for the same reason.

An allocator is chosen when a process starts, so the CLI re-executes itself once with
``LD_PRELOAD`` set. ``RAGEN_ALLOCATOR=system`` opts out; on a platform without the library (macOS,
a Ray build without it) the command runs as it is.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Mapping, Sequence

#: Environment variable: ``system`` keeps glibc's malloc; anything else (or unset) uses jemalloc.
ALLOCATOR_ENV = "RAGEN_ALLOCATOR"
#: Subcommands that load a model (the ones whose memory the allocator changes).
HEAVY_COMMANDS = frozenset({"train", "eval", "rollout", "sweep"})


def jemalloc_path() -> Path | None:
    """Ray's bundled ``libjemalloc.so``, found without importing Ray; None where it is absent."""
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        lib = Path(root) / "core" / "libjemalloc.so"
        if lib.is_file():
            return lib
    return None


def preload_env(env: Mapping[str, str], lib: Path) -> dict[str, str] | None:
    """The environment to re-execute with, or None when nothing is to change.

    None when the user opted out (``RAGEN_ALLOCATOR=system``) or ``lib`` is already preloaded
    (so a re-executed process never loops).
    """
    if env.get(ALLOCATOR_ENV, "").strip().lower() == "system":
        return None
    preload = env.get("LD_PRELOAD", "")
    if str(lib) in preload.split(":") or str(lib) in preload.split():
        return None
    new = dict(env)
    new["LD_PRELOAD"] = f"{lib}:{preload}" if preload else str(lib)
    new[ALLOCATOR_ENV] = "jemalloc"
    return new


def reexec_with_jemalloc(argv: Sequence[str], module: str = "ragen_rllib.cli") -> None:
    """Replace this process by ``python -m MODULE ARGV`` under jemalloc, if it applies.

    Applies on Linux, for the subcommands in ``HEAVY_COMMANDS``, when the library exists and is
    not yet preloaded. Otherwise returns and the command runs in this process.
    """
    if not sys.platform.startswith("linux") or not argv or argv[0] not in HEAVY_COMMANDS:
        return
    lib = jemalloc_path()
    env = preload_env(os.environ, lib) if lib is not None else None
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], env)


def reexec_script_with_jemalloc() -> None:
    """As ``reexec_with_jemalloc``, for a script run by path (the benchmarks): same script, same argv."""
    lib = jemalloc_path()
    env = preload_env(os.environ, lib) if lib is not None and sys.platform.startswith("linux") else None
    if env is not None:
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
