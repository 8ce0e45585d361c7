"""LoRA (peft) on the policy: only adapters train, engines and the export get merged HF weights.

Real components throughout: a tiny random Llama (SmolLM2 tokenizer), peft, a real local Ray +
RLlib algorithm with the HF engine.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

PEFT_REASON = "LoRA needs peft (`pip install -e .[lora]`)"


def _module(model_dir: Path, **cfg: Any) -> Any:
    from ragen_rllib.rl_module.hf_causal_lm_module import HFCausalLMModule

    return HFCausalLMModule(observation_space=None, action_space=None, inference_only=False,
                            model_config={"model_path": str(model_dir), **cfg})


def _plain(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, local_files_only=True)


def _batch(seed: int = 0) -> tuple[Any, Any, Any]:
    """(B=3, T=12) token ids, attention mask (row 2 right-padded) and loss mask (the last 5 real tokens)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 2000, (3, 12), generator=g)
    attn = torch.ones_like(ids)
    attn[2, 9:] = 0
    loss = torch.zeros(3, 12)
    loss[:2, 7:] = 1.0
    loss[2, 4:9] = 1.0
    return ids, attn, loss


def _lora_param_count(model_dir: Path, rank: int, names: tuple[str, ...] | None) -> int:
    """r * (in + out) summed over the linear layers LoRA adapts (all but lm_head when ``names`` is None)."""
    from torch import nn

    total = 0
    for name, mod in _plain(model_dir).named_modules():
        if isinstance(mod, nn.Linear) and name != "lm_head" and (names is None or name.split(".")[-1] in names):
            total += rank * (mod.in_features + mod.out_features)
    return total


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny model with lm_head tied to embed_tokens (as SmolLM2)."""
    from ragen_rllib.env_runners.tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(tmp_path_factory.mktemp("tied"), tiny_model_dir, seed=1, tie_word_embeddings=True)


@pytest.mark.parametrize("targets", [("all-linear",), ("q_proj", "v_proj")])
def test_only_adapters_train_and_policy_keys_match_plain_model(tiny_model_dir, targets) -> None:
    pytest.importorskip("peft", reason=PEFT_REASON)
    import torch

    m = _module(tiny_model_dir, critic_type="value_head", lora_rank=4, lora_target_modules=targets)
    trainable = {n: q for n, q in m.lm.named_parameters() if q.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable), sorted(trainable)[:5]
    expected = _lora_param_count(tiny_model_dir, 4, None if targets == ("all-linear",) else targets)
    assert sum(q.numel() for q in trainable.values()) == expected
    assert all(q.requires_grad for q in m.value_head.parameters())  # the critic is not LoRA'd

    plain = _plain(tiny_model_dir).state_dict()
    merged = m.policy_state_dict()
    assert list(merged) == list(plain)
    for k, v in plain.items():
        assert merged[k].shape == v.shape and merged[k].dtype == v.dtype, k
        assert torch.equal(merged[k], v), k  # lora_B starts at 0: merged == base exactly


def test_merged_weights_equal_peft_merge_and_plain_model_logp(tiny_model_dir) -> None:
    pytest.importorskip("peft", reason=PEFT_REASON)
    import torch

    torch.manual_seed(0)
    m = _module(tiny_model_dir, critic_type="value_head", lora_rank=4, lora_alpha=8.0)
    ids, attn, loss = _batch()
    # One AdamW step over the policy's trainable parameters, as the learner registers them.
    opt = torch.optim.AdamW([q for q in m.lm.parameters() if q.requires_grad], lr=1e-2)
    out = m.score(ids, attn, loss, with_values=True, with_entropy=True)
    (-(out["logp"] * loss).sum() + (out["values"] ** 2).sum()).backward()
    opt.step()
    opt.zero_grad()

    before = {k: v.clone() for k, v in m.lm.state_dict().items()}
    merged = m.policy_state_dict()
    after = m.lm.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # no in-place merge of the trainable state

    reference = copy.deepcopy(m.lm).merge_and_unload().state_dict()
    base = _plain(tiny_model_dir).state_dict()
    assert list(merged) == list(reference) == list(base)
    assert max(float((merged[k] - reference[k]).abs().max()) for k in merged) <= 1e-6
    changed = {k for k in merged if not torch.equal(merged[k], base[k])}
    assert "model.layers.0.self_attn.q_proj.weight" in changed and "model.layers.1.mlp.down_proj.weight" in changed
    assert not {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"} & changed

    # A plain HF model holding the merged weights scores exactly what the LoRA module scores.
    plain = _plain(tiny_model_dir)
    plain.load_state_dict(merged, strict=True)
    m.eval()
    with torch.no_grad():
        got = m.score(ids, attn, loss, with_values=True, with_entropy=False)
        hidden = plain.model(input_ids=ids, attention_mask=attn).last_hidden_state  # (B, T, H)
        logp_all = torch.log_softmax(plain.lm_head(hidden[:, :-1]).float(), dim=-1)
        want = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1) * loss[:, 1:]
        values = m.value_head(hidden[:, :-1]).squeeze(-1) * loss[:, 1:]
    assert float((got["logp"][:, 1:] - want).abs().max()) <= 1e-5
    assert float((got["values"][:, 1:] - values).abs().max()) <= 1e-5


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_the_module_does_not_keep_the_checkpoint_file_mapped(tiny_model_dir, tmp_path) -> None:
    import shutil

    model_dir = tmp_path / "model"  # a copy of its own: no other test's model maps this file
    shutil.copytree(tiny_model_dir, model_dir)
    m = _module(model_dir, critic_type="separate", lora_rank=2)
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if str(model_dir) in line]
    assert mapped == []
    lm = m.lm.get_base_model()
    assert lm.lm_head.weight is lm.model.embed_tokens.weight or not lm.config.tie_word_embeddings


def test_merged_weights_are_built_per_read_and_pickle_as_a_plain_dict(tiny_model_dir) -> None:
    pytest.importorskip("peft", reason=PEFT_REASON)
    import pickle

    import torch
    from peft.tuners.lora import LoraLayer

    from ragen_rllib.lazy import LazyMapping
    from ragen_rllib.rl_module.hf_causal_lm_module import merged_lora_state_dict

    torch.manual_seed(0)
    m = _module(tiny_model_dir, lora_rank=4, lora_alpha=8.0)
    with torch.no_grad():  # adapters away from zero, so that merging changes the weights
        for q in m.lm.parameters():
            if q.requires_grad:
                q.add_(0.05 * torch.randn_like(q))
    merges: list[str] = []
    for name, mod in m.lm.named_modules():
        if isinstance(mod, LoraLayer):
            def counted(adapter, _name=name, _orig=mod.get_delta_weight):
                merges.append(_name)
                return _orig(adapter)
            mod.get_delta_weight = counted

    state = m.policy_state_dict()
    assert isinstance(state, LazyMapping) and merges == []  # keys only: nothing merged yet
    eager = merged_lora_state_dict(m.lm, dtype=torch.float32)
    n_adapted = len(merges)
    assert n_adapted > 0
    merges.clear()
    key = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(state[key], eager[key]) and len(merges) == 1  # one read, one layer merged
    copied = pickle.loads(pickle.dumps(state))  # what a Ray object or a remote learner's reply holds
    assert type(copied) is dict and list(copied) == list(eager) == list(state)
    assert all(torch.equal(copied[k], eager[k]) for k in eager)
    assert len(merges) == 1 + n_adapted


def test_bf16_autocast_stores_frozen_base_in_bf16_with_the_same_outputs(tiny_model_dir, monkeypatch) -> None:
    """Under bf16 autocast the LoRA base linears' frozen weights are kept in bf16 (one copy, not a
    cast per use saved for the backward): log-probs, values and adapter gradients are those of the
    module that keeps them in float32, and the policy weights stay float32 = bf16(W) + delta."""
    pytest.importorskip("peft", reason=PEFT_REASON)
    import torch

    from ragen_rllib.rl_module.hf_causal_lm_module import HFCausalLMModule

    ids, attn, loss = _batch()

    def run(keep_fp32: bool) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        if keep_fp32:
            monkeypatch.setattr(HFCausalLMModule, "_frozen_linears_to", lambda self, dtype: None)
        torch.manual_seed(0)
        m = _module(tiny_model_dir, critic_type="value_head", lora_rank=4, lora_alpha=8.0, bf16_autocast=True)
        with torch.no_grad():  # non-zero B, so the adapters matter in the outputs
            for n, q in m.lm.named_parameters():
                if ".lora_B." in n:
                    q.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(n)))
        out = m.score(ids, attn, loss, with_values=True, with_entropy=True)
        (-(out["logp"] * loss).sum() + (out["values"] ** 2).sum()).backward()
        grads = {n: q.grad.clone() for n, q in m.named_parameters() if q.grad is not None}
        monkeypatch.undo()
        return m, {k: v.detach() for k, v in out.items()}, grads

    m, out, grads = run(keep_fp32=False)
    ref_m, ref, ref_grads = run(keep_fp32=True)
    q_base = m.lm.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert q_base.dtype == torch.bfloat16 and not q_base.requires_grad
    assert ref_m.lm.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight.dtype == torch.float32
    assert m.lm.get_base_model().model.embed_tokens.weight.dtype == torch.float32  # embeddings, norms stay
    for k in ("logp", "values", "entropy"):
        assert torch.equal(out[k], ref[k]), k
    assert set(grads) == set(ref_grads) and any(".lora_A." in n for n in grads)
    for n in grads:
        assert torch.equal(grads[n], ref_grads[n]), n

    merged, ref_merged = m.policy_state_dict(), ref_m.policy_state_dict()
    assert list(merged) == list(ref_merged) and all(v.dtype == torch.float32 for v in merged.values())
    key = "model.layers.0.self_attn.q_proj.weight"
    layer = m.lm.get_base_model().model.layers[0].self_attn.q_proj
    want = q_base.float() + layer.get_delta_weight("default").float()
    assert torch.equal(merged[key], want)
    assert float((merged[key] - ref_merged[key]).abs().max()) <= float(ref_merged[key].abs().max()) * 2 ** -8


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`")  # the refused case
def test_tied_embeddings_stay_tied_and_adapting_them_is_refused(tied_model_dir) -> None:
    pytest.importorskip("peft", reason=PEFT_REASON)
    import torch

    m = _module(tied_model_dir, lora_rank=2)
    with torch.no_grad():
        for name, q in m.lm.named_parameters():
            if ".lora_B." in name:
                q.normal_(std=0.1)
    merged = m.policy_state_dict()
    plain = _plain(tied_model_dir)
    assert plain.lm_head.weight is plain.model.embed_tokens.weight
    assert list(merged) == list(plain.state_dict())
    assert torch.equal(merged["lm_head.weight"], merged["model.embed_tokens.weight"])
    plain.load_state_dict(merged, strict=True)
    assert plain.lm_head.weight is plain.model.embed_tokens.weight
    assert torch.equal(plain.model.layers[0].mlp.up_proj.weight, merged["model.layers.0.mlp.up_proj.weight"])

    with pytest.raises(ValueError, match=r"lora_target_modules=\('q_proj', 'lm_head'\).*tied"):
        _module(tied_model_dir, lora_rank=2, lora_target_modules=("q_proj", "lm_head"))


@pytest.mark.parametrize("preset,adv", [("starpo_s", "gae"), ("starpo", "grpo")])
def test_training_with_lora_syncs_merged_weights_and_exports(tiny_model_dir, ray_local, tmp_path, preset,
                                                             adv) -> None:
    pytest.importorskip("peft", reason=PEFT_REASON)
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from ragen_rllib.algorithms.starpo.config import StarPOConfig
    from ragen_rllib.algorithms.starpo.params import PRESETS
    from ragen_rllib.algorithms.starpo.train import export_hf

    # starpo: KL in the loss, so the learner's frozen reference copy of the (LoRA) policy is scored too.
    params = PRESETS[preset](model=str(tiny_model_dir), engine="hf", env="bandit", env_groups=2, group_size=2,
                             response_length=6, enable_think=False, adv_estimator=adv, critic_type="value_head",
                             test_freq=0, val_before_train=False, ppo_mini_batch_size=4, actor_lr=1e-2,
                             lora_rank=4, lora_alpha=8.0)
    algo = (StarPOConfig().training(starpo=params).storage(run_dir=str(tmp_path), run_name="lora")
            .debugging(seed=0).build_algo())
    try:
        spec = algo.config.get_default_rl_module_spec()
        assert spec.model_config["lora_rank"] == 4 and spec.model_config["lora_target_modules"] == ("all-linear",)
        results = [algo.train() for _ in range(2)]
        assert results[-1]["policy_version"] == 2.0
        weights = next(iter(algo.learner_group.foreach_learner(lambda lrn: lrn.policy_weights()))).get()
        engine_sd = algo.env_runner.engine.model.state_dict()
        base = _plain(tiny_model_dir).state_dict()
        assert list(weights) == list(base) == list(engine_sd)
        for k, v in weights.items():
            assert np.array_equal(engine_sd[k].numpy(), v), k  # the engine holds the merged weights
        assert not np.array_equal(weights["model.layers.0.self_attn.q_proj.weight"],
                                  base["model.layers.0.self_attn.q_proj.weight"].numpy())  # the adapters trained
        assert np.array_equal(weights["model.embed_tokens.weight"], base["model.embed_tokens.weight"].numpy())

        out = export_hf(algo, tmp_path / "hf_model")
    finally:
        algo.stop()
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True).state_dict()
    assert list(exported) == list(weights)
    assert all(np.array_equal(exported[k].numpy(), weights[k]) for k in weights)
    assert not any("lora" in p.name for p in out.iterdir())  # a plain HF folder, no adapter files


def test_lora_with_bf16_autocast_checkpoints_and_restores(tiny_model_dir, ray_local, tmp_path) -> None:
    """With bf16 autocast the frozen base is bf16 in the learner; a checkpoint stores its bits as
    int16 views, not float32 copies (numpy has no bf16), and a restored algorithm serves the same
    policy weights."""
    pytest.importorskip("peft", reason=PEFT_REASON)
    import numpy as np
    import torch

    from ragen_rllib.algorithms.starpo.config import StarPOConfig
    from ragen_rllib.algorithms.starpo.params import starpo_s

    params = starpo_s(model=str(tiny_model_dir), engine="hf", env="bandit", env_groups=2, group_size=2,
                      response_length=6, enable_think=False, critic_type="value_head", test_freq=0,
                      val_before_train=False, ppo_mini_batch_size=2, actor_lr=1e-2, lora_rank=4, lora_alpha=8.0,
                      bf16_autocast=True)

    def build(name: str):
        return (StarPOConfig().training(starpo=params).storage(run_dir=str(tmp_path), run_name=name)
                .debugging(seed=0).build_algo())

    def policy(algo) -> dict:
        return next(iter(algo.learner_group.foreach_learner(lambda lrn: lrn.policy_weights()))).get()

    algo = build("lora-bf16")
    try:
        algo.train()
        module = algo.learner_group._learner.module["default_policy"]
        assert module.lm.get_base_model().model.layers[0].mlp.up_proj.base_layer.weight.dtype == torch.bfloat16
        want = policy(algo)
        from ragen_rllib.rl_module.hf_causal_lm_module import BF16_SUFFIX

        state = module.get_state()
        bits = state["lm.base_model.model.model.layers.0.mlp.up_proj.base_layer.weight" + BF16_SUFFIX]
        weight = module.lm.get_base_model().model.layers[0].mlp.up_proj.base_layer.weight
        assert bits.dtype == np.int16 and np.shares_memory(bits, weight.view(torch.int16).numpy())  # a view
        algo.save_to_path(str(tmp_path / "ckpt"))
    finally:
        algo.stop()
    restored = build("lora-bf16-restored")
    try:
        restored.restore_from_path(str(tmp_path / "ckpt"))
        got = policy(restored)
    finally:
        restored.stop()
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == np.float32 and np.array_equal(got[k], want[k]), k


@pytest.mark.parametrize("field,value,match", [
    ("lora_rank", -1, "int >= 0"), ("lora_rank", 2.0, "int >= 0"), ("lora_rank", True, "int >= 0"),
    ("lora_alpha", 0.0, "> 0"), ("lora_alpha", -8, "> 0"),
    ("lora_dropout", 1.0, r"\[0, 1\)"), ("lora_dropout", -0.1, r"\[0, 1\)"),
    ("lora_target_modules", (), "non-empty tuple"), ("lora_target_modules", "all-linear", "non-empty tuple"),
    ("lora_target_modules", ("q_proj", ""), "non-empty tuple"),
    ("lora_target_modules", ("all-linear", "q_proj"), "alone"),
])
def test_lora_params_are_validated(field, value, match) -> None:
    from ragen_rllib.algorithms.starpo.params import starpo_s

    with pytest.raises(ValueError, match=match) as e:
        starpo_s(**{field: value})
    assert f"StarPOParams.{field} " in str(e.value) and str(e.value).endswith(f"got {value!r}"), str(e.value)


def test_yaml_lists_and_single_names_become_target_tuples() -> None:
    from ragen_rllib.algorithms.starpo.train import build_params

    p = build_params({"starpo": {"lora_rank": 8, "lora_target_modules": ["q_proj", "v_proj"]}})
    assert p.lora_target_modules == ("q_proj", "v_proj") and p.lora_rank == 8
    assert build_params({"starpo": {"lora_target_modules": "all-linear"}}).lora_target_modules == ("all-linear",)
    assert build_params({}).lora_rank == 0  # off by default


def test_export_of_a_tied_model_takes_the_learner_arrays_and_stays_tied(tied_model_dir, tmp_path) -> None:
    """``export_hf`` assigns the learner's arrays as the model's weights (no copy into the
    checkpoint-mapped ones); a tied model's export is tied and reloads with the same weights."""
    from types import SimpleNamespace

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from ragen_rllib.algorithms.starpo.session import export_hf

    base = _plain(tied_model_dir)
    with torch.no_grad():
        for q in base.parameters():
            q.add_(0.01)  # the "trained" weights: not the file's
    weights = {k: v.detach().numpy() for k, v in base.state_dict().items()}
    reply = SimpleNamespace(get=lambda: weights)
    algo = SimpleNamespace(config=SimpleNamespace(starpo=SimpleNamespace(model=str(tied_model_dir))),
                           learner_group=SimpleNamespace(foreach_learner=lambda fn: [reply]))
    out = export_hf(algo, tmp_path / "hf_model")
    got = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True)
    assert got.lm_head.weight.data_ptr() == got.model.embed_tokens.weight.data_ptr()
    sd = got.state_dict()
    assert list(sd) == list(weights) and all(np.array_equal(sd[k].numpy(), weights[k]) for k in weights)
