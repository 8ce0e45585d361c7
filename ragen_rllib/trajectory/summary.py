"""Rollout summaries and human-readable episode rendering, from trajectory tables (pyarrow/numpy)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ragen_rllib.trajectory.schema import Col


def summarize(table: pa.Table) -> dict[str, float]:
    """Return the rollout metrics of a trajectory table.

    Keys (all floats): ``trajectories``, ``groups``, ``success`` (fraction of episodes),
    ``return_mean`` (raw env return), ``score_mean`` (return + penalties), ``well_formed_rate``
    (fraction of turns whose reply matched the format), ``valid_action_rate`` (valid / (valid +
    invalid) actions), ``effective_action_rate``, ``turns_mean``, ``sampled_tokens_mean`` (per
    trajectory), ``tokens_per_turn``, ``context_truncated`` (fraction), ``pass_at_group``
    (fraction of groups with at least one success).
    """
    n = table.num_rows
    if n == 0:
        return {"trajectories": 0.0}
    c = {name: table.column(name).to_numpy(zero_copy_only=False) for name in (
        Col.SUCCESS, Col.EPISODE_RETURN, Col.SCORE, Col.NUM_TURNS, Col.NUM_VALID_ACTIONS, Col.NUM_INVALID_ACTIONS,
        Col.NUM_EFFECTIVE_ACTIONS, Col.NUM_SAMPLED_TOKENS, Col.CONTEXT_TRUNCATED, Col.GROUP_ID)}
    wf = table.column(Col.TURN_WELL_FORMED).combine_chunks().flatten().to_numpy(zero_copy_only=False)
    valid, invalid = c[Col.NUM_VALID_ACTIONS].sum(), c[Col.NUM_INVALID_ACTIONS].sum()
    turns = c[Col.NUM_TURNS].sum()
    groups: dict[int, bool] = {}
    for g, s in zip(c[Col.GROUP_ID], c[Col.SUCCESS], strict=False):
        groups[int(g)] = groups.get(int(g), False) or bool(s)
    return {
        "trajectories": float(n),
        "groups": float(len(groups)),
        "success": float(np.mean(c[Col.SUCCESS])),
        "return_mean": float(np.mean(c[Col.EPISODE_RETURN])),
        "score_mean": float(np.mean(c[Col.SCORE])),
        "well_formed_rate": float(np.mean(wf)) if wf.size else 0.0,
        "valid_action_rate": float(valid / (valid + invalid)) if valid + invalid else 0.0,
        "effective_action_rate": float(c[Col.NUM_EFFECTIVE_ACTIONS].sum() / valid) if valid else 0.0,
        "turns_mean": float(np.mean(c[Col.NUM_TURNS])),
        "sampled_tokens_mean": float(np.mean(c[Col.NUM_SAMPLED_TOKENS])),
        "tokens_per_turn": float(c[Col.NUM_SAMPLED_TOKENS].sum() / turns) if turns else 0.0,
        "context_truncated": float(np.mean(c[Col.CONTEXT_TRUNCATED])),
        "pass_at_group": float(np.mean(list(groups.values()))),
    }


def summary_table(rows: list[tuple[str, dict[str, float]]]) -> str:
    """Format ``[(label, summarize(...)), ...]`` as a fixed-width text table."""
    cols = [("trajectories", "traj", "{:.0f}"), ("success", "success", "{:.3f}"), ("return_mean", "return", "{:+.3f}"),
            ("well_formed_rate", "well-formed", "{:.3f}"), ("valid_action_rate", "valid-act", "{:.3f}"),
            ("turns_mean", "turns", "{:.2f}"), ("tokens_per_turn", "tok/turn", "{:.1f}"),
            ("pass_at_group", "pass@N", "{:.3f}"), ("tokens_per_s", "tok/s", "{:.1f}")]
    w0 = max([len(r[0]) for r in rows] + [5])
    lines = [f"{'':<{w0}} " + " ".join(f"{h:>11}" for _, h, _ in cols)]
    for label, s in rows:
        cells = [(fmt.format(s[k]) if k in s else "-") for k, _, fmt in cols]
        lines.append(f"{label:<{w0}} " + " ".join(f"{x:>11}" for x in cells))
    return "\n".join(lines)


def render_episode(row: dict[str, Any]) -> str:
    """Render one trajectory row (``table.to_pylist()`` item) as readable text: states, replies, rewards."""
    head = (f"run {row[Col.RUN_ID]} iter {row[Col.ITERATION]} | {row[Col.ENV_NAME]}:{row[Col.ENV_VARIANT]} | "
            f"group {row[Col.GROUP_ID]} sample {row[Col.SAMPLE_IDX]} | "
            f"seeds {row[Col.INITIAL_SEED]}/{row[Col.DYNAMICS_SEED]} "
            f"| policy v{row[Col.POLICY_VERSION]}")
    out = [head, "=" * min(len(head), 100)]
    for k in range(row[Col.NUM_TURNS]):
        out.append(f"--- turn {k + 1} state ---")
        out.append(row[Col.TURN_STATES][k])
        out.append(f"--- reply ({'well-formed' if row[Col.TURN_WELL_FORMED][k] else 'MALFORMED'}, "
                   f"{row[Col.TURN_FINISH][k]}) ---")
        out.append(row[Col.TURN_RESPONSES][k])
        pen = row[Col.TURN_PENALTIES][k]
        out.append(f"reward {row[Col.TURN_ENV_REWARDS][k]:+g}" + (f" penalty {pen:+g}" if pen else ""))
    out.append("--- final state ---")
    out.append(row[Col.FINAL_STATE])
    flags = [x for x, on in (("success", row[Col.SUCCESS]), ("terminated", row[Col.TERMINATED]),
                             ("truncated", row[Col.TRUNCATED]),
                             ("context-truncated", row[Col.CONTEXT_TRUNCATED])) if on]
    out.append(f"return {row[Col.EPISODE_RETURN]:+g}, score {row[Col.SCORE]:+g}, {row[Col.NUM_SAMPLED_TOKENS]} sampled "
               f"tokens, actions valid {row[Col.NUM_VALID_ACTIONS]} / invalid {row[Col.NUM_INVALID_ACTIONS]} / dropped "
               f"{row[Col.NUM_DROPPED_ACTIONS]} [{', '.join(flags) or 'unfinished'}]")
    return "\n".join(out)
