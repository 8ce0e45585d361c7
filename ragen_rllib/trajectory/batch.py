"""Trajectory batches as ``pa.Table`` (one row per trajectory): validation, row/table conversion,
group selection, and padding to tensors at the learner boundary.

A *trajectory table* is a ``pa.Table`` whose schema equals ``schema.SCHEMA`` (names, types and
the schema version in the metadata). Every function here takes and returns such tables; tables
are immutable, so each "update" returns a new table that shares the untouched columns.

Symbols (as in ``schema.py``): B trajectories, L tokens of one trajectory, T = max L over the
batch (padded length), K turns of one trajectory. Log-probs in nats.

pyarrow + numpy only; torch is imported lazily inside ``to_padded_tensors``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ragen_rllib.trajectory.schema import (
    SCHEMA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TOKEN_ALIGNED,
    TURN_ALIGNED,
    Col,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

#: Key of the (B, T) attention mask in ``to_padded_tensors``' output. A tensor key, not a column.
ATTENTION_MASK: Final = "attention_mask"

#: Columns that may hold nulls (everything else is required).
_NULLABLE: Final = frozenset(f.name for f in SCHEMA if f.nullable)
#: Columns of list type (their elements must not be null either).
_LIST_COLUMNS: Final = tuple(f.name for f in SCHEMA if pa.types.is_list(f.type))


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def validate_table(table: pa.Table) -> pa.Table:
    """Check that ``table`` is a well-formed trajectory table and return it in canonical form.

    Checks, in order:

    1. Schema: the same column names as ``SCHEMA`` (any order; the result is reordered) and the
       same types. Only metadata or nullability may differ; the result is cast to ``SCHEMA``
       (so it always carries the schema version).
    2. Schema version: if the table's metadata carries ``SCHEMA_VERSION_KEY`` it must equal
       ``SCHEMA_VERSION`` (a table without the key is accepted and stamped).
    3. No nulls in non-nullable columns, nor inside any list column.
    4. Per row: the token-aligned lists (``TOKEN_ALIGNED``) have one length L; the turn-aligned
       lists (``TURN_ALIGNED``) have length ``num_turns``; ``loss_mask`` values are in {0, 1};
       ``num_sampled_tokens == sum(loss_mask)``; ``sample_logprobs`` is 0 where ``loss_mask`` is
       0 and never NaN; ``token_advantages``, where not null, has length L and no NaN.

    Args:
        table: Candidate trajectory table, B rows.

    Returns:
        The same data with schema exactly ``SCHEMA`` (column order, nullability, metadata).

    Raises:
        ValueError: On the first violation; the message names the column and, for per-row
            checks, the row index (0-based, in ``table``'s row order).
    """
    if not isinstance(table, pa.Table):
        raise TypeError(f"expected a pyarrow.Table, got {type(table).__name__}")
    table = _conform_schema(table)
    _check_nulls(table)
    _check_row_invariants(table)
    return table


def _conform_schema(table: pa.Table) -> pa.Table:
    names, expected = set(table.schema.names), set(SCHEMA.names)
    if len(table.schema.names) != len(names):
        dup = sorted({n for n in table.schema.names if table.schema.names.count(n) > 1})
        raise ValueError(f"duplicate columns {dup}")
    if names != expected:
        raise ValueError(f"trajectory table columns differ from the schema: "
                         f"missing {sorted(expected - names)}, unexpected {sorted(names - expected)}")
    for field in SCHEMA:
        got = table.schema.field(field.name).type
        if not _same_type_up_to_nullability(got, field.type):
            raise ValueError(f"column {field.name!r} has type {got}, the schema says {field.type}")
    version = (table.schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    if version is not None and version.decode() != SCHEMA_VERSION:
        raise ValueError(f"schema metadata {SCHEMA_VERSION_KEY.decode()!r} is {version.decode()!r}, "
                         f"this code reads version {SCHEMA_VERSION!r}")
    table = table.select(SCHEMA.names)
    if table.schema.equals(SCHEMA, check_metadata=True):
        return table
    # Only nullability/metadata differ; nulls are checked next with a clearer message than cast's.
    columns = [col if col.type == field.type else col.cast(field.type)
               for col, field in zip(table.columns, SCHEMA, strict=False)]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def _same_type_up_to_nullability(got: pa.DataType, want: pa.DataType) -> bool:
    """Type equality that ignores the nullability of list elements (other writers differ there)."""
    if pa.types.is_list(got) and pa.types.is_list(want):
        return _same_type_up_to_nullability(got.value_type, want.value_type)
    return got == want


def _check_nulls(table: pa.Table) -> None:
    for name in SCHEMA.names:
        col = table[name]
        if name not in _NULLABLE and col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise ValueError(f"column {name!r} row {row}: null in a non-nullable column")
        if name in _LIST_COLUMNS:
            values = pc.list_flatten(col)
            if values.null_count:
                parents = pc.list_parent_indices(col).to_numpy()
                bad = np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0]
                raise ValueError(f"column {name!r} row {int(parents[bad])}: null list element")


def _first_row(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_row_invariants(table: pa.Table) -> None:
    if table.num_rows == 0:
        return
    lengths = _list_lengths(table[TOKEN_ALIGNED[0]])  # (B,) L per row
    for name in TOKEN_ALIGNED[1:]:
        other = _list_lengths(table[name])
        if (bad := other != lengths).any():
            row = _first_row(bad)
            raise ValueError(f"column {name!r} row {row}: length {other[row]} != "
                             f"{TOKEN_ALIGNED[0]!r} length {lengths[row]} (token-aligned columns)")
    num_turns = _np(table[Col.NUM_TURNS]).astype(np.int64)  # (B,) K per row
    if (bad := num_turns < 0).any():
        row = _first_row(bad)
        raise ValueError(f"column {Col.NUM_TURNS!r} row {row}: negative value {num_turns[row]}")
    for name in TURN_ALIGNED:
        turns = _list_lengths(table[name])
        if (bad := turns != num_turns).any():
            row = _first_row(bad)
            raise ValueError(f"column {name!r} row {row}: length {turns[row]} != "
                             f"{Col.NUM_TURNS!r} {num_turns[row]} (turn-aligned columns)")

    # Flattened token values: (sum L,), with parent row index of each element.
    mask = _np(pc.list_flatten(table[Col.LOSS_MASK]))
    parents = np.repeat(np.arange(table.num_rows), lengths)
    if (bad := mask > 1).any():
        i = _first_row(bad)
        raise ValueError(f"column {Col.LOSS_MASK!r} row {parents[i]}: value {mask[i]} not in {{0, 1}}")
    sampled = np.bincount(parents, weights=mask, minlength=table.num_rows).astype(np.int64)  # (B,)
    declared = _np(table[Col.NUM_SAMPLED_TOKENS]).astype(np.int64)
    if (bad := sampled != declared).any():
        row = _first_row(bad)
        raise ValueError(f"column {Col.NUM_SAMPLED_TOKENS!r} row {row}: {declared[row]} != "
                         f"sum({Col.LOSS_MASK}) {sampled[row]}")
    logprobs = _np(pc.list_flatten(table[Col.SAMPLE_LOGPROBS]))
    if (bad := np.isnan(logprobs)).any():
        raise ValueError(f"column {Col.SAMPLE_LOGPROBS!r} row {parents[_first_row(bad)]}: NaN log-prob")
    if (bad := (mask == 0) & (logprobs != 0)).any():
        i = _first_row(bad)
        raise ValueError(f"column {Col.SAMPLE_LOGPROBS!r} row {parents[i]}: {logprobs[i]} at a token with "
                         f"{Col.LOSS_MASK}=0 (must be 0 where the mask is 0)")
    _check_token_advantages(table, lengths)


def _check_token_advantages(table: pa.Table, lengths: np.ndarray) -> None:
    """``token_advantages`` (nullable per row): length L where present, never NaN."""
    col = table[Col.TOKEN_ADVANTAGES]
    if col.null_count == table.num_rows:
        return
    present = ~col.is_null().to_numpy(zero_copy_only=False)  # (B,)
    got = _list_lengths(col)
    if (bad := present & (got != lengths)).any():
        row = _first_row(bad)
        raise ValueError(f"column {Col.TOKEN_ADVANTAGES!r} row {row}: length {got[row]} != "
                         f"{Col.TOKEN_IDS!r} length {lengths[row]}")
    values = _np(pc.list_flatten(col))
    if (bad := np.isnan(values)).any():
        row = int(np.repeat(np.arange(table.num_rows), got)[_first_row(bad)])
        raise ValueError(f"column {Col.TOKEN_ADVANTAGES!r} row {row}: NaN advantage")


def _np(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Null-free primitive column -> numpy (copies only when the column has several chunks)."""
    return col.to_numpy() if isinstance(col, pa.ChunkedArray) else col.to_numpy(zero_copy_only=False)


def _list_lengths(col: pa.ChunkedArray) -> np.ndarray:
    """(B,) int64 lengths of a list column (nulls count as 0)."""
    return _np(pc.fill_null(pc.list_value_length(col), 0)).astype(np.int64)


# --------------------------------------------------------------------------------------------
# rows <-> table
# --------------------------------------------------------------------------------------------


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Build a validated trajectory table from one dict per trajectory.

    Args:
        rows: B mappings keyed by ``Col`` names. Every column is required except the nullable
            ones (``Col.KEPT``, ``Col.TOKEN_ADVANTAGES``), which default to null. List values may be Python lists or 1-D
            numpy arrays (converted to the schema's element type).

    Returns:
        A validated trajectory table with B rows, in the given order.

    Raises:
        ValueError: A row has an unknown key, misses a required column, holds None in one, or
            breaks an invariant of ``validate_table``. The message names the column and row.
    """
    known = set(SCHEMA.names)
    for i, row in enumerate(rows):
        if unknown := set(row) - known:
            raise ValueError(f"row {i}: unknown columns {sorted(unknown)}")
        for name in SCHEMA.names:
            if name not in _NULLABLE and row.get(name) is None:
                raise ValueError(f"column {name!r} row {i}: missing or None (the column is required)")
    table = pa.Table.from_pylist(list(rows), schema=SCHEMA)
    return validate_table(table)


def table_to_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Convert a trajectory table to one dict per row (lists as Python lists; inverse of
    ``rows_to_table``).

    Args:
        table: Trajectory table, B rows.

    Returns:
        B dicts keyed by ``Col`` names, in row order.
    """
    return table.to_pylist()


def empty_table() -> pa.Table:
    """Return a trajectory table with zero rows (schema ``SCHEMA``, version in the metadata)."""
    return SCHEMA.empty_table()


# --------------------------------------------------------------------------------------------
# group selection
# --------------------------------------------------------------------------------------------


def _group_mask(table: pa.Table, group_ids: Iterable[int]) -> pa.ChunkedArray:
    wanted = pa.array(np.unique(np.asarray(list(group_ids), dtype=np.int64)), pa.int64())
    present = pc.is_in(wanted, value_set=pc.unique(table[Col.GROUP_ID]))
    if len(wanted) and not pc.all(present).as_py():
        missing = pc.filter(wanted, pc.invert(present)).to_pylist()
        raise ValueError(f"{Col.GROUP_ID!r} values not in the table: {missing[:20]}")
    return pc.is_in(table[Col.GROUP_ID], value_set=wanted)


def take_groups(table: pa.Table, group_ids: Iterable[int]) -> pa.Table:
    """Keep only the rows whose ``group_id`` is in ``group_ids`` (row order preserved).

    Args:
        table: Trajectory table, B rows.
        group_ids: Group ids to keep (any order; duplicates ignored).

    Returns:
        The selected rows, schema unchanged.

    Raises:
        ValueError: A requested group id has no row in ``table`` (selecting a group that was
            never sampled is a bug upstream, not an empty selection).
    """
    return table.filter(_group_mask(table, group_ids))


def with_kept(table: pa.Table, kept_group_ids: Iterable[int]) -> pa.Table:
    """Set the ``kept`` column: true for rows whose group is in ``kept_group_ids``, false otherwise.

    Every row stays; this records the StarPO-S filter decision next to the data.

    Args:
        table: Trajectory table, B rows.
        kept_group_ids: Group ids the filter kept.

    Returns:
        The table with ``kept`` (bool, no nulls) replaced; all other columns and the metadata
        unchanged.

    Raises:
        ValueError: A kept group id has no row in ``table``.
    """
    kept = _group_mask(table, kept_group_ids)
    return table.set_column(table.schema.get_field_index(Col.KEPT), SCHEMA.field(Col.KEPT), kept)


def with_token_advantages(table: pa.Table, advantages: Sequence[np.ndarray | None]) -> pa.Table:
    """Set the ``token_advantages`` column: each row's per-token advantages, or null.

    Args:
        table: Trajectory table, B rows.
        advantages: B entries: a 1-D float array of at least the row's L values (the first L are
            kept, so rows of a (B, T) right-padded batch can be passed as they are; advantages at
            padding are dropped), or None for a row the update did not train on.

    Returns:
        The table with ``token_advantages`` replaced (float32); all other columns and the metadata
        unchanged.

    Raises:
        ValueError: ``advantages`` has not B entries, an entry is shorter than its row, or holds NaN.
    """
    if len(advantages) != table.num_rows:
        raise ValueError(f"{len(advantages)} advantage rows for a table of {table.num_rows} rows")
    lengths = _list_lengths(table[Col.TOKEN_IDS])  # (B,)
    values: list[np.ndarray | None] = []
    for row, (adv, n) in enumerate(zip(advantages, lengths, strict=True)):
        if adv is None:
            values.append(None)
            continue
        adv = np.asarray(adv, dtype=np.float32).reshape(-1)
        if adv.size < n:
            raise ValueError(f"row {row}: {adv.size} advantages for {n} tokens")
        if np.isnan(adv[:n]).any():
            raise ValueError(f"row {row}: NaN advantage")
        values.append(adv[:n])
    field = SCHEMA.field(Col.TOKEN_ADVANTAGES)
    return table.set_column(table.schema.get_field_index(Col.TOKEN_ADVANTAGES), field,
                            pa.array(values, type=field.type))


# --------------------------------------------------------------------------------------------
# learner boundary
# --------------------------------------------------------------------------------------------


def to_padded_tensors(table: pa.Table, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad the token-aligned columns to (B, T) tensors for the learner.

    T is the longest ``token_ids`` in the batch (0 for an empty table or all-empty rows).
    Padding positions hold ``pad_id`` in ``token_ids`` and 0 in every other (B, T) tensor.

    Args:
        table: Trajectory table, B rows (validate it first if it did not come from this package).
        pad_id: Token id written at padding positions of ``token_ids``.

    Returns:
        Keyed by ``Col`` names plus ``ATTENTION_MASK``:

        - ``token_ids``: (B, T) int64.
        - ``loss_mask``: (B, T) float32, 1.0 on sampled tokens.
        - ``sample_logprobs``: (B, T) float32, sampler log-probs in nats, 0 elsewhere.
        - ``attention_mask``: (B, T) int64, 1 on real tokens, 0 on padding.
        - ``episode_return``, ``score``: (B,) float32.
        - ``group_id``, ``policy_version``: (B,) int64.
    """
    import torch  # noqa: PLC0415 - torch only at the learner boundary (layering rule)

    b = table.num_rows
    lengths = _list_lengths(table[Col.TOKEN_IDS])  # (B,)
    t = int(lengths.max()) if b else 0
    rows = np.repeat(np.arange(b), lengths)  # (sum L,) row of each token
    starts = np.cumsum(lengths) - lengths  # (B,) flat offset of each row's first token
    cols = np.arange(rows.size) - np.repeat(starts, lengths)  # (sum L,) position inside the row

    def pad(name: str, dtype: type, fill: float) -> np.ndarray:
        out = np.full((b, t), fill, dtype=dtype)
        out[rows, cols] = _np(pc.list_flatten(table[name]))
        return out

    attention = np.zeros((b, t), dtype=np.int64)
    attention[rows, cols] = 1
    return {
        Col.TOKEN_IDS: torch.from_numpy(pad(Col.TOKEN_IDS, np.int64, pad_id)),
        Col.LOSS_MASK: torch.from_numpy(pad(Col.LOSS_MASK, np.float32, 0.0)),
        Col.SAMPLE_LOGPROBS: torch.from_numpy(pad(Col.SAMPLE_LOGPROBS, np.float32, 0.0)),
        ATTENTION_MASK: torch.from_numpy(attention),
        Col.EPISODE_RETURN: torch.from_numpy(_np(table[Col.EPISODE_RETURN]).astype(np.float32)),
        Col.SCORE: torch.from_numpy(_np(table[Col.SCORE]).astype(np.float32)),
        Col.GROUP_ID: torch.from_numpy(_np(table[Col.GROUP_ID]).astype(np.int64)),
        Col.POLICY_VERSION: torch.from_numpy(_np(table[Col.POLICY_VERSION]).astype(np.int64)),
    }
