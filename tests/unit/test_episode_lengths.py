"""scripts/episode_lengths.py on a written run: actions per episode and per turn, by window of iterations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ragen_rllib.env_runners.rollout_loop import RolloutSpec
from ragen_rllib.prompting import PromptConfig
from ragen_rllib.trajectory import TrajectoryStore, rows_to_table

from fakes import scripted_rows

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "episode_lengths.py"
SEEDS = list(range(123, 127))


def _rows(run: Path, iteration: int, reply: str) -> list[dict]:
    spec = RolloutSpec("sokoban", group_size=1, max_turns=2,
                       prompt=PromptConfig(enable_think=False, max_actions_per_turn=5))
    return scripted_rows(spec, reply, SEEDS, run.name, iteration)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_actions_per_turn_fall_when_replies_shorten(tmp_path: Path) -> None:
    run = tmp_path / "sok"
    store = TrajectoryStore(tmp_path, run.name)
    long_rows = _rows(run, 0, "<answer>Up || Left || Down</answer>")
    short_rows = _rows(run, 2, "<answer>Up</answer>")
    store.write(0, rows_to_table(long_rows))
    store.write(2, rows_to_table(short_rows))
    p = _run(str(run), "--window", "2")
    assert p.returncode == 0, p.stderr

    def row(label: str, rows: list[dict]) -> str:
        n = len(rows)
        acts = sum(r["num_valid_actions"] for r in rows) / n
        turns = sum(r["num_turns"] for r in rows) / n
        succ = sum(r["success"] for r in rows) / n
        ret = sum(r["episode_return"] for r in rows) / n
        return f"| {label} | {n} | {succ:.3f} | {ret:+.2f} | {acts:.2f} | {turns:.2f} | {acts / turns:.2f} |"

    assert row("0-1", long_rows) in p.stdout and row("2-3", short_rows) in p.stdout, p.stdout
    assert "| 0-1 | 4 | 0.000 | -0.60 | 6.00 | 2.00 | 3.00 |" in p.stdout  # 3 moves a turn, -0.1 each, unsolved
    assert "| 2-3 | 4 | 0.000 | -0.20 | 2.00 | 2.00 | 1.00 |" in p.stdout


def test_bad_input_is_a_one_line_error(tmp_path: Path) -> None:
    missing = _run(str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: no trajectories/ under {tmp_path / 'nope'}"
    run = tmp_path / "sok"
    (run / "trajectories").mkdir(parents=True)
    (run / "trajectories" / "iter_000000.parquet").write_bytes(b"junk")
    p = _run(str(run))
    assert p.returncode == 2 and p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    window = _run(str(run), "--window", "0")
    assert window.returncode == 2 and window.stderr.strip() == "error: --window must be >= 1, got 0"
