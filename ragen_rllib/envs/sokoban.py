"""Sokoban (RAGEN §2.2): push every box onto a target, on a procedurally generated room.

* **Generation** (gym-sokoban's method, our own numpy-only code, driven only by the ``rng`` given
  to ``_reset``): carve a random room topology by a random walk inside walls; put the boxes *on*
  their targets and drop the player on a free floor cell; then play **in reverse** (the player
  walks and may *pull* the box behind it), exploring breadth-first up to ``search_depth`` reverse
  steps, and keep a state with the largest box displacement (ties broken by ``rng``; a solved
  state never qualifies); finally take 1-3 random player-only steps so the player does not always
  start next to a box. Every reverse step is the exact inverse of a legal forward move or push,
  so the start state is **solvable by construction**. A failed attempt (too little floor, no box
  displaceable) retries with a seed derived from the reset rng and the attempt index:
  deterministic, bounded by ``max_generation_tries``, then a ``RuntimeError``.
* **Dynamics** (deterministic, gym-sokoban "push" actions): Up/Down/Left/Right move the player;
  a box in front is pushed if the cell behind it is floor or target. A blocked move is a *valid*
  action with ``action_is_effective=False``.
* **Reward per action** (gym-sokoban): −0.1 per step, +1 when a box lands on a target, −1 when a
  box leaves a target, +10 when all boxes are on targets (then ``terminated`` and ``success``).
  ``step_reward`` sets the per-step term (an ablation knob: with it at 0 a shorter episode no
  longer earns more).
  The action budget (``max_actions``, RAGEN's 10) is the base class's truncation; gym-sokoban's
  internal 100-step cap is not reproduced because the budget always ends the episode first.
* **Symbols**: default ``#`` wall, ``_`` empty, ``O`` target, ``√`` box on target, ``X`` box,
  ``P`` player, ``S`` player on target; ``new_vocab`` (RAGEN's SokobanDifferentGridVocab):
  ``W . G C B A @`` in the same order.
* **Solver**: ``solve_room`` is a breadth-first search over (player, boxes) states that returns a
  shortest action sequence (fewest moves, pushes included). Used by tests and SFT/eval baselines.

Coordinates are ``(row, col)`` with row 0 at the top; "Up" decreases the row.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ragen_rllib.envs.base import TextEnv

#: Action names in gym-sokoban's order (its ids 1-4), as the model must write them.
ACTIONS: tuple[str, ...] = ("Up", "Down", "Left", "Right")
#: (d_row, d_col) per action, same order as ``ACTIONS``.
_DELTAS: tuple[tuple[int, int], ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))
_ACTION_INDEX: dict[str, int] = {a.lower(): i for i, a in enumerate(ACTIONS)}

#: Cell kinds in render order; each vocab maps them to one character.
_KINDS = ("wall", "empty", "target", "box_on_target", "box", "player", "player_on_target")
VOCABS: dict[str, dict[str, str]] = {
    "default": dict(zip(_KINDS, ("#", "_", "O", "√", "X", "P", "S"), strict=False)),
    "new_vocab": dict(zip(_KINDS, ("W", ".", "G", "C", "B", "A", "@"), strict=False)),
}
_MEANINGS = {"wall": "wall", "empty": "empty", "target": "target", "box_on_target": "box on target",
             "box": "box", "player": "player", "player_on_target": "player on target"}

STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0
BOX_OFF_TARGET_REWARD = -1.0
SOLVED_REWARD = 10.0

#: Room-carving masks (3x3 stamps applied along the random walk), as in gym-sokoban.
_MASKS = np.array([
    [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
    [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
    [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
    [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
    [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
], dtype=bool)
_P_CHANGE_DIRECTION = 0.35  # gym-sokoban's default for the carving walk
# Bound on reverse-search states per attempt, so a large search_depth on a large room stays fast
# (gym-sokoban caps its DFS the same way).
_MAX_REVERSE_STATES = 20_000


@dataclass(frozen=True)
class SokobanConfig:
    """Sokoban config (RAGEN ``SokobanEnvConfig`` names where they exist)."""

    dim_room: tuple[int, int] = (6, 6)  # (rows, cols), outer walls included
    num_boxes: int = 1
    # Max reverse-play depth (moves from the solved room). RAGEN's values: 300 (dataclass default;
    # on 6x6 / 1 box the whole reachable space is explored by depth ~20), 10 for 8x8 / 2 boxes.
    search_depth: int = 300
    max_actions: int = 10  # RAGEN's max_actions_per_traj
    step_reward: float = STEP_REWARD  # added for every action; gym-sokoban's -0.1
    vocab: str = "default"  # "default" | "new_vocab"
    max_generation_tries: int = 100  # bounded retries before reset raises RuntimeError

    def __post_init__(self) -> None:
        dim = self.dim_room
        is_pair = isinstance(dim, (tuple, list)) and len(dim) == 2
        if not (is_pair and all(isinstance(d, (int, np.integer)) for d in dim)):
            raise ValueError(f"SokobanConfig.dim_room must be a (rows, cols) pair of ints, got {dim!r}")
        object.__setattr__(self, "dim_room", (int(dim[0]), int(dim[1])))  # lists from configs -> tuple
        if min(self.dim_room) < 3:
            raise ValueError(f"SokobanConfig.dim_room must be at least (3, 3) (walls included), got {self.dim_room!r}")
        if self.num_boxes < 1:
            raise ValueError(f"SokobanConfig.num_boxes must be >= 1, got {self.num_boxes!r}")
        step = self.step_reward
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not np.isfinite(step):
            raise ValueError(f"SokobanConfig.step_reward must be a finite number, got {step!r}")
        interior = (self.dim_room[0] - 2) * (self.dim_room[1] - 2)
        # The player, every box and at least one free cell to move into must fit inside the walls.
        if interior < self.num_boxes + 2:
            raise ValueError(f"SokobanConfig.num_boxes={self.num_boxes!r} does not fit in dim_room={self.dim_room!r}: "
                             f"{interior} interior cells, need >= num_boxes + 2")
        for name in ("search_depth", "max_actions", "max_generation_tries"):
            if getattr(self, name) < 1:
                raise ValueError(f"SokobanConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.vocab not in VOCABS:
            raise ValueError(f"SokobanConfig.vocab must be one of {sorted(VOCABS)}, got {self.vocab!r}")


# ----------------------------------------------------------------------------------- generation
def _carve_topology(rng: np.random.Generator, dim: tuple[int, int]) -> np.ndarray:
    """Carve floor by a random walk that stamps 3x3 masks.

    Returns:
        (H, W) bool, True on floor; the outer ring is always wall.
    """
    h, w = dim
    floor = np.zeros((h, w), dtype=bool)
    num_steps = int(1.7 * (h + w))  # gym-sokoban's walk length
    pos = np.array([rng.integers(1, h - 1), rng.integers(1, w - 1)])
    direction = np.array(_DELTAS[rng.integers(4)])
    change = rng.random(num_steps) < _P_CHANGE_DIRECTION
    new_dirs = rng.integers(4, size=num_steps)
    masks = rng.integers(len(_MASKS), size=num_steps)
    # Pad by one so a stamp centred next to the border never goes out of range.
    padded = np.zeros((h + 2, w + 2), dtype=bool)
    for s in range(num_steps):
        if change[s]:
            direction = np.array(_DELTAS[new_dirs[s]])
        pos = np.clip(pos + direction, 1, (h - 2, w - 2))
        padded[pos[0]:pos[0] + 3, pos[1]:pos[1] + 3] |= _MASKS[masks[s]]
    floor[1:h - 1, 1:w - 1] = padded[2:h, 2:w]
    return floor


def _reverse_search(rng: np.random.Generator, floor: np.ndarray, targets: list[tuple[int, int]],
                    player: tuple[int, int], search_depth: int,
                    max_states: int) -> tuple[tuple[int, int], list[tuple[int, int]], int]:
    """Play backwards from the solved room and return a hardest-looking reachable state.

    Breadth-first over reverse moves up to ``search_depth`` steps (or ``max_states`` states): a
    reverse move walks the player to a free neighbour, optionally pulling the box directly behind
    it into the cell it left. Each is the inverse of a legal forward move or push, so every state
    found can be pushed back to the solved room. Like gym-sokoban's reverse DFS, the score is
    box displacement; we multiply by the number of boxes off a target (gym-sokoban uses its
    "box swaps" count) so several boxes get moved. Ties are broken with ``rng``.

    Returns:
        ``(player, boxes, score)``; box ``i`` started on ``targets[i]``; ``score`` 0 means no
        state with a box off its target was reachable.
    """
    w = floor.shape[1]
    free = floor.ravel().tolist()
    target_set = {r * w + c for r, c in targets}
    deltas = (-w, w, -1, 1)
    start = (player[0] * w + player[1], tuple(r * w + c for r, c in targets))
    seen = {start}
    frontier = [start]
    best_score, best = 0, []
    for _ in range(search_depth):
        nxt_frontier = []
        for p, boxes in frontier:
            for d in deltas:
                q = p + d
                if not free[q] or q in boxes:
                    continue
                children = [(q, boxes)]
                if p - d in boxes:  # the pull variant of the same reverse move
                    children.append((q, tuple(p if b == p - d else b for b in boxes)))
                for child in children:
                    if child in seen:
                        continue
                    seen.add(child)
                    nxt_frontier.append(child)
                    cb = child[1]
                    off = sum(b not in target_set for b in cb)
                    if not off:
                        continue
                    disp = sum(abs(b // w - t[0]) + abs(b % w - t[1]) for b, t in zip(cb, targets, strict=False))
                    if disp * off > best_score:
                        best_score, best = disp * off, [child]
                    elif disp * off == best_score:
                        best.append(child)
            if len(seen) >= max_states:
                break
        frontier = nxt_frontier
        if not frontier or len(seen) >= max_states:
            break
    if not best:
        return player, list(targets), 0
    p, boxes = best[int(rng.integers(len(best)))]
    return divmod(p, w), [divmod(b, w) for b in boxes], best_score


def generate_room(rng: np.random.Generator, dim_room: tuple[int, int], num_boxes: int, search_depth: int,
                  max_tries: int = 100) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """Generate a solvable, unsolved room.

    Args:
        rng: the initial-state RNG; the only source of randomness (same state -> same room).
        dim_room: (rows, cols), outer walls included.
        num_boxes: boxes (= targets).
        search_depth: max reverse-play depth (moves away from the solved room) per attempt.
        max_tries: attempts before giving up.

    Returns:
        ``(walls, targets, boxes, player)``: three (rows, cols) bool arrays and ``(row, col)``.

    Raises:
        RuntimeError: no attempt produced a room with a displaced box.
    """
    # Each attempt gets its own generator seeded by (base, attempt): deterministic, and an
    # attempt's room does not depend on how many draws the failed attempts before it used.
    base = int(rng.integers(2**63))
    for attempt in range(max_tries):
        arng = np.random.default_rng([base, attempt])
        floor = _carve_topology(arng, dim_room)
        cells = np.flatnonzero(floor)
        if len(cells) < num_boxes + 2:
            continue
        picks = arng.choice(cells, size=num_boxes + 1, replace=False)
        player, *targets = [divmod(int(i), dim_room[1]) for i in picks]
        player, boxes, score = _reverse_search(arng, floor, targets, player, search_depth, _MAX_REVERSE_STATES)
        if score == 0:
            continue
        # A few player-only steps so the start is not always "next to the box just pulled".
        for _ in range(int(arng.integers(1, 4))):
            free = [(player[0] + dr, player[1] + dc) for dr, dc in _DELTAS]
            free = [c for c in free if floor[c] and c not in boxes]
            if not free:
                break
            player = free[int(arng.integers(len(free)))]
        walls = ~floor
        tgt = np.zeros(dim_room, dtype=bool)
        tgt[tuple(zip(*targets, strict=False))] = True
        box = np.zeros(dim_room, dtype=bool)
        box[tuple(zip(*boxes, strict=False))] = True
        return walls, tgt, box, player
    raise RuntimeError(f"Sokoban generation failed {max_tries} times (dim_room={dim_room}, num_boxes={num_boxes}, "
                       f"search_depth={search_depth}); enlarge the room or raise search_depth")


# --------------------------------------------------------------------------------------- solver
def _dead_cells(walls: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Return (H, W) bool: cells from which a lone box can never be pushed onto any target.

    Reverse search from the targets: a box at ``y`` can come from ``x = y - d`` if the player
    could stand at ``x - d``. Other boxes are ignored, so "live" is an over-approximation and
    pruning dead cells never cuts a real solution.
    """
    h, w = walls.shape
    live = targets.copy()
    todo = deque(zip(*np.nonzero(targets), strict=False))
    while todo:
        r, c = todo.popleft()
        for dr, dc in _DELTAS:
            xr, xc, pr, pc = r - dr, c - dc, r - 2 * dr, c - 2 * dc
            if 0 <= pr < h and 0 <= pc < w and not walls[xr, xc] and not walls[pr, pc] and not live[xr, xc]:
                live[xr, xc] = True
                todo.append((xr, xc))
    return ~live & ~walls


