"""StarPO on a real local Ray + RLlib stack with a tiny random model and the HF engine."""

from __future__ import annotations

import pytest

from ragen_rllib.trajectory.schema import Col


@pytest.mark.parametrize("preset,adv,critic,extra", [
    ("starpo_s", "gae", "value_head", {}), ("starpo_s", "gae", "separate", {}), ("starpo", "grpo", "value_head", {}),
    ("starpo_s", "gae", "value_head", {"bi_level_gae": True, "use_turn_scores": True}),
    ("starpo_s", "gae", "value_head", {"reuse_update_forward": False})])  # advantages before the update
def test_training_steps_run_and_write_arrow(tiny_model_dir, ray_local, tmp_path, preset, adv, critic, extra) -> None:
    from ragen_rllib.algorithms.starpo.config import StarPOConfig
    from ragen_rllib.algorithms.starpo.params import PRESETS
    from ragen_rllib.trajectory import TrajectoryStore
    from ragen_rllib.trajectory.store import validation_store

    params = PRESETS[preset](model=str(tiny_model_dir), engine="hf", env="sokoban", env_groups=4, group_size=2,
                             max_turns=2, response_length=8, adv_estimator=adv, critic_type=critic,
                             test_freq=2, val_groups=2, ppo_mini_batch_size=8, actor_lr=1e-4, **extra)
    algo = (StarPOConfig().training(starpo=params).storage(run_dir=str(tmp_path), run_name="t")
            .debugging(seed=0).build_algo())
    try:
        results = [algo.train() for _ in range(2)]
    finally:
        algo.stop()
    r = results[-1]
    assert r["policy_version"] == 2.0
    for key in ("rollout/success", "filter/std_all_mean", "time/sample", "time/update", "time/sync",
                "val/sokoban/success"):
        assert key in results[0] or key in r, key
    table = TrajectoryStore(tmp_path, "t").read()
    assert table.num_rows == 2 * 4 * 2
    val = validation_store(tmp_path / "t", "sokoban")  # the validation before RL, kept for paired comparisons
    assert val.iterations() == [0]
    assert val.read_iteration(0)[Col.INITIAL_SEED].to_pylist() == [params.val_seed, params.val_seed + 1]
    assert set(table[Col.POLICY_VERSION].to_pylist()) == {0, 1}
    kept = table.filter(table[Col.ITERATION].to_numpy() == 0)[Col.KEPT].to_pylist()
    assert None not in kept
    expected_groups = 1 if preset == "starpo_s" else 4  # floor(0.25 * 4) = 1 group kept vs keep-all
    assert sum(kept) == expected_groups * 2
    for row in table.to_pylist():  # the advantages the update used, stored on the rows it trained on
        token_adv = row[Col.TOKEN_ADVANTAGES]
        assert (token_adv is None) == (not row[Col.KEPT]), (row[Col.KEPT], token_adv)
        if token_adv is not None:
            assert len(token_adv) == len(row[Col.TOKEN_IDS])
            assert all(a == 0 for a, m in zip(token_adv, row[Col.LOSS_MASK], strict=True) if not m)
            if adv == "gae":  # whitened over the batch's sampled tokens: not all zero
                assert any(a != 0 for a in token_adv)
    if adv == "gae":  # the critic trains: value loss and explained variance are logged
        assert any(k.startswith("critic/vf_loss") for k in r), sorted(r)[:40]
