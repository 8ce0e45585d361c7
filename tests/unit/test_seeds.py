"""Seed streams (ragen_rllib.seeds): neighbouring run seeds share nothing, ranges are disjoint."""

from __future__ import annotations

import pytest

from ragen_rllib.seeds import VAL_SEED_LIMIT, sampling_seed, train_state_seeds, turn_seed, warmup_state_seeds

pytestmark = pytest.mark.unit


def test_neighbouring_seeds_share_no_training_state() -> None:
    # The additive scheme (seed + counter) shared 7 of every 8 states between seeds 10000 and 10001.
    runs = [set(train_state_seeds(s, 0, 8 * 200)) for s in (10000, 10001, 10002)]
    assert all(len(r) == 8 * 200 for r in runs)  # no repeat within a run of 1600 states
    assert not (runs[0] & runs[1]) and not (runs[1] & runs[2]) and not (runs[0] & runs[2])


def test_counter_continues_the_sequence() -> None:
    # A resumed run (counter restored) draws exactly the states it would have drawn.
    assert train_state_seeds(7, 0, 24)[8:16] == train_state_seeds(7, 8, 8)
    assert warmup_state_seeds(7, 0, 16)[4:] == warmup_state_seeds(7, 4, 12)
    assert train_state_seeds(7, 0, 8) == train_state_seeds(7, 0, 8)  # deterministic


def test_ranges_are_disjoint_from_validation_and_each_other() -> None:
    for seed in (0, 1, 10000, 2**40):
        tr, wu = train_state_seeds(seed, 0, 500), warmup_state_seeds(seed, 0, 500)
        assert all(3 * 2**30 <= x < 2**32 for x in tr)
        assert all(VAL_SEED_LIMIT <= x < 3 * 2**30 for x in wu)


def test_sampling_seeds_do_not_overlap_across_iterations_or_runs() -> None:
    # Per-prompt seeds are base + i (i < 64 here): the additive scheme made iteration i + 1's
    # prompt j reuse iteration i's prompt j + 1; derived bases leave no overlap.
    prompt_seeds = {(s, k, it): {sampling_seed(s, k, it) + i for i in range(64)}
                    for s in (10000, 10001) for k in ("train", "warmup") for it in range(20)}
    seen: set[int] = set()
    for v in prompt_seeds.values():
        assert not (v & seen)
        seen |= v
    assert all(0 <= sampling_seed(3, "train", it) < 2**31 for it in range(100))
    with pytest.raises(ValueError, match="kind"):
        sampling_seed(3, "val", 0)
    with pytest.raises(ValueError, match="seed=-1"):
        train_state_seeds(-1, 0, 1)


def test_turn_seeds() -> None:
    assert turn_seed(123, 0) == 123  # validation's first turn keeps its fixed base
    turns = [{turn_seed(123, t) + i for i in range(4096)} for t in range(5)]
    assert all(not (turns[a] & turns[b]) for a in range(5) for b in range(a + 1, 5))
    assert turn_seed(123, 2) == turn_seed(123, 2) != turn_seed(124, 2)
