"""Echo-Trap signals, identical-response fraction, and the MLflow tracker's pure parts (no mlflow import).

The tracker's buffering is tested with a fake ``sender`` (the seam between the tracker and
``MlflowClient``); tests/integration/test_mlflow_logger.py covers the real store.
"""

from __future__ import annotations

import enum
import json
import logging
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ragen_rllib.tracking.echo_trap import (
    ENTROPY_KEY,
    GRAD_NORM_KEY,
    IDENTICAL_KEY,
    MI_ABOVE_CHANCE_KEY,
    MI_ZSCORE_KEY,
    RESPONSE_LENGTH_KEY,
    SIGNALS,
    STD_KEY,
    SUCCESS_KEY,
    TOKENS_PER_TURN_KEY,
    WELL_FORMED_KEY,
    EchoTrapMonitor,
    identical_response_fraction,
)
from ragen_rllib.tracking.mlflow_logger import (
    DROPPED_NONFINITE_KEY,
    MAX_KEY_LENGTH,
    MAX_PARAM_VALUE_LENGTH,
    PENDING_FILE,
    REJECTED_FILE,
    MLflowTracker,
    flatten_config,
    sanitize_key,
    truncate_value,
)

LOGGER = "ragen_rllib.tracking.mlflow_logger"


# -- identical_response_fraction ------------------------------------------------------------

def test_identical_fraction_hand_cases() -> None:
    # g0 all identical, g1 differs, g2 a singleton (not counted) -> 1 of 2 groups.
    assert identical_response_fraction(["a", "a", "a", "b", "x"], [0, 0, 1, 1, 2]) == 0.5
    # Rows of a group need not be contiguous; g7 identical, g3 identical -> 2 of 2.
    assert identical_response_fraction(["!!", "ok", "!!", "ok"], [7, 3, 7, 3]) == 1.0
    # Whitespace counts: exact string comparison.
    assert identical_response_fraction(["a", "a "], [0, 0]) == 0.0
    assert identical_response_fraction(["a", "b", "c"], [0, 1, 2]) == 0.0  # singletons only
    assert identical_response_fraction([], []) == 0.0


def test_identical_fraction_length_mismatch() -> None:
    with pytest.raises(ValueError, match=r"responses \(2\) and group_ids \(1\)"):
        identical_response_fraction(["a", "b"], [0])


# -- EchoTrapMonitor ------------------------------------------------------------------------

def _feed(monitor: EchoTrapMonitor, rows: list[dict[str, float]]) -> list[tuple[str, int]]:
    fired = []
    for step, row in enumerate(rows):
        fired += [(s.name, s.step) for s in monitor.update(row, step)]
    return fired


def _names(fired: list[tuple[str, int]]) -> set[str]:
    return {name for name, _ in fired}


def test_std_collapse_fires_when_success_does_not_rise() -> None:
    rows = [{STD_KEY: 0.5, SUCCESS_KEY: 0.3}] * 8 + [{STD_KEY: 0.02, SUCCESS_KEY: 0.3}] * 8
    fired = _feed(EchoTrapMonitor(), rows)
    assert _names(fired) == {"std_collapse"}
    (step,) = [s for n, s in fired if n == "std_collapse"]
    assert 8 <= step <= 12  # the EMA needs a few steps to fall below 0.3 x 0.5


def test_std_collapse_fires_without_success_metric() -> None:
    assert _names(_feed(EchoTrapMonitor(), [{STD_KEY: 0.5}] * 6 + [{STD_KEY: 0.0}] * 6)) == {"std_collapse"}


@pytest.mark.parametrize("final_success", [1.0, 0.7])  # solved, or risen by >= 0.2 since the std peak
def test_std_drop_explained_by_rising_success_is_not_a_collapse(final_success: float) -> None:
    rows = [{STD_KEY: 0.5, SUCCESS_KEY: 0.3}] * 6
    rows += [{STD_KEY: 0.5 * (1 - i / 10), SUCCESS_KEY: 0.3 + (final_success - 0.3) * i / 10} for i in range(11)]
    rows += [{STD_KEY: 0.0, SUCCESS_KEY: final_success}] * 8
    assert _feed(EchoTrapMonitor(), rows) == []


