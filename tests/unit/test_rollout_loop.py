"""Rollout-loop bookkeeping with a scripted engine: token exactness, masks, groups, budget."""

from __future__ import annotations

import re

import pytest

from ragen_rllib.env_runners.engine import SamplingParams
from ragen_rllib.env_runners.rollout_loop import RolloutLoop, RolloutSpec
from ragen_rllib.envs import make_env
from ragen_rllib.prompting import PromptConfig
from ragen_rllib.trajectory.schema import Col

from fakes import EOS, CharTokenizer, ScriptedEngine

TOK = CharTokenizer()


def sokoban_plan_reply(prompt_text: str, call: int, row: int) -> str:
    """Play the BFS-optimal next move from the last state shown in the prompt."""
    state = prompt_text.rsplit("State:\n", 1)[1].split("\nYou have", 1)[0]
    env = make_env("sokoban")
    env = type(env).from_layout(state.split("\n"))
    plan = env.solve() or ["Up"]
    return f"plan</think><answer>{plan[0]}</answer>"


def run(spec: RolloutSpec, reply_fn, groups=((0, 100), (1, 101))):
    engine = ScriptedEngine(TOK, reply_fn)
    res = RolloutLoop(engine, TOK, spec).run(list(groups), run_id="r", iteration=3, sampling_seed=0)
    return engine, res


