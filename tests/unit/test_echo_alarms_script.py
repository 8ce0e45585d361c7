"""scripts/echo_alarms.py on a written metrics history: logged flags, replayed new signals, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "echo_alarms.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def _write(run: Path, steps: list[dict[str, float]]) -> None:
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "metrics": m}) + "\n"
                                               for i, m in enumerate(steps)))


def test_replayed_format_drift_with_the_validation_before_it(tmp_path: Path) -> None:
    # Logged with a grad-norm flag (never on) and no format_drift flag: format_drift is replayed.
    # Malformed share 0 for 5 steps, then 0.4: EMA 0.12 > 0 + 0.1 at step 5 = iteration 6.
    steps = [{"actor/grad_norm": 1.0, "echo/grad_norm_spike": 0.0,
              "rollout/well_formed_rate": 1.0 if i < 5 else 0.6} for i in range(7)]
    steps[0]["val/frozen_lake/success"] = 0.5
    steps[4]["val/frozen_lake/success"] = 0.25
    run = tmp_path / "drift"
    _write(run, steps)
    quiet = tmp_path / "quiet"
    _write(quiet, [{"rollout/well_formed_rate": 1.0}] * 7)
    p = _run(str(run), str(quiet))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == f"== {run}: 7 logged steps"
    assert lines[1] == "   iteration 6: format_drift (validation 0.250 at iteration 4; first 0.500)"
    assert "the malformed share" in lines[2] and "rose more than 0.1" in lines[2]
    assert lines[3:] == [f"== {quiet}: 7 logged steps", "   no alarm"]


def test_replay_ignores_the_logged_flags(tmp_path: Path) -> None:
    # Logged under an older rule: format_drift flagged 0 throughout; the replay fires at iteration 2.
    run = tmp_path / "old"
    _write(run, [{"rollout/well_formed_rate": wf, "echo/format_drift": 0.0} for wf in (1.0, 0.0, 0.0)])
    assert _run(str(run)).stdout.splitlines()[1:] == ["   no alarm"]
    lines = _run("--replay", str(run)).stdout.splitlines()
    assert lines[1] == "   iteration 2: format_drift (no validation yet; first nan)"
    # A first validation of 0.000 is printed as such, not as a missing one.
    zero = tmp_path / "zero"
    _write(zero, [{"rollout/well_formed_rate": 1.0, "val/frozen_lake/success": 0.0}, {"rollout/well_formed_rate": 0.0}])
    assert _run(str(zero)).stdout.splitlines()[1] == (
        "   iteration 2: format_drift (validation 0.000 at iteration 0; first 0.000)")


def test_a_folder_without_metrics_is_a_one_line_error(tmp_path: Path) -> None:
    p = _run(str(tmp_path))
    assert p.returncode == 2 and p.stderr.strip() == f"error: no metrics.jsonl in {tmp_path}"
    assert _run().returncode == 2
