"""Pure parts of the MLflow wiring: the ``mlflow server`` / ``mlflow ui`` command lines bind
127.0.0.1 unless told otherwise, ``compare --tag`` filters, registry names, and the
``tracking.register_model`` switch. No MLflow store, no server process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ragen_rllib.tracking.compare import comparison_name, parse_tags, tag_filter
from ragen_rllib.tracking.mlflow_logger import registered_model_name
from ragen_rllib.tracking.server import DEFAULT_HOST, server_command

ROOT = Path(__file__).resolve().parents[2]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_mlflow_server_binds_localhost_unless_told_otherwise(tmp_path: Path) -> None:
    argv = server_command("sqlite:///db", tmp_path / "art", port=5123)
    assert DEFAULT_HOST == "127.0.0.1" and _flag(argv, "--host") == "127.0.0.1" and argv.count("--host") == 1
    assert argv[:4] == [sys.executable, "-m", "mlflow", "server"]
    assert _flag(argv, "--port") == "5123" and _flag(argv, "--artifacts-destination") == str(tmp_path / "art")
    assert _flag(argv, "--backend-store-uri") == "sqlite:///db" and _flag(argv, "--workers") == "1"
    assert _flag(server_command("sqlite:///db", tmp_path, port=1, host="0.0.0.0"), "--host") == "0.0.0.0"


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_mlflow_ui_binds_localhost_unless_told_otherwise() -> None:
    def ui_line(*extra: str) -> list[str]:
        out = subprocess.run(["make", "-n", "mlflow-ui", *extra], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
        return next(ln for ln in out.splitlines() if " mlflow ui " in ln).split()

    assert _flag(ui_line(), "--host") == "127.0.0.1"
    assert _flag(ui_line("MLFLOW_HOST=0.0.0.0", "MLFLOW_PORT=5001"), "--host") == "0.0.0.0"
    assert _flag(ui_line("MLFLOW_PORT=5001"), "--port") == "5001"


def test_tag_filter_quotes_keys_and_values() -> None:
    assert tag_filter({}) == ""
    assert (tag_filter({"ragen.kind": "trial", "env": "bandit"})
            == "tags.`ragen.kind` = 'trial' and tags.`env` = 'bandit'")
    assert tag_filter({"team": "o'brien"}) == "tags.`team` = \"o'brien\""
    with pytest.raises(ValueError, match="both ' and"):
        tag_filter({"q": "it's \"x\""})
    with pytest.raises(ValueError, match="keys containing '`'"):
        tag_filter({"a`b": "x"})


def test_parse_tags_and_comparison_name() -> None:
    assert parse_tags(["env=bandit", "note=a=b", " k =v"]) == {"env": "bandit", "note": "a=b", "k": "v"}
    for bad in ("env", "=x"):
        with pytest.raises(ValueError, match="--tag expects KEY=VALUE"):
            parse_tags([bad])
    assert comparison_name("ragen-bandit") == "ragen-bandit"
    assert comparison_name(None, {"team": "a/b", "env": "x"}) == "tagged_env-x_team-a_b"


@pytest.mark.parametrize("experiment,name", [
    ("ragen-bandit", "ragen-bandit"), ("/Users/me/exp", "Users-me-exp"), ("a:b", "a-b"), ("/", "model"),
    ("..", "model"),
])
def test_registered_model_name_is_valid_for_the_registry(experiment: str, name: str) -> None:
    assert registered_model_name(experiment) == name


def test_register_model_is_on_by_default_and_can_be_turned_off() -> None:
    from ragen_rllib.algorithms.starpo.experiment import Experiment

    path = ROOT / "experiments" / "bandit_starpo_s.yaml"
    assert Experiment.load(path, "cpu").tracking.register_model is True
    assert Experiment.load(path, "cpu", ["tracking.register_model=False"]).tracking.register_model is False
    with pytest.raises(ValueError, match="tracking.register_model must be true or false"):
        Experiment.load(path, "cpu", ["tracking.register_model=maybe"])
