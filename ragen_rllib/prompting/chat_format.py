"""RAGEN's chat layout for multi-turn text envs, the reply parser, and the context budget.

Layout (RAGEN ``ContextManager.get_lm_inputs``), one growing chat per episode::

    system    : a short assistant line
    user      : env instruction + symbol legend + action list + "Turn 1: State: ... K actions left ..."
    assistant : reply of turn 1
    user      : "Reward:\\n<r>\\n\\nTurn 2: State: ..."
    assistant : reply of turn 2
    ...

The chat is rendered through the *model's own* chat template (``render_prompt``), and the
generation is forced to start with ``<think>`` (think format) or ``<answer>`` (no-think format),
as RAGEN does. The parser reads that prefix + the sampled text.

Import-light: stdlib only. The tokenizer is duck-typed (anything with ``apply_chat_template``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Protocol, Sequence

Message = dict[str, str]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
#: Parser input cap (chars). A reply is capped by the engine's max new tokens anyway
#: (400 tokens ~ 2k chars); the cap keeps adversarial strings from costing anything.
MAX_PARSE_CHARS = 32_000
# Chat special tokens such as <|im_start|>, <|im_end|>, <|endoftext|>: stripped from parsed parts.
_SPECIAL_RE = re.compile(r"<\|[^<>|\s]{1,40}\|>")
_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)


@dataclass(frozen=True)
class PromptConfig:
    """How episodes are shown to the model and how replies are read (RAGEN names)."""

    enable_think: bool = True  # <think>..</think><answer>..</answer> vs <answer>..</answer> only
    max_actions_per_turn: int = 5  # actions executed per reply; the rest are recorded as dropped
    action_sep: str = "||"
    max_response_words: int = 100  # only the "Max response length" sentence (RAGEN env max_tokens)
    format_penalty: float = -0.1  # added to a turn that executes no valid action / has an invalid one
    # Also penalise a turn that lists more than max_actions_per_turn actions. RAGEN drops them without a
    # penalty (the default); then nothing stops RL from lengthening the lists until replies truncate.
    penalize_dropped_actions: bool = False
    system_prompt: str = "You're a helpful assistant. "
    max_context_tokens: int = 3600  # prompt budget; oldest whole turns are dropped beyond it

    def __post_init__(self) -> None:
        if self.max_actions_per_turn < 1:
            raise ValueError(f"PromptConfig.max_actions_per_turn must be >= 1, got {self.max_actions_per_turn!r}")
        if not self.action_sep or self.action_sep.isspace():
            raise ValueError(f"PromptConfig.action_sep must be a visible separator, got {self.action_sep!r}")
        if self.format_penalty > 0:
            raise ValueError(f"PromptConfig.format_penalty must be <= 0, got {self.format_penalty!r}")
        if self.max_context_tokens < 16:
            raise ValueError(f"PromptConfig.max_context_tokens must be >= 16, got {self.max_context_tokens!r}")
        if self.max_response_words < 1:
            raise ValueError(f"PromptConfig.max_response_words must be >= 1, got {self.max_response_words!r}")

    @classmethod
    def from_fields(cls, src: Mapping[str, Any]) -> PromptConfig:
        """The prompt settings named in ``src`` (a run's parameters or saved eval protocol); others default."""
        return cls(**{f.name: src[f.name] for f in fields(cls) if f.name in src})

    @property
    def generation_prefix(self) -> str:
        """Text forced at the start of every reply (RAGEN appends it after the template)."""
        return THINK_OPEN if self.enable_think else ANSWER_OPEN


class EnvPromptView(Protocol):
    """What the prompt needs from an env (``ragen_rllib.envs.base.TextEnv`` provides it)."""

    @property
    def instruction(self) -> str: ...
    @property
    def symbol_legend(self) -> dict[str, str] | None: ...
    @property
    def action_names(self) -> list[str] | None: ...


@dataclass
class Turn:
    """One turn of the visible history.

    Attributes:
        state: the env observation shown at the start of the turn.
        actions_left: action budget left when the turn starts.
        response: the reply text (forced prefix included), ``None`` while being generated.
        reward: the env reward of the turn (shown to the model as "Reward: r"), ``None`` until stepped.
    """

    state: str
    actions_left: int
    response: str | None = None
    reward: float | None = None


def instruction_message(env: EnvPromptView, cfg: PromptConfig) -> str:
    """Return the fixed head of the first user message: task, symbol legend, action list."""
    parts = [env.instruction.strip()]
    legend = env.symbol_legend
    if legend:
        parts.append("The meaning of each symbol in the state is:\n"
                     + ", ".join(f"{k}: {v}" for k, v in legend.items()))
    names = env.action_names
    if names:
        parts.append(
            "Your available actions are:\n" + ", ".join(names) + "\n"
            f"You can make up to {cfg.max_actions_per_turn} actions per turn, separated by the action separator "
            f'"{cfg.action_sep}".'
        )
    return "\n".join(parts)


def format_reply_rule(cfg: PromptConfig) -> str:
    """Return the per-turn format instruction (think or no-think)."""
    if cfg.enable_think:
        shape = f"{THINK_OPEN} [Your thoughts] {THINK_CLOSE} {ANSWER_OPEN} [your answer] {ANSWER_CLOSE}"
    else:
        shape = f"{ANSWER_OPEN} [your answer] {ANSWER_CLOSE}"
    return (f"Always output: {shape} with no extra text. Strictly follow this format. "
            f"Max response length: {cfg.max_response_words} words (tokens).")


def turn_block(turn_number: int, turn: Turn, cfg: PromptConfig) -> str:
    """Return the user text that opens turn ``turn_number`` (1-based)."""
    return (f"Turn {turn_number}:\nState:\n{turn.state}\n"
            f"You have {turn.actions_left} actions left. {format_reply_rule(cfg)}")


def build_messages(env: EnvPromptView, turns: Sequence[Turn], cfg: PromptConfig,
                   first_turn_number: int = 1) -> list[Message]:
    """Build the chat for ``turns`` (the last one may still await its reply).

    Args:
        env: source of instruction, legend and action names.
        turns: visible turns, oldest first (after any context-budget dropping).
        first_turn_number: the number shown for ``turns[0]`` (> 1 after older turns were dropped).

    Returns:
        ``[{"role": ..., "content": ...}, ...]``: system, user, assistant, user, ...
    """
    msgs: list[Message] = [{"role": "system", "content": cfg.system_prompt}]
    user = instruction_message(env, cfg) + "\n"
    for i, turn in enumerate(turns):
        user += turn_block(first_turn_number + i, turn, cfg)
        msgs.append({"role": "user", "content": user})
        if turn.response is None:
            break
        msgs.append({"role": "assistant", "content": turn.response})
        user = f"Reward:\n{0.0 if turn.reward is None else turn.reward:g}\n\n"
    return msgs


class ChatTemplateTokenizer(Protocol):
    def apply_chat_template(self, conversation: list[Message], **kwargs: object) -> object: ...


def render_prompt(tokenizer: ChatTemplateTokenizer, messages: list[Message], cfg: PromptConfig) -> str:
    """Render ``messages`` with the model's chat template, ending in the forced reply prefix.

    Returns:
        The prompt text: template output with the generation prompt, then ``<think>`` or
        ``<answer>``. The model continues from there.
    """
    if messages and messages[-1]["role"] != "user":
        raise ValueError(f"render_prompt needs the chat to end with a user message, got role {messages[-1]['role']!r}")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
    return text + cfg.generation_prefix


# --------------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class ParsedReply:
    """Result of parsing one reply.

    Attributes:
        well_formed: the reply matched the format (think+answer, or answer only).
        think: text inside the first ``<think>`` block ('' when absent).
        answer: text inside the first ``<answer>`` block ('' when absent).
        actions: the actions to execute (at most ``max_actions_per_turn``), in order.
        dropped_actions: actions beyond ``max_actions_per_turn``: recorded, never executed.
        truncated_input: the reply was longer than ``MAX_PARSE_CHARS`` and was cut before parsing.
    """

    well_formed: bool
    think: str = ""
    answer: str = ""
    actions: tuple[str, ...] = ()
    dropped_actions: tuple[str, ...] = ()
    truncated_input: bool = False


def _clean(part: str) -> str:
    part = _SPECIAL_RE.sub("", part)
    for tag in _TAGS:
        part = part.replace(tag, "")
    return part.strip()


def _block(text: str, open_tag: str, close_tag: str, start: int) -> tuple[str, int] | None:
    i = text.find(open_tag, start)
    if i < 0:
        return None
    j = text.find(close_tag, i + len(open_tag))
    if j < 0:
        return None
    return text[i + len(open_tag): j], j + len(close_tag)


def parse_reply(text: object, cfg: PromptConfig) -> ParsedReply:
    """Parse a model reply (forced prefix included) into actions. Never raises.

    Rule (RAGEN ``_parse_response``, made linear-time): the first ``<think>`` block, then, after
    optional whitespace, the first ``<answer>`` block (think format); or the first ``<answer>``
    block (no-think format). Text after the match is ignored. Chat special tokens and stray tags
    are stripped from both parts. The answer is split on ``cfg.action_sep``; empty pieces are
    dropped; pieces beyond ``cfg.max_actions_per_turn`` go to ``dropped_actions``.

    Args:
        text: the reply; anything that is not a ``str`` is treated as a malformed reply.
    """
    if not isinstance(text, str):
        return ParsedReply(well_formed=False)
    truncated = len(text) > MAX_PARSE_CHARS
    if truncated:
        text = text[:MAX_PARSE_CHARS]
    think = ""
    if cfg.enable_think:
        t = _block(text, THINK_OPEN, THINK_CLOSE, 0)
        if t is None:
            return ParsedReply(well_formed=False, truncated_input=truncated)
        think, end = t
        rest = text[end:]
        if not rest.lstrip().startswith(ANSWER_OPEN):
            return ParsedReply(well_formed=False, think=_clean(think), truncated_input=truncated)
        a = _block(rest, ANSWER_OPEN, ANSWER_CLOSE, 0)
    else:
        a = _block(text, ANSWER_OPEN, ANSWER_CLOSE, 0)
    if a is None:
        return ParsedReply(well_formed=False, think=_clean(think), truncated_input=truncated)
    answer = _clean(a[0])
    pieces = [p.strip() for p in answer.split(cfg.action_sep)]
    pieces = [p for p in pieces if p]
    k = cfg.max_actions_per_turn
    return ParsedReply(well_formed=True, think=_clean(think), answer=answer, actions=tuple(pieces[:k]),
                       dropped_actions=tuple(pieces[k:]), truncated_input=truncated)


# --------------------------------------------------------------------- context budget
@dataclass(frozen=True)
class ContextFit:
    """Result of fitting a history into the prompt budget.

    Attributes:
        first_turn_index: index into the full turn list of the first kept turn.
        dropped_turns: how many oldest turns were dropped (a metric).
        tokens: prompt length after dropping, in tokens (as counted by the caller's function).
        overflow: True if even the newest turn alone does not fit (the caller must stop the
            episode or cap generation; nothing here raises).
    """

    first_turn_index: int
    dropped_turns: int
    tokens: int
    overflow: bool


def fit_context(turns: Sequence[Turn], count_tokens: Callable[[Sequence[Turn], int], int],
                max_context_tokens: int) -> ContextFit:
    """Drop the oldest whole turns until the prompt fits ``max_context_tokens``.

    The first instruction message is always kept (``build_messages`` re-attaches it to the
    first kept turn); the newest turn is never dropped.

    Args:
        turns: the full visible history, oldest first.
        count_tokens: ``(turns[start:], start) -> prompt length in tokens`` for a candidate cut.
        max_context_tokens: budget in tokens.
    """
    start = 0
    n = count_tokens(turns[start:], start)
    while n > max_context_tokens and start < len(turns) - 1:
        start += 1
        n = count_tokens(turns[start:], start)
    return ContextFit(first_turn_index=start, dropped_turns=start, tokens=n, overflow=n > max_context_tokens)


def think_text(reply: str) -> str | None:
    """The reasoning inside a reply's ``<think>…</think>`` block (the forced opening tag may be
    absent from the stored reply), or None when the reply closes no think block."""
    if THINK_CLOSE not in reply:
        return None
    body = reply.split(THINK_CLOSE, 1)[0]
    return body.split(THINK_OPEN, 1)[1] if THINK_OPEN in body else body