def test_std_noise_and_warmup_do_not_fire() -> None:
    noisy = [{STD_KEY: 0.4 + 0.1 * ((i * 7) % 3 - 1)} for i in range(40)]
    assert _feed(EchoTrapMonitor(), noisy) == []
    # A collapse inside the warm-up (fewer than `window` observations) cannot fire yet.
    assert _feed(EchoTrapMonitor(window=5), [{STD_KEY: 0.5}, {STD_KEY: 0.0}, {STD_KEY: 0.0}, {STD_KEY: 0.0}]) == []
    # A std that was never above zero has no reference to collapse from.
    assert _feed(EchoTrapMonitor(), [{STD_KEY: 0.0}] * 10) == []


def test_entropy_collapse() -> None:
    collapse = [{ENTROPY_KEY: 1.2}] * 5 + [{ENTROPY_KEY: 0.1}] * 6
    assert _names(_feed(EchoTrapMonitor(), collapse)) == {"entropy_collapse"}
    gentle = [{ENTROPY_KEY: 1.2 - 0.02 * i} for i in range(25)]  # 1.2 -> 0.72: above 0.3 x early
    assert _feed(EchoTrapMonitor(), gentle) == []


def test_response_length_collapse() -> None:
    collapse = [{RESPONSE_LENGTH_KEY: 200.0}] * 5 + [{RESPONSE_LENGTH_KEY: 40.0}] * 6
    assert _names(_feed(EchoTrapMonitor(), collapse)) == {"response_length_collapse"}
    mild = [{RESPONSE_LENGTH_KEY: 200.0}] * 5 + [{RESPONSE_LENGTH_KEY: 150.0}] * 10
    assert _feed(EchoTrapMonitor(), mild) == []


def test_grad_norm_spike_onset_and_reset() -> None:
    m = EchoTrapMonitor(window=5, grad_norm_spike_k=5.0)
    norms = [1.0, 1.2, 0.9, 1.1, 1.0, 1.0, 12.0, 1.0, 1.1, 4.0, 1.0, 30.0]
    fired = _feed(m, [{GRAD_NORM_KEY: g} for g in norms])
    # 12 > 5 x median(1.0) fires; 4.0 does not; after falling back, 30 fires again (a new onset).
    assert fired == [("grad_norm_spike", 6), ("grad_norm_spike", 11)]
    assert m.flags()["echo/grad_norm_spike"] == 1.0
    m.update({GRAD_NORM_KEY: 1.0}, 12)
    assert m.flags()["echo/grad_norm_spike"] == 0.0


def test_grad_norm_nonfinite_is_a_spike_and_warmup_guards_finite_values() -> None:
    assert _feed(EchoTrapMonitor(), [{GRAD_NORM_KEY: 1.0}, {GRAD_NORM_KEY: 50.0}]) == []  # no median yet
    fired = _feed(EchoTrapMonitor(), [{GRAD_NORM_KEY: 1.0}, {GRAD_NORM_KEY: float("nan")}])
    assert fired == [("grad_norm_spike", 1)]


def test_identical_responses_absolute_threshold() -> None:
    m = EchoTrapMonitor(identical_frac_threshold=0.5)
    (sig,) = m.update({IDENTICAL_KEY: 0.75}, step=0)  # no warm-up for an absolute threshold
    assert (sig.name, sig.step, sig.value, sig.reference) == ("identical_responses", 0, 0.75, 0.5)
    assert IDENTICAL_KEY in sig.message and "step 0" in sig.message
    assert _feed(EchoTrapMonitor(), [{IDENTICAL_KEY: 0.5}, {IDENTICAL_KEY: 0.2}]) == []


def test_flags_missing_keys_and_signal_fields() -> None:
    m = EchoTrapMonitor()
    assert m.flags() == {f"echo/{name}": 0.0 for name in SIGNALS}
    for step in range(6):
        m.update({STD_KEY: 0.5, "actor/pg_loss": 0.1}, step)
    fired = [sig for step in range(6, 10) for sig in m.update({STD_KEY: 0.0}, step)]
    (sig,) = fired  # EMA 0.35, 0.245, 0.17, 0.12: below 0.3 x 0.5 at the 4th zero
    assert sig.name == "std_collapse" and sig.reference == pytest.approx(0.5) and sig.value < 0.15
    assert STD_KEY in sig.message
    assert sig.step == 9
    assert m.update({}, 10) == []  # missing metrics: nothing evaluated, state kept
    assert m.flags()["echo/std_collapse"] == 1.0 and m.active["std_collapse"] is True
    assert m.update({STD_KEY: float("nan")}, 11) == []  # non-finite treated as missing


