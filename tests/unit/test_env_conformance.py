"""Conformance of every registered env with the text contract (Gymnasium tests/envs style)."""

from __future__ import annotations

import pytest

from ragen_rllib.envs import list_envs, list_variants, make_env

CASES = [(name, variant) for name in list_envs() for variant in list_variants(name)]
# Texts no env understands: each must be a no-op invalid step.
JUNK = ["", "   ", "jump", "<answer>Up</answer>", "Up || Down", "x" * 10_000, "\x00\x01", "🙂", "None"]


def _first_valid_action(env) -> str:
    if env.action_names:
        return env.action_names[0]
    return env.solution  # Countdown: a free-text equation


@pytest.mark.parametrize("name,variant", CASES)
def test_api_types_and_info_keys(name: str, variant: str) -> None:
    env = make_env(name, variant=variant)
    obs, info = env.reset(seed=3, options={"dynamics_seed": 7})
    assert isinstance(obs, str) and obs
    assert isinstance(info, dict) and info["initial_seed"] == 3 and info["dynamics_seed"] == 7
    assert isinstance(env.instruction, str) and env.instruction
    assert env.actions_left == env.max_actions
    obs, r, term, trunc, info = env.step(_first_valid_action(env))
    assert isinstance(obs, str) and isinstance(r, float)
    assert isinstance(term, bool) and isinstance(trunc, bool) and not (term and trunc)
    for key in ("success", "action_is_valid", "action_is_effective"):
        assert isinstance(info[key], bool), (name, key, info)
    assert info["action_is_valid"]


@pytest.mark.parametrize("name,variant", CASES)
def test_same_seeds_same_episode(name: str, variant: str) -> None:
    a, b = make_env(name, variant=variant), make_env(name, variant=variant)
    for seed in range(5):
        oa, _ = a.reset(seed=seed, options={"dynamics_seed": 100 + seed})
        ob, _ = b.reset(seed=seed, options={"dynamics_seed": 100 + seed})
        assert oa == ob
        act = _first_valid_action(a)
        for _ in range(3):
            sa, sb = a.step(act), b.step(act)
            assert sa[:4] == sb[:4]
            if sa[2] or sa[3]:
                break


@pytest.mark.parametrize("name,variant", CASES)
def test_initial_state_depends_only_on_initial_seed(name: str, variant: str) -> None:
    env = make_env(name, variant=variant)
    states = {env.reset(seed=11, options={"dynamics_seed": d})[0] for d in range(5)}
    assert len(states) == 1
    distinct = {env.reset(seed=s)[0] for s in range(40)}
    assert len(distinct) > 1, f"{name}:{variant} generates one state for 40 seeds"


@pytest.mark.parametrize("name,variant", CASES)
def test_invalid_text_is_a_noop_step(name: str, variant: str) -> None:
    env = make_env(name, variant=variant)
    obs0, _ = env.reset(seed=5)
    for junk in JUNK:
        if env.action_names and junk.strip().lower() in {a.lower() for a in env.action_names}:
            continue
        obs, r, term, trunc, info = env.step(junk)
        assert (obs, r, term, trunc) == (obs0, 0.0, False, False), (name, junk)
        assert info["action_is_valid"] is False
    assert env.actions_left == env.max_actions


@pytest.mark.parametrize("name,variant", CASES)
def test_budget_truncates_and_step_after_end_raises(name: str, variant: str) -> None:
    env = make_env(name, variant=variant)
    env.reset(seed=2)
    act = _first_valid_action(env)
    for _ in range(env.max_actions):
        *_, term, trunc, _ = env.step(act)
        if term or trunc:
            break
    assert term or trunc
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(act)


def test_step_before_reset_raises() -> None:
    with pytest.raises(RuntimeError, match="before reset"):
        make_env("frozen_lake").step("Up")


def test_dynamics_seed_changes_stochastic_transitions() -> None:
    """Same start state, different dynamics seeds -> different outcomes (bandit and frozen lake)."""
    bandit = make_env("bandit")
    payouts = set()
    for d in range(40):
        bandit.reset(seed=1, options={"dynamics_seed": d})
        payouts.add(bandit.step("Dragon")[1])
    assert payouts == {0.0, 1.0}
    lake = make_env("frozen_lake")
    paths = set()
    for d in range(30):
        lake.reset(seed=4, options={"dynamics_seed": d})
        paths.add(tuple(lake.step("Right")[0] for _ in range(1)))
    assert len(paths) > 1