def solve_room(walls: np.ndarray, boxes: np.ndarray, targets: np.ndarray, player: tuple[int, int],
               max_states: int = 200_000) -> list[str] | None:
    """Find a shortest action sequence that puts every box on a target (breadth-first search).

    Args:
        walls: (H, W) bool, True on walls. Cells outside the grid count as walls.
        boxes: (H, W) bool, True where a box is.
        targets: (H, W) bool, True where a target is (same count as boxes).
        player: ``(row, col)`` of the player.
        max_states: give up after this many distinct states have been reached.

    Returns:
        Action names (``"Up"``/``"Down"``/``"Left"``/``"Right"``), optimal in number of moves;
        ``[]`` if already solved; ``None`` if unsolvable or the state cap was hit first.
    """
    walls = np.asarray(walls, dtype=bool)
    h, w = walls.shape
    # Pad with a wall ring and flatten: a move is then "index + delta" with no bounds checks.
    pw = w + 2
    blocked = np.ones((h + 2, pw), dtype=bool)
    blocked[1:-1, 1:-1] = walls
    dead = np.ones((h + 2, pw), dtype=bool)
    dead[1:-1, 1:-1] = _dead_cells(walls, np.asarray(targets, dtype=bool))
    blocked_l, dead_l = blocked.ravel().tolist(), dead.ravel().tolist()

    def flat(rc: tuple[int, int]) -> int:
        return (int(rc[0]) + 1) * pw + int(rc[1]) + 1

    goal = tuple(sorted(flat(rc) for rc in zip(*np.nonzero(targets), strict=False)))
    start = (flat(player), tuple(sorted(flat(rc) for rc in zip(*np.nonzero(boxes), strict=False))))
    if start[1] == goal:
        return []
    deltas = (-pw, pw, -1, 1)
    parent: dict[tuple[int, tuple[int, ...]], tuple[Any, int]] = {start: (None, -1)}
    todo = deque([start])
    while todo:
        state = todo.popleft()
        p, bxs = state
        for a, d in enumerate(deltas):
            q = p + d
            if blocked_l[q]:
                continue
            if q in bxs:
                b = q + d
                if blocked_l[b] or dead_l[b] or b in bxs:
                    continue
                nb = tuple(sorted(b if x == q else x for x in bxs))
            else:
                nb = bxs
            nxt = (q, nb)
            if nxt in parent:
                continue
            parent[nxt] = (state, a)
            if nb == goal:
                plan = []
                while nxt != start:
                    nxt, a = parent[nxt]
                    plan.append(ACTIONS[a])
                return plan[::-1]
            if len(parent) >= max_states:
                return None
            todo.append(nxt)
    return None