def test_mi_collapse_fires_when_a_prompt_dependence_falls() -> None:
    healthy = [{MI_ZSCORE_KEY: 2.0, MI_ABOVE_CHANCE_KEY: 0.4}] * 3
    collapsed = [{MI_ZSCORE_KEY: 0.0, MI_ABOVE_CHANCE_KEY: 0.0}] * 4
    # z EMA (alpha 0.3): 2.0 -> 1.4 -> 0.98 -> 0.686 -> 0.48 < 0.5 at the 4th collapsed step (step 6);
    # above-chance EMA: 0.4 -> 0.28 -> 0.196 -> 0.137 -> 0.096, still >= 0.05 then
    m = EchoTrapMonitor()
    assert _feed(m, healthy + collapsed) == [("mi_collapse", 6)]
    assert m.flags()["echo/mi_collapse"] == 1.0
    assert _feed(EchoTrapMonitor(mi_above_chance_min=None), healthy + collapsed) == [("mi_collapse", 6)]
    # The retrieval half alone (z half off): EMA 0.5 (reaches 0.3) -> 0.35 -> 0.245 < 0.3 at step 2.
    m = EchoTrapMonitor(mi_zscore_min=None, mi_above_chance_min=0.3)
    rows = [{MI_ABOVE_CHANCE_KEY: 0.5, MI_ZSCORE_KEY: 0.0}] + [{MI_ABOVE_CHANCE_KEY: 0.0, MI_ZSCORE_KEY: 0.0}] * 2
    fired = [sig for step, row in enumerate(rows) for sig in m.update(row, step)]
    (sig,) = fired
    assert (sig.name, sig.step, sig.reference) == ("mi_collapse", 2, 0.3)
    assert sig.value == pytest.approx(0.245) and MI_ABOVE_CHANCE_KEY in sig.message


def test_mi_collapse_needs_a_fall_not_a_low_start_and_not_a_solved_task() -> None:
    never = [{MI_ZSCORE_KEY: 0.0, MI_ABOVE_CHANCE_KEY: 0.0}] * 10  # replies never depended on the prompt
    assert _feed(EchoTrapMonitor(), never) == []
    healthy = [{MI_ZSCORE_KEY: 2.0, MI_ABOVE_CHANCE_KEY: 0.4, SUCCESS_KEY: 0.97}] * 3
    solved = [{MI_ZSCORE_KEY: 0.0, MI_ABOVE_CHANCE_KEY: 0.0, SUCCESS_KEY: 1.0}] * 6  # one right answer left
    assert _feed(EchoTrapMonitor(), healthy + solved) == []
    # Iterations without MI metrics (mi_every > 1) keep the state and never evaluate the signal.
    m = EchoTrapMonitor()
    _feed(m, [{MI_ZSCORE_KEY: 2.0}, {}, {STD_KEY: 0.4}])
    assert m.active["mi_collapse"] is False and m.update({}, 3) == []


def test_mi_metrics_leave_the_other_signals_alone() -> None:
    rows = [{STD_KEY: 0.5, ENTROPY_KEY: 1.2, GRAD_NORM_KEY: 1.0, MI_ZSCORE_KEY: 2.0 - 0.2 * i} for i in range(12)]
    base = [{k: v for k, v in r.items() if not k.startswith("echo/")} for r in rows]
    assert [n for n, _ in _feed(EchoTrapMonitor(), rows) if n != "mi_collapse"] == _feed(EchoTrapMonitor(), base)


