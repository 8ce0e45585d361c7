"""Sokoban env: generation (deterministic, solvable, unsolved), push dynamics, rewards, solver."""

from __future__ import annotations


import numpy as np
import pytest

from ragen_rllib.envs import make_env
from ragen_rllib.envs import sokoban
from ragen_rllib.envs.sokoban import VOCABS, SokobanConfig, SokobanEnv, solve_room

pytestmark = pytest.mark.unit

#: Seeds checked per variant in the solvability test (the issue's counts).
_SEEDS_PER_VARIANT = {"simple": 200, "larger": 50, "new_vocab": 50}


def _env(variant: str, **overrides) -> SokobanEnv:
    return SokobanEnv(SokobanConfig(**{**SokobanEnv.VARIANTS[variant], **overrides}))


def _state(env: SokobanEnv) -> tuple:
    return env.walls.copy(), env.targets.copy(), env.boxes.copy(), env.player


# ------------------------------------------------------------------------------ generation
@pytest.mark.parametrize("variant", list(SokobanEnv.VARIANTS))
def test_same_seed_same_room_and_seeds_differ(variant):
    a, b = _env(variant), _env(variant)
    rooms = set()
    for seed in range(30):
        obs_a, _ = a.reset(seed=seed)
        b.reset(seed=seed + 1000)  # b's history must not matter
        obs_b, _ = b.reset(seed=seed)
        assert obs_a == obs_b
        for x, y in zip(_state(a), _state(b), strict=False):
            assert np.array_equal(x, y)
        rooms.add(obs_a)
    assert len(rooms) >= 25, f"only {len(rooms)} distinct rooms in 30 seeds"


@pytest.mark.parametrize("variant", list(SokobanEnv.VARIANTS))
def test_every_room_is_unsolved_and_its_bfs_plan_solves_it_through_step(variant):
    # A huge budget: the test is about solvability, not about RAGEN's 10-action budget.
    env = _env(variant, max_actions=10_000)
    lengths = []
    for seed in range(_SEEDS_PER_VARIANT[variant]):
        env.reset(seed=seed)
        assert not env.solved, f"seed {seed}: solved at reset"
        assert env.boxes.sum() == env.targets.sum() == env.config.num_boxes
        plan = env.solve()
        assert plan, f"seed {seed}: BFS found no plan for\n{env.render()}"
        lengths.append(len(plan))
        rewards = []
        for i, action in enumerate(plan):
            _, r, terminated, truncated, info = env.step(action)
            rewards.append(r)
            assert info["action_is_valid"] and not truncated
            assert terminated == (i == len(plan) - 1), f"seed {seed}: terminated at step {i} of {len(plan)}"
        assert info["success"] and env.solved
        # The last push puts the last box on a target: -0.1 step + 1 box + 10 solved.
        assert rewards[-1] == pytest.approx(10.9)
    print(f"\n{variant}: optimal plan length mean {np.mean(lengths):.2f}, max {max(lengths)}, "
          f"<= 10 actions: {np.mean(np.array(lengths) <= 10):.0%}")


@pytest.mark.parametrize("variant", list(SokobanEnv.VARIANTS))
def test_render_uses_only_the_variant_symbols_with_the_room_shape(variant):
    env = _env(variant)
    cfg = env.config
    sym = VOCABS[cfg.vocab]
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        lines = obs.split("\n")
        assert len(lines) == cfg.dim_room[0] and all(len(line) == cfg.dim_room[1] for line in lines)
        assert set(obs) - {"\n"} <= set(sym.values())
        assert sum(obs.count(sym[k]) for k in ("player", "player_on_target")) == 1
        assert sum(obs.count(sym[k]) for k in ("box", "box_on_target")) == cfg.num_boxes
        assert obs.count(sym["box"]) >= 1  # not solved
        # The outer ring is always wall.
        assert set(lines[0]) == set(lines[-1]) == {sym["wall"]}
        assert {line[0] for line in lines} == {line[-1] for line in lines} == {sym["wall"]}
    assert set(env.symbol_legend) == set(sym.values())


def test_generation_gives_up_after_bounded_tries(monkeypatch):
    monkeypatch.setattr(sokoban, "_reverse_search", lambda rng, floor, targets, player, *a: (player, targets, 0))
    env = SokobanEnv(max_generation_tries=3)
    with pytest.raises(RuntimeError, match="failed 3 times"):
        env.reset(seed=0)


