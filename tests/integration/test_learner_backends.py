"""The StarPO learner's update path on a real local Ray + RLlib stack (tiny model, HF engine):
micro-batch gradient accumulation equals the one-pass gradient, the LR schedule reaches the
optimizers, DeepSpeed ZeRO runs with 2 learners (gloo) and its optimizer partitions survive a
checkpoint, and a run resumed from a checkpoint repeats the uninterrupted run's next iteration."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.integration

# Compared between an uninterrupted and a resumed run (everything but wall-clock timings).
COMPARED = ("rollout/success", "rollout/return_mean", "filter/std_all_mean", "filter/std_kept_mean",
            "actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss", "actor/pg_clipfrac")


def _params(model: Path, **kw):
    from ragen_rllib.algorithms.starpo.params import starpo_s

    base = dict(model=str(model), engine="hf", env="bandit", env_groups=4, group_size=2, response_length=6,
                enable_think=False, critic_type="value_head", test_freq=0, actor_lr=1e-4)
    return starpo_s(**{**base, **kw})


def _build(params, tmp_path: Path, name: str, num_learners: int = 0):
    from ragen_rllib.algorithms.starpo.config import StarPOConfig

    return (StarPOConfig().training(starpo=params).learners(num_learners=num_learners)
            .storage(run_dir=str(tmp_path), run_name=name).debugging(seed=0).build_algo())


def _all(results) -> list:
    return [r.get() if hasattr(r, "get") else r for r in results]


def test_micro_batches_give_the_one_pass_gradient(tiny_model_dir, ray_local, tmp_path) -> None:
    """Same mini-batch, budget 0 (one pass, RLlib's forward) vs a small budget (4 micro-batches)."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from ragen_rllib.algorithms.starpo.learner import DEFER_FORWARD

    algo = _build(_params(tiny_model_dir), tmp_path, "mb")
    try:
        learner = algo.learner_group._learner  # the local learner (num_learners=0)
        module = learner.module[DEFAULT_MODULE_ID]
        g = torch.Generator().manual_seed(0)
        B, T = 6, 20
        lengths = [20, 7, 12, 15, 9, 20]
        ids = torch.randint(0, 100, (B, T), generator=g)
        attn = torch.zeros(B, T, dtype=torch.long)
        mask = torch.zeros(B, T)
        for b, n in enumerate(lengths):
            attn[b, :n] = 1
            mask[b, n // 2: n] = 1.0
        batch = {"token_ids": ids, "attention_mask": attn, "loss_mask": mask,
                 "advantages": torch.randn(B, T, generator=g) * mask, "returns": torch.randn(B, T, generator=g),
                 "old_values": torch.zeros(B, T), "sample_logprobs": torch.zeros(B, T)}
        with torch.no_grad():
            sc = module.score(ids, attn, mask, with_values=False, with_entropy=False)
        batch["old_logp"] = sc["logp"] + 0.05 * torch.randn(B, T, generator=g) * mask  # some clipping happens

        def grads(budget: int, defer: bool) -> dict[str, torch.Tensor]:
            cfg = learner.config
            cfg._is_frozen = False
            cfg.starpo = dataclasses.replace(cfg.starpo, ppo_max_token_len_per_gpu=budget)
            cfg._is_frozen = True
            b = dict(batch, **({DEFER_FORWARD: torch.ones(B)} if defer else {}))
            fwd = module.forward_train(b)
            loss = learner.compute_loss_for_module(module_id=DEFAULT_MODULE_ID, config=cfg, batch=b, fwd_out=fwd)
            learner.compute_gradients({DEFAULT_MODULE_ID: loss})
            return {n: q.grad.detach().clone() for n, q in module.named_parameters() if q.grad is not None}

        one_pass = grads(0, defer=False)
        deferred = grads(0, defer=True)
        micro = grads(40, defer=True)  # 40 padded tokens: [20,20] [15,12] [9,7] -> 3+ micro-batches
        assert learner.metrics.peek((DEFAULT_MODULE_ID, "actor/micro_batches")) >= 3
        assert set(one_pass) == set(micro) and len(one_pass) > 10
        for name in one_pass:
            assert torch.allclose(deferred[name], one_pass[name], atol=1e-6, rtol=1e-4), name
            assert torch.allclose(micro[name], one_pass[name], atol=1e-6, rtol=1e-4), name
    finally:
        algo.stop()


def test_warm_up_micro_batches_give_the_one_pass_gradient(tiny_model_dir, ray_local, tmp_path) -> None:
    """The SFT warm-up with no token budget runs micro-batches of ``ppo_mini_batch_size`` rows (in
    order, so a group keeps its shared prompt) to bound its activation memory; its token-mean
    cross-entropy gradient equals one pass over the whole batch."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from ragen_rllib.algorithms.starpo.update_batch import MODE, Mode

    algo = _build(_params(tiny_model_dir), tmp_path, "sft-mb")
    try:
        learner = algo.learner_group._learner
        module = learner.module[DEFAULT_MODULE_ID]
        g = torch.Generator().manual_seed(1)
        B, T = 6, 16
        prompt = torch.randint(0, 100, (6,), generator=g)
        ids = torch.randint(0, 100, (B, T), generator=g)
        ids[:, :6] = prompt  # one shared prompt, as a warm-up group's demonstrations have
        lengths = [16, 9, 12, 16, 10, 14]
        attn = torch.zeros(B, T, dtype=torch.long)
        mask = torch.zeros(B, T)
        for b, n in enumerate(lengths):
            attn[b, :n] = 1
            mask[b, 6:n] = 1.0
        batch = {"token_ids": ids, "attention_mask": attn, "loss_mask": mask,
                 MODE: torch.full((B,), int(Mode.SFT), dtype=torch.long)}

        def grads(rows_per_micro_batch: int) -> dict[str, torch.Tensor]:
            cfg = learner.config
            cfg._is_frozen = False
            cfg.starpo = dataclasses.replace(cfg.starpo, ppo_max_token_len_per_gpu=0,
                                             ppo_mini_batch_size=rows_per_micro_batch)
            cfg._is_frozen = True
            loss = learner.compute_loss_for_module(module_id=DEFAULT_MODULE_ID, config=cfg, batch=batch,
                                                   fwd_out=module.forward_train(batch))
            learner.compute_gradients({DEFAULT_MODULE_ID: loss})
            return {n: q.grad.detach().clone() for n, q in module.named_parameters() if q.grad is not None}

        one_pass = grads(B)
        assert learner.metrics.peek((DEFAULT_MODULE_ID, "actor/micro_batches")) == 1
        micro = grads(2)
        assert learner.metrics.peek((DEFAULT_MODULE_ID, "actor/micro_batches")) == 3
        assert set(one_pass) == set(micro) and len(one_pass) > 10
        for name in one_pass:
            assert torch.allclose(micro[name], one_pass[name], atol=1e-6, rtol=1e-4), name
    finally:
        algo.stop()


def test_update_trains_each_row_once_per_epoch(tiny_model_dir, ray_local, tmp_path) -> None:
    """Bug B on the real stack: 6 rows, mini-batches of 4, 2 epochs -> 4 optimizer steps over rows
    [0..3], [4, 5], [0..3], [4, 5] (RLlib's cyclic iterator trained [0..3], [4, 5, 0, 1])."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from ragen_rllib.algorithms.starpo.learner import DEFER_FORWARD, StarPOLearner

    algo = _build(_params(tiny_model_dir, ppo_mini_batch_size=4, ppo_epochs=2), tmp_path, "rows")
    seen: list[list[int]] = []
    orig = StarPOLearner.compute_loss_for_module

    def spy(self, *, module_id, config, batch, fwd_out):
        seen.append(batch["token_ids"][:, 0].tolist())  # row r starts with token r + 3
        return orig(self, module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)

    B, T = 6, 10
    ids = torch.arange(B)[:, None].repeat(1, T) + 3
    mask = torch.zeros(B, T)
    mask[:, 5:] = 1.0
    batch = {"token_ids": ids.numpy(), "attention_mask": np.ones((B, T), dtype=np.int64), "loss_mask": mask.numpy(),
             "advantages": mask.numpy(), "returns": mask.numpy(), "old_values": np.zeros((B, T), np.float32),
             "old_logp": np.zeros((B, T), np.float32), "sample_logprobs": np.zeros((B, T), np.float32),
             DEFER_FORWARD: np.ones(B, np.float32)}
    try:
        StarPOLearner.compute_loss_for_module = spy
        out = algo._update(MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, env_steps=B))
    finally:
        StarPOLearner.compute_loss_for_module = orig
        algo.stop()
    assert [[r - 3 for r in rows] for rows in seen] == [[0, 1, 2, 3], [4, 5], [0, 1, 2, 3], [4, 5]]
    assert out["actor/optimizer_steps"] == 4.0


def test_lr_schedule_reaches_the_optimizers(tiny_model_dir, ray_local, tmp_path) -> None:
    """The LR schedule sets each optimizer's LR; and an update frees its gradients after the
    optimizer step (they would otherwise stay resident, the policy's size, until the next update)."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from ragen_rllib.core.starpo import lr_multiplier

    p = _params(tiny_model_dir, lr_warmup_steps=2, warmup_style="cosine", total_training_steps=4, min_lr_ratio=0.1,
                ppo_max_token_len_per_gpu=32)
    algo = _build(p, tmp_path, "lr")
    try:
        lrs = [algo.train()["actor/lr"] for _ in range(3)]
        learner = algo.learner_group._learner
        opt = learner.get_optimizer(optimizer_name="actor")
        params = list(learner.module[DEFAULT_MODULE_ID].parameters())
        assert opt.state and params and all(q.grad is None for q in params)  # stepped, then freed
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-4 * lr_multiplier(2, 4, 2, "cosine", 0.1))
    finally:
        algo.stop()
    assert lrs == pytest.approx([1e-4 * lr_multiplier(i, 4, 2, "cosine", 0.1) for i in range(3)])
    assert lrs[0] == pytest.approx(0.5e-4)  # first warm-up step: half the base LR


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_two_learners(tiny_model_dir, ray_local, tmp_path, stage) -> None:
    """ZeRO-2/3 over gloo with 2 learner actors: both ranks hold the same full weights, the env
    runner's engine holds them too; a restored checkpoint (every rank's optimizer partition; under
    ZeRO-3 the module state gathered on all ranks) repeats the next iteration."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is the optional `deepspeed` extra")
    from ragen_rllib.algorithms.starpo.algorithm import StarPO

    p = _params(tiny_model_dir, learner_backend="deepspeed", zero_stage=stage, ppo_max_token_len_per_gpu=40)
    algo = _build(p, tmp_path, f"ds{stage}", num_learners=2)
    ckpt = tmp_path / f"ckpt{stage}"
    try:
        r0 = algo.train()
        assert r0["policy_version"] == 1.0 and math.isfinite(r0["actor/grad_norm"])
        weights = _all(algo.learner_group.foreach_learner(lambda lrn: lrn.policy_weights()))
        assert len(weights) == 2
        for k in weights[0]:
            np.testing.assert_array_equal(weights[0][k], weights[1][k])
        engine_sd = algo.env_runner.engine.model.state_dict()
        for k in ("model.layers.0.self_attn.q_proj.weight", "model.norm.weight"):
            np.testing.assert_array_equal(engine_sd[k].numpy(), weights[0][k])
        algo.save_to_path(str(ckpt))
        r1 = algo.train()
    finally:
        algo.stop()
    algo2 = _build(p, tmp_path, f"ds{stage}b", num_learners=2)
    try:
        algo2.restore_from_path(str(ckpt))
        assert algo2.iteration == 1 and algo2.policy_version == 1
        r1b = algo2.train()
    finally:
        algo2.stop()
    for key in ("rollout/return_mean", "actor/pg_loss", "critic/vf_loss", "actor/grad_norm"):
        assert r1b[key] == pytest.approx(r1[key], rel=1e-5, abs=1e-7), key
    assert StarPO is not None