def test_format_drift_hand_computed() -> None:
    # window 5, alpha 0.3: five well-formed iterations leave the malformed EMA at 0 (its lowest).
    # wf 0.7 -> EMA 0.3 * 0.3 = 0.09, not > 0 + 0.1; wf 0.7 again -> 0.09 + 0.7 * 0.09 = 0.153 > 0.1: fires.
    good = [{WELL_FORMED_KEY: 1.0}] * 5
    assert _feed(EchoTrapMonitor(), good + [{WELL_FORMED_KEY: 0.7}] * 2) == [("format_drift", 6)]
    # One bad batch alone: 0.4 malformed -> EMA 0.12 > 0.1 fires at once, and recovery switches it off.
    m = EchoTrapMonitor()
    assert _feed(m, good + [{WELL_FORMED_KEY: 0.6}]) == [("format_drift", 5)]
    _feed(m, [{WELL_FORMED_KEY: 1.0}] * 3)  # 0.12 -> 0.084 -> 0.059 -> 0.041
    assert m.active["format_drift"] is False
    # A run that starts malformed and learns the format: the EMA only falls, so it never fires.
    learning = [{WELL_FORMED_KEY: 0.5}] * 5 + [{WELL_FORMED_KEY: 0.9 + 0.01 * i} for i in range(10)]
    assert _feed(EchoTrapMonitor(), learning) == []
    # No warm-up: a policy that loses the format in its first update fires at the second iteration
    # (EMA 0.3 * 1.0 = 0.3 > 0 + 0.1); a small wobble does not (0.3 * 0.3 = 0.09).
    assert _feed(EchoTrapMonitor(), [{WELL_FORMED_KEY: 1.0}, {WELL_FORMED_KEY: 0.0}, {WELL_FORMED_KEY: 0.0}]) == [
        ("format_drift", 1)]
    assert _feed(EchoTrapMonitor(), [{WELL_FORMED_KEY: 1.0}, {WELL_FORMED_KEY: 0.7}]) == []
    # The reference is the lowest EMA, not the early one: drift after a recovery still counts.
    late = [{WELL_FORMED_KEY: 0.5}] * 5 + [{WELL_FORMED_KEY: 1.0}] * 15 + [{WELL_FORMED_KEY: 0.5}]
    assert _feed(EchoTrapMonitor(), late) == [("format_drift", 20)]


def test_reply_growth_hand_computed() -> None:
    # alpha 0.3, frac 1.5. Replies of 6 tokens: EMA 6 (the lowest). 12 tokens: 0.3 * 12 + 0.7 * 6 = 7.8,
    # not > 9; 12 again: 0.3 * 12 + 0.7 * 7.8 = 9.06 > 1.5 * 6 = 9: fires at the third iteration.
    rows = [{TOKENS_PER_TURN_KEY: 6.0}, {TOKENS_PER_TURN_KEY: 12.0}, {TOKENS_PER_TURN_KEY: 12.0}]
    m = EchoTrapMonitor()
    fired = [s for step, row in enumerate(rows) for s in m.update(row, step) if s.name == "reply_growth"]
    assert [(s.name, s.step) for s in fired] == [("reply_growth", 2)]
    assert fired[0].value == pytest.approx(9.06) and fired[0].reference == pytest.approx(6.0)
    # The reference is the lowest EMA, not the first value: 8, 4, 4 -> EMA 8, 6.8, 5.96 (lowest);
    # then 12 -> 0.3 * 12 + 0.7 * 5.96 = 7.772, not > 1.5 * 5.96 = 8.94; 12 -> 3.6 + 0.7 * 7.772 = 9.0404 > 8.94:
    # fires at step 4 (measured from the first value, 1.5 * 8 = 12, it would not).
    rows = [{TOKENS_PER_TURN_KEY: x} for x in (8.0, 4.0, 4.0, 12.0, 12.0)]
    m = EchoTrapMonitor()
    fired = [s for step, row in enumerate(rows) for s in m.update(row, step) if s.name == "reply_growth"]
    assert [(s.name, s.step) for s in fired] == [("reply_growth", 4)]
    assert fired[0].value == pytest.approx(9.0404) and fired[0].reference == pytest.approx(5.96)
    # Steady replies and a falling length never fire; a reply length of 0 never fires (no reference).
    assert _feed(EchoTrapMonitor(), [{TOKENS_PER_TURN_KEY: 6.0 + 0.1 * (i % 3)} for i in range(30)]) == []
    assert "reply_growth" not in _names(_feed(EchoTrapMonitor(), [{TOKENS_PER_TURN_KEY: 0.0},
                                                                  {TOKENS_PER_TURN_KEY: 5.0}]))