def parse_layout(rows: Sequence[str] | str) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """Parse a room drawn in either vocab (``#_O√XPS`` or ``W.GCBA@``).

    Returns:
        ``(walls, targets, boxes, player)`` like ``generate_room``.

    Raises:
        ValueError: ragged rows, an unknown symbol, not exactly one player, no box, or a box count
            different from the target count.
    """
    if isinstance(rows, str):
        rows = rows.strip("\n").splitlines()
    rows = list(rows)
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError(f"layout rows must be non-empty and of equal length, got {rows!r}")
    symbol_kind = {ch: kind for vocab in VOCABS.values() for kind, ch in vocab.items()}
    h, w = len(rows), len(rows[0])
    walls, targets, boxes = (np.zeros((h, w), dtype=bool) for _ in range(3))
    players = []
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            kind = symbol_kind.get(ch)
            if kind is None:
                raise ValueError(f"unknown Sokoban symbol {ch!r} at row {r}, col {c}")
            walls[r, c] = kind == "wall"
            targets[r, c] = kind in ("target", "box_on_target", "player_on_target")
            boxes[r, c] = kind in ("box", "box_on_target")
            if kind.startswith("player"):
                players.append((r, c))
    if len(players) != 1:
        raise ValueError(f"layout needs exactly one player, found {len(players)}")
    if not boxes.any() or boxes.sum() != targets.sum():
        raise ValueError(f"layout needs >= 1 box and as many targets as boxes, got {int(boxes.sum())} boxes "
                         f"and {int(targets.sum())} targets")
    return walls, targets, boxes, players[0]


