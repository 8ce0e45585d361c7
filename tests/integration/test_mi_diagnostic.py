"""RAGEN-2's MI collapse diagnostic end to end: tiny random model, real RLlib learner, HF engine.

The learner's cross-scores are checked against a plain transformers forward of every
[prompt | reply] pair, and the chance level against the batch's own prompts.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from ragen_rllib.trajectory.schema import Col


def _reference_metrics(model_dir, table) -> dict[str, float]:
    """The same metrics from an independent forward per pair (no prefix sharing, no padding)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragen_rllib.algorithms.starpo.cross_scoring import reply_text
    from ragen_rllib.core.collapse import collapse_metrics

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    lm = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=torch.float32).eval()
    rows = table.to_pylist()
    groups = sorted({r[Col.GROUP_ID] for r in rows})
    prompt = {}
    for r in rows:
        prompt.setdefault(r[Col.GROUP_ID], r[Col.TOKEN_IDS][: r[Col.LOSS_MASK].index(1)])
    replies = [tok.encode(reply_text(r[Col.TURN_RESPONSES][0], False), add_special_tokens=False) for r in rows]
    ll = torch.zeros(len(rows), len(groups), dtype=torch.float64)
    with torch.no_grad():
        for i, z in enumerate(replies):
            for j, g in enumerate(groups):
                ids = torch.tensor([prompt[g] + z])
                logp = torch.log_softmax(lm(input_ids=ids).logits[0, :-1].double(), -1)
                ll[i, j] = logp[len(prompt[g]) - 1:, :].gather(1, ids[0, len(prompt[g]):, None]).sum() / len(z)
    column = torch.tensor([groups.index(r[Col.GROUP_ID]) for r in rows])
    return collapse_metrics(ll, column, [tuple(prompt[g]) for g in groups])


def test_mi_metrics_from_the_learner_match_a_plain_forward(tiny_model_dir, ray_local, tmp_path) -> None:
    from ragen_rllib.algorithms.starpo.config import StarPOConfig
    from ragen_rllib.algorithms.starpo.params import starpo_s
    from ragen_rllib.core import collapse as C
    from ragen_rllib.trajectory import rows_to_table

    params = starpo_s(model=str(tiny_model_dir), engine="hf", env="bandit", env_groups=4, group_size=4,
                      response_length=8, enable_think=False, test_freq=0, ppo_mini_batch_size=16, mi_every=1,
                      mi_num_samples=64)
    algo = (StarPOConfig().training(starpo=params).storage(run_dir=str(tmp_path), run_name="mi")
            .debugging(seed=0).build_algo())
    try:
        # A constructed batch: well-formed random-valid answers ("Dragon" / "Phoenix"), so every
        # first reply has a Z; 64 samples >= 16 rows, so every row is scored under all 4 groups.
        groups = [(g, 20 + g) for g in range(4)]
        rows, _ = algo._sample(groups, 4, "bandit", 1.0, iteration=0, sampling_seed=0, demo="random-valid")
        table = rows_to_table(rows)
        t0 = time.perf_counter()
        m = algo._mutual_information(table, iteration=0)
        seconds = time.perf_counter() - t0
        result = algo.train()  # the hook: metrics and the timer reach the result dict
    finally:
        algo.stop()
    print(f"MI diagnostic on the tiny model: {seconds:.3f} s for 16 replies x 4 columns")
    assert m["echo/mi_valid_frac"] == 1.0
    assert (m["echo/mi_num_samples"], m["echo/mi_num_prompts"]) == (16.0, 4.0)
    assert 0.0 <= m[C.MI_RETRIEVAL_ACCURACY] <= 1.0
    prompts = {}
    for r in table.to_pylist():  # the Bandit shows its two arm names in a seed-drawn order: <= 2 prompts
        prompts.setdefault(r[Col.GROUP_ID], tuple(r[Col.TOKEN_IDS][: r[Col.LOSS_MASK].index(1)]))
    shared = [sum(p == prompts[g] for p in prompts.values()) for g in table[Col.GROUP_ID].to_pylist()]
    assert m[C.MI_RETRIEVAL_CHANCE] == pytest.approx(np.mean(shared) / 4)
    assert m[C.MI_UPPER_BOUND] == pytest.approx(np.log(4))
    assert m[C.MI_ZSCORE_EMA] == pytest.approx(m[C.MI_ZSCORE])  # the first computation sets the EMA
    ref = _reference_metrics(tiny_model_dir, table)
    for key, value in ref.items():
        assert m[key] == pytest.approx(value, abs=1e-4), key
    assert "time/mi" in result and "echo/mi_valid_frac" in result, sorted(k for k in result if "/" in k)
