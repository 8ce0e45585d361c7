"""Reply parsing, turn execution and the context budget: malformed outputs never crash."""

from __future__ import annotations

import random

import pytest

from ragen_rllib.envs import make_env
from ragen_rllib.prompting import PromptConfig, Turn, build_messages, execute_reply, fit_context, parse_reply

THINK = PromptConfig()
NO_THINK = PromptConfig(enable_think=False)


@pytest.mark.parametrize("text,actions", [
    ("<think>go up</think><answer>Up</answer>", ("Up",)),
    ("<think>a</think>\n  <answer> Up || Left ||  || Down </answer>", ("Up", "Left", "Down")),
    ("<think>x</think><answer>Up</answer><think>y</think><answer>Down</answer>", ("Up",)),  # first match wins
    ("<think>x</think><answer>Up<|im_end|></answer>", ("Up",)),  # special tokens stripped
    ("<think>x</think><answer></answer>", ()),  # well-formed, no actions
])
def test_think_format(text: str, actions: tuple[str, ...]) -> None:
    p = parse_reply(text, THINK)
    assert p.well_formed and p.actions == actions


def test_think_text_and_answer_fields() -> None:
    p = parse_reply("<think> push the box <|im_start|></think><answer>Right</answer> trailing chatter", THINK)
    assert p.think == "push the box" and p.answer == "Right"


@pytest.mark.parametrize("text", [
    "", "Up", "<answer>Up</answer>",  # think format needs the think block
    "<think>no close<answer>Up</answer>",
    "<think>x</think> blah <answer>Up</answer>",  # text between blocks
    "<think>x</think><answer>Up",  # unclosed answer
    "</think><answer>Up</answer>",
])
def test_think_format_malformed(text: str) -> None:
    p = parse_reply(text, THINK)
    assert not p.well_formed and p.actions == ()


def test_no_think_format() -> None:
    assert parse_reply("<answer> Dragon </answer>", NO_THINK).actions == ("Dragon",)
    assert parse_reply("<think>x</think><answer>Up</answer>", NO_THINK).actions == ("Up",)
    assert not parse_reply("<answer>Dragon", NO_THINK).well_formed


def test_max_actions_per_turn_drops_the_rest() -> None:
    cfg = PromptConfig(max_actions_per_turn=2)
    p = parse_reply("<think></think><answer>Up || Up || Left || Down</answer>", cfg)
    assert p.actions == ("Up", "Up") and p.dropped_actions == ("Left", "Down")


def test_non_string_and_huge_inputs() -> None:
    assert not parse_reply(None, THINK).well_formed
    assert not parse_reply(b"<think></think><answer>Up</answer>", THINK).well_formed
    huge = "<think>" * 200_000
    p = parse_reply(huge, THINK)
    assert not p.well_formed and p.truncated_input
    p = parse_reply("<think>" + "a" * 100_000 + "</think><answer>Up</answer>", THINK)
    assert not p.well_formed and p.truncated_input  # the answer lies beyond the cap


def test_fuzzed_replies_never_crash_the_turn() -> None:
    rng = random.Random(0)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", "||", "Up", "Down", "Left", "Right", "push", " ", "\n",
              "<|im_end|>", "<", ">", "|", "🙂", "\x00", "Dragon", "0", "(1+2)*3"]
    for name in ("sokoban", "frozen_lake", "bandit", "countdown"):
        env = make_env(name)
        for i in range(300):
            env.reset(seed=i)
            reply = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
            for cfg in (THINK, NO_THINK):
                env.reset(seed=i)
                out = execute_reply(env, reply, cfg)
                assert out.penalty in (0.0, cfg.format_penalty)
                assert out.num_valid + out.num_invalid + out.num_unexecuted == len(out.parsed.actions)


def test_turn_penalty_rules() -> None:
    env = make_env("sokoban")
    env.reset(seed=0)
    out = execute_reply(env, "<think>hmm</think><answer>Up</answer>", THINK)
    assert out.penalty == 0.0 and out.num_valid == 1 and out.env_reward == pytest.approx(-0.1)
    env.reset(seed=0)
    out = execute_reply(env, "I will go up", THINK)  # malformed: penalty, no step
    assert out.penalty == -0.1 and out.num_valid == 0 and env.num_actions == 0 and out.reward == -0.1
    env.reset(seed=0)
    out = execute_reply(env, "<think></think><answer>Up || Fly</answer>", THINK)  # one invalid action
    assert out.penalty == -0.1 and out.num_valid == 1 and out.num_invalid == 1
    env.reset(seed=0)
    out = execute_reply(env, "<think></think><answer></answer>", PromptConfig(format_penalty=-0.5))
    assert out.penalty == -0.5  # well-formed but no valid action


