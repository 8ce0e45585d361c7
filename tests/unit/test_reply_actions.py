"""scripts/reply_actions.py on a written run: actions listed per first reply, malformed turns, cuts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ragen_rllib.env_runners.engine import SamplingParams
from ragen_rllib.env_runners.rollout_loop import RolloutSpec
from ragen_rllib.prompting import PromptConfig
from ragen_rllib.trajectory import rows_to_table
from ragen_rllib.trajectory.store import validation_store

from fakes import scripted_rows

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reply_actions.py"
SEEDS = list(range(123, 127))
SEVEN = "<answer>Up || Up || Up || Up || Up || Up || Up</answer>"  # 7 actions: 5 run, 2 dropped


def _rows(run: Path, iteration: int, reply: str, max_new_tokens: int) -> list[dict]:
    spec = RolloutSpec("frozen_lake", "not_slippery", group_size=1, max_turns=1,
                       prompt=PromptConfig(enable_think=False),
                       sampling=SamplingParams(max_new_tokens=max_new_tokens))
    return scripted_rows(spec, reply, SEEDS, run.name, iteration)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_counts_listed_actions_and_replies_cut_at_the_limit(tmp_path: Path) -> None:
    run = tmp_path / "fl"
    store = validation_store(run, "frozen_lake:not_slippery")
    store.write(0, rows_to_table(_rows(run, 0, "<answer>Up || Up</answer>", 400)))
    store.write(8, rows_to_table(_rows(run, 8, SEVEN, 400)))
    # cut after 26 characters: "<answer>Up || Up || Up || " -> 3 actions written, no closing tag
    store.write(16, rows_to_table(_rows(run, 16, SEVEN, 26)))
    p = _run(str(run))
    assert p.returncode == 0, p.stderr
    assert "| frozen_lake:not_slippery | 0 | 4 | 2.0 | 0.00 | 0 / 4 | 0 |" in p.stdout, p.stdout
    assert "| frozen_lake:not_slippery | 8 | 4 | 7.0 | 1.00 | 0 / 4 | 0 |" in p.stdout, p.stdout
    assert "| frozen_lake:not_slippery | 16 | 4 | 3.0 | 0.00 | 4 / 4 | 4 |" in p.stdout, p.stdout


def test_bad_input_is_a_one_line_error(tmp_path: Path) -> None:
    missing = _run(str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stderr.strip() == f"error: no validation/ under {tmp_path / 'nope'}"
    run = tmp_path / "fl"
    (run / "validation" / "frozen_lake-not_slippery").mkdir(parents=True)
    (run / "validation" / "frozen_lake-not_slippery" / "iter_000000.parquet").write_bytes(b"junk")
    bad = _run(str(run))
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.strip().splitlines()) == 1
    flag = _run(str(run), "--max-actions", "0")
    assert flag.returncode == 2 and "max_actions_per_turn must be >= 1" in flag.stderr
