"""The multi-turn rollout loop: P initial-state groups x N samples, all turns batched.

Each turn, every still-active episode contributes one prompt (token ids) to **one** batched
``engine.generate`` call; finished episodes drop out of the batch; env steps for the turn run
between generate calls (they cost microseconds to a millisecond, see ``benchmarks/envs.py``).

Token-exact (see ``chat_tokens.py``): each row's ``token_ids`` is the concatenation of template /
observation tokens and the engine's sampled tokens; ``loss_mask`` is 1 exactly on sampled tokens;
``sample_logprobs`` holds the engine's log-probs there.

Context budget: when an episode's next prompt would exceed ``PromptConfig.max_context_tokens``,
the oldest whole turns are dropped from *that prompt* (the instruction is kept, re-rendered with
the first kept turn); the row's ``token_ids`` remain the full concatenation and the row is flagged
``context_truncated`` with ``dropped_context_turns``, so the learner can tell that later turns
were sampled from a shorter context. If even the newest turn alone does not fit, the episode ends
(truncated, ``context_truncated``). Nothing here raises on model output.

This module imports no vLLM/transformers: the engine and the tokenizer are passed in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ragen_rllib.envs import TextEnv, make_env
from ragen_rllib.prompting import PromptConfig, Turn, build_messages, execute_reply, fit_context
from ragen_rllib.seeds import turn_seed
from ragen_rllib.trajectory.schema import Col
from ragen_rllib.env_runners.chat_tokens import ChatTokens
from ragen_rllib.env_runners.engine import Engine, Generation, SamplingParams


@dataclass(frozen=True)
class RolloutSpec:
    """What to roll out.

    Attributes:
        env_name / env_variant / env_config: passed to ``make_env``.
        group_size: N samples per initial-state group.
        max_turns: turns per episode (RAGEN ``max_turn``); ``None`` = the env's ``MAX_TURNS``.
        prompt: chat layout / parsing / context budget.
        sampling: engine sampling settings (``seed`` is set per call by the loop).
    """

    env_name: str
    env_variant: str | None = None
    env_config: Mapping[str, Any] = field(default_factory=dict)
    group_size: int = 4
    max_turns: int | None = None
    prompt: PromptConfig = field(default_factory=PromptConfig)
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ValueError(f"RolloutSpec.group_size must be >= 1, got {self.group_size!r}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"RolloutSpec.max_turns must be >= 1, got {self.max_turns!r}")


def dynamics_seed_for(initial_seed: int, sample_idx: int) -> int:
    """Per-sample dynamics seed: independent of the other samples of the group (31-bit int)."""
    return int(np.random.SeedSequence([int(initial_seed) & 0xFFFFFFFF, int(sample_idx), 0xD1])
               .generate_state(1)[0] >> 1)


@dataclass
class _Episode:
    group_id: int
    sample_idx: int
    initial_seed: int
    dynamics_seed: int
    env: TextEnv
    turns: list[Turn]
    head: list[int]
    sampled: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    suffixes: list[list[int]] = field(default_factory=list)
    env_rewards: list[float] = field(default_factory=list)
    penalties: list[float] = field(default_factory=list)
    well_formed: list[bool] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    valid: int = 0
    invalid: int = 0
    dropped: int = 0
    effective: int = 0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    done: bool = False
    context_truncated: bool = False
    dropped_context_turns: int = 0


@dataclass
class RolloutStats:
    """Timing and volume of one ``run_rollouts`` call (seconds, tokens)."""

    num_trajectories: int = 0
    num_turns: int = 0
    num_generate_calls: int = 0
    sampled_tokens: int = 0
    prompt_tokens: int = 0
    generate_s: float = 0.0
    env_s: float = 0.0
    total_s: float = 0.0

    @property
    def sampled_tokens_per_s(self) -> float:
        return self.sampled_tokens / self.total_s if self.total_s > 0 else 0.0


@dataclass
class RolloutResult:
    rows: list[dict[str, Any]]
    stats: RolloutStats


class RolloutLoop:
    """Runs batched multi-turn rollouts of one env spec with one engine.

    Args:
        engine: any ``Engine`` (vLLM or HF).
        tokenizer: the engine model's tokenizer (duck-typed HF tokenizer with a chat template).
        spec: env / prompt / sampling settings.
    """

    def __init__(self, engine: Engine, tokenizer: Any, spec: RolloutSpec) -> None:
        self.engine, self.tok, self.spec = engine, tokenizer, spec
        self.chat = ChatTokens(tokenizer, spec.prompt.generation_prefix)
        self.stop_ids = tuple(engine.eos_token_ids) + tuple(spec.sampling.stop_token_ids)
        probe = make_env(spec.env_name, variant=spec.env_variant, **dict(spec.env_config))
        self.env_variant = spec.env_variant or next(iter(type(probe).VARIANTS))
        self.max_turns = spec.max_turns if spec.max_turns is not None else type(probe).MAX_TURNS

    # ------------------------------------------------------------------ public
    def run(self, groups: Sequence[tuple[int, int]], *, run_id: str = "", iteration: int = 0,
            sampling_seed: int = 0, demo_fn: Callable[[TextEnv], str] | None = None) -> RolloutResult:
        """Roll out every (group_id, initial_seed) group with ``spec.group_size`` samples.

        Args:
            groups: ``[(group_id, initial_seed), ...]``: P groups.
            run_id / iteration: stamped on every row.
            sampling_seed: base seed for the engine (turn t uses ``ragen_rllib.seeds.turn_seed``).
            demo_fn: demonstration mode (supervised warm-up): replies come from ``demo_fn(env)``
                (text after the forced prefix), tokenised, + EOS, log-probs 0; the engine is not called.

        Returns:
            rows (one dict per trajectory, keyed by ``Col`` names; P*N rows, group-major) and stats.
        """
        t_start = time.perf_counter()
        stats = RolloutStats()
        t0 = time.perf_counter()
        episodes = [self._start(gid, seed, i) for gid, seed in groups for i in range(self.spec.group_size)]
        stats.env_s += time.perf_counter() - t0
        version = int(self.engine.policy_version)
        for t in range(self.max_turns):
            active = [ep for ep in episodes if not ep.done]
            prompts = []
            t0 = time.perf_counter()
            for ep in list(active):
                ids = self._prompt_ids(ep)
                if ids is None:  # even the newest turn alone exceeds the budget: end the episode
                    ep.done = ep.truncated = ep.context_truncated = True
                    active.remove(ep)
                else:
                    prompts.append(ids)
            stats.env_s += time.perf_counter() - t0
            if not active:
                break
            params = replace(self.spec.sampling, seed=turn_seed(sampling_seed, t))
            t0 = time.perf_counter()
            gens = self.engine.generate(prompts, params) if demo_fn is None else self._demo(active, demo_fn)
            stats.generate_s += time.perf_counter() - t0
            stats.num_generate_calls += 1
            stats.prompt_tokens += sum(len(p) for p in prompts)
            if int(self.engine.policy_version) != version:
                raise RuntimeError(f"engine weights changed during a rollout: policy_version {version} -> "
                                   f"{self.engine.policy_version}")
            t0 = time.perf_counter()
            for ep, gen in zip(active, gens, strict=False):
                stats.sampled_tokens += len(gen.token_ids)
                stats.num_turns += 1
                self._apply(ep, gen.token_ids, gen.logprobs, gen.finish_reason, last_turn=t == self.max_turns - 1)
            stats.env_s += time.perf_counter() - t0
        rows = [self._row(ep, run_id, iteration, version) for ep in episodes]
        stats.num_trajectories = len(rows)
        stats.total_s = time.perf_counter() - t_start
        return RolloutResult(rows=rows, stats=stats)

    def kv_tokens_for(self, seeds: Sequence[int], group_size: int) -> int:
        """KV-cache tokens one ``run`` over these initial seeds can hold at once, at most.

        The distinct first prompts once (the samples of a group, and identical initial states,
        share them through the prefix cache), plus per row every later token: up to ``max_turns``
        replies of ``max_new_tokens`` and, between them, observations no longer than the longest
        first prompt (which holds the instruction as well as the state); each row capped at the
        context budget plus a reply.
        """
        heads = [tuple(self._start(0, int(s), 0).head) for s in seeds]
        longest = max(len(h) for h in heads)
        row_cap = self.spec.prompt.max_context_tokens + self.spec.sampling.max_new_tokens
        tail = self.max_turns * self.spec.sampling.max_new_tokens + (self.max_turns - 1) * longest
        per_row = min(tail, max(0, row_cap - longest))
        return sum(len(h) for h in set(heads)) + len(heads) * group_size * per_row

    # ----------------------------------------------------------------- helpers
    def _demo(self, active: list[_Episode], demo_fn: Callable[[TextEnv], str]) -> list[Generation]:
        eos = list(self.stop_ids[:1])
        out = []
        for ep in active:
            ids = self.chat.encode(demo_fn(ep.env)) + eos
            out.append(Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"))
        return out

    def _start(self, group_id: int, initial_seed: int, sample_idx: int) -> _Episode:
        spec = self.spec
        env = make_env(spec.env_name, variant=spec.env_variant, **dict(spec.env_config))
        dyn = dynamics_seed_for(initial_seed, sample_idx)
        obs, _ = env.reset(seed=initial_seed, options={"dynamics_seed": dyn})
        turns = [Turn(state=obs, actions_left=env.actions_left)]
        head = self.chat.head(build_messages(env, turns, spec.prompt))
        return _Episode(group_id=group_id, sample_idx=sample_idx, initial_seed=initial_seed, dynamics_seed=dyn,
                        env=env, turns=turns, head=head)

    def _prompt_ids(self, ep: _Episode) -> list[int] | None:
        """Next prompt for ``ep``: the full concatenation, or a cut one under the context budget."""
        k = len(ep.sampled)  # turns already answered
        full = ep.head + [i for j in range(k) for i in ep.sampled[j] + ep.suffixes[j]]
        budget = self.spec.prompt.max_context_tokens
        if len(full) <= budget:
            return full
        heads: dict[int, list[int]] = {}

        def head_at(start: int) -> list[int]:
            if start not in heads:
                only = [Turn(state=ep.turns[start].state, actions_left=ep.turns[start].actions_left)]
                heads[start] = self.chat.head(build_messages(ep.env, only, self.spec.prompt,
                                                             first_turn_number=start + 1))
            return heads[start]

        def count(_turns: Sequence[Turn], start: int) -> int:
            if start == 0:
                return len(full)
            return len(head_at(start)) + sum(len(ep.sampled[j]) + len(ep.suffixes[j]) for j in range(start, k))

        fit = fit_context(ep.turns, count, budget)
        ep.context_truncated = True
        ep.dropped_context_turns = max(ep.dropped_context_turns, fit.dropped_turns)
        if fit.overflow:
            return None
        s = fit.first_turn_index
        return head_at(s) + [i for j in range(s, k) for i in ep.sampled[j] + ep.suffixes[j]]

    def _apply(self, ep: _Episode, ids: list[int], logprobs: list[float], finish: str, last_turn: bool) -> None:
        prompt = self.spec.prompt
        reply = prompt.generation_prefix + self.tok.decode(ids, skip_special_tokens=False)
        out = execute_reply(ep.env, reply, prompt)
        ep.sampled.append(list(ids))
        ep.logprobs.append([float(x) for x in logprobs])
        ep.env_rewards.append(out.env_reward)
        ep.penalties.append(out.penalty)
        ep.well_formed.append(out.parsed.well_formed)
        ep.responses.append(reply)
        ep.finish.append(finish)
        ep.valid += out.num_valid
        ep.invalid += out.num_invalid
        ep.dropped += out.num_dropped
        ep.effective += out.num_effective
        ep.success = ep.success or out.success
        cur = ep.turns[-1]
        cur.response, cur.reward = reply, out.env_reward
        if out.done or last_turn:
            ep.done, ep.terminated = True, out.terminated
            ep.truncated = not out.terminated
            ep.turns.append(Turn(state=out.observation, actions_left=ep.env.actions_left))  # final state, display only
            return
        ep.turns.append(Turn(state=out.observation, actions_left=ep.env.actions_left))
        next_user = build_messages(ep.env, ep.turns, prompt)[-1]["content"]
        ep.suffixes.append(self.chat.suffix(prompt.system_prompt, next_user, ids, self.stop_ids))

    def _row(self, ep: _Episode, run_id: str, iteration: int, version: int) -> dict[str, Any]:
        token_ids, mask, lps, turn_of = list(ep.head), [0] * len(ep.head), [0.0] * len(ep.head), [0] * len(ep.head)
        for j, ids in enumerate(ep.sampled):
            token_ids += ids
            mask += [1] * len(ids)
            lps += ep.logprobs[j]
            turn_of += [j] * len(ids)
            if j < len(ep.suffixes):
                sfx = ep.suffixes[j]
                token_ids += sfx
                mask += [0] * len(sfx)
                lps += [0.0] * len(sfx)
                turn_of += [j + 1] * len(sfx)
        k = len(ep.sampled)
        env_return = float(sum(ep.env_rewards))
        return {
            Col.RUN_ID: run_id, Col.ITERATION: iteration, Col.POLICY_VERSION: version,
            Col.ENV_NAME: self.spec.env_name, Col.ENV_VARIANT: self.env_variant,
            Col.GROUP_ID: ep.group_id, Col.SAMPLE_IDX: ep.sample_idx,
            Col.INITIAL_SEED: ep.initial_seed, Col.DYNAMICS_SEED: ep.dynamics_seed,
            Col.TOKEN_IDS: token_ids, Col.LOSS_MASK: mask, Col.SAMPLE_LOGPROBS: lps, Col.TOKEN_TURN: turn_of,
            Col.TURN_REWARDS: [r + p for r, p in zip(ep.env_rewards, ep.penalties, strict=False)],
            Col.TURN_ENV_REWARDS: list(ep.env_rewards), Col.TURN_PENALTIES: list(ep.penalties),
            Col.TURN_WELL_FORMED: list(ep.well_formed), Col.TURN_STATES: [t.state for t in ep.turns[:k]],
            Col.TURN_RESPONSES: list(ep.responses), Col.TURN_FINISH: list(ep.finish),
            Col.FINAL_STATE: ep.turns[-1].state if k else ep.turns[0].state,
            Col.EPISODE_RETURN: env_return, Col.SCORE: env_return + float(sum(ep.penalties)),
            Col.SUCCESS: bool(ep.success), Col.TERMINATED: bool(ep.terminated), Col.TRUNCATED: bool(ep.truncated),
            Col.NUM_TURNS: k, Col.NUM_VALID_ACTIONS: ep.valid, Col.NUM_INVALID_ACTIONS: ep.invalid,
            Col.NUM_DROPPED_ACTIONS: ep.dropped, Col.NUM_EFFECTIVE_ACTIONS: ep.effective,
            Col.NUM_SAMPLED_TOKENS: int(sum(mask)), Col.CONTEXT_TRUNCATED: bool(ep.context_truncated),
            Col.DROPPED_CONTEXT_TURNS: int(ep.dropped_context_turns), Col.KEPT: None,
        }
