"""The run report: one self-contained ``<run>/report.html`` (inline CSS, SVG and JS; no network).

Sections:

1. Learning curves with 95% intervals: rollout success per iteration (Wilson score interval of
   the iteration's k successes in n episodes), rollout return per iteration (mean ± 1.96 standard
   errors over its episodes), validation success per validation env (Wilson, from the recorded
   success and the protocol's episode count, else the recorded half-width ``success_ci95``).
2. The Echo-Trap dashboard: in-group reward std (``filter/std_*``), entropy (``actor/entropy``),
   grad norm (``actor/grad_norm``) and response length on one iteration axis, with the points
   where the Echo-Trap monitor switched a signal on marked (``EchoTrapMonitor``; its ``echo/*``
   flags are in the metrics).
3. Time per stage (``time/*``): stacked bars per iteration and a table.
4. An episode browser: per iteration and group (kept or dropped by the StarPO-S filter), each
   turn's observation (grid envs drawn as grids), the reply, its reward, and the token advantages
   the update used as a heat map over the reply tokens (``Col.TOKEN_ADVANTAGES``).

Inputs, all in the run folder: ``metrics.jsonl`` (one line per iteration, written by the training
session; ``checkpoint/ragen_history.json`` serves when it is missing), ``trajectories/`` (the
Parquet store), ``resume.json`` (the resolved config) and ``hf_model/`` (its tokenizer decodes the
reply tokens; without one the heat map shows token ids).

Pure Python + pyarrow/numpy (``tokenizers`` optional, imported lazily); no ray, vllm or mlflow.
"""

from __future__ import annotations

import html
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragen_rllib.tracking.echo_trap import FLAG_PREFIX, SIGNALS, EchoTrapMonitor
from ragen_rllib.trajectory.schema import Col
from ragen_rllib.trajectory.store import TRAJECTORIES_DIR, read_run, validation_store

#: The report's file name inside the run folder.
REPORT_FILE = "report.html"
#: Per-iteration metrics of a run, one JSON object per line: ``{"step": i, "metrics": {...}}``;
#: the final validation is a line with ``"final": true``. A step written twice (a resumed run
#: redoing it) counts with its last line.
METRICS_FILE = "metrics.jsonl"
#: Where a checkpoint keeps the metric history (``train.HISTORY_FILE``), read when ``metrics.jsonl`` is missing.
_CHECKPOINT_HISTORY = ("checkpoint/ragen_history.json", "checkpoint.old/ragen_history.json")
_EVAL_PROTOCOL = "hf_model/ragen_eval_protocol.json"
#: z of a two-sided 95% interval.
Z95 = 1.96

#: Stages of ``StarPO.training_step`` in order (``time/<stage>``, seconds), stacked in the time chart.
STAGES = ("validate", "sample", "store", "filter", "advantages", "update", "sync", "store_advantages")
#: Timers that are parts of a stage (not stacked; listed under it in the table).
SUBSTAGES = {"generate": "sample", "env": "sample"}
_STAGE_COLORS = ("#8c564b", "#1f77b4", "#7f7f7f", "#bcbd22", "#9467bd", "#d62728", "#17becf", "#c7c7c7",
                 "#ff7f0e", "#2ca02c")
#: Echo-Trap dashboard panels: (title, metric keys drawn in it).
ECHO_PANELS = (("In-group reward std", ("filter/std_all_mean", "filter/std_kept_mean")),
               ("Entropy (nats/token)", ("actor/entropy",)),
               ("Grad norm (pre-clip)", ("actor/grad_norm",)),
               ("Response length (tokens/turn)", ("rollout/response_length_mean",)))
_SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


# --------------------------------------------------------------------------------------------
# the metrics file (written during training)
# --------------------------------------------------------------------------------------------


def append_metrics(run_folder: str | os.PathLike, step: int, metrics: Mapping[str, float], *,
                   final: bool = False) -> None:
    """Append one step's metrics to ``<run_folder>/metrics.jsonl`` (non-finite values dropped).

    Args:
        run_folder: the run's folder (created if missing).
        step: the iteration (0-based); for ``final``, the step the final validation is logged at.
        metrics: flat ``{name: value}``.
        final: the line holds the final validation.
    """
    folder = Path(run_folder)
    folder.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"step": int(step), "metrics": {k: float(v) for k, v in metrics.items()
                                                             if _finite(v)}}
    if final:
        record["final"] = True
    with open(folder / METRICS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


@dataclass
class History:
    """A run's metrics by step.

    Attributes:
        steps: per-iteration metrics, ``steps[i]`` of iteration i (a step never recorded is ``{}``).
        final: the final validation's metrics (empty when the run has none).
        final_step: the step the final validation is logged at (None without one).
    """

    steps: list[dict[str, float]] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)
    final_step: int | None = None


def read_history(run_folder: str | os.PathLike) -> History:
    """Read a run's metric history: ``metrics.jsonl``, its gaps filled from the checkpoint's
    history (a run resumed from before the file existed), or empty.

    A torn line (a run killed while writing it) is skipped.
    """
    folder = Path(run_folder)
    hist = History()
    by_step: dict[int, dict[str, float]] = {}
    for rel in _CHECKPOINT_HISTORY:
        if (folder / rel).is_file():
            by_step = {i: dict(m) for i, m in enumerate(json.loads((folder / rel).read_text()))}
            break
    path = folder / METRICS_FILE
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("final"):
            hist.final, hist.final_step = dict(rec["metrics"]), int(rec["step"])
        else:
            by_step[int(rec["step"])] = dict(rec["metrics"])
    n = max(by_step) + 1 if by_step else 0
    hist.steps = [by_step.get(i, {}) for i in range(n)]
    return hist


# --------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion.

    Args:
        successes: number of successes k (0..n; a float is accepted: ``p * n`` from a rate).
        n: number of trials.
        z: normal quantile (1.96: 95%).

    Returns:
        ``(low, high)`` in [0, 1]; ``(0, 1)`` when n is 0.
    """
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: Sequence[float], z: float = Z95) -> tuple[float, float, float]:
    """Mean and ``mean ± z * se`` (se = sample std / sqrt(n), ddof 1; 0 for one value)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
    return m, m - z * se, m + z * se


def mcnemar_exact(gains: int, losses: int) -> float:
    """Two-sided exact McNemar test of paired binary outcomes (before, after).

    Under "no change" each discordant pair is a gain (fail -> success) or a loss (success -> fail)
    with probability 1/2, so ``p = min(1, 2 * P[Binomial(gains + losses, 1/2) <= min(gains, losses)])``.

    Args:
        gains: pairs that failed before and succeed after (>= 0).
        losses: pairs that succeeded before and fail after (>= 0).

    Returns:
        The p-value in (0, 1]; 1.0 when there is no discordant pair.

    Raises:
        ValueError: a count is negative.
    """
    if gains < 0 or losses < 0:
        raise ValueError(f"gains and losses must be >= 0, got gains={gains}, losses={losses}")
    n, k = gains + losses, min(gains, losses)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


