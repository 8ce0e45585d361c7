"""Prompts (RAGEN's chat layout), reply parsing, context budget and turn execution. Stdlib only."""

from ragen_rllib.prompting.chat_format import (
    ContextFit, ParsedReply, PromptConfig, Turn, build_messages, fit_context, instruction_message,
    parse_reply, render_prompt,
)
from ragen_rllib.prompting.turns import TurnOutcome, execute_reply

__all__ = ["ContextFit", "ParsedReply", "PromptConfig", "Turn", "TurnOutcome", "build_messages", "execute_reply",
           "fit_context", "instruction_message", "parse_reply", "render_prompt"]
