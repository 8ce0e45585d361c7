"""The run report (``ragen_rllib.tracking.report``) on a synthetic run folder: real FrozenLake
trajectories from the rollout loop (scripted engine), written by the project's store, plus a
metrics file; no browser needed (tests/integration/test_report_browser.py renders one)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ragen_rllib.env_runners.rollout_loop import RolloutLoop, RolloutSpec
from ragen_rllib.tracking import report as R
from ragen_rllib.trajectory import TrajectoryStore, rows_to_table, with_kept, with_token_advantages
from ragen_rllib.trajectory.schema import Col

from fakes import CharTokenizer, ScriptedEngine

TOK = CharTokenizer()
MOVES = ("Right", "Down", "Left", "Up")


def _reply(prompt: str, call: int, row: int) -> str:
    return f"go</think><answer>{MOVES[(row + call) % 4]}</answer>"


def _decode(ids: list[int]) -> list[str]:
    return [TOK.decode([i]) for i in ids]


def make_run(root: Path, name: str = "r1", iterations: int = 2) -> Path:
    """A run folder: ``iterations`` x 2 FrozenLake groups x 2 samples (group 0 kept, with token
    advantages), metrics.jsonl with stage times, validation and an Echo-Trap flag, resume.json."""
    store = TrajectoryStore(root, name)
    spec = RolloutSpec("frozen_lake", group_size=2, max_turns=2)
    for it in range(iterations):
        rows = RolloutLoop(ScriptedEngine(TOK, _reply), TOK, spec).run([(10 * it, 7), (10 * it + 1, 8)], run_id=name,
                                                                       iteration=it, sampling_seed=it).rows
        table = with_kept(rows_to_table(rows), [10 * it])
        adv = [np.asarray(r[Col.LOSS_MASK], np.float32) * (0.5 if r[Col.SAMPLE_IDX] == 0 else -0.5)
               if r[Col.GROUP_ID] == 10 * it else None for r in rows]
        store.write(it, with_token_advantages(table, adv))
    run = store.run_dir
    for i in range(iterations):
        R.append_metrics(run, i, {"rollout/success": 0.25, "filter/std_all_mean": 0.5 / (1 + 9 * i),
                                  "actor/entropy": 2.0 - i, "actor/grad_norm": 1.0 + i,
                                  "rollout/response_length_mean": 30.0, "time/sample": 2.0, "time/generate": 1.5,
                                  "time/update": 1.0, "time/iteration": 3.5, "echo/std_collapse": float(i == 1),
                                  "val/frozen_lake/success": 0.5, "val/frozen_lake/success_ci95": 0.3})
    R.append_metrics(run, iterations, {"val/frozen_lake/success": 0.75, "val/frozen_lake/success_ci95": 0.2},
                     final=True)
    (run / "resume.json").write_text(json.dumps({"config": {"preset": "starpo_s", "iterations": iterations,
                                                            "starpo": {"env": "frozen_lake", "model": "m",
                                                                       "val_groups": 4, "val_group_size": 2}}}))
    return run


def episode_json(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="episode-data">(.*?)</script>', page, re.S)
    assert m, "no embedded episode data"
    return json.loads(m.group(1))


def test_intervals_hand_computed() -> None:
    # Wilson, k=0, n=8: z^2/n = 0.4802, centre = (z^2/16)/1.4802 = 0.16221 = half -> (0, 0.32442)
    lo, hi = R.wilson_interval(0, 8)
    assert lo == 0.0 and hi == pytest.approx(0.32442, abs=1e-4)
    # k=5, n=10: centre 0.5, half = 1.96 * sqrt(0.025 + 0.009604) / 1.38416 = 0.26341
    assert R.wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-4)
    assert R.wilson_interval(0, 0) == (0.0, 1.0)
    # [1, 2, 3]: mean 2, sd 1, se 1/sqrt(3) = 0.57735, 1.96 se = 1.13161
    assert R.mean_interval([1.0, 2.0, 3.0]) == pytest.approx((2.0, 0.86839, 3.13161), abs=1e-4)
    assert R.mean_interval([4.0]) == (4.0, 4.0, 4.0)


def test_report_of_a_synthetic_run(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    path = R.write_report(run, decode=_decode)
    assert path == run / R.REPORT_FILE
    page = path.read_text()
    # self-contained: no external script, style sheet or image
    assert "<script src" not in page and "<link" not in page and "<img" not in page
    assert not re.search(r'(src|href)="https?:', page)
    # curves: validation, rollout success, rollout return, 4 Echo-Trap panels; points and 95% bands
    assert page.count('<svg class="chart"') == 8  # + the stacked time bars
    assert page.count('class="series"') >= 7 and page.count('class="band"') == 3
    assert "Validation success (Wilson 95% interval)" in page
    # the final validation is the point at step 2, with Wilson bounds from 4 x 2 episodes
    lo, hi = R.wilson_interval(0.75 * 8, 8)
    assert f"frozen_lake @ 2: 0.75 (95% interval {R._fmt(lo)} .. {R._fmt(hi)})" in page
    # the Echo-Trap flag that switched on at iteration 1 is marked, with the monitor's message
    assert page.count('<g class="alarm">') == 4 and "std collapse" in page
    assert "<td>1</td><td>std_collapse</td>" in page
    # stage times: "other" = iteration - stages; generate listed under sample
    assert "of which generate" in page and ">other<" in page
    data = episode_json(page)
    assert [it["it"] for it in data["iterations"]] == [0, 1]
    groups = data["iterations"][1]["groups"]
    assert [(g["gid"], g["kept"]) for g in groups] == [(10, True), (11, False)]
    kept_ep, dropped_ep = groups[0]["episodes"][0], groups[1]["episodes"][0]
    turn = kept_ep["turns"][0]
    assert turn["state"].count("\n") == 3 and "P" in turn["state"]  # a 4x4 grid observation
    assert turn["adv"] == [0.5] * len(turn["tok"])  # one advantage per sampled token of the turn
    # the sampled tokens are the reply after the forced "<think>" prefix (EOS included)
    assert "".join(data["vocab"][str(t)] for t in turn["tok"]) == turn["reply"].removeprefix("<think>")
    assert all(t["adv"] is None for t in dropped_ep["turns"])  # dropped: not trained on
    assert data["has_adv"] and data["adv_scale"] == pytest.approx(0.5)
    legend = data["legends"]["frozen_lake:default"]
    assert legend["P"][0] == "player" and legend["O"][0] == "hole"


def test_episode_caps_keep_whole_groups_kept_and_dropped(tmp_path: Path) -> None:
    run = make_run(tmp_path, iterations=3)
    data = R.episode_data(R._read_trajectories(run), legend=lambda env, variant: {}, decode=None, max_iterations=2,
                          max_episodes_per_iteration=2)
    assert [it["it"] for it in data["iterations"]] == [0, 2]  # first and last
    assert [[g["gid"] for g in it["groups"]] for it in data["iterations"]] == [[0], [20]]  # one whole group each
    assert data["vocab"] == {} and data["total_iterations"] == 3
    assert R._pick_iterations(range(100), 5) == [0, 25, 50, 74, 99]


def test_read_history_last_line_wins_torn_line_and_checkpoint_fills_gaps(tmp_path: Path) -> None:
    R.append_metrics(tmp_path, 0, {"a": 1.0, "nan": float("nan")})
    R.append_metrics(tmp_path, 1, {"a": 2.0})
    R.append_metrics(tmp_path, 1, {"a": 3.0})  # a resumed run redid step 1
    with open(tmp_path / R.METRICS_FILE, "a") as f:
        f.write('{"step": 2, "metr')  # killed mid-line
    hist = R.read_history(tmp_path)
    assert hist.steps == [{"a": 1.0}, {"a": 3.0}] and hist.final == {} and hist.final_step is None
    other = tmp_path / "other"
    (other / "checkpoint").mkdir(parents=True)
    (other / "checkpoint" / "ragen_history.json").write_text(json.dumps([{"a": 5.0}, {"a": 6.0}]))
    assert R.read_history(other).steps == [{"a": 5.0}, {"a": 6.0}]
    R.append_metrics(other, 2, {"a": 7.0})  # resumed after the file appeared: the checkpoint fills 0, 1
    assert R.read_history(other).steps == [{"a": 5.0}, {"a": 6.0}, {"a": 7.0}]
    assert R.read_history(tmp_path / "none").steps == []


def test_echo_alarms_from_flags_and_from_a_replay() -> None:
    steps = [{"actor/grad_norm": 1.0, "echo/grad_norm_spike": 0.0} for _ in range(5)]
    steps.append({"actor/grad_norm": 100.0, "echo/grad_norm_spike": 1.0})
    steps.append({"actor/grad_norm": 100.0, "echo/grad_norm_spike": 1.0})  # still on: no second alarm
    alarms = R.echo_alarms(steps)
    assert [(s, n) for s, n, _ in alarms] == [(5, "grad_norm_spike")]
    assert "more than 5 x the median" in alarms[0][2]  # the monitor's own message
    unflagged = [{k: v for k, v in m.items() if not k.startswith("echo/")} for m in steps]
    assert [(s, n) for s, n, _ in R.echo_alarms(unflagged)] == [(5, "grad_norm_spike")]
    # A signal the run logged no flag for (added after the run) comes from the replay, next to the
    # logged flags: the malformed share rises 0 -> 0.4 at step 5 (EMA 0.12 > 0 + 0.1).
    older = [dict(m, **{"rollout/well_formed_rate": 1.0 if i < 5 else 0.6}) for i, m in enumerate(steps)]
    assert [(s, n) for s, n, _ in R.echo_alarms(older)] == [(5, "format_drift"), (5, "grad_norm_spike")]
    # replay=True ignores every logged flag (a run logged under older thresholds) but keeps the
    # echo/mi_* values the monitor reads: the z-score EMA 2.0, 1.4, 0.98, 0.686, 0.480 falls below
    # 0.5 at step 4.
    stale = [{"echo/mi_zscore": z, "echo/mi_collapse": 0.0, "echo/grad_norm_spike": 1.0} for z in (2.0, 0, 0, 0, 0)]
    assert R.echo_alarms(stale) == [(0, "grad_norm_spike", "[echo-trap] step 0: grad_norm_spike switched on")]
    assert [(s, n) for s, n, _ in R.echo_alarms(stale, replay=True)] == [(4, "mi_collapse")]


def test_report_of_a_run_without_trajectories_or_metrics(tmp_path: Path) -> None:
    page = R.build_report(tmp_path)
    assert "This run stored no trajectories." in page and "no data recorded" in page
    assert episode_json(page)["iterations"] == []
    with pytest.raises(FileNotFoundError, match="does not exist"):
        R.build_report(tmp_path / "missing")


def test_report_command_prints_the_path(tmp_path: Path) -> None:
    from ragen_rllib.cli import main

    run = make_run(tmp_path / "runs")
    buf = io.StringIO()
    assert main(["report", "r1", "--root", str(tmp_path / "runs")], out=buf) == 0
    assert buf.getvalue().strip() == str((run / R.REPORT_FILE).resolve())
    assert (run / R.REPORT_FILE).is_file()
    with pytest.raises(SystemExit, match="no run folder 'nope'"):
        main(["report", "nope", "--root", str(tmp_path / "runs")], out=io.StringIO())


def test_report_module_is_import_light() -> None:
    code = "import sys, ragen_rllib.tracking.report; print(' '.join(sorted(sys.modules)))"
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert not mods & {"ray", "vllm", "mlflow", "torch", "transformers"}, mods & {"ray", "vllm", "mlflow", "torch"}


def test_fisher_exact_hand_computed() -> None:
    # 5 / 20 against 0 / 20: tables with 0 or 5 events in the first group are the extremes;
    # P[k=5] = C(20,5) C(20,0) / C(40,5) = 15504 / 658008, doubled by symmetry.
    assert R.fisher_exact(5, 20, 0, 20) == pytest.approx(2 * 15504 / 658008)
    assert R.fisher_exact(0, 20, 5, 20) == R.fisher_exact(5, 20, 0, 20)
    # 1 / 2 against 1 / 2: the only other tables are as likely or likelier.
    assert R.fisher_exact(1, 2, 1, 2) == pytest.approx(1.0)
    # 3 / 3 against 0 / 3: P = 1 / C(6,3) = 0.05 each side.
    assert R.fisher_exact(3, 3, 0, 3) == pytest.approx(0.1)
    assert R.fisher_exact(0, 0, 0, 4) == 1.0 and R.fisher_exact(0, 5, 0, 5) == 1.0
    with pytest.raises(ValueError, match="a=3, n_a=2"):
        R.fisher_exact(3, 2, 0, 2)


def test_mcnemar_exact_hand_computed() -> None:
    assert R.mcnemar_exact(0, 0) == 1.0
    assert R.mcnemar_exact(0, 5) == pytest.approx(2 / 32)  # 2 * P[B(5, .5) = 0]
    assert R.mcnemar_exact(1, 9) == pytest.approx(22 / 1024)  # 2 * (1 + 10) / 2^10
    assert R.mcnemar_exact(5, 2) == pytest.approx(58 / 128)  # 2 * (1 + 7 + 21) / 2^7
    assert R.mcnemar_exact(3, 3) == 1.0  # 2 * 42/64 > 1 is capped
    with pytest.raises(ValueError, match="losses=-1"):
        R.mcnemar_exact(2, -1)


def test_paired_comparison_hand_computed() -> None:
    before = {(1, 0): False, (2, 0): True, (3, 0): False, (4, 0): True}
    after = {(1, 0): True, (2, 0): True, (3, 0): True, (4, 0): False, (5, 0): True}  # state 5 is unpaired
    c = R.paired_comparison(before, after)
    assert (c.pairs, c.states, c.unpaired, c.gains, c.losses) == (4, 4, 1, 2, 1)
    assert (c.before, c.after) == (0.5, 0.75)
    # per-state diffs [1, 0, 1, -1]: mean .25, sd sqrt(2.75 / 3) = .957427, 1.96 * sd / 2 = .938279
    assert (c.diff, c.diff_low, c.diff_high) == pytest.approx((0.25, -0.688279, 1.188279), abs=1e-5)
    assert c.p_mcnemar == 1.0  # 2 * (1 + 3) / 8
    # two samples per state: the state is the paired unit (diffs [.5, 0] -> .25 ± 1.96 * .25)
    two = R.paired_comparison({(1, 0): False, (1, 1): False, (2, 0): True, (2, 1): True},
                              {(1, 0): True, (1, 1): False, (2, 0): True, (2, 1): True})
    assert (two.pairs, two.states, two.gains) == (4, 2, 1)
    assert (two.diff, two.diff_low, two.diff_high) == pytest.approx((0.25, -0.24, 0.74), abs=1e-9)
    with pytest.raises(ValueError, match="share no"):
        R.paired_comparison({(1, 0): True}, {(2, 0): True})


def _write_validation(run: Path, env: str, iteration: int, success: list[bool]) -> None:
    from ragen_rllib.trajectory.store import validation_store

    spec = RolloutSpec("frozen_lake", group_size=1, max_turns=1)
    groups = [(10**9 + g, 123 + g) for g in range(len(success))]
    rows = RolloutLoop(ScriptedEngine(TOK, _reply), TOK, spec).run(groups, run_id=run.name, iteration=iteration,
                                                                   sampling_seed=123).rows
    for r, ok in zip(rows, success, strict=True):
        r[Col.SUCCESS] = ok
    validation_store(run, env).write(iteration, rows_to_table(rows), overwrite=True)


def test_validation_outcomes_and_paired_script(tmp_path: Path) -> None:
    run = make_run(tmp_path, "paired", iterations=1)
    assert R.validation_outcomes(run, "frozen_lake:guided") == {}  # a run without stored validations
    _write_validation(run, "frozen_lake:guided", 0, [False] * 6 + [True] * 2)
    _write_validation(run, "frozen_lake:guided", 8, [True] * 8)
    assert (run / "validation" / "frozen_lake-guided" / "iter_000008.parquet").is_file()
    out = R.validation_outcomes(run, "frozen_lake:guided")
    assert sorted(out) == [0, 8] and out[0][(123, 0)] is False and out[8][(130, 0)] is True
    assert R.read_history(run).steps  # training files untouched by the validation stores
    script = Path(__file__).resolve().parents[2] / "scripts" / "paired_validation.py"
    p = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "differences against paired@0" in lines[0]
    # 6 gains, 0 losses: McNemar p = 2 / 2^6 = 0.03125
    assert any(ln.startswith("| paired@8 | 8 | 1.000 [") and "| 8 | 6 | 0 | +0.750 [" in ln
               and ln.endswith("| 0.0312 |") for ln in lines), p.stdout
    # --base: the same pairs read the other way round (6 losses against the later validation)
    rev = subprocess.run([sys.executable, str(script), str(run), "--base", "paired@8"], capture_output=True,
                         text=True, timeout=120)
    assert rev.returncode == 0 and "differences against paired@8" in rev.stdout, rev.stderr
    assert any(ln.startswith("| paired@0 |") and "| 8 | 0 | 6 | -0.750 [" in ln and ln.endswith("| 0.0312 |")
               for ln in rev.stdout.splitlines()), rev.stdout
    unknown = subprocess.run([sys.executable, str(script), str(run), "--base", "paired@3"], capture_output=True,
                             text=True, timeout=120)
    assert unknown.returncode == 2 and unknown.stderr.strip() == (
        "error: --base paired@3 is not among the validations: paired@0, paired@8"), unknown.stderr
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "nope")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == f"error: no run directory {tmp_path / 'nope'}"
    (run / "validation" / "frozen_lake-guided" / "iter_000016.parquet").write_bytes(b"not parquet")
    corrupt = subprocess.run([sys.executable, str(script), str(run)], capture_output=True, text=True, timeout=120)
    assert corrupt.returncode == 2 and corrupt.stderr.startswith("error: cannot read the validations: "), corrupt.stderr
    assert "iter_000016.parquet" in corrupt.stderr and len(corrupt.stderr.strip().splitlines()) == 1


def _outcomes(successes: list[bool]) -> dict[tuple[int, int], bool]:
    return {(s, 0): ok for s, ok in enumerate(successes)}


def test_validation_fall_hand_computed() -> None:
    # 8 states, all solved at 0. At 4: 5 losses, 0 gains -> McNemar p = 2 / 2^5 = 0.0625 (not a fall);
    # at 8: 6 losses -> 2 / 2^6 = 0.03125 < 0.05, the first fall (2 / 8 = 0.25); at 12: all lost (the
    # lowest, 0.0); at 16: back to 7 / 8.
    vals = {0: _outcomes([True] * 8), 4: _outcomes([False] * 5 + [True] * 3),
            8: _outcomes([False] * 6 + [True] * 2), 12: _outcomes([False] * 8), 16: _outcomes([False] + [True] * 7)}
    f = R.validation_fall(vals)
    assert (f.base, f.base_success, f.first, f.first_success, f.lowest, f.lowest_success) == (0, 1.0, 8, 0.25, 12, 0.0)
    assert f.first_p == pytest.approx(0.03125)
    # A significant rise is not a fall; the lowest is then the base (the earliest of ties).
    up = R.validation_fall({0: _outcomes([False] * 8), 8: _outcomes([True] * 8), 16: _outcomes([False] * 8)})
    assert (up.first, up.first_p, up.lowest, up.lowest_success) == (None, None, 0, 0.0)
    with pytest.raises(ValueError, match="no validation"):
        R.validation_fall({})


def test_echo_alarms_falls_marks_each_alarm_against_the_validations(tmp_path: Path) -> None:
    run = make_run(tmp_path, "falls", iterations=1)
    steps = [{"rollout/tokens_per_turn": x} for x in (6.0, 12.0, 12.0, 12.0, 12.0, 12.0)]
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "metrics": m}) + "\n"
                                               for i, m in enumerate(steps)))
    for it, ok in ((0, [True] * 8), (2, [True] * 8), (4, [False] * 8)):  # 8 losses at 4: p = 2 / 2^8
        _write_validation(run, "frozen_lake:guided", it, ok)
    script = Path(__file__).resolve().parents[2] / "scripts" / "echo_alarms.py"
    p = subprocess.run([sys.executable, str(script), "--falls", str(run)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if not ln.startswith("      ")]
    # reply_jump: 12 > 1.7 * 6 at step 1 (iteration 2); reply_growth: EMA 6, 7.8, 9.06 > 9 at step 2
    # (iteration 3); both before the validation at 4.
    assert lines[1:] == [
        "   validation 1.000 at iteration 0; first significant fall at iteration 4 (0.000, p = 0.0078); "
        "lowest 0.000 at iteration 4",
        "   iteration 2: reply_jump (no validation yet; first nan; before the first fall, before the lowest)",
        "   iteration 3: reply_growth (no validation yet; first nan; before the first fall, before the lowest)"]
    # A corrupt validation file is a one-line error naming it, not a traceback.
    (run / "validation" / "frozen_lake-guided" / "iter_000006.parquet").write_bytes(b"not parquet")
    bad = subprocess.run([sys.executable, str(script), "--falls", str(run)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith(f"error: cannot read the validations of {run}: "), bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
