"""``ragen-rllib doctor``: one line per check, FAIL lines say what to do, exit code 0 iff all ok.

The real checks on this machine (with ``--quick``) are in tests/integration/test_doctor.py; here,
single checks pointed at missing or unwritable paths, and the command's plumbing with fake checks.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_rllib import cli
from ragen_rllib.launch import doctor
from ragen_rllib.launch.doctor import CheckFailed, CheckResult, DoctorOptions, run_checks


def test_doctor_module_is_import_light() -> None:
    """Heavy libraries are imported by the check functions only."""
    code = "import sys, ragen_rllib.launch.doctor; print(' '.join(sorted(sys.modules)))"
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    leaked = sorted(m for m in mods if m.split(".")[0] in ("torch", "ray", "vllm", "deepspeed", "mlflow",
                                                               "transformers", "psutil"))
    assert not leaked, leaked


def test_line_format() -> None:
    assert CheckResult("ray", True, "2.60.0").line() == "ok  ray: 2.60.0"
    assert CheckResult("disk", False, "free\nspace").line() == "FAIL disk: free space"


def test_missing_model_cache_fails_with_the_prepare_command(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "cache"
    (result,) = run_checks(DoctorOptions(cache_dir=missing), names=["models"])
    assert not result.ok
    assert f"ragen-rllib models prepare smollm2-135m-instruct --cache-dir {missing}" in result.detail


def test_unusable_cache_folder_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    (result,) = run_checks(DoctorOptions(cache_dir=blocker / "models"), names=["models"])
    assert not result.ok and "RAGEN_RLLIB_CACHE" in result.detail and "is a file" in result.detail


def test_the_cache_env_var_is_what_the_models_check_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGEN_RLLIB_CACHE", str(tmp_path / "empty"))
    (result,) = run_checks(DoctorOptions(), names=["models"])
    assert not result.ok and str(tmp_path / "empty" / "models") in result.detail


def test_unwritable_mlflow_store_fails_with_advice(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    (result,) = run_checks(DoctorOptions(run_dir=blocker / "runs"), names=["mlflow"])
    assert not result.ok
    assert "cannot be written" in result.detail and "--tracking-uri" in result.detail


def test_writable_mlflow_store_is_ok_and_creates_nothing(tmp_path: Path) -> None:
    (result,) = run_checks(DoctorOptions(run_dir=tmp_path / "runs"), names=["mlflow"])
    assert result.ok, result.detail
    assert not (tmp_path / "runs").exists()


def test_unknown_tracking_scheme_fails(tmp_path: Path) -> None:
    (result,) = run_checks(DoctorOptions(tracking_uri="bogus://x"), names=["mlflow"])
    assert not result.ok and "bogus://x" in result.detail


def test_command_prints_one_line_per_check_and_fails_if_any_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def good(opts: DoctorOptions) -> str:
        return f"quick={opts.quick}"

    def bad(opts: DoctorOptions) -> str:
        raise CheckFailed("do this")

    def broken(opts: DoctorOptions) -> str:
        raise KeyError("bug")

    monkeypatch.setattr(doctor, "CHECKS", {"a": good, "b": bad, "c": broken})
    out = io.StringIO()
    assert cli.main(["doctor", "--quick"], out=out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0] == "ok  a: quick=True" and lines[1] == "FAIL b: do this"
    assert lines[2].startswith("FAIL c: the check itself failed") and "KeyError" in lines[2]
    monkeypatch.setattr(doctor, "CHECKS", {"a": good})
    assert cli.main(["doctor"], out=io.StringIO()) == 0


@pytest.mark.parametrize("native", [True, False])
def test_torch_check_says_what_auto_bf16_picks(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    from ragen_rllib import hardware

    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: native)
    line = doctor.check_torch(DoctorOptions())
    assert ("natively (auto: bf16)" if native else "emulates bf16 (auto: fp32 on CPU)") in line, line
