"""Compare the MLflow runs of an experiment (or the trials of one sweep): table and plot.

``ragen-rllib compare EXPERIMENT`` (or ``compare [EXPERIMENT] --tag key=value ...``: the runs
carrying every given tag, in that experiment or across all of them) is built from three pieces:

- ``compare_runs``: reads the runs from MLflow (through ``mlflow_logger``, the only module that
  talks to MLflow) and returns one ``RunRow`` per run: the params that differ between the runs,
  best and final value of a metric, iterations, wall time, and the metric's curve.
- ``format_table`` (pure, no MLflow): the printed table.
- ``plot_comparison``: a two-panel PNG (metric vs iteration, metric vs wall time), drawn with
  matplotlib's Agg canvas (no pyplot state), and ``log_comparison``, which logs the PNG and the
  table to the sweep's parent run, or to a new ``compare`` run when the runs are not one sweep.

Run kinds are told apart by the ``ragen.kind`` tag: ``sweep`` (a sweep's parent run), ``trial``
(one Tune trial, nested under its parent with MLflow's ``mlflow.parentRunId`` tag) and
``compare`` (a run holding a comparison). Plain ``ragen-rllib train`` runs carry no such tag.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Tag naming what a run is (``sweep``, ``trial``, ``compare``; absent on ``train`` runs).
KIND_TAG = "ragen.kind"
#: MLflow's own nesting tag: a child run's parent run id (the MLflow UI nests on it).
PARENT_TAG = "mlflow.parentRunId"
#: Logged once per RL iteration by ``train`` and by sweep trials: counts iterations.
ITERATION_KEY = "time/iteration"
#: Params that always differ between runs by construction and say nothing about the config.
IGNORED_PARAMS = frozenset({"source"})
MODES = ("max", "min")
MISSING = "-"
#: Where ``log_comparison`` puts a comparison of runs picked by tag alone (no experiment named).
COMPARE_EXPERIMENT = "ragen-compare"


@dataclass(frozen=True)
class RunRow:
    """One run in a comparison.

    Attributes:
        run_id: MLflow run id.
        run_name: MLflow run name.
        status: ``RUNNING``, ``FINISHED``, ``FAILED`` or ``KILLED``.
        config: ``{param: value}`` of the params that differ between the compared runs only
            (``MISSING`` where this run lacks the param).
        best: best value of the metric over the run (max or min by ``mode``); None if never logged.
        final: the metric's value at the run's last logged step; None if never logged.
        iterations: RL iterations logged (largest ``time/iteration`` step + 1; 0 if none).
        wall_s: seconds from run start to end (to now while running); None without a start time.
        curve: ``((step, seconds since run start, value), ...)`` of the metric, by step.
        parent_run_id: the ``mlflow.parentRunId`` tag (the sweep run of a trial), else None.
    """

    run_id: str
    run_name: str
    status: str
    config: Mapping[str, str]
    best: float | None
    final: float | None
    iterations: int
    wall_s: float | None
    curve: tuple[tuple[int, float, float], ...] = field(default=(), repr=False)
    parent_run_id: str | None = None


def config_differences(params: Sequence[Mapping[str, str]], ignore: frozenset[str] = IGNORED_PARAMS) -> list[str]:
    """Return the sorted param keys whose values are not the same in every run.

    A key absent from some runs but present in others counts as differing. With fewer than two
    runs nothing differs.

    Args:
        params: one ``{key: value}`` mapping per run (MLflow params are strings).
        ignore: keys never reported.
    """
    if len(params) < 2:
        return []
    keys = set().union(*params) - set(ignore)
    return sorted(k for k in keys if len({p.get(k) for p in params}) > 1)


def summarize_curve(values: Sequence[float], mode: str = "max") -> tuple[float | None, float | None]:
    """Return ``(best, final)`` of a metric's values in step order; ``(None, None)`` when empty.

    Raises:
        ValueError: if ``mode`` is not ``max`` or ``min``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    finite = [float(v) for v in values if math.isfinite(float(v))]
    if not finite:
        return None, None
    return (max(finite) if mode == "max" else min(finite)), finite[-1]