def fisher_exact(a: int, n_a: int, b: int, n_b: int) -> float:
    """Two-sided Fisher's exact test of two independent proportions, ``a / n_a`` against ``b / n_b``.

    With the margins fixed, the count in the first group is hypergeometric; ``p`` sums the
    probabilities of every table no more likely than the observed one (relative tolerance 1e-7,
    as R's ``fisher.test``).

    Args:
        a: events in the first group (0 <= a <= n_a).
        n_a: size of the first group (>= 0).
        b: events in the second group (0 <= b <= n_b).
        n_b: size of the second group (>= 0).

    Returns:
        The p-value in (0, 1]; 1.0 when a margin is 0.

    Raises:
        ValueError: a count is negative or larger than its group.
    """
    if not (0 <= a <= n_a and 0 <= b <= n_b):
        raise ValueError(f"need 0 <= a <= n_a and 0 <= b <= n_b, got a={a}, n_a={n_a}, b={b}, n_b={n_b}")
    events, n = a + b, n_a + n_b
    lo, hi = max(0, events - n_b), min(events, n_a)
    total = math.comb(n, events)
    probs = {k: math.comb(n_a, k) * math.comb(n_b, events - k) / total for k in range(lo, hi + 1)}
    cut = probs[a] * (1 + 1e-7)
    return min(1.0, sum(q for q in probs.values() if q <= cut))


@dataclass(frozen=True)
class PairedComparison:
    """Two validations compared on the rollouts they share (same initial state, same sample index).

    Rates are success fractions in [0, 1]; ``diff_*`` is the mean over initial states of the
    per-state success difference (after - before) with its 95% normal interval, so the samples
    of one state count as one paired unit. ``p_mcnemar`` treats each rollout pair as independent
    (exact when there is one sample per state).
    """

    pairs: int  # rollouts present in both validations
    states: int  # distinct initial states among them
    unpaired: int  # rollouts present in only one of the two (left out)
    before: float
    after: float
    gains: int  # failed before, succeed after
    losses: int  # succeeded before, fail after
    diff: float
    diff_low: float
    diff_high: float
    p_mcnemar: float


def paired_comparison(before: Mapping[tuple[int, int], bool],
                      after: Mapping[tuple[int, int], bool]) -> PairedComparison:
    """Compare two validations rollout by rollout.

    Args:
        before, after: success of each rollout keyed by ``(initial_seed, sample_idx)``.

    Raises:
        ValueError: the two share no rollout.
    """
    keys = sorted(before.keys() & after.keys())
    if not keys:
        raise ValueError(f"the two validations share no (initial_seed, sample_idx): {len(before)} and "
                         f"{len(after)} rollouts")
    gains = sum(1 for k in keys if after[k] and not before[k])
    losses = sum(1 for k in keys if before[k] and not after[k])
    per_state: dict[int, list[float]] = {}
    for k in keys:
        per_state.setdefault(k[0], []).append(float(after[k]) - float(before[k]))
    diff, lo, hi = mean_interval([sum(d) / len(d) for d in per_state.values()])
    return PairedComparison(
        pairs=len(keys), states=len(per_state), unpaired=len(before.keys() ^ after.keys()),
        before=sum(bool(before[k]) for k in keys) / len(keys), after=sum(bool(after[k]) for k in keys) / len(keys),
        gains=gains, losses=losses, diff=diff, diff_low=lo, diff_high=hi, p_mcnemar=mcnemar_exact(gains, losses))


@dataclass(frozen=True)
class ValidationFall:
    """Where a run's validation fell below its earliest one (``validation_fall``).

    Iterations count RL iterations done before a validation (0: before RL). ``first`` is the
    earliest validation with fewer successes than the base at paired McNemar ``p < alpha`` (None: no
    such validation); ``lowest`` the validation with the lowest success rate (the earliest of ties).
    """

    base: int
    base_success: float  # fraction in [0, 1]
    first: int | None
    first_success: float | None
    first_p: float | None
    lowest: int
    lowest_success: float


def validation_fall(outcomes: Mapping[int, Mapping[tuple[int, int], bool]], alpha: float = 0.05) -> ValidationFall:
    """The first significant fall and the lowest point of a run's validations, against its earliest.

    Args:
        outcomes: ``{iteration: {(initial_seed, sample_idx): success}}`` (``validation_outcomes``).
        alpha: the McNemar p below which a fall counts.

    Raises:
        ValueError: no validation, or two that share no rollout.
    """
    if not outcomes:
        raise ValueError("no validation to compare")
    its = sorted(outcomes)
    base = outcomes[its[0]]
    rate = {it: sum(outcomes[it].values()) / len(outcomes[it]) for it in its}
    first = first_p = None
    for it in its[1:]:
        c = paired_comparison(base, outcomes[it])
        if c.losses > c.gains and c.p_mcnemar < alpha:
            first, first_p = it, c.p_mcnemar
            break
    lowest = min(its, key=lambda it: (rate[it], it))
    return ValidationFall(base=its[0], base_success=rate[its[0]], first=first,
                          first_success=None if first is None else rate[first], first_p=first_p,
                          lowest=lowest, lowest_success=rate[lowest])


def validation_outcomes(run_folder: str | os.PathLike, env: str) -> dict[int, dict[tuple[int, int], bool]]:
    """The stored validations of a run on ``env``: ``{iteration: {(initial_seed, sample_idx): success}}``.

    ``iteration`` is the number of RL iterations done before that validation (0: after the warm-up,
    before RL). Empty when the run stored none (runs made before validation rollouts were kept).
    """
    store = validation_store(run_folder, env)
    out: dict[int, dict[tuple[int, int], bool]] = {}
    for it in store.iterations():
        t = store.read([it], columns=[Col.INITIAL_SEED, Col.SAMPLE_IDX, Col.SUCCESS]).to_pydict()  # not the token lists
        out[it] = {(int(s), int(i)): bool(ok) for s, i, ok in
                   zip(t[Col.INITIAL_SEED], t[Col.SAMPLE_IDX], t[Col.SUCCESS], strict=True)}
    return out


# --------------------------------------------------------------------------------------------
# SVG charts
# --------------------------------------------------------------------------------------------


@dataclass
class Series:
    """One line of a chart: points ``(x, y)`` and an optional band ``(x, low, high)``."""

    name: str
    points: list[tuple[float, float]]
    band: list[tuple[float, float, float]] = field(default_factory=list)
    color: str = _SERIES_COLORS[0]


