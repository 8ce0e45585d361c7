"""Trajectory tables (batch.py) and the per-iteration Parquet store (store.py).

``make_rows`` builds realistic fake trajectories: groups of samples, 1-3 turns each, a prompt
then sampled tokens per turn. ``big_table`` builds a large valid table fast (vectorised) for the
SIGKILL test, which runs the writer in a subprocess.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from ragen_rllib.trajectory import (
    ATTENTION_MASK,
    SCHEMA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TOKEN_ALIGNED,
    TURN_ALIGNED,
    Col,
    TrajectoryStore,
    list_runs,
    read_run,
    rows_to_table,
    table_to_rows,
    take_groups,
    to_padded_tensors,
    validate_table,
    with_kept,
    with_token_advantages,
)
from ragen_rllib.trajectory import store as store_module

HERE = Path(__file__).resolve().parent
RUN = "run-a"


# --------------------------------------------------------------------------------------------
# fake data
# --------------------------------------------------------------------------------------------


def make_rows(run_id: str = RUN, iteration: int = 0, n_groups: int = 2, group_size: int = 3,
              seed: int = 0) -> list[dict[str, Any]]:
    """Fake trajectories: ``n_groups`` x ``group_size`` rows, 1-3 turns, varying token lengths.

    Group ids are ``100 * iteration + g`` (unique across iterations). Every float is exactly
    representable in float32, so rows survive a table round trip unchanged.
    """
    rng = np.random.default_rng(seed + 7919 * iteration)
    rows = []
    for g in range(n_groups):
        group_id = 100 * iteration + g
        for s in range(group_size):
            k = int(rng.integers(1, 4))
            token_ids: list[int] = []
            loss_mask: list[int] = []
            logprobs: list[float] = []
            token_turn: list[int] = []
            env_rewards, penalties, well_formed = [], [], []
            for turn in range(k):
                n_prompt, n_sampled = int(rng.integers(3, 9)), int(rng.integers(2, 7))
                token_ids += rng.integers(0, 32_000, n_prompt + n_sampled).tolist()
                loss_mask += [0] * n_prompt + [1] * n_sampled
                logprobs += [0.0] * n_prompt + (-rng.random(n_sampled)).astype(np.float32).tolist()
                token_turn += [turn] * (n_prompt + n_sampled)
                ok = bool(rng.random() > 0.25)
                well_formed.append(ok)
                penalties.append(0.0 if ok else -0.25)
                env_rewards.append(float(rng.integers(0, 2)) if turn == k - 1 else 0.0)
            success = env_rewards[-1] > 0
            rows.append({
                Col.RUN_ID: run_id,
                Col.ITERATION: iteration,
                Col.POLICY_VERSION: iteration,
                Col.ENV_NAME: "sokoban",
                Col.ENV_VARIANT: "simple",
                Col.GROUP_ID: group_id,
                Col.SAMPLE_IDX: s,
                Col.INITIAL_SEED: 1000 + group_id,
                Col.DYNAMICS_SEED: 10_000 * group_id + s,
                Col.TOKEN_IDS: token_ids,
                Col.LOSS_MASK: loss_mask,
                Col.SAMPLE_LOGPROBS: logprobs,
                Col.TOKEN_TURN: token_turn,
                Col.TURN_REWARDS: [r + p for r, p in zip(env_rewards, penalties, strict=False)],
                Col.TURN_ENV_REWARDS: env_rewards,
                Col.TURN_PENALTIES: penalties,
                Col.TURN_WELL_FORMED: well_formed,
                Col.TURN_STATES: [f"state g{group_id} s{s} t{t}" for t in range(k)],
                Col.TURN_RESPONSES: [f"<answer>Up</answer> {t}" for t in range(k)],
                Col.TURN_FINISH: ["stop"] * (k - 1) + ["length" if not well_formed[-1] else "stop"],
                Col.FINAL_STATE: f"final g{group_id} s{s}",
                Col.EPISODE_RETURN: sum(env_rewards),
                Col.SCORE: sum(env_rewards) + sum(penalties),
                Col.SUCCESS: success,
                Col.TERMINATED: success,
                Col.TRUNCATED: not success,
                Col.NUM_TURNS: k,
                Col.NUM_VALID_ACTIONS: sum(well_formed),
                Col.NUM_INVALID_ACTIONS: k - sum(well_formed),
                Col.NUM_DROPPED_ACTIONS: 0,
                Col.NUM_EFFECTIVE_ACTIONS: sum(well_formed),
                Col.NUM_SAMPLED_TOKENS: sum(loss_mask),
                Col.CONTEXT_TRUNCATED: False,
                Col.DROPPED_CONTEXT_TURNS: 0,
            })
    return rows


def make_table(iteration: int = 0, run_id: str = RUN, **kw: Any) -> pa.Table:
    return rows_to_table(make_rows(run_id=run_id, iteration=iteration, **kw))


def big_table(run_id: str, iteration: int, n_rows: int, tokens_per_row: int) -> pa.Table:
    """A valid (n_rows,) table of one-turn trajectories with ``tokens_per_row`` tokens each, built
    vectorised (seconds for millions of tokens); the second half of each row is sampled."""
    rng = np.random.default_rng(iteration)
    n_tok = n_rows * tokens_per_row
    offsets = pa.array(np.arange(0, n_tok + 1, tokens_per_row, dtype=np.int32))
    one = pa.array(np.arange(n_rows + 1, dtype=np.int32))  # offsets of one-element lists
    mask = np.tile((np.arange(tokens_per_row) >= tokens_per_row // 2).astype(np.uint8), n_rows)

    def lists(values: np.ndarray | pa.Array, offs: pa.Array = offsets) -> pa.ListArray:
        return pa.ListArray.from_arrays(offs, pa.array(values))

    ones = np.ones(n_rows)
    columns = {
        Col.RUN_ID: [run_id] * n_rows,
        Col.ITERATION: np.full(n_rows, iteration, np.int32),
        Col.POLICY_VERSION: np.full(n_rows, iteration, np.int64),
        Col.ENV_NAME: ["sokoban"] * n_rows,
        Col.ENV_VARIANT: ["simple"] * n_rows,
        Col.GROUP_ID: np.arange(n_rows, dtype=np.int64) // 8,
        Col.SAMPLE_IDX: np.arange(n_rows, dtype=np.int32) % 8,
        Col.INITIAL_SEED: np.arange(n_rows, dtype=np.int64) // 8,
        Col.DYNAMICS_SEED: np.arange(n_rows, dtype=np.int64),
        Col.TOKEN_IDS: lists(rng.integers(0, 150_000, n_tok, dtype=np.int32)),
        Col.LOSS_MASK: lists(mask),
        Col.SAMPLE_LOGPROBS: lists(np.where(mask == 1, -rng.random(n_tok, dtype=np.float32), np.float32(0))),
        Col.TOKEN_TURN: lists(np.zeros(n_tok, np.int16)),
        Col.TURN_REWARDS: lists(ones.astype(np.float32), one),
        Col.TURN_ENV_REWARDS: lists(ones.astype(np.float32), one),
        Col.TURN_PENALTIES: lists(np.zeros(n_rows, np.float32), one),
        Col.TURN_WELL_FORMED: lists(pa.array(np.ones(n_rows, bool)), one),
        Col.TURN_STATES: lists(pa.array(["state"] * n_rows), one),
        Col.TURN_RESPONSES: lists(pa.array(["reply"] * n_rows), one),
        Col.TURN_FINISH: lists(pa.array(["stop"] * n_rows), one),
        Col.FINAL_STATE: ["final"] * n_rows,
        Col.EPISODE_RETURN: ones,
        Col.SCORE: ones,
        Col.SUCCESS: np.ones(n_rows, bool),
        Col.TERMINATED: np.ones(n_rows, bool),
        Col.TRUNCATED: np.zeros(n_rows, bool),
        Col.NUM_TURNS: np.ones(n_rows, np.int16),
        Col.NUM_VALID_ACTIONS: np.ones(n_rows, np.int32),
        Col.NUM_INVALID_ACTIONS: np.zeros(n_rows, np.int32),
        Col.NUM_DROPPED_ACTIONS: np.zeros(n_rows, np.int32),
        Col.NUM_EFFECTIVE_ACTIONS: np.ones(n_rows, np.int32),
        Col.NUM_SAMPLED_TOKENS: np.full(n_rows, tokens_per_row - tokens_per_row // 2, np.int32),
        Col.CONTEXT_TRUNCATED: np.zeros(n_rows, bool),
        Col.DROPPED_CONTEXT_TURNS: np.zeros(n_rows, np.int32),
        Col.KEPT: pa.nulls(n_rows, pa.bool_()),
        Col.TOKEN_ADVANTAGES: pa.nulls(n_rows, pa.list_(pa.float32())),
    }
    return validate_table(pa.Table.from_pydict(columns, schema=SCHEMA))


@pytest.fixture
def store(tmp_path: Path) -> TrajectoryStore:
    return TrajectoryStore(tmp_path / "runs", RUN)


# --------------------------------------------------------------------------------------------
# rows <-> table <-> parquet
# --------------------------------------------------------------------------------------------


def test_fake_rows_are_realistic() -> None:
    table = make_table()
    assert table.num_rows == 6
    assert sorted(set(table[Col.GROUP_ID].to_pylist())) == [0, 1]
    assert set(table[Col.NUM_TURNS].to_pylist()) > {1}  # varying turns
    assert len(set(pc.list_value_length(table[Col.TOKEN_IDS]).to_pylist())) > 1  # varying lengths
    assert table.schema.equals(SCHEMA, check_metadata=True)


def test_rows_round_trip() -> None:
    rows = make_rows()
    table = rows_to_table(rows)
    assert table[Col.KEPT].null_count == 6  # omitted -> null
    assert table[Col.TOKEN_ADVANTAGES].null_count == 6
    assert table_to_rows(table) == [{**r, Col.KEPT: None, Col.TOKEN_ADVANTAGES: None} for r in rows]
    assert rows_to_table(table_to_rows(table)).equals(table, check_metadata=True)


def test_rows_accept_numpy_lists() -> None:
    rows = make_rows()
    rows[0] = {**rows[0], Col.TOKEN_IDS: np.asarray(rows[0][Col.TOKEN_IDS], np.int64),
               Col.LOSS_MASK: np.asarray(rows[0][Col.LOSS_MASK], np.uint8)}
    assert rows_to_table(rows).equals(make_table())


def test_rows_to_table_rejects_unknown_and_missing_columns() -> None:
    rows = make_rows()
    with pytest.raises(ValueError, match=r"row 1: unknown columns \['tokens'\]"):
        rows_to_table([rows[0], {**rows[1], "tokens": [1]}])
    del rows[2][Col.SCORE]
    with pytest.raises(ValueError, match=rf"column '{Col.SCORE}' row 2: missing"):
        rows_to_table(rows)


def test_parquet_round_trip(store: TrajectoryStore) -> None:
    table = make_table()
    path = store.write(0, table)
    assert path == store.run_dir / "trajectories" / "iter_000000.parquet"
    plain = pq.read_table(path)  # plain pyarrow, no store involved
    assert plain.equals(table, check_metadata=True)
    assert plain.schema.metadata[SCHEMA_VERSION_KEY] == SCHEMA_VERSION.encode()
    assert store.read_iteration(0).equals(table, check_metadata=True)
    assert store.read().schema.equals(SCHEMA, check_metadata=True)


def test_multi_chunk_and_sliced_tables(store: TrajectoryStore) -> None:
    both = pa.concat_tables([make_table(0), make_table(0, seed=5)])
    assert both[Col.TOKEN_IDS].num_chunks == 2
    part = both.slice(4, 5)  # crosses the chunk boundary
    assert validate_table(part).num_rows == 5
    store.write(0, part)
    assert store.read_iteration(0).equals(part)


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------

BAD_ROW = 4


def _set(name: str, fn: Callable[[Any], Any]) -> Callable[[dict], None]:
    def mutate(row: dict) -> None:
        row[name] = fn(row[name])
    return mutate


def _logprob_off_mask(row: dict) -> None:
    row[Col.SAMPLE_LOGPROBS][row[Col.LOSS_MASK].index(0)] = -0.5


def _mask_two(row: dict) -> None:
    row[Col.LOSS_MASK][-1] = 2
    row[Col.NUM_SAMPLED_TOKENS] += 1


def _nan_logprob(row: dict) -> None:
    row[Col.SAMPLE_LOGPROBS][row[Col.LOSS_MASK].index(1)] = math.nan


@pytest.mark.parametrize(("mutate", "column", "why"), [
    (_set(Col.LOSS_MASK, lambda v: v + [0]), Col.LOSS_MASK, "length"),
    (_set(Col.SAMPLE_LOGPROBS, lambda v: v[:-1]), Col.SAMPLE_LOGPROBS, "length"),
    (_set(Col.TOKEN_TURN, lambda v: v + [0, 0]), Col.TOKEN_TURN, "length"),
    (_set(Col.TURN_REWARDS, lambda v: v + [0.0]), Col.TURN_REWARDS, Col.NUM_TURNS),
    (_set(Col.TURN_STATES, lambda v: v[:-1]), Col.TURN_STATES, Col.NUM_TURNS),
    (_set(Col.NUM_TURNS, lambda v: v + 1), Col.TURN_REWARDS, Col.NUM_TURNS),
    (_mask_two, Col.LOSS_MASK, r"not in \{0, 1\}"),
    (_set(Col.NUM_SAMPLED_TOKENS, lambda v: v - 1), Col.NUM_SAMPLED_TOKENS, "sum"),
    (_logprob_off_mask, Col.SAMPLE_LOGPROBS, "must be 0 where the mask is 0"),
    (_nan_logprob, Col.SAMPLE_LOGPROBS, "NaN"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_validate_names_column_and_row(mutate: Callable[[dict], None], column: str, why: str) -> None:
    rows = make_rows()
    mutate(rows[BAD_ROW])
    with pytest.raises(ValueError, match=rf"column '{column}' row {BAD_ROW}: .*{why}"):
        rows_to_table(rows)


def test_validate_schema_problems() -> None:
    table = make_table()
    with pytest.raises(ValueError, match=rf"missing \['{Col.SCORE}'\]"):
        validate_table(table.drop_columns([Col.SCORE]))
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]"):
        validate_table(table.append_column("extra", pa.array([0] * 6)))
    i = table.schema.get_field_index(Col.TOKEN_IDS)
    wrong = table.set_column(i, Col.TOKEN_IDS, table[Col.TOKEN_IDS].cast(pa.list_(pa.int64())))
    with pytest.raises(ValueError, match=rf"column '{Col.TOKEN_IDS}' has type list<item: int64>"):
        validate_table(wrong)
    future = table.replace_schema_metadata({SCHEMA_VERSION_KEY: b"999"})
    with pytest.raises(ValueError, match="'999'"):
        validate_table(future)


def test_validate_accepts_metadata_nullability_and_order_differences() -> None:
    table = make_table()
    loose = pa.schema([pa.field(f.name, f.type, nullable=True) for f in SCHEMA])  # no metadata, all nullable
    relaxed = pa.Table.from_arrays(table.columns, schema=loose).select(list(reversed(SCHEMA.names)))
    fixed = validate_table(relaxed)
    assert fixed.schema.equals(SCHEMA, check_metadata=True)
    assert fixed.equals(table)


def test_validate_accepts_other_list_element_names(tmp_path: Path) -> None:
    """Parquet-compliant writers name list elements "element", Arrow names them "item"."""
    table = make_table()
    pq.write_table(table, tmp_path / "compliant.parquet", use_compliant_nested_type=True)
    other = pq.read_table(tmp_path / "compliant.parquet")
    assert other.schema.field(Col.TOKEN_IDS).type.value_field.name == "element"
    assert validate_table(other).equals(table, check_metadata=True)


def test_validate_rejects_nulls() -> None:
    table = make_table()
    loose = pa.schema([pa.field(f.name, f.type, nullable=True) for f in SCHEMA])
    rows = table.to_pylist()
    rows[2][Col.EPISODE_RETURN] = None
    with pytest.raises(ValueError, match=rf"column '{Col.EPISODE_RETURN}' row 2: null"):
        validate_table(pa.Table.from_pylist(rows, schema=loose))
    rows = table.to_pylist()
    rows[3][Col.TURN_STATES][0] = None
    with pytest.raises(ValueError, match=rf"column '{Col.TURN_STATES}' row 3: null list element"):
        validate_table(pa.Table.from_pylist(rows, schema=loose))


def test_empty_table_is_valid(store: TrajectoryStore) -> None:
    empty = SCHEMA.empty_table()
    assert validate_table(empty).num_rows == 0
    store.write(3, empty)
    assert store.read_iteration(3).num_rows == 0


# --------------------------------------------------------------------------------------------
# store: write rules, atomicity, layout
# --------------------------------------------------------------------------------------------


def test_duplicate_iteration_needs_overwrite(store: TrajectoryStore) -> None:
    store.write(0, make_table(0))
    redo = make_table(0, seed=9)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        store.write(0, redo)
    assert store.read_iteration(0).equals(make_table(0))
    store.write(0, redo, overwrite=True)
    assert store.read_iteration(0).equals(redo)
    assert store.iterations() == [0]


def test_rows_must_match_run_and_iteration(store: TrajectoryStore) -> None:
    with pytest.raises(ValueError, match=rf"column '{Col.ITERATION}' row 0: 1 != 2"):
        store.write(2, make_table(1))
    with pytest.raises(ValueError, match=rf"column '{Col.RUN_ID}' row 0: 'run-b' != '{RUN}'"):
        store.write(0, make_table(0, run_id="run-b"))
    with pytest.raises(ValueError, match="outside"):
        store.path_for(1_000_000)
    with pytest.raises(ValueError, match="run_id"):
        TrajectoryStore(store.root, "../escape")
    assert store.iterations() == []


def test_crash_inside_parquet_writer_leaves_no_final_file(store: TrajectoryStore, monkeypatch) -> None:
    tables = [make_table(i) for i in range(2)]
    for i, t in enumerate(tables):
        store.write(i, t)

    def crash_half_way(table: pa.Table, path: Path) -> None:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue().to_pybytes()
        path.write_bytes(data[: len(data) // 2])  # a real partial file on disk
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(store_module, "_write_parquet", crash_half_way)
    with pytest.raises(OSError, match="simulated"):
        store.write(2, make_table(2))
    assert not store.path_for(2).exists()
    assert store.iterations() == [0, 1]
    assert sorted(p.name for p in store.directory.iterdir()) == ["iter_000000.parquet", "iter_000001.parquet"]
    assert store.read().equals(pa.concat_tables(tables))


def test_crash_at_rename_keeps_previous_version(store: TrajectoryStore, monkeypatch) -> None:
    first = make_table(1)
    store.write(1, first)

    def boom(src: Any, dst: Any) -> None:
        raise OSError("killed at rename (simulated)")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="simulated"):
        store.write(1, make_table(1, seed=3), overwrite=True)
    monkeypatch.undo()
    assert store.read_iteration(1).equals(first)  # the old file is untouched
    assert store.cleanup_temp_files() == 0  # the failed write removed its own temp


def test_publish_falls_back_without_hard_links(store: TrajectoryStore, monkeypatch) -> None:
    def no_links(src: Any, dst: Any) -> None:
        raise PermissionError("hard links not supported (simulated)")

    monkeypatch.setattr(os, "link", no_links)
    store.write(0, make_table(0))
    with pytest.raises(FileExistsError):
        store.write(0, make_table(0))
    assert store.read_iteration(0).equals(make_table(0))
    assert not list(store.directory.glob(".tmp-*"))


def test_sigkill_mid_write_leaves_no_partial_file(store: TrajectoryStore) -> None:
    """A writer killed with SIGKILL while writing leaves only a ``.tmp-*`` file; readers never
    see it, the previous iterations stay readable, and ``cleanup_temp_files`` removes it."""
    first = make_table(0)
    store.write(0, first)
    n_rows = 2000
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from test_trajectory_store import big_table
        from ragen_rllib.trajectory import TrajectoryStore
        table = big_table({RUN!r}, 1, n_rows={n_rows}, tokens_per_row=4000)  # 8M tokens, ~1 s to write
        TrajectoryStore({str(store.root)!r}, {RUN!r}).write(1, table)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    seen_partial = False
    try:
        deadline = time.monotonic() + 120
        while not seen_partial and proc.poll() is None and time.monotonic() < deadline:
            for tmp in store.directory.glob(".tmp-*"):
                try:
                    seen_partial = tmp.stat().st_size > 1 << 20  # the writer is well into the file
                except FileNotFoundError:
                    pass
            time.sleep(0.001)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        _, err = proc.communicate()
    assert seen_partial, f"never saw the writer's temp file (rc={proc.returncode}): {err.decode()[-2000:]}"

    final = store.path_for(1)
    if final.exists():  # the write completed between seeing the temp and the kill: must be whole
        assert pq.read_table(final).num_rows == n_rows
    else:
        assert proc.returncode == -signal.SIGKILL
        assert store.iterations() == [0]
        assert list(store.directory.glob(".tmp-*")), "the killed write should have left its temp file"
        # Plain pyarrow and the store read the directory as if the temp were not there.
        assert ds.dataset(str(store.directory), format="parquet").to_table().num_rows == first.num_rows
        assert store.read().equals(first)
    assert store.cleanup_temp_files() >= (0 if final.exists() else 1)
    assert not list(store.directory.glob(".tmp-*"))
    assert store.read_iteration(0).equals(first)


def test_cleanup_spares_young_temp_files(store: TrajectoryStore) -> None:
    store.write(0, make_table(0))
    (store.directory / ".tmp-iter_000001-abc.partial").write_bytes(b"PAR1 half")
    assert store.cleanup_temp_files(min_age_s=3600) == 0
    assert store.cleanup_temp_files() == 1
    assert TrajectoryStore(store.root, "never-written").cleanup_temp_files() == 0


def test_iterations_sort_numerically_and_ignore_other_files(store: TrajectoryStore) -> None:
    for i in (100, 2, 10):
        store.write(i, make_table(i))
    (store.directory / ".tmp-iter_000003-x.partial").write_bytes(b"junk")
    (store.directory / "notes.txt").write_text("not an iteration")
    assert store.iterations() == [2, 10, 100]
    assert sorted(p.name for p in store.directory.glob("iter_*")) == [store.path_for(i).name for i in (2, 10, 100)]
    assert store.read()[Col.ITERATION].to_pylist() == [2] * 6 + [10] * 6 + [100] * 6


# --------------------------------------------------------------------------------------------
# store: reading
# --------------------------------------------------------------------------------------------


@pytest.fixture
def filled(store: TrajectoryStore) -> TrajectoryStore:
    for i in range(4):
        store.write(i, make_table(i))
    return store


def test_read_filters(filled: TrajectoryStore) -> None:
    everything = filled.read()
    assert everything.num_rows == 24

    success = filled.read(filter=pc.field(Col.SUCCESS) == True)  # noqa: E712 - an Arrow expression
    assert 0 < success.num_rows < 24
    assert success.equals(everything.filter(everything[Col.SUCCESS]))

    window = filled.read(range(1, 3))
    assert window[Col.ITERATION].to_pylist() == [1] * 6 + [2] * 6
    assert filled.read([2, 1, 2]).equals(window)  # ascending, duplicates ignored
    by_expr = filled.read(filter=(pc.field(Col.ITERATION) >= 1) & (pc.field(Col.ITERATION) < 3))
    assert by_expr.equals(window)

    group = filled.read(filter=pc.field(Col.GROUP_ID).isin([201, 300]))
    assert sorted(set(group[Col.GROUP_ID].to_pylist())) == [201, 300]
    assert group.num_rows == 6

    narrow = filled.read([0], columns=[Col.GROUP_ID, Col.EPISODE_RETURN])
    assert narrow.column_names == [Col.GROUP_ID, Col.EPISODE_RETURN]
    assert narrow.num_rows == 6


def test_read_missing_iteration_and_empty_store(filled: TrajectoryStore, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no iterations \[7\]"):
        filled.read([0, 7])
    empty = TrajectoryStore(tmp_path / "nothing", "run-z").read()
    assert empty.num_rows == 0 and empty.schema.equals(SCHEMA)


def test_read_rejects_other_schema_version(store: TrajectoryStore) -> None:
    store.write(0, make_table(0))
    old = pq.read_table(store.path_for(0)).replace_schema_metadata({SCHEMA_VERSION_KEY: b"0"})
    pq.write_table(old, store.path_for(1))
    with pytest.raises(ValueError, match=r"iter_000001.parquet: schema version '0'"):
        store.read()


def test_read_run_and_list_runs(filled: TrajectoryStore) -> None:
    other = TrajectoryStore(filled.root, "run-b")
    other.write(0, make_table(0, run_id="run-b"))
    assert list_runs(filled.root) == ["run-a", "run-b"]
    assert list_runs(filled.root / "absent") == []
    expected = filled.read()
    assert read_run(filled.root, RUN).equals(expected)
    assert read_run(filled.run_dir).equals(expected)
    assert read_run(filled.directory, iterations=[3]).equals(filled.read_iteration(3))
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        read_run(filled.root)


def test_plain_pyarrow_reads_the_directory(filled: TrajectoryStore) -> None:
    (filled.directory / ".tmp-iter_000004-x.partial").write_bytes(b"PAR1 garbage")
    table = ds.dataset(str(filled.directory), format="parquet").to_table()
    assert table.num_rows == 24


# --------------------------------------------------------------------------------------------
# groups and the learner boundary
# --------------------------------------------------------------------------------------------


def test_take_groups_and_with_kept() -> None:
    table = pa.concat_tables([make_table(0), make_table(1)])  # groups 0, 1, 100, 101
    taken = take_groups(table, [101, 0])
    assert taken[Col.GROUP_ID].to_pylist() == [0, 0, 0, 101, 101, 101]  # row order preserved
    assert take_groups(table, []).num_rows == 0
    with pytest.raises(ValueError, match=r"not in the table: \[5\]"):
        take_groups(table, [0, 5])

    marked = with_kept(table, np.array([1, 100]))
    assert marked[Col.KEPT].to_pylist() == [False] * 3 + [True] * 6 + [False] * 3
    assert marked.schema.equals(SCHEMA, check_metadata=True)
    assert marked.drop_columns([Col.KEPT]).equals(table.drop_columns([Col.KEPT]))
    assert with_kept(table, [])[Col.KEPT].to_pylist() == [False] * 12
    with pytest.raises(ValueError, match="not in the table"):
        with_kept(table, [7])


def test_with_token_advantages_sets_kept_rows_and_nulls() -> None:
    table = make_table(0)  # 6 rows, groups 0 and 1
    lengths = pc.list_value_length(table[Col.TOKEN_IDS]).to_pylist()
    padded = np.zeros((2, max(lengths) + 3), np.float32)  # (K_rows, T) with padding past every row
    padded[0, :3], padded[1, :2] = [0.5, -1.0, 2.0], [0.25, -0.25]
    adv = [padded[0], None, None, padded[1], None, None]
    out = with_token_advantages(table, adv)
    assert out.schema.equals(SCHEMA, check_metadata=True)
    got = out[Col.TOKEN_ADVANTAGES].to_pylist()
    assert got[1] is None and got[2] is None
    assert len(got[0]) == lengths[0] and got[0][:3] == [0.5, -1.0, 2.0]  # padding cut to the row's L
    assert len(got[3]) == lengths[3] and got[3][:2] == [0.25, -0.25]
    assert validate_table(out).equals(out)
    assert out.drop_columns([Col.TOKEN_ADVANTAGES]).equals(table.drop_columns([Col.TOKEN_ADVANTAGES]))
    with pytest.raises(ValueError, match="5 advantage rows for a table of 6"):
        with_token_advantages(table, adv[:5])
    with pytest.raises(ValueError, match=rf"row 0: 2 advantages for {lengths[0]} tokens"):
        with_token_advantages(table, [np.zeros(2)] + [None] * 5)


def test_validate_rejects_token_advantages_of_the_wrong_length() -> None:
    table = make_table(0)
    wrong = pa.array([[0.0]] + [None] * 5, pa.list_(pa.float32()))
    bad = table.set_column(table.schema.get_field_index(Col.TOKEN_ADVANTAGES), Col.TOKEN_ADVANTAGES, wrong)
    with pytest.raises(ValueError, match=rf"column '{Col.TOKEN_ADVANTAGES}' row 0: length 1"):
        validate_table(bad)


def test_store_reads_version_1_files_without_token_advantages(store: TrajectoryStore) -> None:
    """Version 1 had every column but token_advantages: its files read with that column null."""
    table = make_table(0)
    old = table.drop_columns([Col.TOKEN_ADVANTAGES]).replace_schema_metadata({SCHEMA_VERSION_KEY: b"1"})
    store.directory.mkdir(parents=True)
    pq.write_table(old, store.path_for(0))
    got = store.read()
    assert got.schema.equals(SCHEMA) and got[Col.TOKEN_ADVANTAGES].null_count == 6
    assert got.drop_columns([Col.TOKEN_ADVANTAGES]).equals(table.drop_columns([Col.TOKEN_ADVANTAGES]))


def test_to_padded_tensors() -> None:
    import torch

    table = pa.concat_tables([make_table(0), make_table(1)]).slice(1, 9)  # sliced, 2 chunks
    rows = table_to_rows(table)
    out = to_padded_tensors(table, pad_id=-7)
    lengths = [len(r[Col.TOKEN_IDS]) for r in rows]
    b, t = len(rows), max(lengths)
    assert {k: (tuple(v.shape), v.dtype) for k, v in out.items()} == {
        Col.TOKEN_IDS: ((b, t), torch.int64),
        Col.LOSS_MASK: ((b, t), torch.float32),
        Col.SAMPLE_LOGPROBS: ((b, t), torch.float32),
        ATTENTION_MASK: ((b, t), torch.int64),
        Col.EPISODE_RETURN: ((b,), torch.float32),
        Col.SCORE: ((b,), torch.float32),
        Col.GROUP_ID: ((b,), torch.int64),
        Col.POLICY_VERSION: ((b,), torch.int64),
    }
    for i, (row, n) in enumerate(zip(rows, lengths, strict=False)):
        assert out[Col.TOKEN_IDS][i, :n].tolist() == row[Col.TOKEN_IDS]
        assert out[Col.TOKEN_IDS][i, n:].eq(-7).all()
        assert out[Col.LOSS_MASK][i, :n].tolist() == row[Col.LOSS_MASK]
        assert out[Col.SAMPLE_LOGPROBS][i, :n].tolist() == row[Col.SAMPLE_LOGPROBS]
        for name in (Col.LOSS_MASK, Col.SAMPLE_LOGPROBS, ATTENTION_MASK):
            assert out[name][i, n:].eq(0).all()
        assert out[ATTENTION_MASK][i].sum().item() == n
    assert out[Col.LOSS_MASK].sum().item() == sum(r[Col.NUM_SAMPLED_TOKENS] for r in rows)
    assert out[Col.GROUP_ID].tolist() == [r[Col.GROUP_ID] for r in rows]
    assert out[Col.SCORE].tolist() == pytest.approx([r[Col.SCORE] for r in rows])

    empty = to_padded_tensors(SCHEMA.empty_table())
    assert tuple(empty[Col.TOKEN_IDS].shape) == (0, 0)


def test_schema_constants_cover_list_columns() -> None:
    lists = {f.name for f in SCHEMA if pa.types.is_list(f.type)}
    # token_advantages is token-aligned where present, but nullable: checked on its own
    assert lists == set(TOKEN_ALIGNED) | set(TURN_ALIGNED) | {Col.TOKEN_ADVANTAGES}


def test_trajectory_package_is_import_light() -> None:
    """pyarrow + numpy only: no torch (lazy in to_padded_tensors), ray, vllm, ... at import."""
    code = "import sys, ragen_rllib.trajectory; print(' '.join(sorted(sys.modules)))"
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    heavy = ("torch", "ray", "vllm", "deepspeed", "transformers", "mlflow")
    assert not sorted(m for m in mods if m.split(".")[0] in heavy)


def test_validation_stores_sit_beside_the_training_files(store: TrajectoryStore) -> None:
    from ragen_rllib.trajectory.store import validation_envs, validation_store, validation_subdir

    assert validation_subdir("frozen_lake:guided") == "validation/frozen_lake-guided"
    assert validation_envs(store.run_dir) == []  # no validation stored yet
    val = validation_store(store.run_dir, "frozen_lake:guided")
    assert "subdir='validation/frozen_lake-guided'" in repr(val)
    path = val.write(8, make_table(8))
    assert path == store.run_dir / "validation" / "frozen_lake-guided" / "iter_000008.parquet"
    val.write(8, make_table(8, seed=3), overwrite=True)  # a redone validation replaces its file
    assert val.iterations() == [8] and val.read_iteration(8).equals(make_table(8, seed=3))
    validation_store(store.run_dir, "sokoban").write(8, make_table(8))
    assert validation_envs(store.run_dir) == ["frozen_lake:guided", "sokoban"]  # env specs, not directory names
    # training readers see only trajectories/: no iteration, and the run is not listed until it has one
    assert store.iterations() == [] and list_runs(store.root) == []
    store.write(0, make_table(0))
    assert list_runs(store.root) == [RUN] and read_run(store.run_dir)[Col.ITERATION].to_pylist() == [0] * 6
