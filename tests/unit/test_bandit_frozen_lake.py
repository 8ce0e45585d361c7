from __future__ import annotations

import numpy as np
import pytest

from ragen_rllib.envs import make_env
from ragen_rllib.envs.frozen_lake import has_path


def test_bandit_rewards_and_success() -> None:
    env = make_env("bandit")
    hi = []
    for d in range(400):
        env.reset(seed=0, options={"dynamics_seed": d})
        obs, r, term, trunc, info = env.step("phoenix")  # case-insensitive
        assert (r, term, info["success"]) == (0.1, True, False)
        assert obs == "Phoenix: 0.1 points"
        env.reset(seed=0, options={"dynamics_seed": d})
        _, r, term, _, info = env.step(" Dragon ")
        assert term and info["success"] and r in (0.0, 1.0)
        hi.append(r)
    assert 0.18 < np.mean(hi) < 0.32  # p = 0.25


def test_bandit_arm_order_is_randomised_per_seed() -> None:
    env = make_env("bandit")
    orders = {tuple(env.action_names) for s in range(30) if env.reset(seed=s)}
    assert orders == {("Phoenix", "Dragon"), ("Dragon", "Phoenix")}


@pytest.mark.parametrize("variant,hi", [("test", "Librarian"), ("rev", "Phoenix"), ("train", "Engineer")])
def test_bandit_variants(variant: str, hi: str) -> None:
    env = make_env("bandit", variant=variant)
    env.reset(seed=0)
    assert env.step(hi)[4]["success"]


def test_bandit_low_arm_reward_configurable() -> None:
    env = make_env("bandit", lo_arm_score=0.15)
    env.reset(seed=0)
    assert env.step("Phoenix")[1] == 0.15


def test_bandit_config_errors_name_field() -> None:
    with pytest.raises(ValueError, match="hi_arm_prob"):
        make_env("bandit", hi_arm_prob=1.5)
    with pytest.raises(ValueError, match="hi_arm_name"):
        make_env("bandit", hi_arm_name="phoenix")


def test_frozen_lake_maps_always_have_a_path() -> None:
    env = make_env("frozen_lake")
    for seed in range(500):
        obs, _ = env.reset(seed=seed)
        assert env.start != env.goal
        assert has_path(env.frozen, env.start, env.goal)
        rows = obs.split("\n")
        assert len(rows) == 4 and all(len(r) == 4 for r in rows)
        assert set(obs) <= set("P_OG\n") and obs.count("P") == 1 and obs.count("G") == 1
    holes = np.mean([_reset(s).frozen.mean() for s in range(300)])
    assert 0.75 < holes < 0.9  # p_frozen = 0.8, start/goal forced frozen



def _reset(seed: int):
    env = make_env("frozen_lake")
    env.reset(seed=seed)
    return env


def test_frozen_lake_slip_distribution() -> None:
    """Intended move 1/3, each perpendicular 1/3, driven by the dynamics seed."""
    counts: dict[str, int] = {}
    for d in range(900):
        env = make_env("frozen_lake")
        env.reset(seed=7, options={"dynamics_seed": d})
        env.pos = (1, 1)
        env.frozen[:] = True
        env.goal = (3, 3)
        info = env.step("Right")[4]
        counts[info["moved"]] = counts.get(info["moved"], 0) + 1
    assert set(counts) == {"Right", "Down", "Up"}
    assert all(250 < c < 350 for c in counts.values()), counts


def test_frozen_lake_goal_hole_and_render_symbols() -> None:
    env = make_env("frozen_lake", variant="not_slippery")
    env.reset(seed=0)
    env.frozen[:] = True
    env.frozen[0, 1] = False
    env.pos, env.goal = (0, 0), (1, 0)
    obs, r, term, _, info = env.step("Right")  # into the hole
    assert term and r == 0.0 and not info["success"] and "X" in obs
    env.reset(seed=0)
    env.frozen[:] = True
    env.pos, env.goal = (0, 0), (1, 0)
    obs, r, term, _, info = env.step("Down")
    assert term and r == 1.0 and info["success"] and "√" in obs
    env.reset(seed=0)
    env.frozen[:] = True
    env.pos, env.goal = (0, 0), (3, 3)
    _, r, term, _, info = env.step("Up")  # border: valid, not effective
    assert not term and r == 0.0 and info["action_is_valid"] and not info["action_is_effective"]


