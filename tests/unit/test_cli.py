from __future__ import annotations

import io
import subprocess
import sys

import pytest

from ragen_rllib.cli import main


def run(argv: list[str], stdin: str = "") -> str:
    out = io.StringIO()
    assert main(argv, out=out, inp=io.StringIO(stdin)) == 0
    return out.getvalue()


def test_envs_lists_envs_and_variants() -> None:
    text = run(["envs"])
    for name in ("bandit", "sokoban", "frozen_lake", "countdown"):
        assert name in text
    assert "larger" in text and "new_vocab" in text and "rev" in text


def test_play_sokoban_by_bfs_plan_wins() -> None:
    from ragen_rllib.envs import make_env

    env = make_env("sokoban")
    env.reset(seed=3)
    plan = env.solve()
    assert plan is not None and len(plan) <= 10
    replies = "".join(f"<think>step</think><answer>{a}</answer>\n" for a in plan)
    text = run(["play", "sokoban", "--seed", "3", "--max-turns", "20"], replies)
    assert "Turn 1:\nState:" in text and "success" in text and "episode over" in text


def test_play_wraps_plain_input_and_penalises_garbage() -> None:
    text = run(["play", "bandit", "--seed", "0"], "???\nDragon\n")
    assert "penalty -0.1" in text and "(as reply: <think></think><answer>???</answer>)" in text
    assert "success" in text and "Dragon:" in text


def test_play_eof_quits_cleanly() -> None:
    assert "(quit)" in run(["play", "frozen_lake"], "")


def test_play_bad_env_or_field_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="unknown env 'nope'"):
        main(["play", "nope"], out=io.StringIO(), inp=io.StringIO())
    with pytest.raises(SystemExit, match="unknown config field"):
        main(["play", "sokoban", "--set", "colour=1"], out=io.StringIO(), inp=io.StringIO())


def test_prompt_without_model_shows_messages() -> None:
    text = run(["prompt", "all", "--both-formats"])
    assert text.count("=====") >= 8 and "(no-think)" in text and "----- system -----" in text


def test_console_script_installed() -> None:
    out = subprocess.run([sys.executable, "-m", "ragen_rllib.cli", "envs"], capture_output=True, text=True, check=True)
    assert "sokoban" in out.stdout
