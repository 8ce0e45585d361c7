"""Prefix-shared forward == unshared forward (log-probs, entropies, values, gradients; fp32, 1e-5),
on multi-turn rows: shared first prompt, reply, observation, reply; a tiny random Llama. The
equality test also runs on a CUDA GPU where there is one (other attention kernels, the same bound)."""

from __future__ import annotations

import pytest
import torch

from ragen_rllib.trajectory.schema import Col

#: The CPU always; a CUDA GPU where there is one (``gpu``-marked: ``pytest -m gpu`` runs only those).
DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]

pytestmark = pytest.mark.integration


def _module(model_dir, critic_type: str | None, **extra):
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from ragen_rllib.rl_module.hf_causal_lm_module import HFCausalLMModule

    torch.manual_seed(0)
    text = gym.spaces.Text(max_length=1 << 16)
    return RLModuleSpec(module_class=HFCausalLMModule, observation_space=text, action_space=text, model_config={
        "model_path": str(model_dir), "critic_type": critic_type, "seed": 0, **extra}).build()


def _multi_turn_batch(vocab: int, rooted: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """6 rows: group A (3 rows, prompt of 14 tokens; two rows with the same first reply), group B
    (2 rows, prompt of 9; ``rooted``: 13, its first 8 tokens those of A's), one row alone. Row =
    prompt, reply 1 (sampled), observation (not sampled), reply 2 (sampled); right-padded."""
    g = torch.Generator().manual_seed(1)

    def toks(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    prompt_a, prompt_b, same_reply = toks(14), toks(9), toks(4)
    if rooted:
        prompt_b = prompt_a[:8] + toks(5)
    spec = [(prompt_a, same_reply, 5, 3), (prompt_a, same_reply, 5, 6), (prompt_a, toks(3), 4, 2),
            (prompt_b, toks(6), 3, 4), (prompt_b, toks(2), 7, 5), (toks(11), toks(3), 4, 3)]
    rows, masks = [], []
    for prompt, reply1, obs, n_reply2 in spec:
        row = prompt + reply1 + toks(obs) + toks(n_reply2)
        m = [0] * len(prompt) + [1] * len(reply1) + [0] * obs + [1] * n_reply2
        rows.append(row)
        masks.append(m)
    t = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), t, dtype=torch.long)
    attn = torch.zeros(len(rows), t, dtype=torch.long)
    mask = torch.zeros(len(rows), t)
    for b, (r, m) in enumerate(zip(rows, masks, strict=False)):
        ids[b, : len(r)], attn[b, : len(r)], mask[b, : len(m)] = torch.tensor(r), 1, torch.tensor(m, dtype=torch.float)
    return ids, attn, mask


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("critic_type,pack_tokens,call_cost,rooted", [
    ("value_head", 512, 64, False), ("separate", 512, 64, False), (None, 512, 64, False), ("value_head", 1, 64, False),
    ("separate", 1, 0, False), ("value_head", 24, 64, False), ("value_head", 24, 0, False),
    ("value_head", 512, 64, True), ("separate", 1, 0, True), (None, 24, 64, True)])
