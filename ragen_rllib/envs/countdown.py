"""Countdown: combine the given numbers with + - * / into an equation that equals the target.

RAGEN's Countdown (``ragen/env/countdown``) reads TinyZero's parquet of instances and keeps only
rows that a ``±``-only search can solve. Here instances are generated from the initial-state
seed, so there is no data file and every instance has a known solution:

1. draw ``num_numbers`` integers uniformly from ``[1, max_number]``;
2. merge them into one random expression tree: repeatedly pick two sub-expressions at random
   and join them with an operator chosen uniformly among those whose result is a positive
   integer (``+`` and ``*`` always; ``-`` larger minus smaller when they differ; ``/`` when the
   larger is a multiple of the smaller). So every intermediate result is a positive integer
   and every number is used exactly once;
3. keep the tree if its value lies in ``[1, max_target]``, else go back to 1 (at most
   ``_MAX_ATTEMPTS`` times). The value is the target; the tree, printed, is ``solution``.

State text (RAGEN's): ``"Target: 24, nums: [3, 8, 1, 2]"``. One action, one turn: the answer is a
free-text equation such as ``"(3 - 1) * 8 + 2"`` checked by the safe parser in
:mod:`ragen_rllib.envs.arithmetic` (exact rationals, unary minus allowed, integer literals only,
no ``eval``). An optional claimed result ``"= T"`` at the end is accepted and ignored: the
expression on the left is what gets scored, so ``"3 * 8 = 24"`` scores like ``"3 * 8"``.

Reward (RAGEN's ``compute_reward``):

* 1.0 if the literals are exactly the given numbers (as a multiset) and the value equals the
  target exactly; ``success`` is this case;
* 0.1 if the literals are right but the value is not;
* 0.0 if the literals are not the given numbers.

Each of those is a valid action that ends the episode (``terminated=True``). Text that does not
parse (empty, prose, ``2**10``, longer than ``max_answer_chars``, ...) is an *invalid* action under
the base contract: reward 0.0, state unchanged, ``action_is_valid=False``, no budget used, and the
episode goes on. (RAGEN ends the episode on an invalid answer instead; here ending it is left to
the turn executor's turn limit, and its format penalty is what punishes unparsable replies.)
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from ragen_rllib.envs.arithmetic import MAX_DEPTH, ArithmeticParseError, evaluate
from ragen_rllib.envs.base import TextEnv

__all__ = ["CORRECT_REWARD", "RIGHT_NUMBERS_REWARD", "CountdownConfig", "CountdownEnv", "CountdownInstance",
           "generate_instance"]

#: Reward for an equation that uses exactly the numbers and equals the target (RAGEN ``score``).
CORRECT_REWARD = 1.0
#: Reward for an equation that uses exactly the numbers but misses the target (RAGEN ``format_score``).
RIGHT_NUMBERS_REWARD = 0.1

#: Fresh (numbers, tree) draws per instance before giving up. The default config accepts about one
#: draw in four and even ``max_target=1`` about one in 400, so running out means a config whose
#: targets are (nearly) unreachable; a draw costs tens of microseconds.
_MAX_ATTEMPTS = 10_000
#: Parser bound on literal digits: numbers and targets are validated to fit in it.
_MAX_LITERAL_DIGITS = 6
_MAX_NUMBERS = 6


@dataclass(frozen=True)
class CountdownConfig:
    """Countdown settings.

    Attributes:
        num_numbers: numbers per instance, each to be used exactly once (2..6).
        max_number: numbers are drawn uniformly from ``[1, max_number]``.
        max_target: targets lie in ``[1, max_target]``.
        max_actions: answers per episode (RAGEN ``max_actions_per_traj``: 1).
        max_answer_chars: longest expression the parser accepts, in characters, after outer
            whitespace and a claimed ``"= T"`` are removed; longer text is an invalid action.
    """

    num_numbers: int = 4
    max_number: int = 99
    max_target: int = 100
    max_actions: int = 1
    max_answer_chars: int = 200

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not 2 <= self.num_numbers <= _MAX_NUMBERS:
            raise ValueError(f"{name}.num_numbers must be in [2, {_MAX_NUMBERS}], got {self.num_numbers!r}")
        limit = 10**_MAX_LITERAL_DIGITS - 1
        for field in ("max_number", "max_target"):
            v = getattr(self, field)
            if not 1 <= v <= limit:
                raise ValueError(f"{name}.{field} must be in [1, {limit}], got {v!r}")
        if not self.max_actions >= 1:
            raise ValueError(f"{name}.max_actions must be >= 1, got {self.max_actions!r}")
        if not self.max_answer_chars >= 1:
            raise ValueError(f"{name}.max_answer_chars must be >= 1, got {self.max_answer_chars!r}")


@dataclass(frozen=True)
class CountdownInstance:
    """One puzzle.

    Attributes:
        numbers: the given numbers in presentation order, shape ``(num_numbers,)``.
        target: the value to reach, in ``[1, max_target]``.
        solution: an equation over exactly ``numbers`` whose value is ``target``.
    """

    numbers: tuple[int, ...]
    target: int
    solution: str


# A sub-expression during generation: its value, its text, and the precedence of its top
# operator (atoms bind tightest) so that printing adds only the parentheses it needs.
_ATOM, _MUL, _ADD = 3, 2, 1


@dataclass(frozen=True)
class _Node:
    value: int
    text: str
    prec: int


def _join(a: _Node, op: str, b: _Node) -> _Node:
    """Return the node ``a op b``; ``op`` must keep the value a positive integer."""
    prec = _ADD if op in "+-" else _MUL
    left = a.text if a.prec >= prec else f"({a.text})"
    # A right operand of equal precedence needs parentheses under - and /: a - (b + c) != a - b + c.
    right = b.text if b.prec > prec or (b.prec == prec and op in "+*") else f"({b.text})"
    value = {"+": a.value + b.value, "-": a.value - b.value, "*": a.value * b.value, "/": a.value // b.value}[op]
    return _Node(value, f"{left} {op} {right}", prec)


def _random_tree(numbers: list[int], rng: np.random.Generator) -> _Node:
    """Merge ``numbers`` into one random expression whose every sub-value is a positive integer."""
    pool = [_Node(n, str(n), _ATOM) for n in numbers]
    while len(pool) > 1:
        i, j = (int(k) for k in rng.choice(len(pool), size=2, replace=False))
        a, b = pool[i], pool[j]
        hi, lo = (a, b) if a.value >= b.value else (b, a)
        # (left, op, right) candidates; + and * keep the drawn order so both orders appear.
        options = [(a, "+", b), (a, "*", b)]
        if hi.value != lo.value:
            options.append((hi, "-", lo))
        if hi.value % lo.value == 0:
            options.append((hi, "/", lo))
        left, op, right = options[int(rng.integers(len(options)))]
        pool = [node for k, node in enumerate(pool) if k not in (i, j)] + [_join(left, op, right)]
    return pool[0]


def generate_instance(
    rng: np.random.Generator, num_numbers: int, max_number: int, max_target: int
) -> CountdownInstance:
    """Draw a solvable Countdown instance (see the module docstring for the procedure).

    Args:
        rng: the initial-state RNG; the same RNG state gives the same instance.
        num_numbers: how many numbers the puzzle has.
        max_number: numbers are drawn from ``[1, max_number]``.
        max_target: the target must lie in ``[1, max_target]``.

    Returns:
        The instance, with a solution that uses each number exactly once.

    Raises:
        RuntimeError: no tree landed in ``[1, max_target]`` within ``_MAX_ATTEMPTS`` draws.
    """
    for _ in range(_MAX_ATTEMPTS):
        numbers = [int(n) for n in rng.integers(1, max_number + 1, size=num_numbers)]
        tree = _random_tree(numbers, rng)
        if 1 <= tree.value <= max_target:
            return CountdownInstance(numbers=tuple(numbers), target=tree.value, solution=tree.text)
    raise RuntimeError(
        f"no Countdown instance with num_numbers={num_numbers}, max_number={max_number} reached a target in "
        f"[1, {max_target}] after {_MAX_ATTEMPTS} draws; raise max_target"
    )


def _strip_claimed_result(text: str) -> str:
    """Drop a trailing ``"= <integer>"`` (the claimed result); return the expression part.

    Anything else after ``=`` is left in place, so the parser rejects the text.
    """
    lhs, sep, rhs = text.rpartition("=")
    rhs = rhs.strip()
    if sep and rhs and rhs.isascii() and rhs.isdigit():
        return lhs
    return text


class CountdownEnv(TextEnv[CountdownConfig]):
    """Countdown puzzle as a text env: one free-text equation per episode.

    Attributes:
        config: the frozen :class:`CountdownConfig`.
    """

    Config = CountdownConfig
    VARIANTS: ClassVar[dict[str, dict[str, Any]]] = {"default": {}, "three": {"num_numbers": 3}}
    MAX_TURNS: ClassVar[int] = 1
    DESCRIPTION: ClassVar[str] = "Countdown: reach the target with + - * / using each given number once (one answer)"

    def __init__(self, config: CountdownConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._instance: CountdownInstance | None = None
        self._feedback: str | None = None  # set once a valid answer has been scored

    # ------------------------------------------------------------------ puzzle
    @property
    def instance(self) -> CountdownInstance:
        """The current puzzle.

        Raises:
            RuntimeError: before the first ``reset``.
        """
        if self._instance is None:
            raise RuntimeError("CountdownEnv has no puzzle before reset()")
        return self._instance

    @property
    def numbers(self) -> tuple[int, ...]:
        """The given numbers, shape ``(num_numbers,)``."""
        return self.instance.numbers

    @property
    def target(self) -> int:
        """The value the equation must reach."""
        return self.instance.target

    @property
    def solution(self) -> str:
        """A known correct equation for the current puzzle (the generator's tree)."""
        return self.instance.solution

    # -------------------------------------------------------- prompt-facing data
    @property
    def instruction(self) -> str:
        return (
            "You are solving the Countdown puzzle. Using the given numbers, each exactly once, and the "
            "operations + - * / (with parentheses as needed), build an equation that equals the target. "
            "Answer with the equation only, e.g. for target 9 and nums [1, 2, 3]: <answer>(1 + 2) * 3</answer>."
        )

    def render(self) -> str:
        state = f"Target: {self.instance.target}, nums: {list(self.instance.numbers)}"
        return state if self._feedback is None else f"{state}\n{self._feedback}"

    # ------------------------------------------------------------------- hooks
    def _reset(self, rng: np.random.Generator) -> None:
        cfg = self.config
        self._instance = generate_instance(rng, cfg.num_numbers, cfg.max_number, cfg.max_target)
        self._feedback = None

    def _step(self, action_text: str) -> tuple[float, bool, dict[str, Any]]:
        cfg = self.config
        expression = _strip_claimed_result(action_text.strip())
        try:
            result = evaluate(
                expression,
                max_length=cfg.max_answer_chars,
                max_depth=MAX_DEPTH,
                max_literal_digits=_MAX_LITERAL_DIGITS,
            )
        except ArithmeticParseError as e:
            # Base contract: an action the env cannot read is a no-op, not an exception.
            return 0.0, False, {"success": False, "action_is_valid": False, "action_is_effective": False,
                                "parse_error": str(e)}
        numbers_ok = Counter(result.literals) == Counter(self.instance.numbers)
        correct = numbers_ok and result.value == Fraction(self.instance.target)
        if correct:
            reward, verdict = CORRECT_REWARD, "correct"
        elif numbers_ok:
            reward, verdict = RIGHT_NUMBERS_REWARD, f"not the target {self.instance.target}"
        else:
            reward, verdict = 0.0, "does not use each given number exactly once"
        self._feedback = f"Your answer {expression.strip()} = {result.value}: {verdict}."
        return reward, True, {"success": correct, "action_is_valid": True, "action_is_effective": True,
                              "answer_value": str(result.value), "numbers_ok": numbers_ok}