def test_deepspeed_local_learner_and_user_json(tiny_model_dir, ray_local, tmp_path) -> None:
    """num_learners=0: DeepSpeed in the driver (a 1-rank group); a user JSON is merged in."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is the optional `deepspeed` extra")
    user = tmp_path / "ds.json"
    user.write_text('{"zero_optimization": {"reduce_bucket_size": 1000000}, "gradient_clipping": 0.5}')
    algo = _build(_params(tiny_model_dir, learner_backend="deepspeed", zero_stage=1, deepspeed_config=str(user)),
                  tmp_path, "ds0")
    try:
        r = algo.train()
        engine = algo.learner_group._learner._backend.engines["actor"][0]
        assert engine.gradient_clipping() == 0.5 and engine.zero_optimization_stage() == 1
        assert r["policy_version"] == 1.0
    finally:
        algo.stop()


def test_deepspeed_clips_actor_and_critic_apart(tiny_model_dir, ray_local, tmp_path) -> None:
    """Bug A: with a separate critic, DeepSpeed reports (and clips by) each optimizer's own norm,
    the torch backend's numbers; it used to clip and report the joint actor+critic norm."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is the optional `deepspeed` extra")
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from ragen_rllib.algorithms.starpo.learner import DEFER_FORWARD

    B, T = 4, 12
    g = torch.Generator().manual_seed(0)
    mask = torch.zeros(B, T)
    mask[:, 6:] = 1.0
    batch = {"token_ids": torch.randint(3, 100, (B, T), generator=g).numpy(),
             "attention_mask": np.ones((B, T), dtype=np.int64), "loss_mask": mask.numpy(),
             "advantages": (torch.randn(B, T, generator=g) * mask).numpy(),
             "returns": (50.0 * mask).numpy(),  # far from the ~0 initial values: a large critic gradient
             "old_values": np.zeros((B, T), np.float32), "sample_logprobs": np.zeros((B, T), np.float32),
             DEFER_FORWARD: np.ones(B, np.float32)}
    norms = {}
    for backend in ("torch", "deepspeed"):
        extra = {"learner_backend": "deepspeed", "zero_stage": 2} if backend == "deepspeed" else {}
        algo = _build(_params(tiny_model_dir, critic_type="separate", ppo_mini_batch_size=B, **extra), tmp_path,
                      f"clip-{backend}")
        try:
            module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]
            with torch.no_grad():
                old = module.score(torch.as_tensor(batch["token_ids"]), torch.as_tensor(batch["attention_mask"]),
                                   mask, with_values=False, with_entropy=False)["logp"]
            b = dict(batch, old_logp=old.numpy())
            out = algo._update(MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(b)}, env_steps=B))
            norms[backend] = (out["actor/grad_norm"], out["critic/grad_norm"])
            if backend == "deepspeed":
                assert set(algo.learner_group._learner._backend.engines) == {"actor", "critic"}
        finally:
            algo.stop()
    (a_t, c_t), (a_d, c_d) = norms["torch"], norms["deepspeed"]
    assert c_t > 10 * a_t  # the critic's gradient dominates: a joint norm would be ~c_t
    assert a_d == pytest.approx(a_t, rel=1e-3) and c_d == pytest.approx(c_t, rel=1e-3)


