"""FrozenLake (RAGEN §2.3): a random 4x4 lake with slippery ice.

* Map: each tile frozen with probability ``p_frozen`` (0.8), else a hole; start and goal are
  distinct frozen tiles drawn at random; a path from start to goal always exists (BFS check,
  bounded rejection sampling, then a carved path as the last resort so reset never fails).
* Dynamics (driven by the **dynamics seed**, independent per sample): the intended move happens
  with probability 1/3, each perpendicular move with probability 1/3 (gymnasium's slippery rule).
  Moving into the border leaves the player in place.
* Reward 1.0 on reaching the goal, else 0. Terminated on goal or hole. Budget ``max_actions`` (10).
* Symbols (RAGEN): ``P`` player, ``_`` frozen, ``O`` hole, ``G`` goal, ``X`` player in a hole,
  ``√`` player on the goal.
* ``show_goal_offset`` (variant ``guided``, not slippery; not in RAGEN): the state also says where
  the goal lies in action words, e.g. "The goal is 2 steps Down and 1 step Left from you." The map,
  dynamics and reward are unchanged; only the text differs. A 135M model did not learn to read the
  grid alone (docs/results.md); this variant separates reading the grid from learning to act.
* ``cell_separator`` (variant ``spaced``, not slippery; not in RAGEN): the grid's cells joined by a
  space, ``_ G _ _`` instead of ``_G__``. Same map, dynamics, reward and information; only the
  tokenization differs. SmolLM2's BPE merges RAGEN's rows into multi-cell tokens (``OP``, ``__``,
  ``OO``), so the player's column is hidden inside a token; spaced, every cell is one token. (It
  did not help SmolLM2-135M read the lake: docs/results.md.)
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragen_rllib.envs.base import TextEnv

ACTIONS = ("Left", "Down", "Right", "Up")
_DELTA = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
_PERPENDICULAR = {"Left": ("Up", "Down"), "Right": ("Down", "Up"), "Up": ("Left", "Right"), "Down": ("Right", "Left")}
SYMBOLS = {"P": "player", "_": "frozen tile", "O": "hole", "G": "goal", "X": "player fell into a hole",
           "√": "player on the goal"}


@dataclass(frozen=True)
class FrozenLakeConfig:
    """FrozenLake config."""

    size: int = 4  # map side, tiles
    p_frozen: float = 0.8  # probability a tile is frozen (else a hole)
    is_slippery: bool = True
    max_actions: int = 10
    max_map_tries: int = 200  # rejection-sampling bound before carving a path
    show_goal_offset: bool = False  # add the goal's direction in action words to each state
    cell_separator: str = ""  # text between a row's cells ("" = RAGEN's render)

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError(f"FrozenLakeConfig.size must be >= 2, got {self.size!r}")
        if not 0.0 < self.p_frozen <= 1.0:
            raise ValueError(f"FrozenLakeConfig.p_frozen must be in (0, 1], got {self.p_frozen!r}")
        if self.max_actions < 1:
            raise ValueError(f"FrozenLakeConfig.max_actions must be >= 1, got {self.max_actions!r}")
        if self.max_map_tries < 1:
            raise ValueError(f"FrozenLakeConfig.max_map_tries must be >= 1, got {self.max_map_tries!r}")
        if self.cell_separator not in ("", " "):
            raise ValueError(f"FrozenLakeConfig.cell_separator must be '' or ' ', got {self.cell_separator!r}")


_OFFSET_LINE = re.compile(r"The goal is (.*) from you\.")


def goal_directions(state: str) -> frozenset[str] | None:
    """The action words of a ``guided`` state's goal line ("… 2 steps Down and 1 step Left …" ->
    {"Down", "Left"}), or None when the state has no such line (other variants, goal or hole)."""
    m = _OFFSET_LINE.search(state)
    return None if m is None else frozenset(a for a in ACTIONS if a in m.group(1))


def frozen_distances(frozen: np.ndarray, source: tuple[int, int]) -> dict[tuple[int, int], int]:
    """BFS distance (moves, int) from ``source`` to every frozen tile 4-connected to it.

    Args:
        frozen: (H, W) bool, True where the tile is frozen (start and goal count as frozen).
    """
    h, w = frozen.shape
    dist, todo = {source: 0}, deque([source])
    while todo:
        r, c = todo.popleft()
        for dr, dc in _DELTA.values():
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < h and 0 <= nxt[1] < w and frozen[nxt] and nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                todo.append(nxt)
    return dist


def has_path(frozen: np.ndarray, start: tuple[int, int], goal: tuple[int, int]) -> bool:
    """Return True if 4-connected frozen tiles link ``start`` to ``goal`` ((H, W) bool ``frozen``)."""
    return goal in frozen_distances(frozen, start)


def generate_map(rng: np.random.Generator, size: int, p_frozen: float,
                 max_tries: int) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """Draw a solvable map.

    Returns:
        ``(frozen (size, size) bool, start (row, col), goal (row, col))``.
    """
    cells = size * size
    for _ in range(max_tries):
        frozen = rng.random((size, size)) < p_frozen
        s, g = rng.choice(cells, size=2, replace=False)
        start, goal = divmod(int(s), size), divmod(int(g), size)
        frozen[start] = frozen[goal] = True
        if has_path(frozen, start, goal):
            return frozen, start, goal
    # Last resort (very unlikely at p=0.8): carve an L-shaped path so reset never fails.
    r, c = start
    while (r, c) != goal:
        r += int(np.sign(goal[0] - r)) if r != goal[0] else 0
        c += int(np.sign(goal[1] - c)) if r == goal[0] else 0
        frozen[r, c] = True
    return frozen, start, goal


class FrozenLakeEnv(TextEnv[FrozenLakeConfig]):
    """Slippery FrozenLake on a random map; actions Left/Down/Right/Up."""

    Config = FrozenLakeConfig
    DESCRIPTION = "random 4x4 slippery lake: reach the goal, avoid holes"
    VARIANTS: dict[str, dict[str, Any]] = {"default": {}, "not_slippery": {"is_slippery": False},
                                           "guided": {"is_slippery": False, "show_goal_offset": True},
                                           "spaced": {"is_slippery": False, "cell_separator": " "}}

    def _reset(self, rng: np.random.Generator) -> None:
        cfg = self.config
        self.frozen, self.start, self.goal = generate_map(rng, cfg.size, cfg.p_frozen, cfg.max_map_tries)
        self.pos = self.start

    @property
    def instruction(self) -> str:
        text = "You are solving the FrozenLake puzzle. Avoid the holes and go to the goal."
        if self.config.is_slippery:  # the not_slippery variant must not claim it (runs before 2026-12-02 did)
            text += " The ice is slippery: you may move in a direction you did not intend."
        return text

    @property
    def symbol_legend(self) -> dict[str, str]:
        return dict(SYMBOLS)

    @property
    def action_names(self) -> list[str]:
        return list(ACTIONS)

    @property
    def in_hole(self) -> bool:
        return not self.frozen[self.pos]

    def render(self) -> str:
        rows = []
        for r in range(self.config.size):
            row = []
            for c in range(self.config.size):
                here = (r, c) == self.pos
                if (r, c) == self.goal:
                    row.append("√" if here else "G")
                elif not self.frozen[r, c]:
                    row.append("X" if here else "O")
                else:
                    row.append("P" if here else "_")
            rows.append(self.config.cell_separator.join(row))
        grid = "\n".join(rows)
        return f"{grid}\n{self.goal_offset_text()}" if self.config.show_goal_offset else grid

    def goal_offset_text(self) -> str:
        """Where the goal lies from the player, in action words (the ``guided`` variant's extra line)."""
        if self.pos == self.goal:
            return "You are on the goal."
        if self.in_hole:
            return "You fell into a hole."
        dr, dc = self.goal[0] - self.pos[0], self.goal[1] - self.pos[1]
        parts = [f"{abs(d)} step{'s' if abs(d) > 1 else ''} {word}"
                 for d, word in ((dr, "Down" if dr > 0 else "Up"), (dc, "Right" if dc > 0 else "Left")) if d]
        return f"The goal is {' and '.join(parts)} from you."

    def shortest_first_actions(self) -> list[str]:
        """The actions (in ``ACTIONS`` order) that begin *some* shortest frozen-tile path to the goal.

        Not-slippery dynamics: a move onto a frozen neighbour one step closer to the goal (BFS
        distance over 4-connected frozen tiles). ``[]`` on the goal, in a hole or with no path.
        The env is not changed.
        """
        if self.pos == self.goal or self.in_hole:
            return []
        dist = frozen_distances(self.frozen, self.goal)
        here = dist.get(self.pos)
        if here is None:
            return []
        return [a for a in ACTIONS
                if dist.get((self.pos[0] + _DELTA[a][0], self.pos[1] + _DELTA[a][1])) == here - 1]

    def best_success_probability(self, actions: int | None = None) -> float:
        """The highest probability of reaching the goal from the current state within ``actions``
        moves (default: the actions left in the budget), for a policy that sees the state after
        every move: finite-horizon value iteration over this lake's dynamics (slippery: intended or
        either perpendicular move, 1/3 each; a move into the border stays). An upper bound for any
        policy that commits to several actions per turn. 1.0 on the goal, 0.0 in a hole.
        """
        steps = self._action_budget(actions)
        step = self._transition_matrices()
        w = self.frozen.shape[1]
        value = np.zeros(step.shape[1])
        value[self.goal[0] * w + self.goal[1]] = 1.0
        for _ in range(steps):
            value = (step @ value).max(axis=0)  # the goal and the holes are absorbing: they keep 1 and 0
        return float(value[self.pos[0] * w + self.pos[1]])

    def _action_budget(self, actions: int | None) -> int:
        """The move budget of both ceilings: ``actions`` (>= 0), or the actions left when None."""
        if actions is not None and actions < 0:
            raise ValueError(f"actions must be >= 0, or None for the actions left; got {actions}")
        return self.actions_left if actions is None else actions

    def _transition_matrices(self) -> np.ndarray:
        """This lake's dynamics as float64 ``(len(ACTIONS), H*W, H*W)``: ``[a, i, j]`` is the probability
        of landing on cell ``j`` (row-major) after action ``a`` from cell ``i`` (slippery: intended or
        either perpendicular move, 1/3 each; a move into the border stays; the goal and the holes are
        absorbing, as a run stops there)."""
        h, w = self.frozen.shape
        n = h * w
        cells = [(r, c) for r in range(h) for c in range(w)]
        moves = {a: ((a, *_PERPENDICULAR[a]) if self.config.is_slippery else (a,)) for a in ACTIONS}
        step = np.zeros((len(ACTIONS), n, n))
        for a_i, a in enumerate(ACTIONS):
            for i, (r, c) in enumerate(cells):
                if (r, c) == self.goal or not self.frozen[r, c]:
                    step[a_i, i, i] = 1.0
                    continue
                for m in moves[a]:
                    nr, nc = r + _DELTA[m][0], c + _DELTA[m][1]
                    j = nr * w + nc if 0 <= nr < h and 0 <= nc < w else i  # into the border: stays
                    step[a_i, i, j] += 1.0 / len(moves[a])
        return step

    def best_success_probability_in_turns(self, turns: int, actions_per_turn: int, actions: int | None = None) -> float:
        """The highest probability of reaching the goal for a policy that sees the state only between
        turns: each of ``turns`` turns commits to 1..``actions_per_turn`` actions, which run without
        the policy seeing the moves in between (a run stops on the goal or in a hole), within
        ``actions`` moves in all (default: the actions left in the budget). This is how the models
        here play (the ``cpu`` profiles: 3 turns, up to 5 actions a turn), so it is the ceiling of
        the validation protocol, at most ``best_success_probability`` (which sees every move) and
        equal to it with one action a turn and as many turns as actions. Exact dynamic programming
        over the lake's (H*W) cells: every action sequence of each length, as a product of the
        per-action transition matrices (``_transition_matrices``). 1.0 on the goal, 0.0 in a hole.
        """
        if turns < 0 or actions_per_turn < 1:
            raise ValueError(f"turns must be >= 0 and actions_per_turn >= 1, got {turns}, {actions_per_turn}")
        budget = self._action_budget(actions)
        step = self._transition_matrices()
        n, w = step.shape[1], self.frozen.shape[1]
        runs = {1: step}  # runs[k]: (4**k, n, n), the transition matrix of every k-action sequence
        for k in range(2, min(actions_per_turn, max(budget, 1)) + 1):
            runs[k] = np.einsum("sij,ajk->saik", runs[k - 1], step).reshape(-1, n, n)
        goal = np.zeros(n)
        goal[self.goal[0] * w + self.goal[1]] = 1.0
        value = {b: goal for b in range(budget + 1)}  # value[b]: success probability per cell, b actions left
        for _ in range(turns):
            value = {b: np.max([goal] + [(runs[k] @ value[b - k]).max(axis=0)
                                         for k in range(1, min(actions_per_turn, b) + 1)], axis=0)
                     for b in range(budget + 1)}
        return float(value[budget][self.pos[0] * w + self.pos[1]])

    def _step(self, action_text: str) -> tuple[float, bool, dict[str, Any]]:
        name = next((a for a in ACTIONS if a.lower() == action_text.strip().lower()), None)
        if name is None:
            return 0.0, False, {"action_is_valid": False, "action_is_effective": False, "success": False}
        if self.config.is_slippery:
            # gymnasium's rule: intended, or one of the two perpendicular moves, each 1/3.
            name = (name, *_PERPENDICULAR[name])[int(self._dyn_rng.integers(3))]
        dr, dc = _DELTA[name]
        r, c = self.pos[0] + dr, self.pos[1] + dc
        old = self.pos
        if 0 <= r < self.config.size and 0 <= c < self.config.size:
            self.pos = (r, c)
        success = self.pos == self.goal
        terminated = success or self.in_hole
        return (1.0 if success else 0.0), terminated, {
            "action_is_valid": True, "action_is_effective": self.pos != old, "success": success, "moved": name}