# ------------------------------------------------------------------------- dynamics/rewards
def test_push_moves_box_and_solving_gives_plus_ten():
    env = SokobanEnv.from_layout(["#######",
                                  "#_____#",
                                  "#_PX_O#",
                                  "#_____#",
                                  "#######"])
    obs, r, term, trunc, info = env.step("Right")
    assert r == -0.1 and not term and not trunc
    assert info == {"action_is_valid": True, "action_is_effective": True, "success": False}
    assert obs.split("\n")[2] == "#__PXO#"
    obs, r, term, trunc, info = env.step("right")
    assert r == pytest.approx(-0.1 + 1.0 + 10.0)
    assert term and not trunc and info["success"]
    assert obs.split("\n")[2] == "#___P√#"


def test_blocked_moves_are_valid_but_not_effective():
    env = SokobanEnv.from_layout(["#######",
                                  "#PX#_O#",
                                  "#X___O#",
                                  "#X__O_#",
                                  "#######"], max_actions=50)
    start = env.render()
    for action in ("Up", "Left", "Right", "Down"):  # wall, wall, box into wall, box into box
        obs, r, term, trunc, info = env.step(action)
        assert r == -0.1 and not term
        assert info["action_is_valid"] and not info["action_is_effective"]
        assert obs == start
    assert env.num_actions == 4


def test_box_leaving_a_target_costs_one():
    env = SokobanEnv.from_layout(["########",
                                  "#P√____#",
                                  "#__X_O_#",
                                  "########"])
    obs, r, term, _, info = env.step("Right")
    assert r == pytest.approx(-1.1) and not term and info["action_is_effective"]
    assert obs.split("\n")[1] == "#_SX___#"  # the player now stands on the vacated target


def test_box_from_target_to_target_nets_zero():
    env = SokobanEnv.from_layout(["#######",
                                  "#P√O__#",
                                  "#___X_#",
                                  "#######"])
    _, r, term, _, _ = env.step("Right")
    assert r == pytest.approx(-0.1) and not term


def test_ordinary_move_is_exactly_minus_point_one_and_player_on_target_renders():
    env = SokobanEnv.from_layout(["######",
                                  "#P_O_#",
                                  "#__X_#",
                                  "######"])
    obs, r, _, _, info = env.step("  Right ")
    assert r == -0.1 and info["action_is_effective"]
    obs, r, _, _, _ = env.step("RIGHT")
    assert r == -0.1
    assert obs.split("\n")[1] == "#__S_#"


def test_step_reward_sets_the_per_step_term_and_nothing_else():
    rows = ["#######",
            "#_____#",
            "#_PX_O#",
            "#_____#",
            "#######"]
    env = SokobanEnv.from_layout(rows, step_reward=0.0)
    assert env.step("Up")[1] == 0.0  # ordinary move
    env.step("Down")
    _, r, term, _, _ = env.step("Right")
    assert r == 0.0 and not term
    _, r, term, _, info = env.step("Right")  # push onto the target: +1 and +10, no step term
    assert r == pytest.approx(11.0) and term and info["success"]
    assert make_env("sokoban", step_reward=0.0).config.step_reward == 0.0  # as `starpo.env_config` passes it
    assert SokobanConfig().step_reward == -0.1  # gym-sokoban's default is unchanged


@pytest.mark.parametrize("text", ["jump", "", "   ", "Up Up", "Up,", "upp", "0", "x" * 100_000, "Ｕp"])
def test_unknown_action_text_is_an_invalid_no_op(text):
    env = SokobanEnv.from_layout(["######",
                                  "#P_O_#",
                                  "#__X_#",
                                  "######"], max_actions=1)
    before = env.render()
    obs, r, term, trunc, info = env.step(text)
    assert (r, term, trunc) == (0.0, False, False)
    assert info["action_is_valid"] is False and info["action_is_effective"] is False
    assert obs == before and env.num_actions == 0
    # The budget is untouched: one valid action is still allowed, and it ends the episode.
    _, _, _, trunc, _ = env.step("Left")
    assert trunc


def test_new_vocab_layout_and_render():
    rows = ["WWWWWW",
            "WA.G.W",
            "W..B.W",
            "WWWWWW"]
    env = SokobanEnv.from_layout(rows, vocab="new_vocab")
    assert env.render() == "\n".join(rows)
    assert env.symbol_legend == {"W": "wall", ".": "empty", "G": "target", "C": "box on target", "B": "box",
                                 "A": "player", "@": "player on target"}
    env.reset(seed=5)  # a layout env always resets to its layout
    assert env.render() == "\n".join(rows)


