"""scripts/frozen_lake_ceiling.py: optimal-control success on the fixed validation lakes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "frozen_lake_ceiling.py"


def test_ceiling_is_one_without_slips_and_a_probability_with_them() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from frozen_lake_ceiling import ceiling
    finally:
        sys.path.pop(0)
    assert ceiling("not_slippery", 6, 123) == [1.0] * 6  # a path always exists, within 10 moves on 4x4
    slip = ceiling("default", 6, 123)
    assert all(0.0 < p < 1.0 for p in slip)  # slips keep it below 1 in a finite budget
    p = subprocess.run([sys.executable, str(SCRIPT), "--states", "6"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    protocol = ceiling("default", 6, 123, turns=3, actions_per_turn=5)
    assert all(0.0 < q <= p + 1e-12 for q, p in zip(protocol, slip, strict=True))  # seeing less never helps
    assert "| frozen_lake:not_slippery | 6 | 1.000 | 6 | 0 | 1.000 |" in p.stdout
    assert f"| frozen_lake:default | 6 | {sum(slip) / 6:.3f} | 0 |" in p.stdout, p.stdout
    assert p.stdout.splitlines()[-1].endswith(f"| {sum(protocol) / 6:.3f} |"), p.stdout
    bad = subprocess.run([sys.executable, str(SCRIPT), "--states", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --states must be >= 1, got 0"
    bad = subprocess.run([sys.executable, str(SCRIPT), "--actions-per-turn", "0"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --actions-per-turn must be >= 1, got 0"