@dataclass
class Marker:
    """A vertical marker at ``x`` (an Echo-Trap alarm), with its hover text."""

    x: float
    label: str
    text: str


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + 1e-9 * step:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _fmt(v: float) -> str:
    """A short number for axes and tooltips."""
    if v == 0 or not math.isfinite(v):
        return f"{v:g}"
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"


def line_chart(series: Sequence[Series], *, title: str, x_label: str = "iteration",
               x_range: tuple[float, float] | None = None, y_range: tuple[float, float] | None = None,
               markers: Sequence[Marker] = (), width: int = 560, height: int = 210) -> str:
    """An SVG line chart (points as circles with hover titles, bands as shaded areas).

    Args:
        series: the lines; a series without points is left out of the chart and its legend.
        title: shown above the plot.
        x_range, y_range: axis ranges (default: the data's, y padded by 5%).
        markers: vertical dashed lines (Echo-Trap alarms).
        width, height: the SVG's view box in pixels (it scales to the page width).

    Returns:
        An ``<svg>`` element (a "no data" note when no series has points).
    """
    series = [s for s in series if s.points]
    if not series:
        return f'<div class="nodata"><b>{html.escape(title)}</b>: no data recorded</div>'
    xs = [x for s in series for x, _ in s.points] + [m.x for m in markers]
    ys = [y for s in series for _, y in s.points] + [v for s in series for _, lo, hi in s.band for v in (lo, hi)]
    x0, x1 = x_range or (min(xs), max(xs))
    if x1 <= x0:
        x0, x1 = x0 - 0.5, x1 + 0.5
    if y_range is not None:
        y0, y1 = y_range
    else:
        y0, y1 = min(ys), max(ys)
        pad = (y1 - y0) * 0.05 or max(abs(y0) * 0.05, 0.05)
        y0, y1 = y0 - pad, y1 + pad
    left, right, top, bottom = 52, 12, 24, 30
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + (1 - (min(max(y, y0), y1) - y0) / (y1 - y0)) * ph

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
           f'<text class="title" x="{left}" y="15">{html.escape(title)}</text>']
    for t in _nice_ticks(y0, y1, 4):
        out.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}"/>'
                   f'<text class="tick" x="{left - 4}" y="{sy(t) + 3:.1f}" text-anchor="end">{_fmt(t)}</text>')
    x_ticks = [t for t in _nice_ticks(x0, x1, 6) if abs(t - round(t)) < 1e-9]  # iterations are integers
    for t in x_ticks if len(x_ticks) > 1 else range(math.ceil(x0), math.floor(x1) + 1):
        out.append(f'<text class="tick" x="{sx(t):.1f}" y="{top + ph + 13}" text-anchor="middle">{_fmt(t)}</text>')
    out.append(f'<rect class="frame" x="{left}" y="{top}" width="{pw}" height="{ph}"/>')
    out.append(f'<text class="axis" x="{left + pw / 2:.0f}" y="{height - 3}" text-anchor="middle">'
               f'{html.escape(x_label)}</text>')
    at_x: dict[float, int] = {}
    for m in markers:
        k = at_x[m.x] = at_x.get(m.x, -1) + 1  # labels of alarms at one iteration stack downwards
        out.append(f'<g class="alarm"><title>{html.escape(m.text)}</title>'
                   f'<line x1="{sx(m.x):.1f}" x2="{sx(m.x):.1f}" y1="{top}" y2="{top + ph}"/>'
                   f'<text x="{sx(m.x) + 2:.1f}" y="{top + 9 + 10 * k}">{html.escape(m.label)}</text></g>')
    for s in series:
        if s.band:
            upper = " L ".join(f"{sx(x):.1f} {sy(hi):.1f}" for x, _, hi in s.band)
            lower = " L ".join(f"{sx(x):.1f} {sy(lo):.1f}" for x, lo, _ in reversed(s.band))
            out.append(f'<path class="band" d="M {upper} L {lower} Z" fill="{s.color}"/>')
        d = " L ".join(f"{sx(x):.1f} {sy(y):.1f}" for x, y in s.points)
        out.append(f'<path class="series" d="M {d}" stroke="{s.color}" data-name="{html.escape(s.name)}"/>')
        bands = {x: (lo, hi) for x, lo, hi in s.band}
        for x, y in s.points:
            tip = f"{s.name} @ {_fmt(x)}: {_fmt(y)}"
            if x in bands:
                tip += f" (95% interval {_fmt(bands[x][0])} .. {_fmt(bands[x][1])})"
            out.append(f'<circle class="pt" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6" fill="{s.color}">'
                       f'<title>{html.escape(tip)}</title></circle>')
    if len(series) > 1:
        lx = left + 8
        for s in series:
            out.append(f'<rect x="{lx}" y="{top + 5}" width="10" height="3" fill="{s.color}"/>'
                       f'<text class="legend" x="{lx + 13}" y="{top + 10}">{html.escape(s.name)}</text>')
            lx += 18 + 6 * len(s.name)
    out.append("</svg>")
    return "".join(out)


def stacked_bars(rows: Sequence[tuple[float, Sequence[float]]], names: Sequence[str], *, title: str,
                 colors: Sequence[str] = _STAGE_COLORS, width: int = 560, height: int = 230) -> str:
    """An SVG stacked bar chart: one bar per x with one segment per name (seconds).

    Args:
        rows: ``(x, values)`` per bar; ``values`` aligned with ``names`` (missing: 0).
        names: segment names, bottom to top.
        title: shown above the plot.
    """
    if not rows:
        return f'<div class="nodata"><b>{html.escape(title)}</b>: no data recorded</div>'
    left, right, top, bottom = 52, 12, 24, 44
    pw, ph = width - left - right, height - top - bottom
    ymax = max(sum(v) for _, v in rows) or 1.0
    ymax *= 1.05
    slot = pw / len(rows)
    bw = max(1.0, slot * 0.8)
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
           f'<text class="title" x="{left}" y="15">{html.escape(title)}</text>']
    for t in _nice_ticks(0, ymax, 4):
        y = top + (1 - t / ymax) * ph
        out.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text class="tick" x="{left - 4}" y="{y + 3:.1f}" text-anchor="end">{_fmt(t)}</text>')
    every = max(1, math.ceil(len(rows) / 12))
    for i, (x, values) in enumerate(rows):
        bx, acc = left + i * slot + (slot - bw) / 2, 0.0
        for j, v in enumerate(values):
            if v <= 0:
                continue
            y, h = top + (1 - (acc + v) / ymax) * ph, v / ymax * ph
            out.append(f'<rect class="seg" x="{bx:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                       f'fill="{colors[j % len(colors)]}"><title>{html.escape(names[j])} @ {_fmt(x)}: '
                       f'{v:.3f} s</title></rect>')
            acc += v
        if i % every == 0:
            out.append(f'<text class="tick" x="{bx + bw / 2:.1f}" y="{top + ph + 13}" text-anchor="middle">'
                       f'{_fmt(x)}</text>')
    out.append(f'<rect class="frame" x="{left}" y="{top}" width="{pw}" height="{ph}"/>')
    lx, ly = left, height - 18
    for j, name in enumerate(names):
        if lx + 12 + 6 * len(name) > width - right:  # wrap the legend
            lx, ly = left, ly + 12
        out.append(f'<rect x="{lx}" y="{ly - 7}" width="9" height="9" fill="{colors[j % len(colors)]}"/>'
                   f'<text class="legend" x="{lx + 12}" y="{ly + 1}">{html.escape(name)}</text>')
        lx += 20 + 6 * len(name)
    out.append(f'<text class="axis" x="14" y="{top + ph / 2:.0f}" transform="rotate(-90 14 {top + ph / 2:.0f})" '
               'text-anchor="middle">seconds</text>')
    out.append("</svg>")
    return "".join(out)


