"""Trajectory data: one schema (schema.py), batches as ``pa.Table`` (batch.py), and the
per-iteration Parquet store (store.py). pyarrow + numpy only; torch only inside
``to_padded_tensors``.
"""

from ragen_rllib.trajectory.batch import (
    ATTENTION_MASK,
    empty_table,
    rows_to_table,
    table_to_rows,
    take_groups,
    to_padded_tensors,
    validate_table,
    with_kept,
    with_token_advantages,
)
from ragen_rllib.trajectory.schema import SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY, TOKEN_ALIGNED, TURN_ALIGNED, Col
from ragen_rllib.trajectory.store import TrajectoryStore, list_runs, read_run

__all__ = [
    "ATTENTION_MASK",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SCHEMA_VERSION_KEY",
    "TOKEN_ALIGNED",
    "TURN_ALIGNED",
    "Col",
    "TrajectoryStore",
    "empty_table",
    "list_runs",
    "read_run",
    "rows_to_table",
    "table_to_rows",
    "take_groups",
    "to_padded_tensors",
    "validate_table",
    "with_kept",
    "with_token_advantages",
]
