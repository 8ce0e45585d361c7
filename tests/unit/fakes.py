"""Fakes for unit tests only: a character-level ChatML tokenizer and a scripted engine.

Real engines (vLLM, HF) are exercised in tests/integration; these fakes only let the rollout
loop's bookkeeping be checked exactly and fast.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from ragen_rllib.env_runners.engine import Generation, SamplingParams

SPECIALS = {"<|im_start|>": 1, "<|im_end|>": 2}
EOS = 2


class CharTokenizer:
    """One token per character (id = ord + 10); ChatML specials are single tokens."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for s, sid in SPECIALS.items():
                if text.startswith(s, i):
                    ids.append(sid)
                    i += len(s)
                    break
            else:
                ids.append(ord(text[i]) + 10)
                i += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        inv = {v: k for k, v in SPECIALS.items()}
        return "".join(("" if skip_special_tokens else inv[i]) if i in inv else chr(i - 10) for i in ids)


class ScriptedEngine:
    """Replies with ``reply_fn(prompt_text, call_index, row_index)`` + EOS; log-prob -0.5 per token."""

    def __init__(self, tok: CharTokenizer, reply_fn: Callable[[str, int, int], str], eos: bool = True) -> None:
        self.tok, self.reply_fn, self.eos = tok, reply_fn, eos
        self.policy_version = 0
        self.calls: list[list[list[int]]] = []
        self.outputs: list[list[list[int]]] = []

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return (EOS,)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        self.calls.append([list(p) for p in prompts])
        outs = []
        for i, p in enumerate(prompts):
            ids = self.tok.encode(self.reply_fn(self.tok.decode(p), len(self.calls) - 1, i))[: params.max_new_tokens]
            finish = "length"
            if self.eos and len(ids) < params.max_new_tokens:
                ids, finish = ids + [EOS], "stop"
            outs.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason=finish))
        self.outputs.append([o.token_ids for o in outs])
        return outs

    def load_weights(self, named_tensors: Iterable, policy_version: int) -> None:
        self.policy_version = policy_version


def scripted_rows(spec, reply: str, seeds: Sequence[int], run_id: str, iteration: int) -> list[dict]:
    """The trajectory rows of one group per initial seed in ``seeds`` (``spec.group_size`` rollouts
    each), every turn answered with ``reply`` through the character tokenizer."""
    from ragen_rllib.env_runners.rollout_loop import RolloutLoop

    tok = CharTokenizer()
    engine = ScriptedEngine(tok, lambda prompt, call, row: reply)
    return RolloutLoop(engine, tok, spec).run([(g, s) for g, s in enumerate(seeds)], run_id=run_id,
                                              iteration=iteration, sampling_seed=1).rows