# --------------------------------------------------------------------------------------------
# report sections
# --------------------------------------------------------------------------------------------


def _series_of(steps: Sequence[Mapping[str, float]], key: str) -> list[tuple[float, float]]:
    return [(float(i), float(m[key])) for i, m in enumerate(steps) if key in m and _finite(m[key])]


def _rollout_curves(table: Any, steps: Sequence[Mapping[str, float]]) -> tuple[Series, Series]:
    """Rollout success (Wilson) and return (mean ± 1.96 se) per iteration, from the stored episodes;
    from the logged means (no interval) when the run has no trajectories."""
    succ = Series("rollout success", [], color=_SERIES_COLORS[0])
    ret = Series("rollout return", [], color=_SERIES_COLORS[1])
    if table is not None and table.num_rows:
        its = table[Col.ITERATION].to_numpy()
        ok = table[Col.SUCCESS].to_numpy(zero_copy_only=False).astype(float)
        returns = table[Col.EPISODE_RETURN].to_numpy()
        for it in np.unique(its):
            sel = its == it
            n, k = int(sel.sum()), float(ok[sel].sum())
            lo, hi = wilson_interval(k, n)
            succ.points.append((float(it), k / n))
            succ.band.append((float(it), lo, hi))
            m, lo, hi = mean_interval(returns[sel])
            ret.points.append((float(it), m))
            ret.band.append((float(it), lo, hi))
        return succ, ret
    succ.points = _series_of(steps, "rollout/success")
    ret.points = _series_of(steps, "rollout/return_mean")
    return succ, ret


def _val_curves(hist: History, val_episodes: int | None) -> list[Series]:
    """``val/<env>/success`` per validation env (the final validation included), with a Wilson
    interval from ``val_episodes``, else the recorded half-width ``success_ci95``."""
    rows = [(float(i), m) for i, m in enumerate(hist.steps)]
    if hist.final and hist.final_step is not None:
        rows.append((float(hist.final_step), hist.final))
    keys = sorted({k for _, m in rows for k in m if k.startswith("val/") and k.endswith("/success")})
    out = []
    for j, key in enumerate(keys):
        s = Series(key.removeprefix("val/").removesuffix("/success"), [],
                   color=_SERIES_COLORS[(j + 2) % len(_SERIES_COLORS)])
        for x, m in rows:
            if key not in m:
                continue
            p = float(m[key])
            s.points.append((x, p))
            half = m.get(key.replace("/success", "/success_ci95"))
            if val_episodes:
                s.band.append((x, *wilson_interval(p * val_episodes, val_episodes)))
            elif half is not None:
                s.band.append((x, max(0.0, p - half), min(1.0, p + half)))
        out.append(s)
    return out


def echo_alarms(steps: Sequence[Mapping[str, float]], replay: bool = False) -> list[tuple[int, str, str]]:
    """The Echo-Trap alarms of a run: ``(step, signal, message)`` where a signal switched on.

    The steps come from the logged ``echo/<signal>`` flags (a 0 -> 1 change); the monitor replayed
    over the history supplies the messages, and the steps too for a signal the history has no flag
    of (a run logged before that signal existed). With ``replay`` the logged flags are ignored and
    every signal comes from the current monitor (a run logged under older thresholds); the
    ``echo/mi_*`` values it reads stay.
    """
    if replay:
        flags = {FLAG_PREFIX + name for name in SIGNALS}
        steps = [{k: v for k, v in m.items() if k not in flags} for m in steps]
    replayed: dict[tuple[int, str], str] = {}
    monitor = EchoTrapMonitor()
    for i, m in enumerate(steps):
        for sig in monitor.update(m, step=i):
            replayed[(sig.step, sig.name)] = sig.message
    out = []
    for name in SIGNALS:
        if not any(FLAG_PREFIX + name in m for m in steps):
            out += [(s, n, msg) for (s, n), msg in replayed.items() if n == name]
            continue
        prev = 0.0
        for i, m in enumerate(steps):
            on = m.get(FLAG_PREFIX + name)
            if on is None:
                continue
            if on > 0.5 >= prev:
                out.append((i, name, replayed.get((i, name), f"[echo-trap] step {i}: {name} switched on")))
            prev = on
    return sorted(out)


def _time_rows(steps: Sequence[Mapping[str, float]]) -> tuple[list[str], list[tuple[float, list[float]]]]:
    """Stacked stage times per iteration: ``(names, [(iteration, seconds per name)])``; "other" is
    ``time/iteration`` minus the stages (RLlib's and the session's own work)."""
    present = [s for s in STAGES if any(f"time/{s}" in m for m in steps)]
    present += sorted({k[5:] for m in steps for k in m if k.startswith("time/")}
                      - set(STAGES) - set(SUBSTAGES) - {"iteration", "warmup_step"})
    rows = []
    for i, m in enumerate(steps):
        vals = [float(m.get(f"time/{s}", 0.0)) for s in present]
        if not any(vals):
            continue
        total = float(m.get("time/iteration", sum(vals)))
        rows.append((float(i), vals + [max(0.0, total - sum(vals))]))
    return present + ["other"], rows


