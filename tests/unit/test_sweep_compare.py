"""Sweep files (parsing, validation, --set routing), the Echo-Trap stop rule, and the comparison table.

No Ray cluster, no MLflow store, no model: the sweep module imports ray.tune but starts nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ragen_rllib.algorithms.starpo.sweep import (
    DEFAULT_STOP_SIGNALS,
    SETTINGS_KEY,
    EchoTrapStop,
    EchoTrapStopper,
    apply_overrides,
    load_sweep,
    trainable_config,
    tune_search_space,
)
from ragen_rllib.tracking.compare import (
    MISSING,
    RunRow,
    common_parent,
    config_differences,
    format_table,
    select_runs,
    summarize_curve,
)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "experiments" / "sweeps" / "bandit_filter_ratio.yaml"


def _sweep(tmp_path: Path, **over) -> Path:
    """A minimal valid sweep file over the shipped Bandit experiment (its CPU profile); ``over`` replaces keys."""
    raw = {"base": str(ROOT / "experiments" / "bandit_starpo_s.yaml"), "profile": "cpu", "iterations": 4,
           "search_space": {"starpo.rollout_filter_ratio": {"grid": [0.25, 1.0]}}}
    raw.update(over)
    raw = {k: v for k, v in raw.items() if v is not None}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# ------------------------------------------------------------------ the shipped sweep file
def test_shipped_bandit_sweep_loads_with_six_grid_points() -> None:
    spec = load_sweep(SHIPPED)
    assert spec.search_space == {"starpo.rollout_filter_ratio": ("grid", (0.25, 0.5, 1.0)),
                                 "starpo.adv_estimator": ("grid", ("gae", "grpo"))}
    assert (spec.iterations, spec.num_samples, spec.max_concurrent_trials) == (10, 1, 1)
    assert (spec.metric, spec.mode, spec.scheduler.type) == ("val/bandit/success", "max", "fifo")
    assert spec.echo_trap_stop == EchoTrapStop(2, DEFAULT_STOP_SIGNALS)
    assert spec.resources_per_trial == {"cpu": 2.0, "gpu": 0.0} and spec.checkpoint_at_end is False
    exp = spec.experiment
    assert exp["iterations"] == 10 and exp["warmup"]["steps"] == 10 and exp["profile"] == "cpu"
    assert exp["starpo"]["model"] == "smollm2-135m-instruct" and Path(exp["run_dir"]).is_absolute()
    assert spec.name.startswith("sweep-bandit-filter-ratio-")


def test_tune_search_space_builds_tune_domains() -> None:
    from ray.tune.search.sample import Categorical, Float, Integer

    space = tune_search_space({"a": ("grid", (1, 2)), "b": ("choice", ("x", "y")), "c": ("uniform", (0.1, 0.3)),
                               "d": ("loguniform", (1e-6, 1e-4)), "e": ("randint", (1, 4))})
    assert space["a"] == {"grid_search": [1, 2]}
    assert isinstance(space["b"], Categorical) and space["b"].categories == ["x", "y"]
    assert isinstance(space["c"], Float) and (space["c"].lower, space["c"].upper) == (0.1, 0.3)
    assert isinstance(space["d"], Float) and isinstance(space["e"], Integer)


# ------------------------------------------------------------------ --set routing
def test_set_routes_sweep_keys_to_the_sweep_and_the_rest_to_the_experiment(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path), ["iterations=3", "starpo.actor_lr=2e-5", "warmup.steps=2",
                                         "scheduler.type=asha", "scheduler.grace_period=2",
                                         "search_space.starpo.lam={'grid': [0.9, 1.0]}", "name=my-sweep"])
    assert spec.iterations == 3 and spec.experiment["iterations"] == 3
    assert spec.experiment["starpo"]["actor_lr"] == 2e-5 and spec.experiment["warmup"]["steps"] == 2
    assert (spec.scheduler.type, spec.scheduler.grace_period) == ("asha", 2)
    assert spec.search_space["starpo.lam"] == ("grid", (0.9, 1.0))
    assert "starpo.rollout_filter_ratio" in spec.search_space
    assert spec.name == "my-sweep"


def test_apply_overrides_sets_nested_keys_on_a_copy() -> None:
    base = {"starpo": {"lam": 1.0}, "warmup": None}
    out = apply_overrides(base, {"starpo.lam": 0.9, "warmup.steps": 3, "preset": "starpo"})
    assert out == {"starpo": {"lam": 0.9}, "warmup": {"steps": 3}, "preset": "starpo"}
    assert base == {"starpo": {"lam": 1.0}, "warmup": None}


def test_trainable_config_defaults_like_train(tmp_path: Path) -> None:
    exp = {"preset": "starpo_s", "run_dir": str(tmp_path / "runs"), "starpo": {"env": "sokoban"}}
    s = trainable_config(exp, run_prefix="p", resources={"cpu": 2})[SETTINGS_KEY]
    assert s["tracking_uri"] == f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    assert s["mlflow_experiment"] == "ragen-sokoban" and s["parent_run_id"] is None
    assert s["artifact_location"] == (tmp_path / "runs" / "mlartifacts").resolve().as_uri()
    assert s["resources"] == {"cpu": 2.0, "gpu": 0.0}
    s = trainable_config(exp, tracking_uri="http://mlflow:5000")[SETTINGS_KEY]
    assert s["artifact_location"] is None  # the server decides


# ------------------------------------------------------------------ clear errors
@pytest.mark.parametrize("over,match", [
    ({"serach_space": {}}, r"unknown key\(s\) \['serach_space'\]"),
    ({"search_space": {"starpo.rollout_filter_rato": {"grid": [0.5]}}},
     r"'starpo.rollout_filter_rato'.*did you mean 'starpo.rollout_filter_ratio'"),
    ({"search_space": {"starpo.rollout_filter_ratio": {"grid": [0.5, 1.5]}}},
     r"search_space\['starpo.rollout_filter_ratio'\] value 1.5 is invalid.*rollout_filter_ratio.*1.5"),
    ({"search_space": {"starpo.rollout_filter_ratio": [0.5, 1.0]}}, r"must be one of \{grid: \[..\]\}"),
    ({"search_space": {"starpo.actor_lr": {"loguniform": [1e-4, 1e-6]}}}, r"lo < hi, got \[0.0001, 1e-06\]"),
    ({"search_space": {"starpo.actor_lr": {"grid": []}}}, r"grid needs a non-empty list"),
    ({"search_space": {"tracking.experiment": {"grid": ["a", "b"]}}}, r"'tracking' is sweep-wide"),
    ({"search_space": {"learning_rate": {"grid": [1]}}}, r"key 'learning_rate' must start with one of"),
    ({"search_space": {"rllib": {"grid": [1]}}}, r"key 'rllib': '' is not a field of 'rllib'"),
    ({"search_space": {}}, r"'search_space' must map at least one dotted key"),
    ({"overrides": {"starpo.rollout_filter_ratio": 0.5}}, r"both a fixed override and in search_space"),
    ({"overrides": {"starpo.clip_ratio_low": 2.0}}, r"base experiment.*clip_ratio_low.*2.0"),
    ({"scheduler": {"type": "pbt"}}, r"scheduler.type must be one of \['fifo', 'asha'\], got 'pbt'"),
    ({"scheduler": {"type": "asha", "grace_period": 9}}, r"grace_period must be <= iterations \(4\), got 9"),
    ({"scheduler": {"type": "asha", "reduction_factor": 1}}, r"reduction_factor must be a number > 1, got 1"),
    ({"echo_trap_stop": {"signals": ["std_colapse"]}}, r"echo_trap_stop.signals must be .* got \['std_colapse'\]"),
    ({"echo_trap_stop": {"patience": 0}}, r"echo_trap_stop.patience must be an int >= 1, got 0"),
    ({"metric": "val/sokoban/success"}, r"validation env 'sokoban' is not validated.*val/bandit:test/success"),
    ({"metric": "success"}, r"'metric' must be a namespaced metric"),
    ({"mode": "maximize"}, r"'mode' must be one of \['max', 'min'\], got 'maximize'"),
    ({"iterations": 0}, r"'iterations' must be an int >= 1, got 0"),
    ({"resources_per_trial": {"cpus": 2}}, r"resources_per_trial: unknown key\(s\) \['cpus'\]"),
    ({"name": "my sweep"}, r"'name' must match"),
    ({"base": None}, r"'base' must name the experiment file"),
    ({"profile": "tpu"}, r"unknown profile 'tpu'"),
])
def test_bad_sweep_files_name_the_key_and_value(tmp_path: Path, over: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_sweep(_sweep(tmp_path, **over))


def test_a_bad_combination_fails_before_any_trial(tmp_path: Path) -> None:
    # Each value is fine alone; bi-level GAE with the critic-free estimator is not.
    path = _sweep(tmp_path, search_space={"starpo.adv_estimator": {"grid": ["gae", "grpo"]},
                                          "starpo.bi_level_gae": {"choice": [False, True]}})
    with pytest.raises(ValueError, match=r"combination \{'starpo.adv_estimator': 'grpo', 'starpo.bi_level_gae': True\}"
                                         r".*bi_level_gae"):
        load_sweep(path)


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_sweep(tmp_path / "nope.yaml")
    with pytest.raises(FileNotFoundError, match="base experiment .*missing.yaml"):
        load_sweep(_sweep(tmp_path, base="missing.yaml"))


def test_val_metric_needs_validation_from_the_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"test_freq=0"):
        load_sweep(_sweep(tmp_path, metric="val/bandit/success", overrides={"starpo.test_freq": 0}))
    assert load_sweep(_sweep(tmp_path, metric="val/bandit:test/success")).metric == "val/bandit:test/success"


# ------------------------------------------------------------------ the Echo-Trap stop rule
def _flags(**on: float) -> dict[str, float]:
    return {f"echo/{s}": on.get(s, 0.0) for s in ("std_collapse", "entropy_collapse", "grad_norm_spike",
                                                  "response_length_collapse", "identical_responses")}


def test_stopper_needs_patience_consecutive_flagged_iterations() -> None:
    stop = EchoTrapStopper(patience=2)
    seq = [_flags(std_collapse=1), _flags(), _flags(grad_norm_spike=1), _flags(entropy_collapse=1)]
    decisions = [stop("t1", {**r, "training_iteration": i + 1}) for i, r in enumerate(seq)]
    assert decisions == [False, False, False, True]  # a clean iteration resets the count; any watched signal counts
    assert stop.stopped == {"t1": {"iteration": 4, "signals": ["entropy_collapse"]}}
    assert stop.stop_all() is False


def test_stopper_ignores_unwatched_signals_and_keeps_trials_apart() -> None:
    stop = EchoTrapStopper(patience=1)
    # identical_responses is not watched by default: a converged answer-only policy repeats itself.
    assert stop("a", _flags(identical_responses=1, response_length_collapse=1)) is False
    assert stop("b", _flags(std_collapse=1)) is True and stop("a", _flags()) is False
    assert set(stop.stopped) == {"b"}
    watched = EchoTrapStopper(patience=1, signals=["identical_responses"])
    assert watched("a", _flags(identical_responses=1)) is True
    assert EchoTrapStopper(patience=1)("c", {"rollout/success": 0.5}) is False  # no flags reported: never stops


@pytest.mark.parametrize("kwargs,match", [({"patience": 0}, "patience must be an int >= 1, got 0"),
                                          ({"signals": ["nope"]}, r"signals must be a non-empty subset"),
                                          ({"signals": []}, r"signals must be a non-empty subset")])
def test_stopper_rejects_bad_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EchoTrapStopper(**kwargs)


# ------------------------------------------------------------------ comparison table
def _row(name: str, best: float | None, final: float | None, config: dict, wall: float | None = 65.0,
         parent: str | None = "P") -> RunRow:
    return RunRow(run_id=name * 4, run_name=name, status="FINISHED", config=config, best=best, final=final,
                  iterations=10, wall_s=wall, curve=((0, 1.0, 0.1), (1, 2.5, best or 0.0)), parent_run_id=parent)


def test_config_differences_counts_missing_keys_and_ignores_source() -> None:
    runs = [{"starpo.lam": "1.0", "starpo.gamma": "1.0", "source": "a.yaml"},
            {"starpo.lam": "0.9", "starpo.gamma": "1.0", "source": "b.yaml", "warmup.steps": "5"}]
    assert config_differences(runs) == ["starpo.lam", "warmup.steps"]
    assert config_differences(runs[:1]) == []


def test_summarize_curve_best_and_final() -> None:
    assert summarize_curve([0.2, 0.9, 0.5]) == (0.9, 0.5)
    assert summarize_curve([3.0, 1.0, 2.0], "min") == (1.0, 2.0)
    assert summarize_curve([0.2, float("nan")]) == (0.2, 0.2)
    assert summarize_curve([]) == (None, None)
    with pytest.raises(ValueError, match="mode must be one of"):
        summarize_curve([1.0], "best")


def test_format_table_columns_star_and_missing_values() -> None:
    rows = [_row("run-a", 0.5, 0.4, {"starpo.lam": "1.0"}), _row("run-b", 0.9, 0.75, {"starpo.lam": "0.9"}, wall=5),
            _row("run-c", None, None, {"starpo.lam": MISSING}, wall=None)]
    lines = format_table(rows, "rollout/success").splitlines()
    assert lines[0].split() == ["run", "status", "starpo.lam", "best", "rollout/success", "final", "rollout/success",
                                "iters", "wall"]
    assert set(lines[1]) <= {"-", " "}
    a, b, c = (ln.split() for ln in lines[2:])
    assert a == ["run-a", "FINISHED", "1.0", "0.5", "0.4", "10", "1m05s"]
    assert b == ["run-b", "FINISHED", "0.9", "0.9*", "0.75", "10", "5s"]
    assert c == ["run-c", "FINISHED", "-", "-", "-", "10", "-"]
    assert "0.4*" not in format_table(rows, "loss", "min") and "0.5*" in format_table(rows, "loss", "min")
    assert format_table([], "rollout/success") == "(no runs to compare for rollout/success)"


def test_select_runs_and_common_parent() -> None:
    runs = [{"run_id": "s", "start_time": 1, "tags": {"ragen.kind": "sweep"}},
            {"run_id": "t2", "start_time": 3, "tags": {"ragen.kind": "trial", "mlflow.parentRunId": "s"}},
            {"run_id": "t1", "start_time": 2, "tags": {"ragen.kind": "trial", "mlflow.parentRunId": "s"}},
            {"run_id": "c", "start_time": 4, "tags": {"ragen.kind": "compare"}},
            {"run_id": "train", "start_time": 0, "tags": {}}]
    assert [r["run_id"] for r in select_runs(runs, "s")] == ["t1", "t2"]
    assert [r["run_id"] for r in select_runs(runs)] == ["train", "t1", "t2"]
    assert common_parent([_row("a", 1, 1, {}), _row("b", 1, 1, {})]) == "P"
    assert common_parent([_row("a", 1, 1, {}), _row("b", 1, 1, {}, parent=None)]) is None


def test_short_run_names_drop_the_shared_prefix_at_a_separator() -> None:
    from ragen_rllib.tracking.compare import short_run_names

    trials = ["sweep-echo-20261204-101010-e5f1c-00000", "sweep-echo-20261204-101010-e5f1c-00011"]
    assert short_run_names(trials) == ["00000", "00011"]
    # The shared prefix "run_a" is cut back to the separator, so names stay whole words.
    assert short_run_names(["run_alpha", "run_beta"]) == ["alpha", "beta"]
    assert short_run_names(["alpha", "beta"]) == ["alpha", "beta"]  # nothing shared
    assert short_run_names(["x-1", "x-"]) == ["x-1", "x-"]  # a name would become empty
    assert short_run_names(["only-one"]) == ["only-one"]