def test_groups_seeds_and_row_order() -> None:
    spec = RolloutSpec("bandit", group_size=3, max_turns=1)
    _, res = run(spec, lambda p, c, r: "x</think><answer>Dragon</answer>")
    rows = res.rows
    assert [(r[Col.GROUP_ID], r[Col.SAMPLE_IDX]) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert {r[Col.INITIAL_SEED] for r in rows[:3]} == {100}
    assert len({r[Col.DYNAMICS_SEED] for r in rows}) == 6  # independent dynamics inside a group
    assert all(r[Col.RUN_ID] == "r" and r[Col.ITERATION] == 3 and r[Col.POLICY_VERSION] == 0 for r in rows)
    assert all(r[Col.SUCCESS] and r[Col.TERMINATED] and r[Col.NUM_TURNS] == 1 for r in rows)


def test_token_exact_concatenation_and_mask() -> None:
    spec = RolloutSpec("sokoban", group_size=2, max_turns=4)
    engine, res = run(spec, sokoban_plan_reply)
    for b, row in enumerate(res.rows):
        ids, mask, lps, turn = row[Col.TOKEN_IDS], row[Col.LOSS_MASK], row[Col.SAMPLE_LOGPROBS], row[Col.TOKEN_TURN]
        assert len(ids) == len(mask) == len(lps) == len(turn)
        # Every prompt the engine saw for this row is a prefix of the row, followed by the sampled ids.
        seen = 0
        for call, outs in zip(engine.calls, engine.outputs, strict=False):
            if seen >= row[Col.NUM_TURNS]:
                break
            active = [i for i, _ in enumerate(call)]
            # rows drop out as episodes finish: find this row's prompt by prefix match
            match = [i for i in active
                     if ids[: len(call[i])] == call[i] and ids[len(call[i]): len(call[i]) + len(outs[i])] == outs[i]]
            assert match, f"row {b}: turn {seen} prompt is not a prefix of the stored sequence"
            seen += 1
        sampled = [t for t, m in zip(ids, mask, strict=False) if m]
        replies = "".join(r[len("<think>"):] for r in row[Col.TURN_RESPONSES])
        assert TOK.decode(sampled) == replies  # mask covers exactly the sampled tokens
        assert (all(lp == -0.5 for lp, m in zip(lps, mask, strict=False) if m)
                and all(lp == 0.0 for lp, m in zip(lps, mask, strict=False) if not m))
        assert sum(mask) == row[Col.NUM_SAMPLED_TOKENS]
        assert ids[-1] == EOS and mask[-1] == 1  # ends with the last sampled token (EOS included)
        # template tokens around turns are never masked
        assert all(m == 0 for t, m in zip(ids, mask, strict=False) if t == 1)  # <|im_start|>


def test_suffix_has_reward_and_next_turn_and_no_duplicate_eos() -> None:
    spec = RolloutSpec("sokoban", group_size=1, max_turns=2, env_config={"max_actions": 50})
    engine, res = run(spec, lambda p, c, r: "t</think><answer>Up</answer>", groups=((0, 5),))
    text = TOK.decode(res.rows[0][Col.TOKEN_IDS])
    assert "</answer><|im_end|>\n<|im_start|>user\nReward:\n-0.1\n\nTurn 2:\nState:\n" in text
    assert "<|im_end|><|im_end|>" not in text
    assert text.endswith("<|im_start|>assistant\n<think>t</think><answer>Up</answer><|im_end|>")


def test_sokoban_solved_by_plan_replies() -> None:
    spec = RolloutSpec("sokoban", group_size=2, max_turns=10, env_config={"max_actions": 20})
    engine, res = run(spec, sokoban_plan_reply)
    for row in res.rows:
        assert row[Col.SUCCESS] and row[Col.TERMINATED] and not row[Col.TRUNCATED]
        assert row[Col.TURN_ENV_REWARDS][-1] == pytest.approx(10.9)
        assert all(row[Col.TURN_WELL_FORMED]) and row[Col.NUM_INVALID_ACTIONS] == 0
    assert [len(c) for c in engine.calls] == sorted((len(c) for c in engine.calls), reverse=True)


def test_finished_episodes_leave_the_batch() -> None:
    # sample 0 of each group answers with the right arm -> done after 1 turn; others babble
    def reply(p, call, row):
        return "x</think><answer>Dragon</answer>" if call == 0 and row % 2 == 0 else "babble"

    spec = RolloutSpec("bandit", group_size=2, max_turns=3)
    engine, res = run(spec, reply)
    assert [len(c) for c in engine.calls] == [4, 2, 2]
    babblers = [r for r in res.rows if r[Col.SAMPLE_IDX] == 1]
    assert all(r[Col.NUM_TURNS] == 3 and r[Col.TRUNCATED] and not r[Col.SUCCESS] for r in babblers)
    assert all(r[Col.TURN_PENALTIES] == [-0.1] * 3 and r[Col.SCORE] == pytest.approx(-0.3) for r in babblers)
    assert all(r[Col.EPISODE_RETURN] == 0.0 for r in babblers)  # raw env return excludes penalties


def test_length_finish_without_eos() -> None:
    spec = RolloutSpec("sokoban", group_size=1, max_turns=2, sampling=SamplingParams(max_new_tokens=5),
                       env_config={"max_actions": 50})
    engine, res = run(spec, lambda p, c, r: "a very long reply", groups=((0, 1),))
    row = res.rows[0]
    assert row[Col.TURN_FINISH] == ["length", "length"]
    text = TOK.decode(row[Col.TOKEN_IDS])
    assert "a ver<|im_end|>\n<|im_start|>user\nReward:" in text  # the template closes the cut turn


def test_context_budget_drops_oldest_turns_and_flags_rows() -> None:
    full_spec = RolloutSpec("sokoban", group_size=1, max_turns=4, env_config={"max_actions": 50})
    _, full = run(full_spec, lambda p, c, r: "t</think><answer>Left</answer>", groups=((0, 9),))
    budget = 1300
    spec = RolloutSpec("sokoban", group_size=1, max_turns=4, env_config={"max_actions": 50},
                       prompt=PromptConfig(max_context_tokens=budget))
    engine, res = run(spec, lambda p, c, r: "t</think><answer>Left</answer>", groups=((0, 9),))
    row = res.rows[0]
    assert max(len(c[0]) for c in engine.calls) <= budget
    assert row[Col.CONTEXT_TRUNCATED] and row[Col.DROPPED_CONTEXT_TURNS] >= 1
    assert row[Col.TOKEN_IDS] == full.rows[0][Col.TOKEN_IDS]  # the stored sequence is still the full one
    cut_prompt = TOK.decode(engine.calls[-1][0])
    assert "Turn 1:" not in cut_prompt and re.search(r"Turn [2-4]:", cut_prompt)
    assert "You are solving the Sokoban puzzle" in cut_prompt  # instruction kept


def test_context_overflow_ends_episode() -> None:
    spec = RolloutSpec("sokoban", group_size=1, max_turns=3, prompt=PromptConfig(max_context_tokens=50))
    engine, res = run(spec, lambda p, c, r: "x", groups=((0, 1),))
    row = res.rows[0]
    assert engine.calls == [] and row[Col.NUM_TURNS] == 0 and row[Col.CONTEXT_TRUNCATED] and row[Col.TRUNCATED]


def test_weights_changing_mid_rollout_is_detected() -> None:
    engine = ScriptedEngine(TOK, lambda p, c, r: "x")
    orig = engine.generate

    def bump(prompts, params):
        engine.policy_version += 1
        return orig(prompts, params)

    engine.generate = bump
    with pytest.raises(RuntimeError, match="policy_version"):
        RolloutLoop(engine, TOK, RolloutSpec("bandit", group_size=1)).run([(0, 0)])


def test_kv_tokens_for_counts_shared_first_prompts_once_and_bounds_every_row() -> None:
    """KV-cache sizing from the batch: distinct first prompts once, plus per row its replies and, for
    later turns, observations bounded by the longest first prompt; each row capped by the context."""
    engine = ScriptedEngine(TOK, lambda text, call, row: "x</think><answer>Up</answer>")
    spec = RolloutSpec("frozen_lake", group_size=1, max_turns=3, sampling=SamplingParams(max_new_tokens=7),
                       prompt=PromptConfig(max_context_tokens=10**6))
    loop = RolloutLoop(engine, TOK, spec)
    heads = {s: len(loop._start(0, s, 0).head) for s in (100, 101)}
    longest = max(heads.values())
    per_row = 3 * 7 + 2 * longest
    assert loop.kv_tokens_for([100, 101], group_size=4) == sum(heads.values()) + 8 * per_row
    # the same initial state twice: its prompt is cached once, its rows still count
    assert loop.kv_tokens_for([100, 100], group_size=4) == heads[100] + 8 * (3 * 7 + 2 * heads[100])
    tight = RolloutLoop(engine, TOK, RolloutSpec("frozen_lake", group_size=1, max_turns=3,
                                                  sampling=SamplingParams(max_new_tokens=7),
                                                  prompt=PromptConfig(max_context_tokens=heads[100] + 5)))
    assert tight.kv_tokens_for([100], group_size=2) == heads[100] + 2 * (5 + 7)  # context budget + one reply