def test_reply_jump_hand_computed() -> None:
    # frac 1.7, window 5, raw values. 6, 7: 7 > 1.7 * 6 = 10.2? no. 10.5 > 10.2: fires at step 2.
    rows = [{TOKENS_PER_TURN_KEY: x} for x in (6.0, 7.0, 10.5)]
    m = EchoTrapMonitor()
    fired = [s for step, row in enumerate(rows) for s in m.update(row, step) if s.name == "reply_jump"]
    assert [s.step for s in fired] == [2] and fired[0].value == 10.5 and fired[0].reference == 6.0
    # 10.2 exactly does not fire (strictly above).
    assert "reply_jump" not in [n for n, _ in _feed(EchoTrapMonitor(), [{TOKENS_PER_TURN_KEY: x} for x in (6.0, 10.2)])]
    # The reference is the lowest of the previous 5 only. 4, 6, 6, 6, 6, then 7 > 1.7 * 4 = 6.8 fires at
    # step 5 (the 4 is among steps 0-4); 6 at step 6 is off (lowest of steps 1-5 is 6: 6 < 10.2); 10.5 >
    # 10.2 fires again at step 7; a 7 at step 8 does not (the 4 has left the window).
    rows = [{TOKENS_PER_TURN_KEY: x} for x in (4.0, 6.0, 6.0, 6.0, 6.0, 7.0, 6.0, 10.5, 7.0)]
    assert [st for n, st in _feed(EchoTrapMonitor(), rows) if n == "reply_jump"] == [5, 7]
    # The message names how many iterations the reference came from: 5 once the window is full, 1 at step 1.
    m = EchoTrapMonitor()
    msgs = [s.message for step, row in enumerate(rows) for s in m.update(row, step) if s.name == "reply_jump"]
    assert "the lowest of the previous 5 iterations (4)" in msgs[0]
    assert "the lowest of the previous 5 iterations (6)" in msgs[1]
    m = EchoTrapMonitor()
    early = [s.message for step, x in enumerate((6.0, 10.5)) for s in m.update({TOKENS_PER_TURN_KEY: x}, step)
             if s.name == "reply_jump"]
    assert len(early) == 1 and "the lowest of the previous 1 iteration (6)" in early[0]
    # Slow growth never fires: 1.1x an iteration is 1.1 ** 5 = 1.61 < 1.7 over the window.
    slow = [{TOKENS_PER_TURN_KEY: 6.0 * 1.1 ** i} for i in range(20)]
    assert "reply_jump" not in [n for n, _ in _feed(EchoTrapMonitor(), slow)]
    # A reference of 0 never fires.
    assert "reply_jump" not in [n for n, _ in _feed(EchoTrapMonitor(), [{TOKENS_PER_TURN_KEY: 0.0},
                                                                        {TOKENS_PER_TURN_KEY: 5.0}])]


@pytest.mark.parametrize(("kwargs", "field_name"), [
    ({"mi_zscore_min": float("nan")}, "mi_zscore_min"), ({"mi_above_chance_min": "x"}, "mi_above_chance_min"),
    ({"window": 0}, "window"), ({"ema_alpha": 0.0}, "ema_alpha"), ({"std_collapse_frac": 1.5}, "std_collapse_frac"),
    ({"grad_norm_spike_k": 1.0}, "grad_norm_spike_k"), ({"identical_frac_threshold": 1.0}, "identical_frac_threshold"),
    ({"format_drift_rise": 0.0}, "format_drift_rise"), ({"reply_growth_frac": 1.0}, "reply_growth_frac"),
    ({"reply_growth_frac": float("inf")}, "reply_growth_frac"), ({"reply_jump_frac": 0.5}, "reply_jump_frac"),
])
def test_monitor_validates_fields(kwargs: dict, field_name: str) -> None:
    with pytest.raises(ValueError, match=field_name):
        EchoTrapMonitor(**kwargs)


# -- flatten_config, sanitize_key, truncate_value --------------------------------------------

class _Mode(enum.Enum):
    FAST = "fast"


@dataclass(frozen=True)
class _Inner:
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28


@dataclass(frozen=True)
class _Outer:
    starpo: _Inner = _Inner()
    lr: float = 1e-6
    mode: _Mode = _Mode.FAST
    envs: tuple[str, ...] = ("bandit", "sokoban")
    extra: dict = field(default_factory=lambda: {"a": {"b": 1}, "empty": {}})
    note: str | None = None