# ------------------------------------------------------------------------------------------ env
class SokobanEnv(TextEnv[SokobanConfig]):
    """Sokoban with gym-sokoban push dynamics and rewards; actions Up/Down/Left/Right.

    State: ``walls``, ``targets``, ``boxes`` are (rows, cols) bool arrays, ``player`` is
    ``(row, col)``. Read them, don't write them (tests use ``from_layout``).
    """

    Config = SokobanConfig
    DESCRIPTION = "procedurally generated Sokoban (always solvable): push every box onto a target"
    VARIANTS: dict[str, dict[str, Any]] = {
        "simple": {"dim_room": (6, 6), "num_boxes": 1},
        "larger": {"dim_room": (8, 8), "num_boxes": 2, "search_depth": 10},
        "new_vocab": {"dim_room": (6, 6), "num_boxes": 1, "search_depth": 30, "vocab": "new_vocab"},
    }

    def __init__(self, config: SokobanConfig | None = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        # Set by from_layout: every reset then restores this hand-built room instead of generating.
        self._layout: tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]] | None = None

    @classmethod
    def from_layout(cls, rows: Sequence[str] | str, *, seed: int = 0, **overrides: Any) -> SokobanEnv:
        """Build an env on a hand-drawn room, already reset (for tests and demos).

        Args:
            rows: the room, one string per row, in either vocab (see ``parse_layout``).
            seed: initial seed recorded by ``reset`` (the room does not depend on it).
            **overrides: config fields (e.g. ``max_actions``, ``vocab``); ``dim_room`` and
                ``num_boxes`` are taken from the layout.

        Returns:
            The env; every later ``reset`` restores the same room.
        """
        layout = parse_layout(rows)
        env = cls(**{**overrides, "dim_room": layout[0].shape, "num_boxes": int(layout[2].sum())})
        env._layout = layout
        env.reset(seed=seed)
        return env

    # ------------------------------------------------------------------ state
    def _reset(self, rng: np.random.Generator) -> None:
        if self._layout is not None:
            walls, targets, boxes, player = self._layout
        else:
            cfg = self.config
            walls, targets, boxes, player = generate_room(rng, cfg.dim_room, cfg.num_boxes, cfg.search_depth,
                                                          cfg.max_generation_tries)
        self.walls, self.targets, self.boxes = walls.copy(), targets.copy(), boxes.copy()
        self.player = (int(player[0]), int(player[1]))

    @property
    def solved(self) -> bool:
        """True when every box is on a target."""
        return bool(np.array_equal(self.boxes, self.boxes & self.targets))

    def solve(self, max_states: int = 200_000) -> list[str] | None:
        """Return a shortest action sequence from the current state (see ``solve_room``)."""
        return solve_room(self.walls, self.boxes, self.targets, self.player, max_states=max_states)

    def shortest_first_actions(self, max_states: int = 200_000) -> list[str]:
        """The actions that begin *some* shortest solution from the current state.

        ``solve`` returns one shortest plan; this lists every action (in ``ACTIONS`` order) after
        which a shortest plan one move shorter exists, so a policy is scored against all optimal
        first moves, not one arbitrary tie-break. ``[]`` when solved, unsolvable or over the
        state cap. The env is not changed.
        """
        plan = self.solve(max_states)
        if not plan:
            return []
        out = []
        for i, a in enumerate(ACTIONS):
            move = self._move(i)
            if move is None:
                continue
            cell, pushed_to = move
            boxes = self.boxes.copy()
            if pushed_to is not None:
                boxes[cell], boxes[pushed_to] = False, True
            rest = solve_room(self.walls, boxes, self.targets, cell, max_states=max_states)
            if rest is not None and len(rest) == len(plan) - 1:
                out.append(a)
        return out

    def _move(self, a: int) -> tuple[tuple[int, int], tuple[int, int] | None] | None:
        """Where action index ``a`` (into ``ACTIONS``) leads from the current state, without moving:
        ``(player's new cell, the pushed box's new cell or None)``; None when a wall or a box that
        cannot move blocks it (the step is then valid but not effective)."""
        dr, dc = _DELTAS[a]
        r, c = self.player[0] + dr, self.player[1] + dc
        h, w = self.walls.shape
        if not (0 <= r < h and 0 <= c < w) or self.walls[r, c]:
            return None
        if not self.boxes[r, c]:
            return (r, c), None
        return ((r, c), (r + dr, c + dc)) if self._free(r + dr, c + dc) else None

    def _free(self, r: int, c: int) -> bool:
        """True if (r, c) is inside the grid, not a wall and not a box."""
        h, w = self.walls.shape
        return 0 <= r < h and 0 <= c < w and not self.walls[r, c] and not self.boxes[r, c]

    def _step(self, action_text: str) -> tuple[float, bool, dict[str, Any]]:
        a = _ACTION_INDEX.get(action_text.strip().lower())
        if a is None:
            return 0.0, False, {"action_is_valid": False, "action_is_effective": False, "success": self.solved}
        move = self._move(a)
        reward, moved = self.config.step_reward, move is not None
        if move is not None:
            cell, pushed_to = move
            if pushed_to is not None:
                # Push: one box moves, so at most one target is left and one is reached.
                self.boxes[cell], self.boxes[pushed_to] = False, True
                if self.targets[cell]:
                    reward += BOX_OFF_TARGET_REWARD
                if self.targets[pushed_to]:
                    reward += BOX_ON_TARGET_REWARD
            self.player = cell
        success = self.solved
        if success:
            reward += SOLVED_REWARD
        return float(reward), success, {"action_is_valid": True, "action_is_effective": moved, "success": success}

    # ----------------------------------------------------------- prompt-facing
    def render(self) -> str:
        """Return the room as text: one row per line, symbols of ``config.vocab``."""
        sym = VOCABS[self.config.vocab]
        rows = []
        for r in range(self.walls.shape[0]):
            row = []
            for c in range(self.walls.shape[1]):
                t = self.targets[r, c]
                if (r, c) == self.player:
                    row.append(sym["player_on_target" if t else "player"])
                elif self.boxes[r, c]:
                    row.append(sym["box_on_target" if t else "box"])
                elif self.walls[r, c]:
                    row.append(sym["wall"])
                else:
                    row.append(sym["target" if t else "empty"])
            rows.append("".join(row))
        return "\n".join(rows)

    @property
    def instruction(self) -> str:
        return ("You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets. "
                "When you are right next to a box, you can push it by moving in the same direction. "
                "You cannot push a box through a wall, and you cannot pull a box.")

    @property
    def symbol_legend(self) -> dict[str, str]:
        return {ch: _MEANINGS[kind] for kind, ch in VOCABS[self.config.vocab].items()}

    @property
    def action_names(self) -> list[str]:
        return list(ACTIONS)