def test_frozen_lake_instruction_says_slippery_only_when_it_is() -> None:
    slippery = make_env("frozen_lake").instruction
    plain = make_env("frozen_lake", variant="not_slippery").instruction
    assert "slippery" in slippery and "did not intend" in slippery
    assert "slippery" not in plain and plain.startswith("You are solving the FrozenLake puzzle.")


def test_frozen_lake_guided_states_the_goal_in_action_words_on_the_same_lake() -> None:
    guided, plain = make_env("frozen_lake:guided"), make_env("frozen_lake", variant="not_slippery")
    obs_g, _ = guided.reset(seed=7)
    obs_p, _ = plain.reset(seed=7)
    assert obs_g.startswith(obs_p) and (guided.frozen == plain.frozen).all() and guided.goal == plain.goal
    assert not guided.config.is_slippery
    guided.frozen[:] = True
    guided.pos, guided.goal = (0, 3), (2, 2)
    assert guided.goal_offset_text() == "The goal is 2 steps Down and 1 step Left from you."
    guided.pos = (2, 0)
    assert guided.goal_offset_text() == "The goal is 2 steps Right from you."
    obs, r, term, _, _ = guided.step("Right")
    assert not term and obs.endswith("The goal is 1 step Right from you.")
    obs, r, term, _, _ = guided.step("Right")
    assert term and r == 1.0 and obs.endswith("You are on the goal.")
    guided.reset(seed=7)
    guided.frozen[:] = True
    guided.frozen[3, 3] = False
    guided.pos, guided.goal = (3, 2), (0, 0)
    assert guided.goal_offset_text() == "The goal is 3 steps Up and 2 steps Left from you."
    obs, _, term, _, _ = guided.step("Right")
    assert term and obs.endswith("You fell into a hole.")