def test_flatten_config_nested_frozen_dataclass() -> None:
    assert flatten_config(_Outer()) == {
        "starpo.clip_ratio_low": "0.2",
        "starpo.clip_ratio_high": "0.28",
        "lr": "1e-06",
        "mode": "fast",
        "envs": '["bandit", "sokoban"]',
        "extra.a.b": "1",
        "extra.empty": "{}",
        "note": "None",
    }
    assert flatten_config({"x": _Inner()}, prefix="cfg") == {
        "cfg.x.clip_ratio_low": "0.2", "cfg.x.clip_ratio_high": "0.28"}

    class _HasToDict:
        def to_dict(self):
            return {"lr": 3e-4, "model": {"name": "tiny"}}

    assert flatten_config(_HasToDict()) == {"lr": "0.0003", "model.name": "tiny"}
    with pytest.raises(TypeError, match="got int"):
        flatten_config(5)


@pytest.mark.parametrize(("key", "expected"), [
    ("rollout/success", "rollout/success"),
    ("time/step s-1.x", "time/step s-1.x"),
    ("rollout/pass@4", "rollout/pass_4"),
    ("a:b", "a_b"),
    ("réward", "r_ward"),
    ("/a//b/", "a/b"),
    ("a/./b", "a/_/b"),
    ("../x", "__/x"),
    ("", "_"),
])
def test_sanitize_key(key: str, expected: str) -> None:
    assert sanitize_key(key) == expected
    assert sanitize_key(expected) == expected  # idempotent


def test_sanitize_long_keys_stay_distinct() -> None:
    a, b = "k" * 300 + "a", "k" * 300 + "b"
    assert len(sanitize_key(a)) == MAX_KEY_LENGTH and sanitize_key(a) != sanitize_key(b)


def test_truncate_value() -> None:
    assert truncate_value("x" * MAX_PARAM_VALUE_LENGTH) == "x" * MAX_PARAM_VALUE_LENGTH
    cut = truncate_value("x" * 7000)
    assert len(cut) == MAX_PARAM_VALUE_LENGTH and cut.endswith("...[truncated, 7000 chars]")


# -- MLflowTracker buffering with a fake sender ----------------------------------------------

class _Down(ConnectionError):
    pass


class _Rejected(Exception):
    error_code = "INVALID_PARAMETER_VALUE"


class FakeSender:
    """Stands in for MlflowClient: records what was delivered; raises while ``down``."""

    def __init__(self) -> None:
        self.down = False
        self.reject = False
        self.calls = 0
        self.sent: list[dict] = []

    def __call__(self, record: dict) -> None:
        self.calls += 1
        if self.down:
            raise _Down("connection refused")
        if self.reject:
            raise _Rejected("param changed")
        if record["kind"] == "artifact":
            assert Path(record["local_path"]).exists()
        self.sent.append(json.loads(json.dumps(record)))

    def steps(self) -> list[int]:
        return [m[3] for r in self.sent if r["kind"] == "batch" for m in r["metrics"]]


def _tracker(tmp_path: Path, sender: FakeSender, **kw) -> MLflowTracker:
    return MLflowTracker(None, "exp", run_id="run0", local_dir=tmp_path, sender=sender, **kw).start()