def test_from_layout_rejects_bad_rooms():
    with pytest.raises(ValueError, match="exactly one player"):
        SokobanEnv.from_layout(["#####", "#_XO#", "#####"])
    with pytest.raises(ValueError, match="as many targets"):
        SokobanEnv.from_layout(["#####", "#PXO#", "#_O_#", "#####"])
    with pytest.raises(ValueError, match="unknown Sokoban symbol"):
        SokobanEnv.from_layout(["#####", "#PX?#", "#####"])


# ---------------------------------------------------------------------------------- solver
def test_solver_finds_the_shortest_plan():
    env = SokobanEnv.from_layout(["#######",
                                  "#_____#",
                                  "#_XPO_#",
                                  "#_____#",
                                  "#######"])
    plan = env.solve()
    # Walk around the box (4 moves), then two pushes right.
    assert len(plan) == 6 and plan[-2:] == ["Right", "Right"]
    assert solve_room(env.walls, env.boxes, env.targets, env.player) == plan
    corridor = SokobanEnv.from_layout(["######", "#PX_O#", "######"])
    assert corridor.solve() == ["Right", "Right"]


def test_solver_unsolvable_capped_and_solved():
    stuck = SokobanEnv.from_layout(["#####",
                                    "#X__#",
                                    "#_PO#",
                                    "#####"])
    assert stuck.solve() is None
    env = SokobanEnv.from_layout(["#######", "#_____#", "#_XPO_#", "#_____#", "#######"])
    assert env.solve(max_states=3) is None
    walls = np.array([[1, 1, 1, 1], [1, 0, 0, 1], [1, 1, 1, 1]], dtype=bool)
    on = np.array([[0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], dtype=bool)
    assert solve_room(walls, on, on, (1, 1)) == []


def test_solver_finds_plans_on_larger_rooms():
    # Reset and solve times are measured in benchmarks/envs.py (make bench-envs), not asserted here.
    env = _env("larger")
    for seed in range(20):
        env.reset(seed=seed)
        assert env.solve() is not None


# ------------------------------------------------------------------------- config/registry
@pytest.mark.parametrize("overrides, field", [
    ({"dim_room": (2, 6)}, "dim_room"),
    ({"dim_room": (6,)}, "dim_room"),
    ({"num_boxes": 0}, "num_boxes"),
    ({"num_boxes": 15}, "num_boxes"),
    ({"search_depth": 0}, "search_depth"),
    ({"max_actions": 0}, "max_actions"),
    ({"vocab": "emoji"}, "vocab"),
    ({"step_reward": "-0.1"}, "step_reward"),
    ({"step_reward": float("nan")}, "step_reward"),
])
def test_config_validation_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        SokobanConfig(**overrides)


def test_config_is_frozen_and_normalises_dim_room():
    cfg = SokobanConfig(dim_room=[7, 8])
    assert cfg.dim_room == (7, 8)
    with pytest.raises(AttributeError):
        cfg.num_boxes = 2  # type: ignore[misc]


def test_registry_and_prompt_data():
    env = make_env("sokoban")
    assert isinstance(env, SokobanEnv) and env.config.dim_room == (6, 6) and env.config.num_boxes == 1
    assert env.max_actions == 10
    larger = make_env("sokoban:larger")
    assert larger.config.dim_room == (8, 8) and larger.config.num_boxes == 2
    assert make_env("sokoban", "new_vocab").config.vocab == "new_vocab"
    assert env.action_names == ["Up", "Down", "Left", "Right"]
    assert "push all boxes to targets" in env.instruction
    assert env.symbol_legend == {"#": "wall", "_": "empty", "O": "target", "√": "box on target", "X": "box",
                                 "P": "player", "S": "player on target"}
    obs, info = env.reset(seed=3)
    assert info["success"] is False and info["initial_seed"] == 3


def test_shortest_first_actions_lists_every_optimal_first_move():
    # Box X left of the player, target O right of it: the shortest plans (6 moves) walk round the
    # box over the row above or the row below, so Up and Down both start one. Left pushes the box
    # against the left wall (dead) and Right steps onto the target (then 8 moves at best).
    env = SokobanEnv.from_layout(["#######",
                                  "#_____#",
                                  "#_XPO_#",
                                  "#_____#",
                                  "#######"])
    before = (env.player, env.boxes.copy())
    assert env.shortest_first_actions() == ["Up", "Down"]
    assert env.player == before[0] and np.array_equal(env.boxes, before[1])  # the env is not changed
    corridor = SokobanEnv.from_layout(["######", "#PX_O#", "######"])
    assert corridor.shortest_first_actions() == ["Right"]
    corridor.step("Right")
    corridor.step("Right")
    assert corridor.solved and corridor.shortest_first_actions() == []
