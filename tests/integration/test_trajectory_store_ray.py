"""Ray Data reads the trajectory store's directory as written by ``TrajectoryStore``.

One local Ray instance per module (``num_cpus=1``, no dashboard); a leftover ``.tmp-*`` file of
a crashed write sits in the directory and must be skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from ragen_rllib.trajectory import SCHEMA, Col, TrajectoryStore, validate_table

# Ray Data warns about its own deprecated context fields on every run; not ours to fix.
pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
RUN = "run-ray"


def _table(iteration: int, n_groups: int = 3, group_size: int = 4) -> pa.Table:
    """A small valid table: ``n_groups`` x ``group_size`` one-turn rows of varying length."""
    rng = np.random.default_rng(iteration)
    rows = []
    for g in range(n_groups):
        for s in range(group_size):
            n_prompt, n_sampled = int(rng.integers(2, 6)), int(rng.integers(1, 5))
            ret = float(rng.integers(0, 2))
            rows.append({
                Col.RUN_ID: RUN, Col.ITERATION: iteration, Col.POLICY_VERSION: iteration,
                Col.ENV_NAME: "bandit", Col.ENV_VARIANT: "default",
                Col.GROUP_ID: 100 * iteration + g, Col.SAMPLE_IDX: s,
                Col.INITIAL_SEED: g, Col.DYNAMICS_SEED: 10 * g + s,
                Col.TOKEN_IDS: rng.integers(0, 1000, n_prompt + n_sampled).tolist(),
                Col.LOSS_MASK: [0] * n_prompt + [1] * n_sampled,
                Col.SAMPLE_LOGPROBS: [0.0] * n_prompt + [-0.5] * n_sampled,
                Col.TOKEN_TURN: [0] * (n_prompt + n_sampled),
                Col.TURN_REWARDS: [ret], Col.TURN_ENV_REWARDS: [ret], Col.TURN_PENALTIES: [0.0],
                Col.TURN_WELL_FORMED: [True], Col.TURN_STATES: ["pick an arm"], Col.TURN_RESPONSES: ["arm 1"],
                Col.TURN_FINISH: ["stop"], Col.FINAL_STATE: "done",
                Col.EPISODE_RETURN: ret, Col.SCORE: ret, Col.SUCCESS: ret > 0,
                Col.TERMINATED: True, Col.TRUNCATED: False, Col.NUM_TURNS: 1,
                Col.NUM_VALID_ACTIONS: 1, Col.NUM_INVALID_ACTIONS: 0, Col.NUM_DROPPED_ACTIONS: 0,
                Col.NUM_EFFECTIVE_ACTIONS: 1, Col.NUM_SAMPLED_TOKENS: n_sampled,
                Col.CONTEXT_TRUNCATED: False, Col.DROPPED_CONTEXT_TURNS: 0, Col.KEPT: g == 0,
            })
    return validate_table(pa.Table.from_pylist(rows, schema=SCHEMA))


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


@pytest.mark.timeout(300)
def test_ray_data_reads_store_directory(ray_local: None, tmp_path: Path) -> None:
    import ray

    store = TrajectoryStore(tmp_path, RUN)
    tables = [_table(i) for i in range(2)]
    for i, table in enumerate(tables):
        store.write(i, table)
    # What a SIGKILLed write leaves behind: Ray Data must skip it like pyarrow does.
    (store.directory / ".tmp-iter_000002-crashed.partial").write_bytes(b"PAR1 half a file")
    expected = pa.concat_tables(tables)

    # One read, materialised once; count/schema/blocks below reuse it (each execution costs seconds).
    data = ray.data.read_parquet(str(store.directory)).materialize()
    assert data.count() == expected.num_rows
    assert data.sum(Col.NUM_SAMPLED_TOKENS) == pc.sum(expected[Col.NUM_SAMPLED_TOKENS]).as_py()
    assert set(data.schema().names) == set(SCHEMA.names)

    # Whole rows survive: compare after sorting both sides the same way.
    keys = [(Col.ITERATION, "ascending"), (Col.GROUP_ID, "ascending"), (Col.SAMPLE_IDX, "ascending")]
    got = pa.concat_tables(ray.get(data.to_arrow_refs())).sort_by(keys)
    assert validate_table(got.select(SCHEMA.names)).equals(expected.sort_by(keys))