def test_shared_prefix_forward_and_gradients_equal_the_unshared_ones(tiny_model_dir, critic_type, pack_tokens,
                                                                     call_cost, rooted, device) -> None:
    """pack_tokens 512: each prefix's rows packed into one sequence (and the lone row in one);
    1: one row a pack, group A's three packs in one padded batch (call cost 64) or in three forward
    calls continued from one prefix cache (0); 24: group A's rows in two packs (12 tokens, then
    15 + 9), padded into one batch (64) or run apart (0). ``rooted``: the two groups' prompts
    start with the same 8 tokens, forwarded once (``shared_root``), then both groups' tails (6 and
    5 tokens) in one padded batch."""
    from ragen_rllib.core.prefix import length_buckets, pack_rows, plan_shared_prefixes, shared_root

    module = _module(tiny_model_dir, critic_type, pack_tokens=pack_tokens, bucket_call_cost=call_cost).to(device)
    ids, attn, mask = (t.to(device) for t in _multi_turn_batch(module.lm.config.vocab_size, rooted))
    groups, alone = plan_shared_prefixes(ids, attn, mask)
    assert [g.rows for g in groups] == [[0, 1, 2], [3, 4]] and alone == [5]
    assert groups[0].prefix_len == 14  # rows 0, 1 share more, row 2 only the prompt
    assert shared_root(ids, groups) == (8 if rooted else 0)
    suffixes = [int(attn[r].sum()) - groups[0].prefix_len for r in groups[0].rows]
    packs = pack_rows(suffixes, pack_tokens)
    assert len(packs) == {512: 1, 1: 3, 24: 2}[pack_tokens]
    sizes = [sum(suffixes[i] for i in p) for p in packs]
    assert len(length_buckets(sizes, call_cost)) == (len(packs) if call_cost == 0 else 1)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2)).to(device) * mask

    def run(share: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        module.zero_grad(set_to_none=True)
        out = module.score(ids, attn, mask, with_values=True, with_entropy=True, share_prefix=share)
        loss = (out["logp"] * w).sum() + 0.3 * (out["entropy"] * w).sum()
        if "values" in out:
            loss = loss + (out["values"] * w).sum()
        loss.backward()
        return ({k: v.detach() for k, v in out.items()},
                {n: q.grad.detach().clone() for n, q in module.named_parameters() if q.grad is not None})

    shared_out, shared_grads = run(True)
    plain_out, plain_grads = run(False)
    assert set(shared_out) == set(plain_out) == ({"logp", "entropy"} | ({"values"} if critic_type else set()))
    for k in plain_out:
        assert (shared_out[k] - plain_out[k]).abs().max() <= 1e-5, k
        assert torch.equal(shared_out[k] == 0, plain_out[k] == 0) or k == "values", k
    assert set(shared_grads) == set(plain_grads) and len(plain_grads) > 10
    for n in plain_grads:
        assert (shared_grads[n] - plain_grads[n]).abs().max() <= 1e-5 * max(1.0, float(plain_grads[n].abs().max())), n


@pytest.mark.parametrize("adv,critic,kl", [("gae", "value_head", "off"), ("grpo", None, "loss"),
                                           ("gae", "separate", "off")])
def test_update_forward_as_old_logp_gives_the_same_loss_and_gradient(tiny_model_dir, ray_local, tmp_path,
                                                                    adv, critic, kl) -> None:
    """One epoch, one mini-batch: the update's own forward, detached, as old log-probs and values
    gives the loss and gradient of a separate no-grad pass (multi-turn FrozenLake rows)."""
    import dataclasses

    import numpy as np
    from ray.rllib.core import DEFAULT_MODULE_ID

    from ragen_rllib.algorithms.starpo.config import StarPOConfig
    from ragen_rllib.algorithms.starpo.params import starpo_s
    from ragen_rllib.trajectory import take_groups

    params = starpo_s(model=str(tiny_model_dir), engine="hf", env="frozen_lake", env_groups=4, group_size=3,
                      max_turns=3, response_length=6, enable_think=False, adv_estimator=adv,
                      critic_type=critic or "value_head", rollout_filter_ratio=0.5, test_freq=0, actor_lr=1e-4,
                      kl_mode=kl, kl_coef=0.1 if kl != "off" else 0.0)
    algo = (StarPOConfig().training(starpo=params).storage(run_dir=str(tmp_path), run_name="reuse")
            .debugging(seed=0).build_algo())
    try:
        table, _ = algo._sample_train_groups(0)
        kept, _ = algo._filter(table)
        train = take_groups(table, kept)
        assert max(len(t) for t in train[Col.TURN_REWARDS].to_pylist()) >= 2  # multi-turn rows
        learner = algo.learner_group._learner
        module = learner.module[DEFAULT_MODULE_ID]

        def loss_and_grads(reuse: bool) -> tuple[float, dict[str, torch.Tensor], dict]:
            cfg = algo.config
            cfg._is_frozen = False
            cfg.starpo = dataclasses.replace(cfg.starpo, reuse_update_forward=reuse)
            cfg._is_frozen = True
            mab, _ = algo._advantages(train)
            b = {k: torch.as_tensor(np.asarray(v)) for k, v in mab.policy_batches[DEFAULT_MODULE_ID].items()}
            assert ("advantages" not in b) == reuse and int(b["mode"][0]) == (1 if reuse else 0)
            loss = learner.compute_loss_for_module(module_id=DEFAULT_MODULE_ID, config=learner.config, batch=b,
                                                   fwd_out={})
            learner.compute_gradients({DEFAULT_MODULE_ID: loss})
            grads = {n: q.grad.detach().clone() for n, q in module.named_parameters() if q.grad is not None}
            return float(loss), grads, {k: learner.metrics.peek((DEFAULT_MODULE_ID, k))
                                        for k in ("actor/pg_loss", "actor/ppo_kl")}

        loss_sep, grads_sep, m_sep = loss_and_grads(False)
        loss_reuse, grads_reuse, m_reuse = loss_and_grads(True)
        assert learner.metrics.peek((DEFAULT_MODULE_ID, "actor/old_logp_from_update_forward")) == 1.0
        assert m_reuse["actor/ppo_kl"] == 0.0  # ratio exactly 1 by construction
        assert loss_reuse == pytest.approx(loss_sep, abs=1e-6)
        assert m_reuse["actor/pg_loss"] == pytest.approx(m_sep["actor/pg_loss"], abs=1e-6)
        assert set(grads_sep) == set(grads_reuse) and len(grads_sep) > 10
        for n in grads_sep:
            assert (grads_reuse[n] - grads_sep[n]).abs().max() <= 1e-6 * max(1.0, float(grads_sep[n].abs().max())), n
    finally:
        algo.stop()


def test_score_takes_log_probs_at_the_sampling_temperature(tiny_model_dir) -> None:
    """Bug D: the learner's log-probs and entropies are those of softmax(logits / T), the
    distribution the engine sampled from; the SFT warm-up (``sft`` in the batch) stays at T=1."""
    module = _module(tiny_model_dir, None, temperature=0.7)
    ids, attn, mask = _multi_turn_batch(module.lm.config.vocab_size)
    with torch.no_grad():
        logits = module.lm(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        for temp, got in ((0.7, module.score(ids, attn, mask, with_values=False, with_entropy=True)),
                          (1.0, module.forward_train({"token_ids": ids, "attention_mask": attn, "loss_mask": mask,
                                                      "sft": torch.ones(len(ids))}))):
            logp_all = torch.log_softmax(logits / temp, -1)
            want = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1) * mask[:, 1:]
            ent = -(logp_all.exp() * logp_all).sum(-1) * mask[:, 1:]
            torch.testing.assert_close(got["logp"][:, 1:], want, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got["entropy"][:, 1:], ent, atol=1e-5, rtol=1e-5)


def test_the_algorithm_config_hands_the_sampling_temperature_to_the_module(tiny_model_dir) -> None:
    from ragen_rllib.algorithms.starpo.config import StarPOConfig
    from ragen_rllib.algorithms.starpo.params import starpo_s

    cfg = StarPOConfig().training(starpo=starpo_s(model=str(tiny_model_dir), engine="hf", temperature=0.6))
    assert cfg.get_default_rl_module_spec().model_config["temperature"] == 0.6
