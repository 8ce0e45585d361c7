"""The Echo-Trap alarms of one or more runs, with the monitor replayed over their logged metrics.

For each run folder, prints every iteration (1-based) at which an Echo-Trap signal switched on:
the logged ``echo/<signal>`` flags where the run logged that signal, and the current
``EchoTrapMonitor`` replayed over ``metrics.jsonl`` for a signal the run has no flag of (one added
after the run, such as ``format_drift``). Next to each alarm: the run's last validation success
at or before that iteration, so one can see whether the alarm came before a fall. With
``--replay`` the logged flags are ignored and every signal comes from the current monitor (for a
run logged under older thresholds).

With ``--falls`` each run's stored validations (``<run>/validation/<env>/iter_<it>.parquet``) are
compared state by state with its earliest one (``tracking.report.validation_fall``): the first
validation significantly below it (paired McNemar p < 0.05) and the lowest one are printed, and
each alarm is marked as coming before or after them. An alarm at iteration ``i`` comes from the
rollouts of the policy after ``i - 1`` updates, and the validation "at iteration v" tests the
policy after ``v`` updates, so an alarm is *before* a validation v when ``i - 1 < v``.

    .venv/bin/python scripts/echo_alarms.py [--replay] [--falls] runs/<run> [runs/<run> ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from ragen_rllib.tracking.report import ValidationFall, echo_alarms, read_history, validation_fall, validation_outcomes
from ragen_rllib.trajectory.store import validation_envs


def _validation(step: dict[str, float]) -> float | None:
    """The first ``val/<env>/success`` of a step's metrics, or None."""
    return next((v for k, v in sorted(step.items()) if k.startswith("val/") and k.endswith("/success")), None)


def _fall(run: str) -> ValidationFall | None:
    """The validation fall of a run's single validation env, or None when it stored none."""
    envs = validation_envs(run)
    if len(envs) != 1:
        return None
    outcomes = validation_outcomes(run, envs[0])
    return validation_fall(outcomes) if len(outcomes) >= 2 else None


def _when(step: int, fall: ValidationFall) -> str:
    """Whether an alarm at ``step`` (policy after ``step`` updates) came before the fall's validations."""
    if fall.first is None:
        return "no significant fall"
    return (("before" if step < fall.first else "after") + " the first fall, "
            + ("before" if step < fall.lowest else "after") + " the lowest")


def main(argv: list[str]) -> int:
    replay, falls = "--replay" in argv, "--falls" in argv
    runs = [a for a in argv if a not in ("--replay", "--falls")]
    if not runs:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for run in runs:
        if not (Path(run) / "metrics.jsonl").is_file():
            print(f"error: no metrics.jsonl in {run}", file=sys.stderr)
            return 2
        steps = read_history(run).steps
        print(f"== {run}: {len(steps)} logged steps")
        fall = None
        if falls:
            try:
                fall = _fall(run)
            except (OSError, ValueError) as e:  # a corrupt or foreign validation file: name it, no traceback
                print(f"error: cannot read the validations of {run}: {e}", file=sys.stderr)
                return 2
            if fall is None:
                print("   no stored validations to compare (one env, two or more validations needed)")
            else:
                first = ("no significant fall" if fall.first is None else
                         f"first significant fall at iteration {fall.first} ({fall.first_success:.3f}, "
                         f"p = {fall.first_p:.2g})")
                print(f"   validation {fall.base_success:.3f} at iteration {fall.base}; {first}; lowest "
                      f"{fall.lowest_success:.3f} at iteration {fall.lowest}")
        alarms = echo_alarms(steps, replay)
        if not alarms:
            print("   no alarm")
        for step, name, message in alarms:
            seen = [(i, v) for i, m in enumerate(steps[: step + 1]) if (v := _validation(m)) is not None]
            val = f"validation {seen[-1][1]:.3f} at iteration {seen[-1][0]}" if seen else "no validation yet"
            first = _validation(steps[0])
            when = "" if fall is None else f"; {_when(step, fall)}"
            base = float("nan") if first is None else first
            print(f"   iteration {step + 1}: {name} ({val}; first {base:.3f}{when})")
            print(f"      {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
