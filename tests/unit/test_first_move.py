"""scripts/first_move.py on a written run: first moves scored against every shortest plan."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ragen_rllib.env_runners.rollout_loop import RolloutSpec
from ragen_rllib.envs.registry import make_env
from ragen_rllib.trajectory import TrajectoryStore, rows_to_table
from ragen_rllib.trajectory.schema import Col
from ragen_rllib.trajectory.store import validation_store

from fakes import scripted_rows

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "first_move.py"
SEEDS = list(range(123, 135))


def _rows(run: Path, iteration: int, env: str = "sokoban", variant: str | None = None) -> list[dict]:
    spec = RolloutSpec(env, env_variant=variant, group_size=1, max_turns=1)
    return scripted_rows(spec, "go</think><answer>Up</answer>", SEEDS, run.name, iteration)


def test_first_move_against_every_shortest_plan(tmp_path: Path) -> None:
    run = tmp_path / "sok"
    TrajectoryStore(tmp_path, run.name).write(0, rows_to_table(_rows(run, 0)))
    validation_store(run, "sokoban").write(0, rows_to_table(_rows(run, 0)), overwrite=True)
    env = make_env("sokoban")
    optimal = []
    for s in SEEDS:
        env.reset(seed=s)
        optimal.append(env.shortest_first_actions())
    good = sum("Up" in o for o in optimal) / len(SEEDS)
    chance = sum(len(o) for o in optimal) / 4 / len(SEEDS)
    p = subprocess.run([sys.executable, str(SCRIPT), str(run)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    want = f"| 12 | 1.00 | {good:.2f} | {chance:.2f} |"
    assert f"| training | 0 {want}" in p.stdout and f"| validation sokoban | 0 {want}" in p.stdout, p.stdout


def test_frozen_lake_first_moves_against_every_shortest_path(tmp_path: Path) -> None:
    run = tmp_path / "fl"
    TrajectoryStore(tmp_path, run.name).write(0, rows_to_table(_rows(run, 0, "frozen_lake", "spaced")))
    env = make_env("frozen_lake:spaced")
    optimal = []
    for s in SEEDS:
        env.reset(seed=s)
        optimal.append(env.shortest_first_actions())
    assert all(optimal) and any("Up" not in o for o in optimal)  # the check below is not trivially 1.00
    good = sum("Up" in o for o in optimal) / len(SEEDS)
    chance = sum(len(o) for o in optimal) / 4 / len(SEEDS)
    p = subprocess.run([sys.executable, str(SCRIPT), str(run)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"| training | 0 | 12 | 1.00 | {good:.2f} | {chance:.2f} |" in p.stdout, p.stdout


def test_a_room_that_does_not_rebuild_is_a_one_line_error(tmp_path: Path) -> None:
    run = tmp_path / "sok"
    rows = _rows(run, 0)
    rows[3][Col.TURN_STATES] = ["a room from another env config"]
    TrajectoryStore(tmp_path, run.name).write(0, rows_to_table(rows))
    p = subprocess.run([sys.executable, str(SCRIPT), str(run)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip() == f"error: initial seed {SEEDS[3]} of sokoban:simple does not " \
                                                     "rebuild the stored room", p.stderr
    missing = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nope")], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: no run directory {tmp_path / 'nope'}"


def test_a_corrupt_trajectory_file_is_a_one_line_error(tmp_path: Path) -> None:
    run = tmp_path / "sok"
    (run / "trajectories").mkdir(parents=True)
    (run / "trajectories" / "iter_000000.parquet").write_bytes(b"junk")
    p = subprocess.run([sys.executable, str(SCRIPT), str(run)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
