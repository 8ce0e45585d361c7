"""Every random stream of a run, derived from its one seed (``starpo.seed``); numpy only.

A run draws initial states for training and for the supervised warm-up, and a sampling seed for
each training iteration, warm-up step and turn. Each stream is seeded by
``numpy.random.SeedSequence([seed, stream, *counters])``, so runs whose seeds differ by one share
no stream. An additive scheme (state ``seed + counter``, sampling ``seed + iteration``; RAGEN's
``seed.train`` counter, and this project's first scheme) makes neighbouring seeds near copies
of each other: seeds 10000 and 10001 then train on 7 of the same 8 initial states in every
iteration, and iteration ``i + 1`` of one samples prompt ``j`` with the seed that iteration ``i``
used for prompt ``j + 1``.

Ranges (all ``int``, ≥ 0), disjoint by construction:

- validation states ``val_seed + g``: below ``2**31`` (``StarPOParams`` checks it), fixed across runs;
- warm-up states: ``[2**31, 3 * 2**30)``;
- training states: ``[3 * 2**30, 2**32)``, distinct within a run except by chance
  (about ``n**2 / 2**31`` collisions for ``n`` states: 5e-4 for 1000);

so a held-out validation state is never trained on. Sampling seeds are in ``[0, 2**31)``; an
engine adds the prompt's index in the batch to them (``SamplingParams.seed``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["VAL_SEED_LIMIT", "sampling_seed", "train_state_seeds", "turn_seed", "val_state_seeds",
           "warmup_state_seeds"]

VAL_SEED_LIMIT = 2**31  # validation states are val_seed + g < VAL_SEED_LIMIT

# Stream ids: part of every derived seed; changing one changes every run that uses it.
_TRAIN_STATES, _WARMUP_STATES, _TRAIN_SAMPLING, _WARMUP_SAMPLING, _TURN = 1, 2, 3, 4, 5
_SAMPLING_KINDS = {"train": _TRAIN_SAMPLING, "warmup": _WARMUP_SAMPLING}


def _draw(seed: int, stream: int, counter: int, low: int, width: int) -> int:
    """One integer in ``[low, low + width)`` from ``SeedSequence([seed, stream, counter])``."""
    if seed < 0 or counter < 0:
        raise ValueError(f"seeds and counters must be >= 0, got seed={seed} counter={counter}")
    word = np.random.SeedSequence([int(seed), stream, int(counter)]).generate_state(1, np.uint64)[0]
    return low + int(word) % width


def val_state_seeds(val_seed: int, n: int) -> list[int]:
    """The ``n`` fixed validation states, ``val_seed .. val_seed + n - 1``: the same in every run."""
    return [val_seed + g for g in range(n)]


def train_state_seeds(seed: int, start: int, n: int) -> list[int]:
    """Initial-state seeds of training states ``start .. start + n - 1`` of run ``seed``.

    ``start`` is the run's state counter (states drawn so far), so a resumed run continues the
    sequence. Returns ``n`` ints in ``[3 * 2**30, 2**32)``.
    """
    return [_draw(seed, _TRAIN_STATES, start + g, 3 * 2**30, 2**30) for g in range(n)]


def warmup_state_seeds(seed: int, start: int, n: int) -> list[int]:
    """Initial-state seeds of warm-up states ``start .. start + n - 1`` of run ``seed``.

    Returns ``n`` ints in ``[2**31, 3 * 2**30)``: never a training or validation state.
    """
    return [_draw(seed, _WARMUP_STATES, start + g, 2**31, 2**30) for g in range(n)]


def sampling_seed(seed: int, kind: str, step: int) -> int:
    """Base sampling seed of training iteration ``step`` (``kind="train"``) or warm-up step
    ``step`` (``kind="warmup"``) of run ``seed``; an int in ``[0, 2**31)``."""
    if kind not in _SAMPLING_KINDS:
        raise ValueError(f"sampling seed kind must be one of {sorted(_SAMPLING_KINDS)}, got {kind!r}")
    return _draw(seed, _SAMPLING_KINDS[kind], step, 0, 2**31)


def turn_seed(base: int, turn: int) -> int:
    """Sampling seed of turn ``turn`` (0-based) of a rollout call whose base seed is ``base``.

    Turn 0 keeps ``base`` itself; later turns draw from ``SeedSequence([base, turn])``, so no
    turn's per-prompt seeds (``seed + i``) run into another turn's however many prompts a call has.
    Returns an int in ``[0, 2**31)`` for ``turn > 0``.
    """
    if turn == 0:
        return int(base)
    return _draw(base, _TURN, turn, 0, 2**31)