def test_dropped_actions_are_penalised_only_when_asked() -> None:
    # FrozenLake 4x4: six moves, the sixth beyond max_actions_per_turn=5; Left/Up at the start are
    # valid no-ops (the agent stays in the corner), so the episode cannot end before the drop.
    reply = "<answer>Left || Up || Left || Up || Left || Up</answer>"
    off, on = PromptConfig(enable_think=False), PromptConfig(enable_think=False, penalize_dropped_actions=True)
    for cfg, penalty in ((off, 0.0), (on, -0.1)):
        env = make_env("frozen_lake:not_slippery")
        env.reset(seed=3)
        out = execute_reply(env, reply, cfg)
        assert out.num_dropped == 1 and out.num_valid == 5 and out.num_invalid == 0
        assert out.penalty == penalty and env.num_actions == 5
    env = make_env("frozen_lake:not_slippery")  # five actions: nothing dropped, no penalty either way
    env.reset(seed=3)
    assert execute_reply(env, "<answer>Left || Up || Left || Up || Left</answer>", on).penalty == 0.0


def test_prompt_config_from_fields_takes_the_named_settings() -> None:
    cfg = PromptConfig.from_fields({"enable_think": False, "penalize_dropped_actions": True,
                                    "format_penalty": -0.2, "actor_lr": 1e-5})  # unknown keys ignored
    assert cfg == PromptConfig(enable_think=False, penalize_dropped_actions=True, format_penalty=-0.2)


def test_actions_stop_when_the_episode_ends() -> None:
    env = make_env("bandit")
    env.reset(seed=0)
    out = execute_reply(env, "<think></think><answer>Dragon || Phoenix || Dragon</answer>", THINK)
    assert out.terminated and out.num_valid == 1 and out.num_unexecuted == 2 and out.success


def test_messages_layout() -> None:
    env = make_env("sokoban")
    obs, _ = env.reset(seed=0)
    turns = [Turn(obs, 10, "<think>a</think><answer>Up</answer>", -0.1), Turn("S2", 9)]
    msgs = build_messages(env, turns, THINK)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    first = msgs[1]["content"]
    assert first.startswith(env.instruction)
    assert "The meaning of each symbol" in first and "Up, Down, Left, Right" in first
    assert "Turn 1:\nState:\n" + obs in first and "You have 10 actions left" in first and "<think>" in first
    assert msgs[3]["content"].startswith("Reward:\n-0.1\n\nTurn 2:\nState:\nS2\nYou have 9 actions left")
    nothink = build_messages(env, turns[:1], NO_THINK)[1]["content"]
    assert "<think>" not in nothink and "<answer> [your answer] </answer>" in nothink


def test_context_budget_drops_oldest_whole_turns() -> None:
    env = make_env("sokoban")
    env.reset(seed=0)
    turns = [Turn(f"state{i}" * 20, 10 - i, "<think></think><answer>Up</answer>", 0.0)
             for i in range(6)] + [Turn("now", 4)]

    def count(ts, start):  # chars as a stand-in for tokens
        return sum(len(m["content"]) for m in build_messages(env, ts, THINK, first_turn_number=start + 1))

    full = count(turns, 0)
    fit = fit_context(turns, count, full)
    assert fit.dropped_turns == 0 and not fit.overflow
    fit = fit_context(turns, count, full - 1)
    assert fit.dropped_turns == 1 and fit.tokens <= full - 1
    kept = build_messages(env, turns[fit.first_turn_index:], THINK, first_turn_number=fit.first_turn_index + 1)
    assert kept[1]["content"].startswith(env.instruction) and "Turn 2:" in kept[1]["content"]
    fit = fit_context(turns, count, 10)  # nothing fits: keep the newest turn, flag overflow
    assert fit.first_turn_index == len(turns) - 1 and fit.overflow


def test_prompt_config_validation_names_field() -> None:
    with pytest.raises(ValueError, match="max_actions_per_turn"):
        PromptConfig(max_actions_per_turn=0)
    with pytest.raises(ValueError, match="format_penalty"):
        PromptConfig(format_penalty=0.5)


def test_think_text_extracts_the_reasoning() -> None:
    from ragen_rllib.prompting.chat_format import think_text

    assert think_text("<think>go left now</think><answer>Left</answer>") == "go left now"
    assert think_text("a b</think><answer>x</answer>") == "a b"  # forced <think> prefix not stored
    assert think_text("<answer>x</answer>") is None
    assert think_text("<think>never closed") is None
