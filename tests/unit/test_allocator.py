"""The CLI's allocator choice: jemalloc preloaded once, opt-out honoured, no re-exec loop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_rllib.launch.allocator import ALLOCATOR_ENV, preload_env

LIB = Path("/x/ray/core/libjemalloc.so")


def test_preload_env_adds_the_library_and_keeps_an_existing_preload():
    env = preload_env({"PATH": "/bin"}, LIB)
    assert env is not None and env["LD_PRELOAD"] == str(LIB) and env[ALLOCATOR_ENV] == "jemalloc"
    assert env["PATH"] == "/bin"
    env = preload_env({"LD_PRELOAD": "/opt/libiomp5.so"}, LIB)
    assert env is not None and env["LD_PRELOAD"] == f"{LIB}:/opt/libiomp5.so"


def test_preload_env_is_none_when_already_preloaded_or_opted_out():
    assert preload_env({"LD_PRELOAD": f"/a.so:{LIB}"}, LIB) is None  # the re-executed process
    assert preload_env({ALLOCATOR_ENV: "system"}, LIB) is None
    assert preload_env({ALLOCATOR_ENV: " System "}, LIB) is None


def test_ray_ships_jemalloc_and_it_is_found_without_importing_ray():
    code = ("import sys; from ragen_rllib.launch.allocator import jemalloc_path; p = jemalloc_path(); "
            "print(p); assert 'ray' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out.endswith("libjemalloc.so") and Path(out).is_file()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux-only")
def test_heavy_command_reexecs_once_under_jemalloc(tmp_path: Path):
    """A heavy subcommand re-executes once with jemalloc mapped; a light one runs as it is.

    The probe module stands in for the CLI: it calls the same function at start, then reports from
    ``/proc/self/maps`` whether the library is loaded. One line means one process printed.
    """
    (tmp_path / "probe_cli.py").write_text(
        "import os, sys\n"
        "from ragen_rllib.launch.allocator import reexec_with_jemalloc\n"
        "reexec_with_jemalloc(sys.argv[1:], module='probe_cli')\n"
        "print('jemalloc' if 'libjemalloc.so' in open('/proc/self/maps').read() else 'glibc',\n"
        "      os.environ.get('RAGEN_ALLOCATOR'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", ALLOCATOR_ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])

    def probe(*argv: str, **extra: str) -> list[str]:
        r = subprocess.run([sys.executable, "-m", "probe_cli", *argv], capture_output=True, text=True,
                           env={**env, **extra}, check=True)
        return r.stdout.splitlines()

    assert probe("train", "--config", "x.yaml") == ["jemalloc jemalloc"]
    assert probe("eval") == ["jemalloc jemalloc"]
    assert probe("models", "list") == ["glibc None"]  # light commands keep the process
    assert probe("train", RAGEN_ALLOCATOR="system") == ["glibc system"]
