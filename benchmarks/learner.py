"""Learner update: ours (RLlib learner, StarPO-S loss) vs a bare torch loop on the same batch.

The batch is what one Bandit CPU-profile iteration trains on: the 2 kept groups x 8 samples
(16 rows, the real chat-templated prompt of ~180 tokens, replies from the env's random-valid
demonstrations; ``--env frozen_lake --max-turns 3`` gives multi-turn rows). Every variant takes one
optimizer step on it per repetition; medians over ``--reps`` after one warm-up rep:

1. **ours**: ``StarPO._advantages`` + ``StarPO._update`` (RLlib ``LearnerGroup.update``, our
   loss, grad clip, AdamW), as ``training_step`` runs them; the defaults: shared prefixes, old
   log-probs and values from the update's own forward.
2. **ours, unshared**: the same with ``share_prefix`` off (every row forwards its own prompt).
   **ours, no shared root**: shared prefixes, but each group forwards its whole prompt; by default
   the groups' common start (``shared_root``: the instructions before the initial state) is
   forwarded once. With ``--distinct-prompts`` the groups are chosen with pairwise different
   first prompts (on the Bandit, both arm orders), where the root matters.
   **ours, rows unpacked**: shared prefixes, but ``pack_tokens=1``: every row continued from a
   prefix is a pack of its own, so the rows run as padded batches over a per-row copy of the
   prefix's keys/values (the learner before packing).
3. **ours, separate old-log-prob pass**: ``reuse_update_forward`` off (a no-grad pass first).
4. **bare torch**: the same model, value head, autocast setting (the profile's ``bf16_autocast: auto``:
   bf16 where the CPU has bf16 instructions, fp32 elsewhere) and fused AdamW in a hand-written loop
   with no RLlib and no prefix sharing: forward, log-probs at sampled positions only, PPO
   clipped loss + value loss, backward, clip, step. "learner / bare" >= 0.9 is the goal.
5. **bare torch, full logits**: the same but logits at every position (what a plain
   ``model(...).logits`` loop does).

Ratios are speed ratios (time of the reference / time of the variant): > 1 = faster.

Run: ``.venv/bin/python benchmarks/learner.py [--env bandit] [--reps 5] [--groups 2]
[--group-size 8] [--max-turns 1] [--set starpo.KEY=VALUE ...]``

On a GPU, ``--profile gpu`` runs the learner as that profile does (on the GPU, DeepSpeed ZeRO-2 in
bf16); the bare loop then runs on the same device under bf16 autocast, and the peak GPU memory of
each part is printed. Times on a GPU wait for the device (``torch.cuda.synchronize``).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np
import torch

from ragen_rllib.hardware import resolve_bf16


def _demo_table(params: Any, groups: int, group_size: int, distinct: bool = False) -> Any:
    """Rows of ``groups`` x ``group_size`` demonstration rollouts (no engine: replies are the env's
    random valid actions in the answer format), as the trajectory table the learner trains on.
    ``distinct``: initial states (seeds counted up from ``params.seed``) whose first prompts differ
    pairwise."""
    from ragen_rllib.env_runners.engine import SamplingParams
    from ragen_rllib.env_runners.rollout_loop import RolloutLoop, RolloutSpec
    from ragen_rllib.envs.demos import make_demo_fn
    from ragen_rllib.models.loading import load_tokenizer
    from ragen_rllib.prompting import PromptConfig
    from ragen_rllib.trajectory import rows_to_table

    tok = load_tokenizer(params.model)

    class _Engine:
        eos_token_ids = (int(tok.eos_token_id),)
        policy_version = 0

    name, _, variant = params.env.partition(":")
    spec = RolloutSpec(env_name=name, env_variant=variant or None, group_size=group_size, max_turns=params.max_turns,
                       prompt=PromptConfig(enable_think=params.enable_think,
                                           max_actions_per_turn=params.max_actions_per_turn),
                       sampling=SamplingParams(max_new_tokens=params.response_length))
    loop = RolloutLoop(_Engine(), tok, spec)
    demo_fn = make_demo_fn("random-valid", 0, params.enable_think, params.max_actions_per_turn)
    seeds = [params.seed + g for g in range(groups)]
    if distinct:  # one sample per candidate state, its first prompt = its tokens before the reply
        probe_loop = RolloutLoop(_Engine(), tok, dataclasses.replace(spec, group_size=1))
        seeds, seen, s = [], set(), params.seed
        while len(seeds) < groups and s < params.seed + 1000:
            row = probe_loop.run([(0, s)], demo_fn=demo_fn).rows[0]
            prompt = tuple(row["token_ids"][:list(row["loss_mask"]).index(1)])
            if prompt not in seen:
                seen.add(prompt)
                seeds.append(s)
            s += 1
        if len(seeds) < groups:
            raise SystemExit(f"--distinct-prompts: only {len(seeds)} distinct first prompts in 1000 states "
                             f"of {params.env}")
    res = loop.run([(g, seed) for g, seed in enumerate(seeds)], demo_fn=demo_fn)
    rng = np.random.default_rng(0)
    for r in res.rows:  # varied returns so that advantages are not all zero
        r["turn_rewards"] = [float(x) for x in rng.choice([0.0, 0.1, 1.0], size=len(r["turn_rewards"]))]
        r["episode_return"] = float(sum(r["turn_rewards"]))
    return rows_to_table(res.rows)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_s(fn: Callable[[], Any], reps: int, device: torch.device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _bare_step(model: Any, head: Any, opt: Any, t: dict[str, torch.Tensor], full_logits: bool, clip: float,
               bf16: bool) -> None:
    ids, attn, mask = t["ids"], t["attn"], t["mask"]
    sel = mask[:, 1:] > 0
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        if full_logits:
            out = model(input_ids=ids, attention_mask=attn, output_hidden_states=True)
            logits = out.logits[:, :-1][sel].float()
            h = out.hidden_states[-1][:, :-1][sel]
        else:
            h = model.model(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1][sel]
            logits = model.lm_head(h).float()
        values = head(h).squeeze(-1).float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:][sel][:, None]).squeeze(-1)
    adv = t["adv"][:, 1:][sel]
    ratio = torch.exp(logp - logp.detach())
    pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv).mean()
    vf = 0.5 * ((values - t["ret"][:, 1:][sel]) ** 2).mean()
    opt.zero_grad(set_to_none=True)
    (pg + vf).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="experiments/bandit_starpo_s.yaml")
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--env", default=None, help="override the experiment's env (e.g. frozen_lake)")
    ap.add_argument("--max-turns", type=int, default=None)
    ap.add_argument("--groups", type=int, default=2, help="kept groups (StarPO-S keeps 2 of 8 on the Bandit)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--distinct-prompts", action="store_true",
                    help="groups with pairwise different first prompts (the Bandit: both arm orders)")
    ap.add_argument("--with-engine", action="store_true",
                    help="start the experiment's rollout engine in this process first (the in-process placement)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override an experiment key, as `ragen-rllib train --set` (repeatable)")
    args = ap.parse_args()
    from ragen_rllib.launch.allocator import reexec_script_with_jemalloc

    reexec_script_with_jemalloc()  # the allocator `ragen-rllib train` runs under (jemalloc)
    t_all = time.perf_counter()

    import ray

    from ragen_rllib.algorithms.starpo.train import build_config, load_experiment

    from ragen_rllib.models import resolve_model

    sets = ["starpo.test_freq=0"] + ([f"starpo.env={args.env}"] if args.env else [])
    sets += [f"starpo.max_turns={args.max_turns}"] if args.max_turns else []
    sets += args.set
    cfg = load_experiment(args.config, args.profile, sets)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    algo = build_config(cfg, "bench-learner").build_algo()
    p = algo.config.starpo
    if args.with_engine:
        algo.env_runner.engine  # noqa: B018 -- builds the in-process engine (as a run's first sample does)
    table = _demo_table(p, args.groups, args.group_size, args.distinct_prompts)
    lengths = [len(x) for x in table["token_ids"].to_pylist()]
    from ragen_rllib.core.prefix import plan_shared_prefixes, shared_root
    from ragen_rllib.trajectory import to_padded_tensors
    from ragen_rllib.trajectory.schema import Col

    tt = to_padded_tensors(table)  # also the bare loop's batch, below
    plan, _ = plan_shared_prefixes(tt[Col.TOKEN_IDS], tt["attention_mask"], tt[Col.LOSS_MASK])
    print(f"batch: {table.num_rows} rows ({args.groups} groups x {args.group_size}), env {p.env}, "
          f"{min(lengths)}-{max(lengths)} tokens per row, torch threads {torch.get_num_threads()}; "
          f"{len(plan)} shared prefixes of {[g.prefix_len for g in plan]} tokens, "
          f"their shared root {shared_root(tt[Col.TOKEN_IDS], plan)} tokens")
    learner = algo.learner_group._learner
    module = learner.module[next(iter(learner.module.keys()))]
    device = next(module.parameters()).device
    print(f"learner device {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
          + f", backend {type(learner._backend).__name__}, bf16 autocast {module.bf16_autocast_on(device.type)}")

    def ours(share: bool, reuse: bool, pack_tokens: int = p.pack_tokens, root: bool = True) -> Callable[[], Any]:
        def step() -> None:
            module.share_prefix = share
            module.share_root = root
            module.pack_tokens = pack_tokens
            algo.config._is_frozen = False
            algo.config.starpo = dataclasses.replace(p, reuse_update_forward=reuse)
            algo.config._is_frozen = True
            batch, _ = algo._advantages(table)
            algo._update(batch)
        return step

    results = {"ours": _median_s(ours(True, True), args.reps, device),
               "ours, unshared": _median_s(ours(False, True), args.reps, device),
               "ours, no shared root": _median_s(ours(True, True, root=False), args.reps, device),
               "ours, rows unpacked": _median_s(ours(True, True, pack_tokens=1), args.reps, device),
               "ours, separate old-logp pass": _median_s(ours(True, False), args.reps, device)}
    peak = {}
    if device.type == "cuda":
        peak["ours (all three variants)"] = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    algo.stop()
    ray.shutdown()

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model(p.model), dtype=torch.float32,
                                                 local_files_only=True).to(device)
    head = torch.nn.Linear(model.config.hidden_size, 1).to(device)
    bf16 = resolve_bf16(p.bf16_autocast, device.type)
    # the same fused AdamW as the learner, so the ratio measures the learner, not the optimizer kernel
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=p.actor_lr, weight_decay=p.weight_decay,
                            fused=True)
    mask = tt[Col.LOSS_MASK].float()
    g = torch.Generator().manual_seed(0)
    t = {"ids": tt[Col.TOKEN_IDS], "attn": tt["attention_mask"], "mask": mask,
         "adv": torch.randn(mask.shape, generator=g) * mask, "ret": torch.randn(mask.shape, generator=g) * mask}
    t = {k: v.to(device) for k, v in t.items()}
    results["bare torch"] = _median_s(lambda: _bare_step(model, head, opt, t, False, p.grad_clip, bf16), args.reps,
                                      device)
    if device.type == "cuda":
        peak["bare torch"] = torch.cuda.max_memory_allocated(device)
    results["bare torch, full logits"] = _median_s(lambda: _bare_step(model, head, opt, t, True, p.grad_clip, bf16),
                                                   args.reps, device)

    print(f"\n{'variant':<34} {'median s':>9} {'speed vs bare':>14}")
    for k, v in results.items():
        print(f"{k:<34} {v:>9.3f} {results['bare torch'] / v:>13.2f}x")
    for k, v in peak.items():
        print(f"peak GPU memory allocated, {k}: {v / 2**30:.2f} GiB")
    print(f"\nlearner / bare torch: {results['bare torch'] / results['ours']:.2f}x (goal >= 0.9)")
    print(f"prefix-shared vs unshared update: {results['ours, unshared'] / results['ours']:.2f}x faster")
    print(f"groups' shared root forwarded once vs per group: {results['ours, no shared root'] / results['ours']:.2f}x "
          "faster")
    print(f"rows packed (pack_tokens={p.pack_tokens}) vs unpacked: "
          f"{results['ours, rows unpacked'] / results['ours']:.2f}x faster")
    print(f"update forward reused vs separate old-logp pass: "
          f"{results['ours, separate old-logp pass'] / results['ours']:.2f}x faster")
    print(f"\ncommand: {' '.join(['benchmarks/learner.py', *sys.argv[1:]])}; "
          f"total wall time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
