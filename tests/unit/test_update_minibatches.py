"""``StarPO._update`` cuts its own mini-batches: every row once per epoch (bug B) and
``ppo_mini_batch_size`` rows per optimizer step whatever the learner count (bug C).

The real method runs against a recording stand-in for RLlib's ``LearnerGroup``; RLlib's own
behaviour for ``minibatch_size=None`` (one step over each learner's whole shard) is exercised with
a real learner in ``tests/integration/test_learner_backends.py``.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest


class RecordingLearnerGroup:
    def __init__(self) -> None:
        self.calls: list[tuple[list[int], object, int]] = []

    def foreach_learner(self, fn):
        return [SimpleNamespace(get=lambda: {"actor/lr": 1e-5})]  # as RLlib's RemoteCallResult

    def update(self, *, batch, minibatch_size=None, num_epochs=1, **kw):
        from ray.rllib.core import DEFAULT_MODULE_ID

        rows = batch.policy_batches[DEFAULT_MODULE_ID]["row"].tolist()
        self.calls.append((rows, minibatch_size, num_epochs))
        return [{DEFAULT_MODULE_ID: {"actor/pg_loss": float(len(rows)), "actor/ppo_kl_max": float(rows[-1])}}]


def _update(n_rows: int, mini: int, epochs: int, num_learners: int) -> RecordingLearnerGroup:
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from ragen_rllib.algorithms.starpo.algorithm import StarPO
    from ragen_rllib.algorithms.starpo.params import starpo_s

    p = dataclasses.replace(starpo_s(model="m"), ppo_mini_batch_size=mini, ppo_epochs=epochs)
    group = RecordingLearnerGroup()
    algo = SimpleNamespace(config=SimpleNamespace(starpo=p, num_learners=num_learners), iteration=0,
                           learner_group=group)
    batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch({"row": np.arange(n_rows)})}, env_steps=n_rows)
    out = StarPO._update(algo, batch)
    assert out["actor/optimizer_steps"] == len(group.calls)
    return group


@pytest.mark.parametrize("n_rows,mini,epochs", [(48, 32, 1), (48, 32, 2), (64, 32, 1), (12, 32, 3)])
def test_every_row_once_per_epoch(n_rows, mini, epochs):
    group = _update(n_rows, mini, epochs, num_learners=0)
    seen = [r for rows, _, _ in group.calls for r in rows]
    assert sorted(seen) == sorted(list(range(n_rows)) * epochs)  # bug B: no row twice within an epoch
    assert all(len(rows) <= mini for rows, _, _ in group.calls)
    # Each call is one optimizer step over its whole batch (no RLlib mini-batching inside).
    assert all(size is None and ep == 1 for _, size, ep in group.calls)


def test_step_size_does_not_grow_with_learners():
    one = _update(64, 32, 1, num_learners=0)
    four = _update(64, 32, 1, num_learners=4)
    # Bug C: the same two steps of 32 rows; RLlib shards each over the 4 learners (8 rows each).
    assert [rows for rows, _, _ in one.calls] == [rows for rows, _, _ in four.calls] == [list(range(32)),
                                                                                        list(range(32, 64))]


def test_metrics_are_combined_over_steps():
    from ragen_rllib.algorithms.starpo.algorithm import _mean_over_steps

    out = _mean_over_steps([{"actor/pg_loss": 1.0, "actor/ppo_kl_max": 0.1},
                            {"actor/pg_loss": 3.0, "actor/ppo_kl_max": 0.3}])
    assert out == {"actor/pg_loss": 2.0, "actor/ppo_kl_max": 0.3}


def test_filter_reads_raw_episode_returns_not_penalised_scores():
    """Group 0: equal raw returns, scores spread by format penalties. Group 1: spread raw returns,
    equal scores. Keeping half must keep group 1 (the variance of the env's reward, RAGEN §4)."""
    import pyarrow as pa

    from ragen_rllib.algorithms.starpo.algorithm import StarPO
    from ragen_rllib.algorithms.starpo.params import starpo_s
    from ragen_rllib.trajectory.schema import Col

    table = pa.table({Col.GROUP_ID: [0, 0, 0, 0, 1, 1, 1, 1],
                      Col.EPISODE_RETURN: [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0],
                      Col.SCORE: [1.0, 0.9, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5]})
    p = dataclasses.replace(starpo_s(model="m"), rollout_filter_ratio=0.5)
    kept, metrics = StarPO._filter(SimpleNamespace(config=SimpleNamespace(starpo=p)), table)
    assert kept == {1}