def test_goal_directions_and_the_hint_following_count() -> None:
    import importlib.util
    from pathlib import Path

    from ragen_rllib.envs.frozen_lake import goal_directions
    from ragen_rllib.prompting import PromptConfig

    assert goal_directions("P_G_\nThe goal is 2 steps Down and 1 step Left from you.") == {"Down", "Left"}
    assert goal_directions("P_G_\nYou are on the goal.") is None and goal_directions("P_G_") is None
    path = Path(__file__).resolve().parents[2] / "scripts" / "guided_hint_following.py"
    spec = importlib.util.spec_from_file_location("guided_hint_following", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    states = ["x\nThe goal is 1 step Up from you.", "x\nThe goal is 2 steps Down and 1 step Right from you.",
              "x\nYou fell into a hole."]
    replies = ["<answer> Up || Left </answer>", "<answer> Left </answer>", "<answer> Up </answer>"]
    turns, actions, follows, chance = mod.hint_following(states, replies, PromptConfig(enable_think=False))
    assert (turns, actions, follows) == (2, 3, 1) and chance == 0.25 + 0.5


def test_frozen_lake_spaced_is_the_same_lake_with_one_cell_per_word() -> None:
    spaced, plain = make_env("frozen_lake:spaced"), make_env("frozen_lake", variant="not_slippery")
    obs_s, _ = spaced.reset(seed=7)
    obs_p, _ = plain.reset(seed=7)
    assert (spaced.frozen == plain.frozen).all() and spaced.goal == plain.goal and not spaced.config.is_slippery
    assert obs_s.replace(" ", "") == obs_p  # same text but for the separators
    spaced.frozen[:] = True
    spaced.frozen[1, 0] = False
    spaced.pos, spaced.goal = (0, 1), (0, 3)
    assert spaced.render() == "_ P _ G\nO _ _ _\n_ _ _ _\n_ _ _ _"
    obs, r, term, _, _ = spaced.step("Right")
    assert obs == "_ _ P G\nO _ _ _\n_ _ _ _\n_ _ _ _" and r == 0.0 and not term
    obs, r, term, _, _ = spaced.step("Right")
    assert obs.startswith("_ _ _ √\n") and r == 1.0 and term


def test_frozen_lake_cell_separator_is_validated() -> None:
    from ragen_rllib.envs.frozen_lake import FrozenLakeConfig

    with pytest.raises(ValueError, match="cell_separator"):
        FrozenLakeConfig(cell_separator="|")


def test_frozen_lake_shortest_first_actions_lists_every_optimal_first_move() -> None:
    env = make_env("frozen_lake", variant="not_slippery")
    env.reset(seed=3)
    env.frozen[:] = True
    env.pos, env.goal = (0, 0), (2, 2)
    assert env.shortest_first_actions() == ["Down", "Right"]  # both start a 4-step path
    env.frozen[1, 0] = False  # a hole below: only Right still starts a shortest path
    assert env.shortest_first_actions() == ["Right"]
    env.frozen[0, 1] = False  # both neighbours holes: no path at all
    assert env.shortest_first_actions() == []
    env.frozen[:] = True
    env.frozen[0, 1] = env.frozen[1, 1] = env.frozen[2, 1] = False  # a wall of holes: around, 2+... steps
    env.pos, env.goal = (0, 0), (0, 2)
    assert env.shortest_first_actions() == ["Down"]
    env.pos = env.goal
    assert env.shortest_first_actions() == []


def test_frozen_lake_best_success_probability_by_hand() -> None:
    env = make_env("frozen_lake", variant="not_slippery")
    env.reset(seed=3)
    env.frozen[:] = True
    env.pos, env.goal = (0, 0), (0, 2)
    assert env.best_success_probability(1) == 0.0 and env.best_success_probability(2) == 1.0
    slip = make_env("frozen_lake")  # slippery: intended or either perpendicular move, 1/3 each
    slip.reset(seed=3)
    slip.frozen[:] = True
    slip.pos, slip.goal = (0, 0), (0, 1)
    # One move: Right lands on the goal with 1/3 (Up stays at the border, Down leaves the row);
    # Up moves Up/Left/Right, so also 1/3. Nothing does better.
    assert abs(slip.best_success_probability(1) - 1 / 3) < 1e-12
    # Two moves, no holes: 1/3 now, or stay in (0,0) (Up: 1/3, Left: 1/3 stays) and try again.
    # Best first move is Up (Up/Left stay, Right hits the goal): 1/3 + 2/3 * 1/3 = 5/9.
    assert abs(slip.best_success_probability(2) - 5 / 9) < 1e-12
    slip.frozen[1, 0] = False  # a hole below the start changes nothing for Up (Down is not one of its moves)
    assert abs(slip.best_success_probability(2) - 5 / 9) < 1e-12
    slip.pos = (1, 0)  # in the hole
    assert slip.best_success_probability(5) == 0.0


def test_frozen_lake_best_success_probability_in_turns_by_hand() -> None:
    slip = make_env("frozen_lake")
    slip.reset(seed=3)
    slip.frozen[:] = True
    slip.pos, slip.goal = (0, 0), (0, 1)
    assert abs(slip.best_success_probability_in_turns(1, 1) - 1 / 3) < 1e-12
    # One turn of two actions, unseen in between: Up then Right. Up reaches the goal (1/3) or stays
    # in (0,0) (Up into the border, Left into the border), so not seeing it costs nothing: 5/9.
    assert abs(slip.best_success_probability_in_turns(1, 2) - 5 / 9) < 1e-12
    assert abs(slip.best_success_probability_in_turns(1, 2, actions=1) - 1 / 3) < 1e-12  # the budget binds
    assert slip.best_success_probability_in_turns(0, 5) == 0.0  # no turn, no move
    slip.pos = slip.goal
    assert slip.best_success_probability_in_turns(0, 5) == 1.0
    with pytest.raises(ValueError, match="actions_per_turn"):
        slip.best_success_probability_in_turns(3, 0)
    with pytest.raises(ValueError, match="actions must be >= 0, or None for the actions left; got -1"):
        slip.best_success_probability_in_turns(3, 5, actions=-1)
    with pytest.raises(ValueError, match="actions must be >= 0, or None for the actions left; got -2"):
        slip.best_success_probability(actions=-2)  # the twin ceiling shares the budget check
    for seed in range(123, 131):  # one action a turn with a turn per action is the closed loop
        env = make_env("frozen_lake")
        env.reset(seed=seed)
        seen = env.best_success_probability()
        assert abs(env.best_success_probability_in_turns(10, 1) - seen) < 1e-12
        blind = [env.best_success_probability_in_turns(3, k) for k in (1, 2, 5)]
        assert blind == sorted(blind) and blind[-1] <= seen + 1e-12  # more actions a turn help; never above seeing
    flat = make_env("frozen_lake", variant="not_slippery")
    flat.reset(seed=123)
    assert flat.best_success_probability_in_turns(3, 5) == 1.0  # without slips one planned path reaches the goal
