"""scripts/echo_trap_report.py on written trial folders: falls, format losses, the per-preset tally."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "echo_trap_report.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def _trial(sweep: Path, i: int, preset: str, seed: int, rows: list[dict[str, float]]) -> None:
    d = sweep / f"StarPOTrainable_ab123_{i:05d}_{i}_preset={preset},starpo_seed={seed}_2026-12-07_22-05-00"
    d.mkdir(parents=True)
    (d / "result.json").write_text("".join(json.dumps({"training_iteration": it + 1, **r}) + "\n"
                                           for it, r in enumerate(rows)))


def _rows(success: list[float], well_formed: list[float], val: float, **extra: list[float]) -> list[dict[str, float]]:
    rows = [{"rollout/success": s, "rollout/well_formed_rate": w} for s, w in zip(success, well_formed, strict=True)]
    rows[-1]["val/bandit/success"] = val
    for key, values in extra.items():
        for r, v in zip(rows, values, strict=True):
            r[key.replace("__", "/")] = v
    return rows


def test_falls_format_losses_and_the_tally(tmp_path: Path) -> None:
    a, b = tmp_path / "sweep-a", tmp_path / "sweep-b"
    # Vanilla 1: format lost at 3 (well-formed 0), success halves at 2 (0.3 < 0.8 / 2), ends at 0.
    _trial(a, 0, "starpo", 1, _rows([0.8, 0.3, 0.0], [1.0, 0.4, 0.0], 0.0, actor__ppo_kl=[0.01, 0.2, 0.0]))
    # StarPO-S 1: a dip to exactly half (not below) and a well-formed rate that never reaches 0.
    _trial(a, 1, "starpo_s", 1, _rows([0.8, 0.4, 1.0], [1.0, 0.02, 1.0], 1.0))
    # Vanilla 2 in another sweep: no fall; StarPO-S 2: falls, keeps the format, ends at 0.
    _trial(b, 0, "starpo", 2, _rows([0.5, 0.9, 1.0], [1.0, 1.0, 1.0], 1.0))
    _trial(b, 1, "starpo_s", 2, _rows([0.2, 0.05, 0.0], [1.0, 1.0, 1.0], 0.0))
    p = _run(str(a), str(b))
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[0].startswith("== 0_preset=starpo,starpo_seed=1: success halves at it. 2; format lost at it. 3;")
    assert out[0].endswith("first ppo_kl >= 0.15: it. 2; final val 0.0")
    assert out[1].split() == ["rollout/success", "0.80", "0.30", "0.00"]
    assert "success halves at it. None; format lost at it. None;" in out[12]
    assert out[-4:-1] == [
        "== per preset, over 2 sweep(s)",
        "   starpo: fell 1 of 2 (1); lost the format 1 of 2 (1); ended at validation 0.00 1 of 2 (1)",
        "   starpo_s: fell 1 of 2 (2); lost the format 0 of 2 (-); ended at validation 0.00 1 of 2 (2)",
    ]
    # 1 / 2 against 1 / 2 and 1 / 2 against 0 / 2: p = 1.0 each.
    assert out[-1] == ("   Fisher's exact test (two-sided), starpo against starpo_s: fell p = 1; "
                       "lost the format p = 1; ended at validation 0.00 p = 1")


def test_a_trial_still_in_its_warm_up_and_a_missing_sweep(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    (sweep / "StarPOTrainable_ab123_00000_0_preset=starpo,starpo_seed=1_2026-12-07").mkdir(parents=True)
    p = _run(str(sweep))
    assert p.returncode == 0 and "no result.json yet" in p.stdout.splitlines()[0]
    p = _run(str(tmp_path / "nope"))
    assert p.returncode == 2 and p.stderr.strip() == f"error: no sweep folder {tmp_path / 'nope'}"
    p = _run(str(sweep), str(tmp_path / "nope"))  # a good folder first: still no partial output
    assert p.returncode == 2 and p.stdout == "" and p.stderr.strip() == f"error: no sweep folder {tmp_path / 'nope'}"
    assert _run().returncode == 2
