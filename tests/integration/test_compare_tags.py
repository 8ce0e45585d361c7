"""``ragen-rllib compare --tag key=value``: runs picked by tag, within one experiment or across all,
from a real MLflow sqlite store in tmp_path."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from ragen_rllib import cli
from ragen_rllib.tracking.compare import COMPARE_EXPERIMENT, KIND_TAG, compare_runs
from ragen_rllib.tracking.mlflow_logger import MLflowTracker, default_tracking_uri, find_runs

pytest.importorskip("mlflow")

# SQLAlchemy's SADeprecationWarning about `noload` is harmless.
pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

#: (experiment, run name, tags, rollout/success per step)
RUNS = (
    ("ragen-bandit", "b-team-a", {"team": "a", "ragen.seed": "1"}, [0.1, 0.4]),
    ("ragen-bandit", "b-team-b", {"team": "b", "ragen.seed": "1"}, [0.2, 0.3]),
    ("ragen-sokoban", "s-team-a", {"team": "a", "ragen.seed": "2"}, [0.0, 0.9]),
    ("ragen-sokoban", "s-quote", {"team": "o'brien"}, [0.5]),
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder whose sqlite store holds ``RUNS``."""
    folder = tmp_path_factory.mktemp("compare")
    for experiment, name, tags, values in RUNS:
        with MLflowTracker(None, experiment, run_name=name, tags=tags, local_dir=folder) as t:
            t.log_params({"env": experiment.split("-")[1], "seed": tags.get("ragen.seed", "0")})
            for step, v in enumerate(values):
                t.log_metrics({"rollout/success": v, "time/iteration": 1.0}, step=step)
    return folder


def _compare(*argv: str) -> str:
    out = io.StringIO()
    assert cli.main(["compare", *argv], out=out) == 0
    return out.getvalue()


def test_compare_by_tag_across_experiments(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    uri = default_tracking_uri(store)
    text = _compare("--tag", "team=a", "--tracking-uri", uri, "--out", str(tmp_path / "a.png"))
    table = text.split("comparison plot:")[0]
    assert "b-team-a" in table and "s-team-a" in table
    assert "b-team-b" not in table and "s-quote" not in table
    assert "0.9*" in table  # the best run across both experiments is starred
    # Runs of several experiments: the comparison goes to its own experiment.
    (logged,) = find_runs(uri, COMPARE_EXPERIMENT)
    assert logged["tags"][KIND_TAG] == "compare"
    assert set(logged["params"]["runs"].split(",")) == {
        r["run_id"] for r in find_runs(uri, None) if r["run_name"] in ("b-team-a", "s-team-a")}


def test_compare_by_tag_within_one_experiment_and_all_tags_must_match(store: Path) -> None:
    uri = default_tracking_uri(store)
    rows = compare_runs(uri, "ragen-bandit", tags={"team": "a"})
    assert [r.run_name for r in rows] == ["b-team-a"] and rows[0].best == 0.4 and rows[0].final == 0.4
    rows = compare_runs(uri, None, tags={"ragen.seed": "1"})  # a key with a dot
    assert sorted(r.run_name for r in rows) == ["b-team-a", "b-team-b"]
    assert [r.run_name for r in compare_runs(uri, None, tags={"ragen.seed": "1", "team": "b"})] == ["b-team-b"]
    assert [r.run_name for r in compare_runs(uri, None, tags={"team": "o'brien"})] == ["s-quote"]
    assert compare_runs(uri, None, tags={"team": "nobody"}) == []


def test_compare_tag_errors_are_clear(store: Path) -> None:
    uri = default_tracking_uri(store)
    with pytest.raises(SystemExit, match="give an EXPERIMENT, or --tag"):
        cli.main(["compare", "--tracking-uri", uri], out=io.StringIO())
    with pytest.raises(SystemExit, match="--tag expects KEY=VALUE"):
        cli.main(["compare", "--tag", "team", "--tracking-uri", uri], out=io.StringIO())
    with pytest.raises(SystemExit, match=r"no runs to compare \(any experiment tag team='nobody'\)"):
        cli.main(["compare", "--tag", "team=nobody", "--tracking-uri", uri], out=io.StringIO())
