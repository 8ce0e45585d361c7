"""The Echo-Trap alarms of one or more runs, with the monitor replayed over their logged metrics.

For each run folder, prints every iteration (1-based) at which an Echo-Trap signal switched on:
the logged ``echo/<signal>`` flags where the run logged that signal, and the current
``EchoTrapMonitor`` replayed over ``metrics.jsonl`` for a signal the run has no flag of (one added
after the run, such as ``format_drift``). Next to each alarm: the run's last validation success
at or before that iteration, so one can see whether the alarm came before a fall. With
``--replay`` the logged flags are ignored and every signal comes from the current monitor (for a
run logged under older thresholds).

    .venv/bin/python scripts/echo_alarms.py [--replay] runs/<run> [runs/<run> ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from ragen_rllib.tracking.report import echo_alarms, read_history


def _validation(step: dict[str, float]) -> float | None:
    """The first ``val/<env>/success`` of a step's metrics, or None."""
    return next((v for k, v in sorted(step.items()) if k.startswith("val/") and k.endswith("/success")), None)


def main(argv: list[str]) -> int:
    replay = "--replay" in argv
    runs = [a for a in argv if a != "--replay"]
    if not runs:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for run in runs:
        if not (Path(run) / "metrics.jsonl").is_file():
            print(f"error: no metrics.jsonl in {run}", file=sys.stderr)
            return 2
        steps = read_history(run).steps
        print(f"== {run}: {len(steps)} logged steps")
        alarms = echo_alarms(steps, replay)
        if not alarms:
            print("   no alarm")
        for step, name, message in alarms:
            seen = [(i, v) for i, m in enumerate(steps[: step + 1]) if (v := _validation(m)) is not None]
            val = f"validation {seen[-1][1]:.3f} at iteration {seen[-1][0]}" if seen else "no validation yet"
            first = _validation(steps[0])
            print(f"   iteration {step + 1}: {name} ({val}; first {float('nan') if first is None else first:.3f})")
            print(f"      {message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
