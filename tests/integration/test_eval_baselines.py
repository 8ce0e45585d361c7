"""``eval`` of reference policies on an experiment's validation protocol: the baselines every
learning result is compared against (same fixed initial states, same rollout loop, no engine)."""

from __future__ import annotations

import io
import json

import pytest

from ragen_rllib import cli

pytestmark = pytest.mark.integration


def _eval(*argv: str) -> str:
    out = io.StringIO()
    assert cli.main(["eval", *argv], out=out) == 0
    return out.getvalue()


def test_expert_is_the_ceiling_and_random_valid_the_floor(tiny_model_dir, tmp_path):
    common = ["--config", "experiments/frozen_lake_starpo_s.yaml", "--profile", "cpu", "--checkpoint",
              str(tiny_model_dir), "--env", "frozen_lake:not_slippery", "--set", "starpo.val_groups=32"]
    text = _eval(*common, "--policy", "expert", "--json", str(tmp_path / "expert.json"))
    assert "frozen_lake:not_slippery [expert]: success 1.000" in text  # shortest paths fit in 3 turns x 5 actions
    _eval(*common, "--policy", "random-valid", "--json", str(tmp_path / "random.json"))
    expert = json.loads((tmp_path / "expert.json").read_text())
    rand = json.loads((tmp_path / "random.json").read_text())
    assert expert["policy"] == "expert" and expert["frozen_lake:not_slippery/success"] == 1.0
    assert rand["frozen_lake:not_slippery/success"] < 0.5
    assert rand["frozen_lake:not_slippery/well_formed_rate"] == 1.0  # valid actions in the exact format
    # Same protocol, same states: a second run gives the same numbers (seeded policy, fixed states).
    _eval(*common, "--policy", "random-valid", "--json", str(tmp_path / "random2.json"))
    assert json.loads((tmp_path / "random2.json").read_text()) == rand


def test_eval_needs_a_model_or_an_experiment():
    with pytest.raises(SystemExit, match="give --checkpoint"):
        cli.main(["eval"], out=io.StringIO())
    with pytest.raises(SystemExit) as e:  # argparse: "invalid choice: 'oracle'", exit code 2
        cli.main(["eval", "--config", "experiments/frozen_lake_starpo_s.yaml", "--policy", "oracle"],
                 out=io.StringIO())
    assert e.value.code != 0
