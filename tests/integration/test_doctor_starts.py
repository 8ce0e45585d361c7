"""``ragen-rllib doctor`` on this machine: every check reported, failures named with what to do,
and (vLLM tier) the engine and Ray really start. Also ``compare`` naming an unknown experiment in
a real MLflow store."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from ragen_rllib import cli
from ragen_rllib.launch.doctor import CHECKS, DoctorOptions, run_checks


def _doctor(*argv: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = cli.main(["doctor", *argv], out=out)
    return code, out.getvalue().splitlines()


def test_quick_doctor_reports_every_check_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no_token_yet"))  # not this machine's ~/.ray
    code, lines = _doctor("--quick", "--run-dir", str(tmp_path / "runs"))
    assert [ln.split(":")[0].split()[-1] for ln in lines] == list(CHECKS)
    assert all(ln.startswith(("ok  ", "FAIL ")) for ln in lines), lines
    assert code == (0 if all(ln.startswith("ok") for ln in lines) else 1)
    by_name = {ln.split(":")[0].split()[-1]: ln for ln in lines}
    assert by_name["python"].startswith("ok") and by_name["torch"].startswith("ok")
    assert "--quick" in by_name["ray"]  # the start was skipped, and it says so


def test_failing_checks_print_fail_with_advice_and_exit_nonzero(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code, lines = _doctor("--quick", "--cache-dir", str(tmp_path / "no_cache"), "--run-dir", str(blocker / "runs"))
    assert code == 1
    by_name = {ln.split(":")[0].split()[-1]: ln for ln in lines}
    assert by_name["models"].startswith("FAIL models:") and "ragen-rllib models prepare" in by_name["models"]
    assert by_name["mlflow"].startswith("FAIL mlflow:") and "--tracking-uri" in by_name["mlflow"]


@pytest.mark.vllm
def test_engine_and_ray_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The full checks: a tiny model in a vLLM engine generates, a local Ray starts and stops, and
    the token file that start needed was created private (0600)."""
    pytest.importorskip("vllm")
    token = tmp_path / "ray" / "auth_token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))  # the child Ray start reads it; ~ untouched
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    results = {r.name: r for r in run_checks(DoctorOptions(), names=["models", "vllm", "ray"])}
    if not results["models"].ok:
        pytest.skip(f"embedded model not prepared: {results['models'].detail}")
    assert results["vllm"].ok and "generated" in results["vllm"].detail, results["vllm"].detail
    assert results["ray"].ok and "started and stopped" in results["ray"].detail, results["ray"].detail
    assert f"token file {token} is private" in results["ray"].detail
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64


def test_ray_check_fails_on_a_readable_token_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token file others can read (as Ray itself writes it under a 022 umask) fails the check with the fix."""
    token = tmp_path / "auth_token"
    token.write_text("a" * 64)
    token.chmod(0o644)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    (res,) = run_checks(DoctorOptions(quick=True), names=["ray"])
    assert not res.ok and f"chmod 600 {token}" in res.detail and "mode 0644" in res.detail, res.detail


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_compare_names_an_unknown_experiment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).create_experiment("ragen-bandit")
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", "ragen-bandt", "--tracking-uri", uri], out=io.StringIO())
    assert e.value.code == f"error: no MLflow experiment 'ragen-bandt' at {uri}; did you mean 'ragen-bandit'?"