def _pending_lines(tmp_path: Path) -> list[dict]:
    p = tmp_path / PENDING_FILE
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def test_buffer_and_retry_in_order(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeSender()
    t = _tracker(tmp_path, fake)
    t.log_metrics({"rollout/success": 0.1}, step=0)
    fake.down = True
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for step in (1, 2, 3):
            t.log_metrics({"rollout/success": 0.1 * step}, step=step)  # must not raise
    warnings = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(warnings) == 1 and PENDING_FILE in warnings[0].getMessage()
    assert t.pending_count == 3 and [r["metrics"][0][3] for r in _pending_lines(tmp_path)] == [1, 2, 3]
    fake.down = False
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        t.log_metrics({"rollout/success": 0.4}, step=4)  # flushes the buffer first, then sends step 4
    assert fake.steps() == [0, 1, 2, 3, 4]
    assert t.pending_count == 0 and not (tmp_path / PENDING_FILE).exists()
    assert any("reachable again" in r.getMessage() for r in caplog.records)


def test_explicit_flush_and_retry_interval(tmp_path: Path) -> None:
    fake = FakeSender()
    t = _tracker(tmp_path, fake, retry_interval_s=3600.0)
    fake.down = True
    t.log_metrics({"a/x": 1.0}, step=0)
    calls = fake.calls
    t.log_metrics({"a/x": 2.0}, step=1)  # within the retry interval: buffered without a new attempt
    assert fake.calls == calls and t.pending_count == 2
    assert t.flush() is False  # flush() always tries
    fake.down = False
    assert t.flush() is True and fake.steps() == [0, 1]


def test_pending_survives_a_crash_and_end_is_replayed(tmp_path: Path) -> None:
    fake = FakeSender()
    t = _tracker(tmp_path, fake)
    fake.down = True
    t.log_metrics({"a/x": 1.0}, step=0)
    t.log_text("hello", "notes/readme.txt")
    t.end("FAILED")
    assert [r["kind"] for r in _pending_lines(tmp_path)] == ["batch", "artifact", "end"]
    staged = Path(_pending_lines(tmp_path)[1]["local_path"])
    assert staged.read_text() == "hello"
    # A new process on the same run folder (the store is back) sends everything, in order.
    fake2 = FakeSender()
    _tracker(tmp_path, fake2)
    assert [r["kind"] for r in fake2.sent] == ["batch", "artifact", "end"]
    assert fake2.sent[1]["artifact_path"] == "notes" and fake2.sent[2]["status"] == "FAILED"
    assert not staged.exists() and not (tmp_path / PENDING_FILE).exists()


def test_permanent_rejection_is_not_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeSender()
    t = _tracker(tmp_path, fake)
    fake.reject = True
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        t.log_params({"lr": 1e-6})
    assert t.pending_count == 0 and "rejected" in caplog.text
    (line,) = (tmp_path / REJECTED_FILE).read_text().splitlines()
    assert json.loads(line)["record"]["params"] == [["lr", "1e-06"]]


def test_nonfinite_dropped_and_counted_keys_sanitized_and_batched(tmp_path: Path) -> None:
    fake = FakeSender()
    t = _tracker(tmp_path, fake)
    t.log_metrics({"rollout/pass@4": 1, "a/nan": float("nan"), "a/inf": float("inf"), "a/s": "x"}, step=5)
    (rec,) = fake.sent
    assert {k: v for k, v, _, _ in rec["metrics"]} == {"rollout/pass_4": 1.0, DROPPED_NONFINITE_KEY: 2.0}
    t.log_metrics({"a/nan": float("nan")}, step=6)
    assert fake.sent[-1]["metrics"][0][:2] == [DROPPED_NONFINITE_KEY, 3.0]  # cumulative
    assert t.last_step == 6 and t.dropped_nonfinite == 3
    fake.sent.clear()
    t.log_metrics({f"m/{i}": float(i) for i in range(1500)}, step=7)
    assert [len(r["metrics"]) for r in fake.sent] == [1000, 500]
    fake.sent.clear()
    t.log_params({f"p{i}": i for i in range(250)} | {"long": "y" * 9000})
    assert [len(r["params"]) for r in fake.sent] == [100, 100, 51]
    long_value = dict(p for r in fake.sent for p in r["params"])["long"]
    assert len(long_value) == MAX_PARAM_VALUE_LENGTH


def test_lifecycle_errors(tmp_path: Path) -> None:
    t = MLflowTracker(None, "exp", run_id="run0", local_dir=tmp_path, sender=FakeSender())
    with pytest.raises(RuntimeError, match="start"):
        t.log_metrics({"a": 1.0}, step=0)
    with pytest.raises(ValueError, match="status must be one of"):
        t.end("DONE")
    with pytest.raises(ValueError, match="needs run_id"):
        MLflowTracker(None, "exp", local_dir=tmp_path, sender=FakeSender())
    with t:
        with pytest.raises(FileNotFoundError):
            t.log_artifact(tmp_path / "missing.txt")
        with pytest.raises(ValueError, match="relative"):
            t.log_text("x", "../escape.txt")
    with pytest.raises(RuntimeError, match="ended"):
        t.log_metrics({"a": 1.0}, step=1)


def test_tracking_package_is_import_light() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import ragen_rllib.tracking, sys; print(sorted(sys.modules))"],
        capture_output=True, text=True, check=True).stdout
    for heavy in ("mlflow", "matplotlib", "ray", "torch", "transformers"):
        assert f"'{heavy}'" not in out, heavy
