"""Tests for the safe arithmetic evaluator and the Countdown env (values worked by hand)."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest

from ragen_rllib.envs.arithmetic import (
    MAX_DEPTH,
    MAX_LENGTH,
    ArithmeticParseError,
    DivisionByZeroError,
    ExpressionTooLongError,
    LiteralTooLargeError,
    NestingTooDeepError,
    evaluate,
)
from ragen_rllib.envs.base import state_rng
from ragen_rllib.envs.countdown import (
    CORRECT_REWARD,
    RIGHT_NUMBERS_REWARD,
    CountdownConfig,
    CountdownEnv,
    generate_instance,
)
from ragen_rllib.envs.registry import make_env

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------------------- evaluator
@pytest.mark.parametrize(
    ("text", "value", "literals"),
    [
        ("7", 7, (7,)),
        ("0", 0, (0,)),
        ("1 + 2 * 3", 7, (1, 2, 3)),  # * binds tighter than +
        ("(1 + 2) * 3", 9, (1, 2, 3)),
        ("10 - 4 - 3", 3, (10, 4, 3)),  # left-associative: (10 - 4) - 3
        ("10 - (4 - 3)", 9, (10, 4, 3)),
        ("100 / 10 / 5", 2, (100, 10, 5)),  # (100 / 10) / 5
        ("7/2*2", 7, (7, 2, 2)),  # exact: 7/2 is 3.5, not 3
        ("1/3 + 1/3 + 1/3", 1, (1, 3, 1, 3, 1, 3)),  # exactly 1; floats would give 1.0 only by luck
        ("7 / 2", Fraction(7, 2), (7, 2)),
        ("(44 - 19) * 2 + 3", 53, (44, 19, 2, 3)),
        ("((((5))))", 5, (5,)),
        ("-3 + 5", 2, (3, 5)),  # unary minus: accepted, and it does not change the literals
        ("2 * -3", -6, (2, 3)),
        ("--4", 4, (4,)),
        ("-(2 - 5)", 3, (2, 5)),
        ("6 × 7 ÷ 3 − 4", 10, (6, 7, 3, 4)),  # typographic operators
        (" \t1+\n2 \r", 3, (1, 2)),
        ("999999 * 999999", 999998000001, (999999, 999999)),
    ],
)
def test_evaluate_values(text: str, value: Fraction | int, literals: tuple[int, ...]) -> None:
    result = evaluate(text)
    assert result.value == value
    assert isinstance(result.value, Fraction)
    assert result.literals == literals


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("__import__('os')", ArithmeticParseError),
        ("__import__('os').system('ls')", ArithmeticParseError),
        ("2**10", ArithmeticParseError),
        ("a+1", ArithmeticParseError),
        ("1;2", ArithmeticParseError),
        ("()", ArithmeticParseError),
        ("1+", ArithmeticParseError),
        ("", ArithmeticParseError),
        ("   ", ArithmeticParseError),
        ("(1 + 2", ArithmeticParseError),
        ("1 + 2)", ArithmeticParseError),
        ("1 2", ArithmeticParseError),
        ("+1", ArithmeticParseError),  # unary plus is not in the grammar
        ("1.5 + 2", ArithmeticParseError),
        ("1e9", ArithmeticParseError),
        ("07 + 1", ArithmeticParseError),  # leading zero
        ("1 = 1", ArithmeticParseError),
        ("abs(-1)", ArithmeticParseError),
        ("1 // 2", ArithmeticParseError),
        ("1 % 2", ArithmeticParseError),
        ("٣ + 1", ArithmeticParseError),  # Arabic-Indic digit: str.isdigit() says yes, we say no
        ("2² + 1", ArithmeticParseError),
        ("1\u00a0+ 1", ArithmeticParseError),  # non-breaking space
        ("1 + 2 \U0001f600", ArithmeticParseError),
        ("\x00", ArithmeticParseError),
        ("1/0", DivisionByZeroError),
        ("5 / (3 - 3)", DivisionByZeroError),
        ("1/(1/2 - 1/2)", DivisionByZeroError),
        ("1234567 + 1", LiteralTooLargeError),
        ("1" * 200, LiteralTooLargeError),
        ("1+" * 100 + "1", ExpressionTooLongError),  # 201 characters
        ("(" * 10_000 + "1" + ")" * 10_000, ExpressionTooLongError),
        ("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), NestingTooDeepError),
    ],
)
def test_evaluate_rejects(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        evaluate(text)


def test_error_family_is_value_error() -> None:
    for cls in (DivisionByZeroError, ExpressionTooLongError, LiteralTooLargeError, NestingTooDeepError):
        assert issubclass(cls, ArithmeticParseError)
    assert issubclass(ArithmeticParseError, ValueError)


def test_bounds_are_inclusive_and_configurable() -> None:
    at_depth = "(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH
    assert evaluate(at_depth).value == 1
    assert evaluate("1" * 6).value == 111111
    at_length = "1+" * ((MAX_LENGTH - 1) // 2) + "1"
    assert len(at_length) <= MAX_LENGTH
    assert evaluate(at_length).value == (MAX_LENGTH - 1) // 2 + 1
    with pytest.raises(ExpressionTooLongError):
        evaluate("1 + 1", max_length=4)
    with pytest.raises(LiteralTooLargeError):
        evaluate("100", max_literal_digits=2)
    with pytest.raises(NestingTooDeepError):
        evaluate("((1))", max_depth=1)


def test_deep_nesting_never_hits_the_recursion_limit() -> None:
    # Even with the length bound lifted, the depth bound stops the descent long before Python's
    # recursion limit; unary minus is a loop, so a long run of it costs no frames.
    with pytest.raises(NestingTooDeepError):
        evaluate("(" * 50_000 + "1" + ")" * 50_000, max_length=10**6)
    assert evaluate("-" * 50_000 + "1", max_length=10**6).value == 1


def test_error_messages_say_what_is_wrong() -> None:
    with pytest.raises(ArithmeticParseError, match="position 1"):
        evaluate("1a")
    with pytest.raises(ExpressionTooLongError, match="201"):
        evaluate("1" + " " * 200)
    with pytest.raises(DivisionByZeroError, match="division by zero"):
        evaluate("1/0")


# --------------------------------------------------------------------------- generator
@pytest.mark.parametrize("num_numbers", [3, 4])
def test_every_generated_instance_is_solvable(num_numbers: int) -> None:
    cfg = CountdownConfig(num_numbers=num_numbers)
    for seed in range(500):
        inst = generate_instance(state_rng(seed), cfg.num_numbers, cfg.max_number, cfg.max_target)
        assert len(inst.numbers) == num_numbers
        assert all(1 <= n <= cfg.max_number for n in inst.numbers), inst
        assert 1 <= inst.target <= cfg.max_target, inst
        result = evaluate(inst.solution)
        assert result.value == inst.target, inst
        assert Counter(result.literals) == Counter(inst.numbers), inst


def test_generator_respects_other_configs() -> None:
    for seed in range(30):
        inst = generate_instance(state_rng(seed), 6, 9, 20)
        result = evaluate(inst.solution)
        assert 1 <= inst.target <= 20 and all(1 <= n <= 9 for n in inst.numbers)
        assert result.value == inst.target and Counter(result.literals) == Counter(inst.numbers)


def test_instances_are_deterministic_per_seed_and_vary_across_seeds() -> None:
    a, b = CountdownEnv(), CountdownEnv()
    for seed in (0, 1, 12345, 2**40):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        assert obs_a == obs_b and a.solution == b.solution
    # The dynamics seed must not change the puzzle: it is fixed by the initial-state seed.
    obs_c, _ = b.reset(seed=7, options={"dynamics_seed": 99})
    obs_d, _ = a.reset(seed=7)
    assert obs_c == obs_d
    assert len({CountdownEnv().reset(seed=s)[0] for s in range(50)}) > 40


# --------------------------------------------------------------------------------- env
def _env_with(seed: int = 0, **cfg: int) -> CountdownEnv:
    env = CountdownEnv(**cfg)
    env.reset(seed=seed)
    return env


def test_observation_format() -> None:
    env = CountdownEnv()
    obs, info = env.reset(seed=5)
    assert obs == f"Target: {env.target}, nums: {list(env.numbers)}"
    assert info["success"] is False and info["action_is_valid"] is True
    assert env.action_names is None and env.symbol_legend is None
    assert "each exactly once" in env.instruction and "<answer>" in env.instruction


def test_correct_answer_scores_one_and_ends_the_episode() -> None:
    env = _env_with(seed=11)
    obs, reward, terminated, truncated, info = env.step(env.solution)
    assert reward == CORRECT_REWARD == 1.0
    assert terminated and not truncated
    assert info["success"] and info["action_is_valid"] and info["action_is_effective"]
    assert obs.startswith(f"Target: {env.target}, nums: ") and "correct" in obs
    with pytest.raises(RuntimeError):
        env.step(env.solution)


def test_claimed_result_suffix_is_accepted_and_ignored() -> None:
    env = _env_with(seed=11)
    _, reward, _, _, info = env.step(f"  {env.solution} = {env.target}\n")
    assert reward == 1.0 and info["success"]
    # The claim is not checked: the expression on the left is the answer.
    env = _env_with(seed=11)
    _, reward, _, _, _ = env.step(f"{env.solution} = {env.target + 1}")
    assert reward == 1.0


def test_hand_built_instance_rewards() -> None:
    # Pin a puzzle by hand to check 1 / 0.1 / 0 on values worked out on paper.
    env = _env_with()
    env._instance = type(env.instance)(numbers=(44, 19, 2, 3), target=53, solution="(44 - 19) * 2 + 3")
    cases = [
        ("(44 - 19) * 2 + 3", 1.0, True),  # 25 * 2 + 3 = 53
        ("3 + 2 * (44 - 19)", 1.0, True),  # any order
        ("(44 - 19) * 2 + 3 = 53", 1.0, True),
        ("44 - 19 * 2 + 3", 0.1, False),  # right numbers, 44 - 38 + 3 = 9
        ("44 * 19 / 2 / 3", 0.1, False),  # 836 / 6, a fraction
        ("-44 + 19 * 3 + 2 * 20", 0.0, False),  # 20 is not given
        ("(44 - 19) * 2 + 3 + 0", 0.0, False),  # extra literal
        ("44 + 19 + 2", 0.0, False),  # 3 unused
        ("53", 0.0, False),
        ("(44 - 19) * 2 + 3 = 52", 1.0, True),  # the claim is ignored
    ]
    for text, want, success in cases:
        env.num_actions, env._done, env._feedback = 0, False, None
        _, reward, terminated, _, info = env.step(text)
        assert reward == pytest.approx(want), text
        assert terminated and info["action_is_valid"] and info["success"] is success, text
    assert RIGHT_NUMBERS_REWARD == 0.1


def test_duplicate_numbers_are_a_multiset() -> None:
    env = _env_with()
    env._instance = type(env.instance)(numbers=(5, 5, 2), target=12, solution="5 + 5 + 2")
    _, reward, _, _, _ = env.step("5 + 2 * 5 + 5")  # one 5 too many
    assert reward == 0.0
    env.num_actions, env._done = 0, False
    _, reward, _, _, _ = env.step("5 + 5 + 2")
    assert reward == 1.0


ADVERSARIAL = [
    "",
    "   ",
    "I think the answer is 24",
    "__import__('os').system('echo hi')",
    "2**10",
    "1;2",
    "()",
    "1+",
    "1/0",
    "(1 + 2) * 3 = x",
    "1 = 2 = 3",
    "lambda: 1",
    "1e9",
    "<answer>1+2</answer>",
    "9" * 10_000,
    "1+" * 50_000 + "1",
    "(" * 10_000 + "1" + ")" * 10_000,
    "-" * 100_000 + "1",
    "\x00\x01\x02",
    "\u202e1+1",
    "١+٢",
    "😀" * 300,
]


@pytest.mark.parametrize("text", ADVERSARIAL)
def test_unparsable_answer_is_an_invalid_no_op(text: str) -> None:
    env = _env_with(seed=3)
    before = env.render()
    obs, reward, terminated, truncated, info = env.step(text)
    assert reward == 0.0 and not terminated and not truncated
    assert info["action_is_valid"] is False and info["action_is_effective"] is False and info["success"] is False
    assert info["parse_error"]
    assert obs == before and env.actions_left == 1
    # The episode goes on: the real answer still counts.
    _, reward, terminated, _, _ = env.step(env.solution)
    assert reward == 1.0 and terminated


def test_non_string_action_does_not_raise() -> None:
    env = _env_with(seed=3)
    _, reward, terminated, _, info = env.step(None)  # type: ignore[arg-type]
    assert reward == 0.0 and not terminated and not info["action_is_valid"]


def test_max_answer_chars_bounds_the_answer() -> None:
    env = _env_with(seed=3, max_answer_chars=10)
    _, _, terminated, _, info = env.step("1 + 2 + 3 + 4")  # 13 characters
    assert not terminated and "characters" in info["parse_error"]


# ---------------------------------------------------------------------- config/registry
@pytest.mark.parametrize(
    ("field", "value"),
    [("num_numbers", 1), ("num_numbers", 7), ("max_number", 0), ("max_target", 0),
     ("max_target", 10**6), ("max_actions", 0), ("max_answer_chars", 0)],
)
def test_config_validation_names_field_and_value(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=rf"CountdownConfig\.{field} .*{value}"):
        CountdownConfig(**{field: value})


def test_registry_and_variants() -> None:
    env = make_env("countdown")
    assert isinstance(env, CountdownEnv) and env.config == CountdownConfig()
    three = make_env("countdown:three")
    three.reset(seed=0)
    assert len(three.numbers) == 3
    assert list(CountdownEnv.VARIANTS)[0] == "default"
    assert CountdownEnv.Config is CountdownConfig and CountdownEnv.DESCRIPTION


def test_puzzle_properties_need_reset() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        _ = CountdownEnv().solution
