"""Evaluate untrusted arithmetic text safely and exactly (the Countdown answer checker).

RAGEN (like TinyZero) scores Countdown answers with Python's ``eval``. Model output is untrusted
text, so here a small tokenizer plus a recursive-descent parser accept *only* arithmetic and
evaluate it with exact rationals (``fractions.Fraction``): ``7/2*2`` is exactly 7, with no float
tolerance to tune.

Grammar (usual precedence; binary operators are left-associative)::

    expr    := term (("+" | "-") term)*
    term    := unary (("*" | "/") unary)*
    unary   := "-"* primary            # unary minus, as in Python ("-3 + 5", "2 * -3", "--1")
    primary := INTEGER | "(" expr ")"

Accepted:

* integer literals in canonical decimal form: ASCII digits, no sign, no leading zeros (``"0"``
  itself is fine, ``"07"`` is not), at most ``max_literal_digits`` digits;
* ``+ - * /``, plus the typographic spellings ``×`` (U+00D7), ``÷`` (U+00F7) and ``−`` (U+2212)
  that models sometimes emit;
* parentheses, nested at most ``max_depth`` deep;
* ASCII whitespace (space, tab, newline, carriage return) between tokens.

Rejected: everything else, including names, calls, ``**``, ``;``, ``=``, unary ``+``, decimals
(``1.5``) and exponent notation (``1e9``), non-ASCII digits, and text longer than ``max_length``
characters. Unary minus is accepted because RAGEN's ``eval`` accepted it (its solvability check
even assumes a leading ``-``); it consumes no literal, so it cannot smuggle numbers in.

Every failure raises a subclass of :class:`ArithmeticParseError` (a ``ValueError``); division by
zero is one of them. The length bound is checked before anything else, and unary minus is parsed
in a loop, so recursion depth is at most a few frames per parenthesis level: no input can reach
Python's recursion limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "MAX_DEPTH",
    "MAX_LENGTH",
    "MAX_LITERAL_DIGITS",
    "ArithmeticParseError",
    "ArithmeticResult",
    "DivisionByZeroError",
    "ExpressionTooLongError",
    "LiteralTooLargeError",
    "NestingTooDeepError",
    "evaluate",
]

#: Default bound on the input length, in characters (whitespace included).
MAX_LENGTH = 200
#: Default bound on parenthesis nesting depth.
MAX_DEPTH = 32
#: Default bound on the digits of one integer literal.
MAX_LITERAL_DIGITS = 6


class ArithmeticParseError(ValueError):
    """The text is not an accepted arithmetic expression (base class of every parser error)."""


class ExpressionTooLongError(ArithmeticParseError):
    """The text is longer than the ``max_length`` bound."""


class NestingTooDeepError(ArithmeticParseError):
    """Parentheses nest deeper than the ``max_depth`` bound."""


class LiteralTooLargeError(ArithmeticParseError):
    """An integer literal has more digits than the ``max_literal_digits`` bound."""


class DivisionByZeroError(ArithmeticParseError):
    """The expression divides by a sub-expression that is exactly zero."""


@dataclass(frozen=True)
class ArithmeticResult:
    """The value of an expression and the literals it used.

    Attributes:
        value: exact value of the expression.
        literals: the integer literals in order of appearance, shape ``(L,)``; a unary minus
            does not change them (``"-3"`` has literals ``(3,)``).
    """

    value: Fraction
    literals: tuple[int, ...]


_DIGITS = frozenset("0123456789")
_WHITESPACE = frozenset(" \t\n\r")
# Typographic spellings map to the ASCII operator, so the parser only sees + - * /.
_OPERATORS = {"+": "+", "-": "-", "*": "*", "/": "/", "\u00d7": "*", "\u00f7": "/", "\u2212": "-"}
_PARENS = frozenset("()")

# Token kinds.
_INT = "int"
_OP = "op"
_END = "end"


@dataclass(frozen=True)
class _Token:
    kind: str  # _INT, _OP (also parentheses) or _END
    text: str  # the normalised operator, the digits, or "" for _END
    pos: int  # 0-based character offset in the input, for error messages


def _tokenize(text: str, max_literal_digits: int) -> list[_Token]:
    """Split ``text`` into tokens, rejecting any character outside the grammar."""
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _WHITESPACE:
            i += 1
        elif ch in _DIGITS:
            j = i
            while j < n and text[j] in _DIGITS:
                j += 1
            digits = text[i:j]
            if len(digits) > max_literal_digits:
                raise LiteralTooLargeError(
                    f"integer literal at position {i} has {len(digits)} digits; at most "
                    f"{max_literal_digits} are allowed"
                )
            if len(digits) > 1 and digits[0] == "0":
                raise ArithmeticParseError(f"integer literal {digits!r} at position {i} has a leading zero")
            # "1.5" and "1e9" stop the digit run at "." or "e"; name them in the message.
            if j < n and text[j] in ".eE":
                raise ArithmeticParseError(
                    f"only integer literals are allowed; found {text[j]!r} after {digits!r} at position {j}"
                )
            tokens.append(_Token(_INT, digits, i))
            i = j
        elif ch in _OPERATORS or ch in _PARENS:
            tokens.append(_Token(_OP, _OPERATORS.get(ch, ch), i))
            i += 1
        else:
            raise ArithmeticParseError(f"unexpected character {ch!r} at position {i}")
    tokens.append(_Token(_END, "", n))
    return tokens


class _Parser:
    """Recursive-descent parser and evaluator over a token list (one use per expression)."""

    def __init__(self, tokens: list[_Token], max_depth: int) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0
        self.max_depth = max_depth
        self.literals: list[int] = []

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def parse(self) -> Fraction:
        if self.peek().kind == _END:
            raise ArithmeticParseError("empty expression")
        value = self.expr()
        tok = self.peek()
        if tok.kind != _END:
            raise ArithmeticParseError(f"unexpected {_describe(tok)} after a complete expression")
        return value

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek().kind == _OP and self.peek().text in ("+", "-"):
            op = self.take().text
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek().kind == _OP and self.peek().text in ("*", "/"):
            op_tok = self.take()
            rhs = self.unary()
            if op_tok.text == "*":
                value = value * rhs
            elif rhs == 0:
                raise DivisionByZeroError(f"division by zero (the '/' at position {op_tok.pos})")
            else:
                value = value / rhs
        return value

    def unary(self) -> Fraction:
        # A loop, not recursion: "-----1" must not cost stack frames.
        negate = False
        while self.peek().kind == _OP and self.peek().text == "-":
            self.take()
            negate = not negate
        value = self.primary()
        return -value if negate else value

    def primary(self) -> Fraction:
        tok = self.take()
        if tok.kind == _INT:
            n = int(tok.text)
            self.literals.append(n)
            return Fraction(n)
        if tok.kind == _OP and tok.text == "(":
            self.depth += 1
            if self.depth > self.max_depth:
                raise NestingTooDeepError(
                    f"parentheses nest deeper than {self.max_depth} levels (at position {tok.pos})"
                )
            value = self.expr()
            close = self.take()
            if not (close.kind == _OP and close.text == ")"):
                raise ArithmeticParseError(
                    f"expected ')' to close the '(' at position {tok.pos}, found {_describe(close)}"
                )
            self.depth -= 1
            return value
        raise ArithmeticParseError(f"expected a number or '(', found {_describe(tok)}")


def _describe(tok: _Token) -> str:
    if tok.kind == _END:
        return "end of input"
    kind = "number" if tok.kind == _INT else "operator"
    return f"{kind} {tok.text!r} at position {tok.pos}"


def evaluate(
    text: str,
    *,
    max_length: int = MAX_LENGTH,
    max_depth: int = MAX_DEPTH,
    max_literal_digits: int = MAX_LITERAL_DIGITS,
) -> ArithmeticResult:
    """Parse and evaluate an arithmetic expression exactly.

    Args:
        text: the expression, e.g. ``"(44 - 19) * 2 + 3"``.
        max_length: most characters accepted (checked first, on the raw text).
        max_depth: most nested parenthesis levels.
        max_literal_digits: most digits in one integer literal.

    Returns:
        The exact value and the integer literals used, in order of appearance.

    Raises:
        TypeError: ``text`` is not a ``str``.
        ExpressionTooLongError: ``len(text) > max_length``.
        NestingTooDeepError: parentheses nest deeper than ``max_depth``.
        LiteralTooLargeError: a literal has more than ``max_literal_digits`` digits.
        DivisionByZeroError: a divisor evaluates to exactly zero.
        ArithmeticParseError: any other text that is not in the grammar (the module docstring).
    """
    if not isinstance(text, str):
        raise TypeError(f"evaluate() needs a str, got {type(text).__name__}")
    if len(text) > max_length:
        raise ExpressionTooLongError(f"expression has {len(text)} characters; at most {max_length} are allowed")
    parser = _Parser(_tokenize(text, max_literal_digits), max_depth)
    value = parser.parse()
    return ArithmeticResult(value=value, literals=tuple(parser.literals))
