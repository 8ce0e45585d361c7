"""Learning-curve PNGs (matplotlib, optional: without it plotting is skipped with a logged warning).

Uses ``matplotlib.figure.Figure`` with the Agg canvas directly, not ``pyplot``, so no global
backend or figure state is touched and it works headless and from any thread.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

History = Sequence[Mapping[str, float]] | Mapping[str, Sequence[tuple[int, float]]]


def to_series(history: History, keys: Sequence[str], step_key: str = "step") -> dict[str, list[tuple[int, float]]]:
    """Normalise a metric history to ``{key: [(step, value), ...]}``, sorted by step, finite values only.

    Args:
        history: either a list of per-iteration metric dicts (the step is ``d[step_key]`` when present,
            else the list index) or ``{key: [(step, value), ...]}`` (``mlflow_logger.get_metric_history``).
        keys: the metrics wanted; absent keys map to ``[]``.
        step_key: the step entry of the per-iteration dicts.
    """
    out: dict[str, list[tuple[int, float]]] = {k: [] for k in keys}
    if isinstance(history, Mapping):
        for k in keys:
            out[k] = [(int(s), float(v)) for s, v in history.get(k, ()) if _finite(v)]
    else:
        for i, row in enumerate(history):
            step = int(row.get(step_key, i))
            for k in keys:
                if k in row and _finite(row[k]):
                    out[k].append((step, float(row[k])))
    return {k: sorted(v, key=lambda sv: sv[0]) for k, v in out.items()}


def plot_curves(history: History, keys: Sequence[str], out_png: str | os.PathLike, title: str | None = None, *,
                smooth: float | None = None, step_key: str = "step") -> Path | None:
    """Plot one small panel per metric key (x = step) into a PNG.

    Args:
        history: see ``to_series``.
        keys: metrics to plot, one panel each, in this order; keys without data are skipped.
        out_png: output file (parent folders are created; written via a temp file, then renamed).
        title: figure title.
        smooth: if given, also draw an EMA with this weight of the newest value (0 < smooth <= 1),
            as the RAGEN paper's curves are EMA-smoothed.
        step_key: the step entry of per-iteration dicts.

    Returns:
        The PNG path, or None when matplotlib is not installed or no key has data.
    """
    if not have_matplotlib("learning-curve plot", out_png):
        return None
    if smooth is not None and not 0.0 < smooth <= 1.0:
        raise ValueError(f"plot_curves(smooth={smooth}): smooth must be in (0, 1]")
    series = to_series(history, keys, step_key)
    present = [k for k in keys if series[k]]
    if not present:
        logger.warning("no data for any of %s: skipping plot %s", list(keys), out_png)
        return None
    ncols = min(3, len(present))
    nrows = math.ceil(len(present) / ncols)
    fig = new_figure((4.2 * ncols, 3.0 * nrows))
    axes = list(fig.subplots(nrows, ncols, squeeze=False).flat)
    for ax, key in zip(axes, present, strict=False):
        steps, values = zip(*series[key], strict=False)
        ax.plot(steps, values, lw=1.0, marker="." if len(steps) < 30 else None, alpha=0.45 if smooth else 1.0)
        if smooth:
            ax.plot(steps, _ema(values, smooth), lw=1.5)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in axes[len(present):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=11)
    return save_png(fig, out_png)


def have_matplotlib(what: str, out_png: str | os.PathLike) -> bool:
    """True if matplotlib imports; else log that ``what`` (written to ``out_png``) is skipped."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        logger.warning("matplotlib is not installed: skipping %s %s", what, out_png)
        return False
    return True


def new_figure(figsize: tuple[float, float]) -> Any:
    """A matplotlib ``Figure`` on the Agg canvas (no GUI backend, thread-safe), 100 dpi."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Any, out_png: str | os.PathLike) -> Path:
    """Write ``fig`` as PNG via a temp file, then rename (readers never see half a file)."""
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, out)
    return out


def _ema(values: Sequence[float], alpha: float) -> list[float]:
    out, acc = [], None
    for v in values:
        acc = v if acc is None else alpha * v + (1.0 - alpha) * acc
        out.append(acc)
    return out


def _finite(x: object) -> bool:
    try:
        return math.isfinite(float(x))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
