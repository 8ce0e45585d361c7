"""How the learners' per-shard results become one iteration's metrics."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.rllib", reason="the StarPO algorithm module imports RLlib")


def test_learner_results_are_averaged_over_learners_in_any_order() -> None:
    from ray.rllib.core import DEFAULT_MODULE_ID

    from ragen_rllib.algorithms.starpo.algorithm import _flatten_learner_results

    rank0 = {DEFAULT_MODULE_ID: {"actor": {"pg_loss": -0.0525}, "gradients_actor_global_norm": 2.0}}
    rank1 = {DEFAULT_MODULE_ID: {"actor": {"pg_loss": -0.0524}, "gradients_actor_global_norm": 2.0,
                                 "only_here": 3.0}}
    a = _flatten_learner_results([rank0, rank1])
    b = _flatten_learner_results([rank1, rank0])
    assert a == b  # exact: the mean uses math.fsum, so the order Ray lists the learners in cannot matter
    assert a["actor/pg_loss"] == pytest.approx(-0.05245)
    assert a["actor/grad_norm"] == 2.0
    assert a["learner/only_here"] == 3.0  # a key one learner lacks is averaged over those that have it
    assert _flatten_learner_results(rank0)["actor/pg_loss"] == -0.0525  # a single (local) learner's dict
    assert _flatten_learner_results([]) == {}