def _time_table(steps: Sequence[Mapping[str, float]], names: Sequence[str],
                rows: Sequence[tuple[float, Sequence[float]]]) -> str:
    if not rows:
        return ""
    totals = np.sum([v for _, v in rows], axis=0)
    grand = float(totals.sum()) or 1.0
    lines = ['<table class="times"><tr><th>stage</th><th>mean s / iteration</th><th>total s</th>'
             '<th>share</th></tr>']
    for j, name in enumerate(names):
        lines.append(f'<tr><td><span class="swatch" style="background:{_STAGE_COLORS[j % len(_STAGE_COLORS)]}">'
                     f'</span>{html.escape(name)}</td><td>{totals[j] / len(rows):.3f}</td><td>{totals[j]:.2f}</td>'
                     f'<td>{100 * totals[j] / grand:.1f}%</td></tr>')
        for sub, parent in SUBSTAGES.items():
            vals = [float(m[f"time/{sub}"]) for m in steps if f"time/{sub}" in m]
            if parent == name and vals:
                lines.append(f'<tr class="sub"><td>&nbsp;&nbsp;of which {sub}</td><td>{np.mean(vals):.3f}</td>'
                             f'<td>{np.sum(vals):.2f}</td><td>{100 * np.sum(vals) / grand:.1f}%</td></tr>')
    lines.append(f'<tr class="total"><td>iteration</td><td>{grand / len(rows):.3f}</td><td>{grand:.2f}</td>'
                 '<td>100%</td></tr></table>')
    return "".join(lines)


# --------------------------------------------------------------------------------------------
# episodes
# --------------------------------------------------------------------------------------------

_CELL_COLORS = (("fell", "#7b2d26"), ("player on", "#f4a261"), ("box on", "#6a994e"), ("player", "#e4572e"),
                ("box", "#b5651d"), ("hole", "#1d3557"), ("wall", "#4a4a4a"), ("goal", "#2a9d8f"),
                ("target", "#2a9d8f"))


def _cell_color(meaning: str) -> str:
    """Background of a grid cell by what its symbol means (the first keyword found, in order)."""
    low = meaning.lower()
    return next((c for word, c in _CELL_COLORS if word in low), "#e9eef5")


def _legend_of(env: str, variant: str, env_config: Mapping[str, Any]) -> dict[str, list[str]]:
    """``{symbol: [meaning, colour]}`` of a grid env (empty for text envs or an unknown env)."""
    from ragen_rllib.envs import make_env

    # The run's env_config may be for another env (a validation env), the variant unknown here:
    # fall back to the env's defaults; a report never fails on an env it cannot build.
    for var, cfg in ((variant or None, dict(env_config)), (variant or None, {}), (None, {})):
        try:
            legend = make_env(env, variant=var, **cfg).symbol_legend or {}
        except Exception:
            continue
        return {sym: [meaning, _cell_color(meaning)] for sym, meaning in legend.items()}
    return {}


def _pick_iterations(iterations: Sequence[int], k: int) -> list[int]:
    """At most ``k`` iterations, evenly spaced, the first and the last always included."""
    its = sorted(set(int(i) for i in iterations))
    if len(its) <= k:
        return its
    idx = sorted({round(j * (len(its) - 1) / (k - 1)) for j in range(k)}) if k > 1 else [len(its) - 1]
    return [its[j] for j in idx]


def _load_decoder(run_folder: Path, config: Mapping[str, Any]) -> Callable[[list[int]], list[str]] | None:
    """Token id -> text piece, from the run's exported tokenizer (else the model folder's), or None."""
    candidates = [run_folder / "hf_model" / "tokenizer.json"]
    model = (config.get("starpo") or {}).get("model")
    if model:
        candidates.append(Path(str(model)) / "tokenizer.json")
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    tok = Tokenizer.from_file(str(path))
    return lambda ids: tok.decode_batch([[i] for i in ids], skip_special_tokens=False)


def _group_std(returns: Sequence[float]) -> float:
    """Unbiased std of a group's raw returns (what the StarPO-S filter ranks by); 0 for one sample."""
    return float(np.std(returns, ddof=1)) if len(returns) > 1 else 0.0


def _round(x: float, digits: int = 4) -> float | None:
    return round(float(x), digits) if _finite(x) else None


