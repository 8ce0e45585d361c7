"""Token-exact chat assembly: the prompt/observation token segments around sampled tokens.

RAGEN re-renders and re-tokenises the whole chat every turn and trains on the re-tokenised
*text*, so the trained tokens can differ from the sampled ones. Here a trajectory is
the concatenation

    head(turn 0) + sampled_0 + suffix_0 + sampled_1 + suffix_1 + ... + sampled_{K-1}

where ``sampled_k`` are the engine's own token ids and ``head``/``suffix_k`` are tokenised
template + observation text. ``suffix_k`` is what the chat template writes after assistant
turn k's content: the end-of-turn marker, the next user message ("Reward: ..." + the next turn
block) and the assistant header, then the forced ``<think>``/``<answer>`` prefix. It is found by
rendering a conversation with a placeholder assistant message and cutting at the placeholder,
so it works for any chat template that renders earlier messages independently of later ones
(ChatML/SmolLM, Qwen2.5, Llama-3); ``ChatTokens`` checks that property and raises otherwise.

The tokenizer is duck-typed (a Hugging Face tokenizer): no transformers import here.
"""

from __future__ import annotations

from typing import Any, Sequence

_PLACEHOLDER = "\u2063RAGEN_PLACEHOLDER\u2063"


class ChatTokens:
    """Tokenise heads and between-turn suffixes for one tokenizer.

    Args:
        tokenizer: has ``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)``,
            ``encode(text, add_special_tokens=False)`` and ``decode(ids, skip_special_tokens=False)``.
        generation_prefix: text forced at the start of every reply (``<think>`` / ``<answer>``).
    """

    def __init__(self, tokenizer: Any, generation_prefix: str) -> None:
        self.tok = tokenizer
        self.prefix = generation_prefix
        self.closer = self._assistant_closer()

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
        return text

    def _assistant_closer(self) -> str:
        """Text the template writes right after an assistant message's content (e.g. '<|im_end|>\\n')."""
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": _PLACEHOLDER}]
        text = self._render(msgs, add_generation_prompt=False)
        tail = text[text.index(_PLACEHOLDER) + len(_PLACEHOLDER):]
        return tail

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def head(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the first prompt: template with generation prompt, then the forced prefix.

        Args:
            messages: system + first user message (``ragen_rllib.prompting.build_messages``).
        """
        return self.encode(self._render(messages, add_generation_prompt=True) + self.prefix)

    def suffix(self, system: str, next_user: str, sampled_ids: Sequence[int], stop_ids: Sequence[int]) -> list[int]:
        """Token ids that follow a reply's sampled tokens up to the next reply's forced prefix.

        Args:
            system: the system message (some templates need it to render consistently).
            next_user: content of the next user message ("Reward: ...\\n\\nTurn k: ...").
            sampled_ids: the reply's sampled ids; when the last one is a stop token that already is
                (the start of) the template's end-of-turn marker, that marker text is not repeated.
            stop_ids: ids that end a reply (EOS).

        Raises:
            ValueError: the chat template renders an earlier message differently once a later one
                is added (then token-exact concatenation is impossible with this template).
        """
        base = [{"role": "system", "content": system}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": _PLACEHOLDER}]
        before = self._render(base, add_generation_prompt=False)
        after = self._render(base + [{"role": "user", "content": next_user}], add_generation_prompt=True)
        cut = before.index(_PLACEHOLDER) + len(_PLACEHOLDER)
        if not after.startswith(before[:cut]):
            raise ValueError("this chat template re-renders earlier messages when a new one is added; "
                             "token-exact multi-turn concatenation is not possible with it")
        text = after[cut:] + self.prefix
        if sampled_ids and sampled_ids[-1] in stop_ids:
            stop_text = self.tok.decode([sampled_ids[-1]], skip_special_tokens=False)
            if stop_text and text.startswith(stop_text):
                text = text[len(stop_text):]  # the sampled EOS already closed the turn
        return self.encode(text)