@pytest.mark.parametrize("kl_mode", ["loss", "reward"])
def test_kl_changes_the_update(tiny_model_dir, ray_local, tmp_path, kl_mode) -> None:
    """KL against a reference that differs from the policy changes the weights an update writes
    (same rollouts, same seed), in both places the KL can go: the loss and the reward."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    def one_update(mode: str) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        kl = {"kl_mode": mode, "kl_coef": 0.5} if mode != "off" else {}
        algo = _build(_params(tiny_model_dir, **kl), tmp_path, f"kl-{mode}")
        try:
            learner = algo.learner_group._learner
            if learner._ref_lm is not None:  # the reference starts equal to the policy: move it away
                g = torch.Generator().manual_seed(7)
                with torch.no_grad():
                    for q in learner._ref_lm.parameters():
                        q.add_(0.05 * torch.randn(q.shape, generator=g))
            result = algo.train()
            return learner.policy_weights(), result
        finally:
            algo.stop()

    base, r0 = one_update("off")
    with_kl, r1 = one_update(kl_mode)
    assert r1["rollout/return_mean"] == r0["rollout/return_mean"]  # the same rollouts
    key = "actor/kl_loss" if kl_mode == "loss" else "actor/reward_kl_penalty"
    assert abs(r1[key]) > 0 and key not in r0
    changed = [k for k in base if not np.array_equal(base[k], with_kl[k])]
    assert len(changed) > len(base) // 2, f"only {len(changed)} of {len(base)} tensors changed"
    assert DEFAULT_MODULE_ID


def test_resume_repeats_the_next_iteration(tiny_model_dir, ray_local, tmp_path) -> None:
    """Uninterrupted 3 iterations vs 2 iterations + `--resume` to 3: iteration 3 is identical; the
    resumed run continues the same MLflow run with each step once and the same Arrow folder."""
    from ragen_rllib.algorithms.starpo.train import load_resume_config, train
    from ragen_rllib.tracking.mlflow_logger import find_runs, get_metric_history
    from ragen_rllib.trajectory import TrajectoryStore

    def cfg(name: str, iterations: int) -> dict:
        return {"preset": "starpo_s", "iterations": iterations, "run_dir": str(tmp_path / "runs"), "run_name": name,
                "warmup": {"steps": 2, "groups": 2, "group_size": 2},
                "starpo": {"model": str(tiny_model_dir), "engine": "hf", "env": "bandit", "env_groups": 4,
                           "group_size": 2, "response_length": 6, "enable_think": False, "critic_type": "value_head",
                           "test_freq": 0, "actor_lr": 1.0e-4, "total_training_steps": 3},
                "tracking": {"experiment": "resume", "log_model": False}}

    quiet = lambda m: None  # noqa: E731
    full = train(cfg("full", 3), log=quiet)["history"]
    train(cfg("cut", 2), log=quiet)
    lines: list[str] = []
    resumed = train(load_resume_config(tmp_path / "runs" / "cut", ["iterations=3"]), log=lines.append,
                    resume=True)["history"]
    assert any(ln.startswith("[resume] cut: restored iteration 2") for ln in lines)
    assert len(resumed) == 3
    for key in COMPARED:
        if key in full[2]:
            assert resumed[2][key] == pytest.approx(full[2][key], rel=1e-5, abs=1e-7), key
    assert sum(k in full[2] for k in COMPARED) >= 6
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    runs = {r["run_name"]: r for r in find_runs(uri, "resume")}
    assert set(runs) == {"full", "cut"} and runs["cut"]["status"] == "FINISHED"
    hist = get_metric_history(uri, runs["cut"]["run_id"], ["rollout/return_mean"])["rollout/return_mean"]
    assert [s for s, _ in hist] == [0, 1, 2]
    assert TrajectoryStore(tmp_path / "runs", "cut").iterations() == [0, 1, 2]