def episode_data(table: Any, *, legend: Callable[[str, str], dict[str, list[str]]],
                 decode: Callable[[list[int]], list[str]] | None, max_iterations: int = 12,
                 max_episodes_per_iteration: int = 32) -> dict[str, Any]:
    """The episode browser's data (JSON-able): iterations -> groups -> episodes -> turns.

    Per iteration up to ``max_episodes_per_iteration`` episodes, as whole groups, kept and dropped
    groups alternating (so both kinds show); up to ``max_iterations`` iterations (first and last
    included). Each turn carries its sampled token ids (``tok``) and their advantages (``adv``,
    None where the row has none), ``vocab`` maps the ids to text pieces.
    """
    data: dict[str, Any] = {"iterations": [], "legends": {}, "vocab": {}, "adv_scale": 0.0,
                            "has_adv": False, "total_iterations": 0}
    if table is None or table.num_rows == 0:
        return data
    its = table[Col.ITERATION].to_numpy()
    data["total_iterations"] = int(len(np.unique(its)))
    ids_seen: set[int] = set()
    abs_adv: list[float] = []
    for it in _pick_iterations(its.tolist(), max_iterations):
        rows = table.filter(its == it).to_pylist()
        groups: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(int(r[Col.GROUP_ID]), []).append(r)
        kept = [g for g, rs in groups.items() if rs[0][Col.KEPT]]
        dropped = [g for g in groups if g not in kept]
        order = [g for pair in zip(kept, dropped, strict=False) for g in pair]
        order += kept[len(order) // 2:] + dropped[len(order) // 2:]
        budget, out_groups = max_episodes_per_iteration, []
        for g in order:
            rs = sorted(groups[g], key=lambda r: r[Col.SAMPLE_IDX])
            if out_groups and len(rs) > budget:
                break
            budget -= len(rs)
            out_groups.append(_group_json(g, rs, legend, ids_seen, abs_adv))
        out_groups.sort(key=lambda grp: grp["gid"])
        data["iterations"].append({"it": int(it), "groups": out_groups, "n_groups": len(groups),
                                   "n_episodes": len(rows)})
    if abs_adv:
        data["has_adv"] = True
        data["adv_scale"] = float(np.quantile(abs_adv, 0.98)) or float(max(abs_adv)) or 1.0
    ids = sorted(ids_seen)
    if decode is not None and ids:
        data["vocab"] = {str(i): p for i, p in zip(ids, decode(ids), strict=True)}
    for grp in (g for it in data["iterations"] for g in it["groups"]):
        for ep in grp["episodes"]:
            data["legends"].setdefault(ep["env"], legend(*ep["env"].split(":", 1)))
    return data


def _group_json(gid: int, rows: list[dict[str, Any]], legend: Callable[[str, str], dict[str, list[str]]],
                ids_seen: set[int], abs_adv: list[float]) -> dict[str, Any]:
    """One group of ``episode_data``: its filter decision, in-group std, and episodes turn by turn."""
    returns = [float(r[Col.EPISODE_RETURN]) for r in rows]
    episodes = []
    for r in rows:
        tok, mask, turn = r[Col.TOKEN_IDS], r[Col.LOSS_MASK], r[Col.TOKEN_TURN]
        adv = r.get(Col.TOKEN_ADVANTAGES)
        turns = []
        for k in range(int(r[Col.NUM_TURNS])):
            pos = [j for j in range(len(tok)) if mask[j] and turn[j] == k]
            ids_seen.update(tok[j] for j in pos)
            a = None
            if adv is not None:
                a = [_round(adv[j]) for j in pos]
                abs_adv.extend(abs(float(adv[j])) for j in pos)
            turns.append({"state": r[Col.TURN_STATES][k], "reply": r[Col.TURN_RESPONSES][k],
                          "r": _round(r[Col.TURN_REWARDS][k]), "env_r": _round(r[Col.TURN_ENV_REWARDS][k]),
                          "pen": _round(r[Col.TURN_PENALTIES][k]), "wf": bool(r[Col.TURN_WELL_FORMED][k]),
                          "finish": r[Col.TURN_FINISH][k], "tok": [tok[j] for j in pos], "adv": a})
        episodes.append({"s": int(r[Col.SAMPLE_IDX]), "env": f"{r[Col.ENV_NAME]}:{r[Col.ENV_VARIANT]}",
                         "ret": _round(r[Col.EPISODE_RETURN]), "score": _round(r[Col.SCORE]),
                         "success": bool(r[Col.SUCCESS]), "terminated": bool(r[Col.TERMINATED]),
                         "truncated": bool(r[Col.TRUNCATED]), "final": r[Col.FINAL_STATE],
                         "version": int(r[Col.POLICY_VERSION]), "seed": int(r[Col.INITIAL_SEED]),
                         "turns": turns})
    kept = rows[0][Col.KEPT]
    return {"gid": int(gid), "kept": None if kept is None else bool(kept), "std": _round(_group_std(returns)),
            "returns": [_round(x) for x in returns], "episodes": episodes}


# --------------------------------------------------------------------------------------------
# the page
# --------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _read_trajectories(run_folder: Path) -> Any:
    """The run's stored trajectories (one table), or None when it stored none."""
    if not (run_folder / TRAJECTORIES_DIR).is_dir():
        return None
    return read_run(run_folder)


def build_report(run_folder: str | os.PathLike, *, max_iterations: int = 12, max_episodes_per_iteration: int = 32,
                 decode: Callable[[list[int]], list[str]] | None = None) -> str:
    """Build the report HTML of a run folder (see the module docstring).

    Args:
        run_folder: ``<run_dir>/<run_name>``.
        max_iterations: iterations shown in the episode browser (evenly spaced).
        max_episodes_per_iteration: episodes per shown iteration (whole groups).
        decode: token ids -> text pieces; default: the run's tokenizer when there is one.

    Returns:
        The page, one self-contained HTML document.

    Raises:
        FileNotFoundError: ``run_folder`` is not a directory.
    """
    folder = Path(run_folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"run folder {folder} does not exist")
    hist = read_history(folder)
    config = _read_json(folder / "resume.json").get("config") or {}
    protocol = _read_json(folder / _EVAL_PROTOCOL)
    starpo = config.get("starpo") or {}
    table = _read_trajectories(folder)
    decode = decode or _load_decoder(folder, config)
    env_config = starpo.get("env_config") or protocol.get("env_config") or {}

    def legend(env: str, variant: str) -> dict[str, list[str]]:
        return _legend_of(env, variant, env_config)

    steps = hist.steps
    last_stored = max(table[Col.ITERATION].to_pylist()) if table is not None and table.num_rows else 0
    x_range = (0.0, float(max(len(steps) - 1, last_stored, hist.final_step or 0, 1)))

    succ, ret = _rollout_curves(table, steps)
    val_n = None
    vg, vs = protocol.get("val_groups", starpo.get("val_groups")), protocol.get("val_group_size",
                                                                                 starpo.get("val_group_size"))
    if vg and vs:
        val_n = int(vg) * int(vs)
    vals = _val_curves(hist, val_n)
    alarms = echo_alarms(steps)
    markers = [Marker(s, name.replace("_", " "), msg) for s, name, msg in alarms]
    curves = [
        line_chart(vals, title="Validation success (Wilson 95% interval)", x_range=x_range, y_range=(0.0, 1.0)),
        line_chart([succ], title="Rollout success per iteration (Wilson 95% interval)", x_range=x_range,
                   y_range=(0.0, 1.0)),
        line_chart([ret], title="Rollout return per iteration (mean ± 1.96 se)", x_range=x_range),
    ]
    echo = [line_chart([Series(k, _series_of(steps, k), color=_SERIES_COLORS[j]) for j, k in enumerate(keys)],
                       title=title, x_range=x_range, markers=markers) for title, keys in ECHO_PANELS]
    names, time_rows = _time_rows(steps)
    episodes = episode_data(table, legend=legend, decode=decode, max_iterations=max_iterations,
                            max_episodes_per_iteration=max_episodes_per_iteration)
    return _page(folder.name, config, hist, curves, echo, alarms,
                 stacked_bars(time_rows, names, title="Seconds per iteration, by stage"),
                 _time_table(steps, names, time_rows), episodes)


def write_report(run_folder: str | os.PathLike, **kwargs: Any) -> Path:
    """Build the report (``build_report``) and write it to ``<run_folder>/report.html`` atomically.

    Returns:
        The report's path.
    """
    folder = Path(run_folder)
    page = build_report(folder, **kwargs)
    out = folder / REPORT_FILE
    tmp = folder / f".{REPORT_FILE}.{os.getpid()}.tmp"
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return out


def _summary_cards(config: Mapping[str, Any], hist: History, alarms: Sequence[tuple[int, str, str]]) -> str:
    starpo = config.get("starpo") or {}
    cards = [("env", starpo.get("env", "?")), ("preset", config.get("preset", "?")),
             ("model", Path(str(starpo.get("model", "?"))).name),
             ("iterations", f"{len(hist.steps)} of {config.get('iterations', '?')}")]
    last = hist.steps[-1] if hist.steps else {}
    if "rollout/success" in last:
        cards.append(("last rollout success", f"{last['rollout/success']:.3f}"))
    for k, v in sorted(hist.final.items()):
        if k.endswith("/success"):
            half = hist.final.get(k.replace("/success", "/success_ci95"))
            cards.append((f"final {k}", f"{v:.3f}" + (f" ± {half:.3f}" if half is not None else "")))
    cards.append(("Echo-Trap alarms", str(len(alarms))))
    return "".join(f'<div class="card"><div class="k">{html.escape(str(k))}</div>'
                   f'<div class="v">{html.escape(str(v))}</div></div>' for k, v in cards)


def _alarm_table(alarms: Sequence[tuple[int, str, str]]) -> str:
    if not alarms:
        return '<p class="note">No Echo-Trap signal switched on in this run.</p>'
    rows = "".join(f'<tr><td>{s}</td><td>{html.escape(n)}</td><td>{html.escape(m)}</td></tr>' for s, n, m in alarms)
    return f'<table class="alarms"><tr><th>iteration</th><th>signal</th><th>message</th></tr>{rows}</table>'


def _json_script(obj: Any) -> str:
    """JSON for an inline ``<script type="application/json">`` ("<" escaped: no early ``</script>``)."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def _page(name: str, config: Mapping[str, Any], hist: History, curves: Sequence[str], echo: Sequence[str],
          alarms: Sequence[tuple[int, str, str]], time_chart: str, time_table: str, episodes: dict[str, Any]) -> str:
    shown = len(episodes["iterations"])
    ep_note = (f"{shown} of {episodes['total_iterations']} iterations shown." if episodes["iterations"]
               else "This run stored no trajectories.")
    adv_note = ("Token colours: the advantage each sampled token had in the update "
                "(green positive, red negative; hover a token for its value)." if episodes["has_adv"] else
                "No token advantages are stored for the shown episodes (dropped groups, or a run written "
                "before they were stored): the reply tokens are shown uncoloured.")
    return _TEMPLATE.format(
        title=html.escape(f"{name}: run report"),
        name=html.escape(name),
        generated=html.escape(time.strftime("%Y-%m-%d %H:%M:%S")),
        css=_CSS,
        cards=_summary_cards(config, hist, alarms),
        curves="".join(f'<div class="panel">{c}</div>' for c in curves),
        echo="".join(f'<div class="panel">{c}</div>' for c in echo),
        alarms=_alarm_table(alarms),
        time_chart=time_chart,
        time_table=time_table,
        ep_note=html.escape(ep_note),
        adv_note=html.escape(adv_note),
        data=_json_script(episodes),
        js=_JS,
    )


def _finite(x: object) -> bool:
    try:
        return math.isfinite(float(x))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#243447;color:#fff;padding:12px 20px}header h1{font-size:20px;margin:0}
header .meta{font-size:12px;opacity:.8}nav{display:flex;gap:14px;padding:6px 20px;background:#e8edf3;
font-size:13px;position:sticky;top:0;z-index:2}nav a{color:#243447}
main{padding:8px 20px 40px}h2{font-size:17px;border-bottom:1px solid #ccd;padding-bottom:3px;margin-top:26px}
.cards{display:flex;flex-wrap:wrap;gap:8px}.card{background:#fff;border:1px solid #dde;border-radius:6px;
padding:6px 10px;min-width:110px}.card .k{font-size:11px;color:#667}.card .v{font-size:15px;font-weight:600}
.grid2{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:10px}
.panel{background:#fff;border:1px solid #dde;border-radius:6px;padding:4px}
svg.chart{width:100%;height:auto;display:block}svg .title{font-size:12px;font-weight:600}
svg .tick,svg .axis,svg .legend{font-size:10px;fill:#555}svg .grid{stroke:#eee}
svg .frame{fill:none;stroke:#bbb}svg .series{fill:none;stroke-width:1.6}svg .band{opacity:.18;stroke:none}
svg .alarm line{stroke:#d00;stroke-dasharray:4 3;stroke-width:1.2}svg .alarm text{font-size:9px;fill:#d00}
.nodata{padding:20px;color:#888;font-size:13px}.note{font-size:13px;color:#555}
table{border-collapse:collapse;font-size:12px;background:#fff}td,th{border:1px solid #dde;padding:3px 7px;
text-align:left;vertical-align:top}tr.sub td{color:#666}tr.total td{font-weight:600}
.swatch{display:inline-block;width:10px;height:10px;margin-right:5px}
#browser{display:grid;grid-template-columns:330px 1fr;gap:12px;align-items:start}
#groups{max-height:75vh;overflow:auto}.group{background:#fff;border:1px solid #dde;border-radius:6px;
margin-bottom:6px;padding:4px 6px;font-size:12px}.group.dropped{opacity:.75;border-style:dashed}
.badge{border-radius:3px;padding:0 4px;font-size:11px;margin-left:4px}.badge.kept{background:#d8f3dc;color:#1b4332}
.badge.dropped{background:#f8d7da;color:#842029}.badge.na{background:#eee;color:#555}
button.episode{display:block;width:100%;text-align:left;border:0;background:#f1f4f8;margin:2px 0;
padding:3px 5px;cursor:pointer;font-size:12px;border-radius:3px}button.episode:hover{background:#dde7f3}
button.episode.sel{background:#243447;color:#fff}.ok{color:#2a9d8f;font-weight:600}
#episode-detail{background:#fff;border:1px solid #dde;border-radius:6px;padding:8px 12px;min-height:200px}
.turn{border-top:1px solid #eee;padding:8px 0;display:grid;grid-template-columns:auto 1fr;gap:12px}
.turn h4{margin:0 0 4px;font-size:13px}pre{white-space:pre-wrap;word-break:break-word;margin:0;
font-size:12px;background:#f6f8fa;padding:4px 6px;border-radius:4px}
table.cells{border-collapse:collapse}table.cells td{width:22px;height:22px;text-align:center;padding:0;
font:bold 13px monospace;color:#fff;border:1px solid #fff}.heat{font:12px monospace;line-height:1.9;
white-space:pre-wrap;word-break:break-all}.tok{border-radius:2px;padding:1px 0}
.legendline{font-size:11px;color:#555;margin:4px 0}.reward{font-size:12px;margin-top:4px}
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{css}</style></head>
<body><header><h1>{name}</h1><div class="meta">ragen-rllib run report, generated {generated}</div></header>
<nav><a href="#curves">Learning curves</a><a href="#echo">Echo-Trap</a><a href="#time">Time</a>
<a href="#episodes">Episodes</a></nav>
<main>
<div class="cards">{cards}</div>
<h2 id="curves">Learning curves</h2>
<div class="grid2">{curves}</div>
<h2 id="echo">Echo-Trap dashboard</h2>
<p class="note">RAGEN's Echo Trap: in-group reward std falls before reward collapses; entropy and response
length shrink; grad-norm spikes mark irreversible collapse. Red dashed lines: the iterations where the
Echo-Trap monitor switched a signal on (hover for its message).</p>
<div class="grid2">{echo}</div>
{alarms}
<h2 id="time">Time per stage</h2>
<div class="grid2"><div class="panel">{time_chart}</div><div>{time_table}</div></div>
<h2 id="episodes">Episodes</h2>
<p class="note">{ep_note} Groups the StarPO-S filter kept are marked <span class="badge kept">kept</span>,
the others <span class="badge dropped">dropped</span> (not trained on). {adv_note}</p>
<div id="browser"><div><label>iteration <select id="it-select"></select></label>
<div id="groups"></div></div><div id="episode-detail"><p class="note">Pick an episode on the left.</p></div></div>
</main>
<script type="application/json" id="episode-data">{data}</script>
<script>{js}</script>
</body></html>
"""

_JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("episode-data").textContent);
  var sel = document.getElementById("it-select");
  var groupsDiv = document.getElementById("groups");
  var detail = document.getElementById("episode-detail");
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function fmt(x) { return x === null || x === undefined ? "n/a" : (Math.round(x * 1000) / 1000).toString(); }
  function badge(kept) {
    if (kept === true) { return el("span", "badge kept", "kept"); }
    if (kept === false) { return el("span", "badge dropped", "dropped"); }
    return el("span", "badge na", "no filter record");
  }
  // A text block as a grid when every line is as long as the first and every symbol is in the legend.
  function renderState(text, legend) {
    var lines = String(text).split("\n");
    var syms = Object.keys(legend || {});
    var isGrid = syms.length > 0 && lines.length > 1 && lines.every(function (ln) {
      return Array.from(ln).length === Array.from(lines[0]).length &&
        Array.from(ln).every(function (c) { return syms.indexOf(c) >= 0; });
    });
    if (!isGrid) { return el("pre", "obs", text); }
    var t = el("table", "cells grid-obs");
    lines.forEach(function (ln) {
      var tr = el("tr");
      Array.from(ln).forEach(function (c) {
        var td = el("td", null, c);
        td.style.background = legend[c][1];
        td.title = c + ": " + legend[c][0];
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
    return t;
  }
  function heat(turn) {
    var box = el("div", "heat");
    var scale = data.adv_scale || 1;
    turn.tok.forEach(function (id, j) {
      var piece = data.vocab[String(id)];
      var span = el("span", "tok", piece === undefined ? "\u27e8" + id + "\u27e9" : piece);
      var a = turn.adv ? turn.adv[j] : null;
      if (a !== null && a !== undefined) {
        var alpha = Math.min(1, Math.abs(a) / scale) * 0.85;
        span.style.background = a >= 0 ? "rgba(0,150,70," + alpha + ")" : "rgba(210,40,40," + alpha + ")";
      }
      span.title = "token " + id + (piece === undefined ? "" : " " + JSON.stringify(piece)) +
        ", advantage " + (a === null || a === undefined ? "n/a" : a);
      box.appendChild(span);
    });
    return box;
  }
  function showEpisode(it, grp, ep, button) {
    Array.prototype.forEach.call(document.querySelectorAll("button.episode.sel"), function (b) {
      b.classList.remove("sel");
    });
    if (button) { button.classList.add("sel"); }
    var legend = data.legends[ep.env] || {};
    detail.textContent = "";
    var h = el("h3", null, "iteration " + it.it + ", group " + grp.gid + ", sample " + ep.s + " (" + ep.env +
      ", policy v" + ep.version + ", seed " + ep.seed + ")");
    h.appendChild(badge(grp.kept));
    detail.appendChild(h);
    detail.appendChild(el("div", "reward", "return " + fmt(ep.ret) + ", score " + fmt(ep.score) + ", " +
      (ep.success ? "success" : "no success") + (ep.terminated ? ", terminated" : "") +
      (ep.truncated ? ", truncated" : "") + "; group returns [" + grp.returns.map(fmt).join(", ") +
      "], in-group std " + fmt(grp.std)));
    if (data.has_adv) {
      detail.appendChild(el("div", "legendline", "advantage colour scale: \u00b1" + fmt(data.adv_scale) +
        " = full colour" + (ep.turns.some(function (t) { return t.adv; }) ? "" :
        " (this episode has no advantages: its group was not trained on)")));
    }
    ep.turns.forEach(function (t, k) {
      var row = el("div", "turn");
      var left = el("div");
      left.appendChild(el("h4", null, "turn " + (k + 1) + ": observation"));
      left.appendChild(renderState(t.state, legend));
      var right = el("div");
      right.appendChild(el("h4", null, "reply"));
      right.appendChild(el("pre", "reply", t.reply));
      right.appendChild(el("h4", null, "sampled tokens (" + t.tok.length + ")"));
      right.appendChild(heat(t));
      right.appendChild(el("div", "reward", "reward " + fmt(t.r) + " (env " + fmt(t.env_r) + ", format penalty " +
        fmt(t.pen) + "), " + (t.wf ? "well-formed" : "malformed") + ", finish: " + t.finish));
      row.appendChild(left);
      row.appendChild(right);
      detail.appendChild(row);
    });
    var fin = el("div", "turn final");
    var fl = el("div");
    fl.appendChild(el("h4", null, "final state"));
    fl.appendChild(renderState(ep.final, legend));
    fin.appendChild(fl);
    detail.appendChild(fin);
  }
  function showIteration(i) {
    var it = data.iterations[i];
    groupsDiv.textContent = "";
    groupsDiv.appendChild(el("div", "note", it.groups.length + " of " + it.n_groups + " groups (" +
      it.n_episodes + " episodes in the iteration)"));
    it.groups.forEach(function (grp) {
      var g = el("div", "group" + (grp.kept === false ? " dropped" : ""));
      var head = el("div", null, "group " + grp.gid + " \u00b7 std " + fmt(grp.std));
      head.appendChild(badge(grp.kept));
      g.appendChild(head);
      grp.episodes.forEach(function (ep) {
        var b = el("button", "episode");
        b.type = "button";
        b.dataset.it = it.it; b.dataset.group = grp.gid; b.dataset.sample = ep.s;
        b.appendChild(document.createTextNode("sample " + ep.s + " \u00b7 return " + fmt(ep.ret) + " \u00b7 " +
          ep.turns.length + " turn(s) "));
        if (ep.success) { b.appendChild(el("span", "ok", "\u2713")); }
        b.addEventListener("click", function () { showEpisode(it, grp, ep, b); });
        g.appendChild(b);
      });
      groupsDiv.appendChild(g);
    });
  }
  data.iterations.forEach(function (it, i) {
    var o = el("option", null, "iteration " + it.it);
    o.value = String(i);
    sel.appendChild(o);
  });
  sel.addEventListener("change", function () { showIteration(Number(sel.value)); });
  if (data.iterations.length) { showIteration(0); }
})();
"""
