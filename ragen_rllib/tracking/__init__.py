"""Experiment tracking: MLflow logging, Echo-Trap warning signals, learning-curve plots, and the
self-contained HTML run report (``tracking.report``, imported on its own).

Import-light: mlflow is imported only inside ``mlflow_logger``'s functions and matplotlib only
inside ``plots.plot_curves``; importing this package loads neither.
"""

from ragen_rllib.tracking.echo_trap import (
    SIGNALS,
    EchoTrapMonitor,
    EchoTrapSignal,
    identical_response_fraction,
)
from ragen_rllib.tracking.mlflow_logger import (
    MLflowTracker,
    default_tracking_uri,
    find_runs,
    flatten_config,
    flush_pending,
    get_git_commit,
    get_metric_history,
    sanitize_key,
)
from ragen_rllib.tracking.plots import plot_curves

__all__ = [
    "SIGNALS",
    "EchoTrapMonitor",
    "EchoTrapSignal",
    "MLflowTracker",
    "default_tracking_uri",
    "find_runs",
    "flatten_config",
    "flush_pending",
    "get_git_commit",
    "get_metric_history",
    "identical_response_fraction",
    "plot_curves",
    "sanitize_key",
]
