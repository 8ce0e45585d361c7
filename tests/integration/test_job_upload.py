"""What ``ragen-rllib submit`` uploads as the job's working dir: packed by Ray's own code
(``upload_manifest``), it honours ``.gitignore`` files and never contains credentials. No cluster."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from ragen_rllib import cli
from ragen_rllib.launch.jobs import (
    DEFAULT_EXCLUDES,
    RAY_IGNORE_GITIGNORE_ENV,
    SECRET_EXCLUDES,
    training_runtime_env,
    upload_manifest,
)

pytest.importorskip("ray")
pytestmark = pytest.mark.integration

#: The files of the project below; True: must be uploaded.
FILES = {
    "README.md": True,
    "experiments/bandit.yaml": True,
    ".gitignore": True,
    "sub/.gitignore": True,
    "sub/keep.txt": True,
    "sub/local.txt": False,           # sub/.gitignore
    "notes.log": False,               # .gitignore: *.log
    "scratch/big.txt": False,         # .gitignore: scratch/
    "runs/r1/metrics.json": False,    # DEFAULT_EXCLUDES
    ".env": False,                    # the secrets: never, whatever the ignore files and excludes say
    ".env.production": False,
    "sub/.env": False,
    "certs/server.pem": False,
    "tls.key": False,
    ".netrc": False,
    ".ray/auth_token": False,
    "home/.aws/credentials": False,
    "my-ray-token": False,            # $RAY_AUTH_TOKEN_PATH points here
}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wd = tmp_path / "project"
    for rel in FILES:
        (wd / rel).parent.mkdir(parents=True, exist_ok=True)
        (wd / rel).write_text(f"contents of {rel}\n")
    (wd / ".gitignore").write_text("*.log\nscratch/\n!.env\n")  # the negation must not re-include .env
    (wd / "sub" / ".gitignore").write_text("local.txt\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(wd / "my-ray-token"))
    monkeypatch.setenv(RAY_IGNORE_GITIGNORE_ENV, "1")  # would make Ray skip .gitignore: overridden
    return wd


def test_upload_honours_gitignore_and_never_ships_secrets(project: Path) -> None:
    names = upload_manifest(project, (*DEFAULT_EXCLUDES, "!.env", "!*.pem"))  # user negations lose too
    assert names == sorted(rel for rel, keep in FILES.items() if keep)
    assert os.environ[RAY_IGNORE_GITIGNORE_ENV] == "1"  # the caller's environment is restored


def test_secret_patterns_come_last_in_the_runtime_env(project: Path) -> None:
    excludes = training_runtime_env(project, "ragen-x", excludes=("!.netrc",))["excludes"]
    assert excludes[0] == "!.netrc"
    assert excludes[1:] == [*SECRET_EXCLUDES, "/my-ray-token"]


def test_submit_list_upload_prints_the_manifest(project: Path) -> None:
    out = io.StringIO()
    assert cli.main(["submit", "--config", "experiments/bandit.yaml", "--working-dir", str(project),
                     "--list-upload"], out=out) == 0
    assert out.getvalue().split() == sorted(rel for rel, keep in FILES.items() if keep)