def format_table(rows: Sequence[RunRow], metric: str, mode: str = "max") -> str:
    """Render the comparison as a fixed-width text table, one line per run.

    Columns: run name, status, one column per differing param (the keys of ``rows[i].config``),
    best and final ``metric``, iterations, wall time. The best row's best value is starred.

    Args:
        rows: from ``compare_runs`` (all rows carry the same ``config`` keys).
        metric: the metric's name, used in the header.
        mode: ``max`` or ``min``: which best value gets the star.
    """
    if not rows:
        return f"(no runs to compare for {metric})"
    keys = sorted({k for r in rows for k in r.config})
    best_of_all = summarize_curve([r.best for r in rows if r.best is not None], mode)[0]
    header = ["run", "status", *keys, f"best {metric}", f"final {metric}", "iters", "wall"]
    body = []
    for r in rows:
        star = "*" if r.best is not None and r.best == best_of_all else ""
        body.append([r.run_name, r.status, *(r.config.get(k, MISSING) for k in keys), _num(r.best) + star,
                     _num(r.final), str(r.iterations), _duration(r.wall_s)])
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    numeric = {len(header) - 4, len(header) - 3, len(header) - 2, len(header) - 1}
    out = []
    for line in [header, *body]:
        out.append("  ".join(cell.rjust(w) if i in numeric else cell.ljust(w)
                             for i, (cell, w) in enumerate(zip(line, widths, strict=False))).rstrip())
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def parse_tags(items: Sequence[str]) -> dict[str, str]:
    """``["key=value", ...]`` (``--tag``) -> ``{key: value}``; the value may contain ``=``.

    Raises:
        ValueError: an item without ``=`` or with an empty key.
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--tag expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def tag_filter(tags: Mapping[str, str]) -> str:
    """MLflow search filter matching runs that carry every tag with exactly that value.

    ``{"ragen.kind": "trial", "env": "bandit"}`` -> ``tags.`ragen.kind` = 'trial' and tags.`env` = 'bandit'``
    (backticks let keys contain dots; a value holding ``'`` is double-quoted instead).

    Raises:
        ValueError: a key holding a backtick, or a value holding both quote characters (MLflow's
            search syntax has no escapes).
    """
    clauses = []
    for key, value in tags.items():
        if "`" in key:
            raise ValueError(f"tag key {key!r}: MLflow search cannot match keys containing '`'")
        if "'" in value and '"' in value:
            raise ValueError(f"tag {key}={value!r}: MLflow search cannot match values containing both ' and \"")
        quote = '"' if "'" in value else "'"
        clauses.append(f"tags.`{key}` = {quote}{value}{quote}")
    return " and ".join(clauses)


def comparison_name(experiment: str | None, tags: Mapping[str, str] | None = None) -> str:
    """A file-name-safe label for a comparison: ``ragen-bandit``, ``ragen-bandit_env-bandit``,
    ``tagged_env-bandit`` (tags without an experiment)."""
    parts = [experiment or ("tagged" if tags else "all")] + [f"{k}-{v}" for k, v in sorted((tags or {}).items())]
    return _safe("_".join(parts))


def select_runs(runs: Sequence[Mapping[str, Any]], parent_run_id: str | None = None) -> list[Mapping[str, Any]]:
    """Pick the runs to compare from ``find_runs`` dicts, oldest first.

    With ``parent_run_id``: that sweep's trials (runs whose ``mlflow.parentRunId`` tag is it).
    Without: every run except sweep parents and comparison runs (training runs and trials).
    """
    if parent_run_id:
        picked = [r for r in runs if r["tags"].get(PARENT_TAG) == parent_run_id]
    else:
        picked = [r for r in runs if r["tags"].get(KIND_TAG) not in ("sweep", "compare")]
    return sorted(picked, key=lambda r: (r.get("start_time") or 0, r["run_id"]))


def compare_runs(tracking_uri: str, experiment: str | None, metric: str = "rollout/success", *,
                 parent_run_id: str | None = None, mode: str = "max",
                 tags: Mapping[str, str] | None = None) -> list[RunRow]:
    """Read the runs of ``experiment`` (or one sweep's trials, or the runs with given tags) and
    build the comparison rows.

    Args:
        tracking_uri: the MLflow store (``sqlite:///runs/mlflow.db`` for the default run folder).
        experiment: MLflow experiment name (e.g. ``ragen-bandit``); None: every experiment (then
            ``tags`` should narrow the runs down).
        metric: the metric whose best / final values and curves are compared.
        parent_run_id: compare only this sweep's trials (see ``select_runs``).
        mode: ``max`` (success, return) or ``min`` (a loss).
        tags: only runs carrying every one of these tags with exactly this value (``tag_filter``).

    Returns:
        One ``RunRow`` per run, oldest first; ``[]`` when the experiment has no matching runs.

    Raises:
        ValueError: bad ``mode`` or tag, or ``parent_run_id`` given but no run of ``experiment`` has
            it as parent (the message lists the sweep runs that exist).
    """
    from ragen_rllib.tracking.mlflow_logger import find_runs, get_timed_metric_history

    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    all_runs = find_runs(tracking_uri, experiment, filter_string=tag_filter(tags or {}))
    runs = select_runs(all_runs, parent_run_id)
    if parent_run_id and not runs:
        sweeps = [f"{r['run_id']} ({r['run_name']})" for r in all_runs if r["tags"].get(KIND_TAG) == "sweep"]
        raise ValueError(f"no runs of experiment {experiment!r} have parent run {parent_run_id!r}; "
                         f"sweep runs there: {sweeps or 'none'}")
    diff = config_differences([r["params"] for r in runs])
    now_ms = int(time.time() * 1000)
    rows = []
    for r in runs:
        start = r.get("start_time")
        hist = get_timed_metric_history(tracking_uri, r["run_id"], metric)
        iters = get_timed_metric_history(tracking_uri, r["run_id"], ITERATION_KEY)
        best, final = summarize_curve([v for _, _, v in hist], mode)
        end = r.get("end_time") or (now_ms if r["status"] == "RUNNING" else None)
        rows.append(RunRow(
            run_id=r["run_id"], run_name=r["run_name"] or r["run_id"][:8], status=r["status"],
            config={k: r["params"].get(k, MISSING) for k in diff}, best=best, final=final,
            iterations=(max(s for s, _, _ in iters) + 1) if iters else 0,
            wall_s=(end - start) / 1000.0 if start and end else None,
            curve=tuple((s, (ts - start) / 1000.0 if start else float("nan"), v) for s, ts, v in hist),
            parent_run_id=r["tags"].get(PARENT_TAG)))
    return rows


def common_parent(rows: Sequence[RunRow]) -> str | None:
    """Return the parent run id all ``rows`` share (they are one sweep's trials), else None."""
    parents = {r.parent_run_id for r in rows}
    return parents.pop() if len(parents) == 1 and None not in parents else None


def short_run_names(names: Sequence[str]) -> list[str]:
    """Drop the prefix all ``names`` share, cut at a ``-`` or ``_`` (a sweep's trials keep ``00003``).

    One name, or names with no common prefix ending in a separator, are returned unchanged.
    """
    if len(names) < 2:
        return list(names)
    prefix = os.path.commonprefix(list(names))
    cut = max(prefix.rfind("-"), prefix.rfind("_")) + 1
    if cut <= 0 or any(len(n) <= cut for n in names):
        return list(names)
    return [n[cut:] for n in names]


def plot_comparison(rows: Sequence[RunRow], metric: str, out_png: str | os.PathLike,
                    title: str | None = None) -> Path | None:
    """Draw ``metric`` per run against iteration (left) and wall time (right) into one PNG.

    Each run is one line, labelled with its name (less the prefix all runs share) and its differing
    params; the legend sits under both panels. Written via a temp file, then renamed.

    Args:
        rows: from ``compare_runs``.
        metric: the y-axis metric name.
        out_png: output file (parent folders are created).
        title: figure title (default: the metric).

    Returns:
        The PNG path, or None when matplotlib is not installed or no run has data.
    """
    from ragen_rllib.tracking.plots import have_matplotlib, new_figure, save_png

    if not have_matplotlib("comparison plot", out_png):
        return None
    from matplotlib.ticker import MaxNLocator

    with_data = [r for r in rows if r.curve]
    if not with_data:
        logger.warning("no run has %s: skipping comparison plot %s", metric, out_png)
        return None
    # The legend sits under both panels, one line per run, so long labels never squeeze the axes.
    fig = new_figure((11.0, 4.0 + 0.17 * len(with_data)))
    ax_it, ax_t = fig.subplots(1, 2)
    names = short_run_names([r.run_name for r in with_data])
    for r, name in zip(with_data, names, strict=True):
        label = " ".join([name, *(f"{k.split('.')[-1]}={v}" for k, v in sorted(r.config.items()))])
        steps = [s for s, _, _ in r.curve]
        secs = [t for _, t, _ in r.curve]
        values = [v for _, _, v in r.curve]
        marker = "." if len(steps) < 30 else None
        (line,) = ax_it.plot(steps, values, lw=1.2, marker=marker, label=label)
        ax_t.plot(secs, values, lw=1.2, marker=marker, color=line.get_color())
    for ax, xlabel in ((ax_it, "iteration"), (ax_t, "wall time since run start (s)")):
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_ylabel(metric, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    ax_it.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.legend(loc="outside lower center", ncols=1, fontsize=7, frameon=False)
    fig.suptitle(title or metric, fontsize=11)
    return save_png(fig, out_png)


def log_comparison(tracking_uri: str, experiment: str, rows: Sequence[RunRow], metric: str, png: Path | None,
                   table: str, *, parent_run_id: str | None = None, local_dir: str | os.PathLike = ".") -> str:
    """Log the comparison PNG and table to MLflow; return the run id they went to.

    With ``parent_run_id`` (a sweep), they are added to that run's artifacts under ``compare/``
    without changing its status or times. Otherwise a new run ``compare-<time>`` (tag
    ``ragen.kind=compare``) is created in ``experiment`` with the compared run ids as a param.

    Args:
        local_dir: folder for the table file and, for a new run, the tracker's pending buffer.
    """
    from ragen_rllib.tracking.mlflow_logger import MLflowTracker, log_artifact_to_run

    local = Path(local_dir)
    local.mkdir(parents=True, exist_ok=True)
    table_file = local / f"compare_{_safe(metric)}.txt"
    table_file.write_text(table + "\n", encoding="utf-8")
    if parent_run_id:
        for path in (png, table_file):
            if path is not None:
                log_artifact_to_run(tracking_uri, parent_run_id, path, "compare")
        return parent_run_id
    tracker = MLflowTracker(tracking_uri, experiment, run_name=time.strftime("compare-%Y%m%d-%H%M%S"),
                            tags={KIND_TAG: "compare"}, local_dir=local)
    with tracker:
        tracker.log_params({"metric": metric, "runs": ",".join(r.run_id for r in rows)})
        for path in (png, table_file):
            if path is not None:
                tracker.log_artifact(path, "compare")
    return str(tracker.run_id)


def _num(x: float | None) -> str:
    return MISSING if x is None else f"{x:.4g}"


def _duration(s: float | None) -> str:
    if s is None:
        return MISSING
    m, sec = divmod(int(round(s)), 60)
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
