"""StarPO / StarPO-S as a custom RLlib Algorithm.

How StarPO-S differs from PPO (RAGEN paper §4):

1. The unit of optimisation is a whole multi-turn trajectory (all turns of one episode in one
   token sequence); the loss covers only the model's sampled tokens.
2. Rollouts come in groups: P initial states x N samples; each sample has its own dynamics seed.
3. Variance filtering: only the top ``rollout_filter_ratio`` of groups by in-group reward std
   (on raw episode returns) are trained on.
4. Decoupled clipping (ε_low 0.2, ε_high 0.28) and dual clip c = 3; no KL term.
5. The critic is a value model over token prefixes; GAE runs over sampled tokens only.

``training_step`` reads as the data flow: sample -> store -> (mi) -> filter -> advantages ->
update -> sync, one timer per stage. ``mi`` (every ``mi_every`` iterations) is RAGEN-2's
mutual-information diagnostic of template collapse (``echo/mi_*``); it never changes training.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np
import torch

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override

from ragen_rllib.algorithms.starpo import cross_scoring as X
from ragen_rllib.algorithms.starpo.config import StarPOConfig
from ragen_rllib.algorithms.starpo.update_batch import ADVANTAGES, Mode, UpdateBatch
from ragen_rllib.env_runners.runner_pool import RunnerPool
from ragen_rllib.core import collapse as C
from ragen_rllib.core import starpo as S
from ragen_rllib.seeds import sampling_seed, train_state_seeds, val_state_seeds, warmup_state_seeds
from ragen_rllib.trajectory import (
    TrajectoryStore,
    rows_to_table,
    take_groups,
    to_padded_tensors,
    with_kept,
    with_token_advantages,
)
from ragen_rllib.trajectory.schema import Col
from ragen_rllib.trajectory.store import validation_store
from ragen_rllib.trajectory.summary import summarize


def _all(results: Any) -> list[Any]:
    """Every value of an RLlib ``RemoteCallResults`` (or a plain list), in learner order."""
    return [r.get() if hasattr(r, "get") else r for r in results]


def _rank() -> int:
    """This learner's rank in the learners' process group (0 without one)."""
    from torch.distributed import get_rank, is_initialized

    return get_rank() if is_initialized() else 0


def _first(results: Any) -> Any:
    """First value of an RLlib ``RemoteCallResults`` (or a plain list)."""
    for r in results:
        return r.get() if hasattr(r, "get") else r
    raise RuntimeError("no learner answered")


def _mean_over_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    """Per-step learner metrics combined over an iteration's optimizer steps: the mean, the max
    for ``*_max`` keys (e.g. ``actor/ppo_kl_max``)."""
    out: dict[str, float] = {}
    for key in {k for step in steps for k in step}:
        vals = [float(step[key]) for step in steps if key in step]
        out[key] = max(vals) if key.endswith("_max") else float(np.mean(vals))
    return out


def success_ci95(successes: np.ndarray) -> tuple[float, float]:
    """Mean and 95% half-width (Wilson score interval) of a 0/1 array."""
    n = len(successes)
    if n == 0:
        return 0.0, 0.0
    p, z = float(np.mean(successes)), 1.96
    denom = 1 + z * z / n
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return p, half


def pass_at_k(successes_per_state: Sequence[Sequence[bool]], k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021) averaged over states with n >= k samples."""
    vals = []
    for s in successes_per_state:
        n, c = len(s), int(sum(s))
        if n < k:
            continue
        vals.append(1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k))
    return float(np.mean(vals)) if vals else 0.0


class StarPO(Algorithm):
    """The StarPO / StarPO-S algorithm (see the module docstring)."""

    @classmethod
    @override(Algorithm)
    def get_default_config(cls) -> StarPOConfig:
        return StarPOConfig()

    @override(Algorithm)
    def setup(self, config: StarPOConfig) -> None:
        super().setup(config)
        self.policy_version = 0
        self.seed_counter = 0  # training states drawn so far (ragen_rllib.seeds.train_state_seeds)
        self.set_aside: list[Any] = []  # Arrow files of iterations after a restored checkpoint (kept aside)
        run = config.run_name or time.strftime("starpo-%Y%m%d-%H%M%S")
        self.store = TrajectoryStore(config.run_dir, run)
        self.runners = RunnerPool(self.env_runner_group, config.num_consecutive_env_runner_failures_tolerance,
                                  config.env_runner_health_probe_timeout_s)
        self._tokenizer: Any = None  # loaded on first use (the MI diagnostic re-tokenises replies)
        self._mi_std_ema: float | None = None  # in memory only, as RAGEN-2: a resumed run starts it again

    # ------------------------------------------------------------ the spine
    @override(Algorithm)
    def training_step(self) -> None:
        p, it, timers = self.config.starpo, self.iteration, {}
        if p.test_freq and (it % p.test_freq == 0) and (it > 0 or p.val_before_train):
            with _timer(timers, "validate"):
                self._log(self.validate())
        with _timer(timers, "sample"):
            table, rollout_stats = self._sample_train_groups(it)
        with _timer(timers, "store"):
            self.store.write(it, table)
        mi_metrics = {}
        if X.is_due(it, p.mi_every):  # on the unfiltered batch, under the weights that sampled it
            with _timer(timers, "mi"):
                mi_metrics = self._mutual_information(table, it)
        with _timer(timers, "filter"):
            kept, filter_metrics = self._filter(table)
            table = with_kept(table, kept)
            self.store.write(it, table, overwrite=True)
            train = take_groups(table, kept)
        adv_metrics, learner_results = {"filter/empty": float(not kept)}, {}
        if kept:  # RAGEN-2's linear top-p can keep no group: then no update, no new policy version
            with _timer(timers, "advantages"):
                batch, more = self._advantages(train)
                adv_metrics.update(more)
            with _timer(timers, "update"):
                learner_results = self._update(batch)
            with _timer(timers, "sync"):
                self._sync_weights()
            with _timer(timers, "store_advantages"):
                self.store.write(it, self._with_advantages(table, batch), overwrite=True)
        self._log({**_rollout_metrics(table, rollout_stats), **filter_metrics, **adv_metrics, **mi_metrics,
                   **learner_results, **{f"time/{k}": v for k, v in timers.items()},
                   "policy_version": float(self.policy_version)})

    # --------------------------------------------------------------- stages
    def _sample_train_groups(self, iteration: int) -> tuple[Any, dict[str, float]]:
        p = self.config.starpo
        seeds = train_state_seeds(p.seed, self.seed_counter, p.env_groups)
        groups = [(iteration * p.env_groups + g, s) for g, s in enumerate(seeds)]
        self.seed_counter += p.env_groups
        rows, stats = self._sample(groups, p.group_size, p.env, p.temperature, iteration,
                                   sampling_seed=sampling_seed(p.seed, "train", iteration))
        return rows_to_table(rows), stats

    def _sample(self, groups: list[tuple[int, int]], group_size: int, env: str, temperature: float, iteration: int,
                sampling_seed: int, demo: str | None = None) -> tuple[list[dict], dict[str, float]]:
        """Rows of ``groups`` x ``group_size`` from the env runners (``RunnerPool.sample``: sharding,
        merge checks, weights for runners behind, re-sampling the groups of a runner that died)."""
        kw = dict(env=env, temperature=temperature, run_id=self.store.run_id, iteration=iteration,
                  sampling_seed=sampling_seed, demo=demo)
        rows, stats, resampled = self.runners.sample(groups, group_size, kw, self.policy_version,
                                                     self._learner_weights)
        self.metrics.log_value("faults/resampled_groups", resampled, reduce="lifetime_sum")
        self._log({"faults/env_runner_restarts": float(self.runners.restarts())})
        return rows, stats

    def _filter(self, table: Any) -> tuple[set[int], dict[str, float]]:
        """StarPO-S variance filter on raw episode returns; returns the kept group ids and metrics."""
        p = self.config.starpo
        returns = torch.tensor(table[Col.EPISODE_RETURN].to_numpy(), dtype=torch.float32)  # raw env returns
        gids = torch.tensor(table[Col.GROUP_ID].to_numpy(), dtype=torch.int64)
        stds, unique = S.group_reward_std(returns, gids)
        kept_idx, metrics = S.select_groups(stds, p.rollout_filter_ratio, p.rollout_filter_type,
                                            include_zero=p.rollout_filter_include_zero,
                                            eps=p.rollout_filter_selection_eps)
        return set(unique[kept_idx].tolist()), metrics

    def _mutual_information(self, table: Any, iteration: int) -> dict[str, float]:
        """RAGEN-2's MI collapse diagnostic (``echo/mi_*``): first replies cross-scored under the
        groups' first prompts (``cross_scoring``) by the learner, then ``C.collapse_metrics``.
        Only ``echo/mi_valid_frac`` when fewer than two groups have a reply to score."""
        p = self.config.starpo
        if self._tokenizer is None:
            from ragen_rllib.models.loading import load_tokenizer

            self._tokenizer = load_tokenizer(p.model)
        pairs, valid_frac = X.first_turn_pairs(table, self._tokenizer, p.enable_think, p.mi_num_samples,
                                               np.random.default_rng([p.seed, iteration]))
        metrics = {X.MI_VALID_FRAC: valid_frac}
        if pairs is None:
            return metrics
        batch = pairs.batch()
        logp = _first(self.learner_group.foreach_learner(lambda lrn: lrn.sequence_logprobs(batch)))
        l_tok, l_sum = pairs.loglik(logp)
        metrics.update(C.collapse_metrics(torch.as_tensor(l_tok), torch.as_tensor(pairs.column),
                                          pairs.prompt_of_column.tolist(), loglik_seq=torch.as_tensor(l_sum)))
        self._mi_std_ema = C.marginal_std_ema(self._mi_std_ema, metrics[C.MI_MARGINAL_STD])
        metrics.update({C.MI_MARGINAL_STD_EMA: self._mi_std_ema,
                        C.MI_ZSCORE_EMA: metrics[C.MI_ESTIMATE] / (self._mi_std_ema + C.STD_EPS),
                        X.MI_NUM_SAMPLES: float(len(pairs.replies)),
                        X.MI_NUM_PROMPTS: float(len(pairs.prompt_of_column))})
        return metrics

    def _advantages(self, train: Any) -> tuple[MultiAgentBatch, dict[str, float]]:
        """The ``UpdateBatch`` of the kept rows: token rewards placed (``S.place_rewards``), then
        either advantages from a no-grad learner pass (``_precomputed``), or, when the update's own
        forward can give the old log-probs and values (``_reuses_update_forward``), the rewards
        alone: the learner then computes the advantages with the same ``S.estimate_advantages``."""
        p = self.config.starpo
        t = to_padded_tensors(train)
        token_turn = _pad_token_turn(train, t[Col.LOSS_MASK].shape)
        rewards = S.place_rewards(t[Col.LOSS_MASK], token_turn, [list(r) for r in train[Col.TURN_REWARDS].to_pylist()],
                                  per_turn=p.use_turn_scores)
        _check_on_policy(t[Col.POLICY_VERSION].numpy(), self.policy_version)
        if self._reuses_update_forward(t["attention_mask"].sum(1).tolist()):
            ub, metrics = update_batch(t, Mode.RL_FROM_UPDATE_FORWARD, token_rewards=rewards.numpy(),
                                       token_turn=token_turn.numpy(), group_ids=t[Col.GROUP_ID].numpy()), {}
        else:
            ub, metrics = self._precomputed(t, rewards, token_turn)
        return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(ub.columns())}, env_steps=len(ub)), metrics

    def _precomputed(self, t: dict[str, torch.Tensor], rewards: torch.Tensor, token_turn: torch.Tensor
                     ) -> tuple[UpdateBatch, dict[str, float]]:
        """Old log-probs, values (and reference log-probs) from a no-grad learner pass; KL into the
        reward (``kl_mode: reward``); advantages and returns (``S.estimate_advantages``)."""
        p, mask, version = self.config.starpo, t[Col.LOSS_MASK], self.policy_version
        rows = {k: t[c].numpy() for k, c in (("token_ids", Col.TOKEN_IDS), ("attention_mask", "attention_mask"),
                                             ("loss_mask", Col.LOSS_MASK), ("policy_version", Col.POLICY_VERSION))}
        extra = _first(self.learner_group.foreach_learner(lambda lrn: lrn.compute_rollout_tensors(rows, version)))
        metrics = {"actor/entropy_rollout": float((torch.as_tensor(extra["entropy"]) * mask).sum()
                                                  / mask.sum().clamp(min=1))}
        if p.kl_mode == "reward":
            kl = S.kl_penalty(torch.as_tensor(extra["old_logp"]), torch.as_tensor(extra["ref_logp"]), mask, p.kl_type)
            rewards, kl_metrics = S.apply_kl_in_reward(rewards, kl, mask, p.kl_coef)
            metrics.update(kl_metrics)
        adv, returns = S.estimate_advantages(rewards, torch.as_tensor(extra["old_values"]), mask, token_turn,
                                             t[Col.GROUP_ID], **p.adv_kwargs())
        return update_batch(t, Mode.RL, old_logp=extra["old_logp"], old_values=extra["old_values"],
                            advantages=adv.numpy(), returns=returns.numpy(), ref_logp=extra.get("ref_logp")), metrics

    def _with_advantages(self, table: Any, batch: MultiAgentBatch) -> Any:
        """``table`` (its ``kept`` column set) with the token advantages the update used on each kept
        row (``Col.TOKEN_ADVANTAGES``; null on rows of filtered-out groups): the batch's own when
        they were computed before the update, else the learner's from the update's forward."""
        adv = batch.policy_batches[DEFAULT_MODULE_ID].get(ADVANTAGES)  # (K_rows, T), kept rows in table order
        if adv is None:  # Mode.RL_FROM_UPDATE_FORWARD
            adv = _first(self.learner_group.foreach_learner(lambda lrn: lrn.update_forward_advantages()))
        if adv is None:
            return table
        rows = iter(np.asarray(adv, dtype=np.float32))
        return with_token_advantages(table, [next(rows) if k else None for k in table[Col.KEPT].to_pylist()])

    def _reuses_update_forward(self, lengths: list[int]) -> bool:
        """True when the update's forward can give the old log-probs and values (detached) exactly:
        one epoch, one mini-batch, one micro-batch, one learner, no KL in the reward (it needs them
        before the update) and no dropout (the no-grad pass runs in eval mode)."""
        p = self.config.starpo
        return (p.reuse_update_forward and p.ppo_epochs == 1 and len(lengths) <= p.ppo_mini_batch_size
                and len(S.plan_micro_batches(lengths, p.ppo_max_token_len_per_gpu)) == 1
                and p.kl_mode != "reward" and p.lora_dropout == 0 and self.config.num_learners <= 1)

    def _update(self, batch: MultiAgentBatch) -> dict[str, float]:
        p = self.config.starpo
        n = batch.env_steps()
        factor = S.lr_multiplier(self.iteration, max(1, p.total_training_steps), p.lr_warmup_steps, p.warmup_style,
                                 p.min_lr_ratio)
        lrs = _first(self.learner_group.foreach_learner(lambda lrn: lrn.apply_lr_schedule(factor)))
        # One learner_group.update per optimizer step, over a mini-batch we cut ourselves: RLlib's
        # cyclic iterator would repeat rows when n is not a multiple of the mini-batch (bug B), and
        # its minibatch_size counts per learner shard, which scaled the step with the learner count
        # (bug C). minibatch_size=None: each learner takes its whole shard as one step, and the
        # learners average their gradients, so a step is ppo_mini_batch_size rows in all.
        sample = batch.policy_batches[DEFAULT_MODULE_ID]
        steps: list[dict[str, float]] = []
        for _ in range(p.ppo_epochs):
            for rows in S.plan_mini_batches(n, p.ppo_mini_batch_size, min_rows=max(1, self.config.num_learners)):
                mb = MultiAgentBatch({DEFAULT_MODULE_ID: sample[rows.start:rows.stop]}, env_steps=len(rows))
                steps.append(_flatten_learner_results(self.learner_group.update(batch=mb, minibatch_size=None,
                                                                                num_epochs=1)))
        return {**_mean_over_steps(steps), "actor/optimizer_steps": float(len(steps)), **lrs}

    def _sync_weights(self) -> float:
        """Learner 0's policy weights -> every env runner's engine, stamped with the next version.

        One ``ray.put`` for all runners; every runner reports the version it now holds, and a wrong
        one raises. A runner that dies during the sync is restarted by Ray and gets the weights
        before it samples again (``RunnerPool.bring_to_policy``).

        Returns:
            seconds from the ``ray.put`` to the last runner's answer (the learner gather excluded).
        """
        self.policy_version += 1
        return self.runners.broadcast(self._learner_weights, self.policy_version)[1]

    def _learner_weights(self) -> dict[str, Any]:
        # The learner's weights are the current version's: they change only in _update, and
        # training_step syncs right after it (under ZeRO-3 every learner must join this call).
        return _first(self.learner_group.foreach_learner(lambda lrn: lrn.policy_weights()))

    # ------------------------------------------------------------- warm-up
    def warmup(self, steps: int, kind: str = "random-valid", groups: int = 4, group_size: int = 4,
               log: Any = None, lr: float | None = None) -> list[dict[str, float]]:
        """Supervised stage before RL: cross-entropy on env-generated demonstrations.

        ``random-valid`` teaches the answer format (random valid actions); ``expert`` (BFS plans,
        shortest paths, solutions, the high arm) reproduces the paper's SFT baseline. Uses the
        same Learner and the same token-exact chat assembly as RL; ends with a weight sync.

        ``lr`` (None: ``starpo.actor_lr``) is the actor's rate for these steps; the RL schedule sets
        its own rate again at each update (``_update``).

        Returns:
            per-step metrics (``sft/loss``, ``sft/lr``, ``time/warmup_step``).
        """
        p = self.config.starpo
        history = []
        factor = 1.0 if lr is None else lr / p.actor_lr
        lrs = _first(self.learner_group.foreach_learner(lambda lrn: lrn.apply_lr_schedule(factor)))
        for s in range(steps):
            t0 = time.perf_counter()
            seeds = warmup_state_seeds(p.seed, s * groups, groups)
            grp = [(-(s * groups + g + 1), seed) for g, seed in enumerate(seeds)]
            rows, _ = self._sample(grp, group_size, p.env, p.temperature, iteration=0,
                                   sampling_seed=sampling_seed(p.seed, "warmup", s), demo=kind)
            ub = update_batch(to_padded_tensors(rows_to_table(rows)), Mode.SFT)
            # minibatch_size=None: one step over each learner's whole shard (n would cycle a shard to n rows)
            res = self.learner_group.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(ub.columns())},
                                                                  env_steps=len(ub)),
                                            minibatch_size=None, num_epochs=1)
            m = {k: v for k, v in _flatten_learner_results(res).items() if "sft" in k or "norm" in k}
            m["sft/lr"] = lrs["actor/lr"]
            m["time/warmup_step"] = time.perf_counter() - t0
            history.append(m)
            if log is not None:
                log(f"[warm-up {s + 1}/{steps}] " + " ".join(f"{k}={v:.4g}" for k, v in m.items()))
        self._sync_weights()
        return history

    # ----------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        """Fixed initial states (``val_seed``..), ``val_group_size`` samples each, at ``val_temperature``.

        Returns ``val/<env>/success`` (mean), ``.../success_ci95`` (Wilson half-width),
        ``.../pass@k`` (k = val_group_size) and the rollout summary metrics. The rollouts are
        stored as ``<run>/validation/<env>/iter_<it>.parquet`` (it = RL iterations done; a redone
        validation replaces its file), so that two validations compare state by state.
        """
        p = self.config.starpo
        out: dict[str, float] = {}
        for env in (p.val_envs or (p.env,)):
            groups = [(10**9 + g, s) for g, s in enumerate(val_state_seeds(p.val_seed, p.val_groups))]
            rows, _ = self._sample(groups, p.val_group_size, env, p.val_temperature, self.iteration,
                                   sampling_seed=p.val_seed)
            validation_store(self.store.run_dir, env).write(self.iteration, rows_to_table(rows), overwrite=True)
            succ = np.array([r[Col.SUCCESS] for r in rows], dtype=float)
            mean, half = success_ci95(succ)
            per_state: dict[int, list[bool]] = {}
            for r in rows:
                per_state.setdefault(r[Col.GROUP_ID], []).append(bool(r[Col.SUCCESS]))
            s = summarize(rows_to_table(rows))
            out.update({f"val/{env}/success": mean, f"val/{env}/success_ci95": half,
                        f"val/{env}/pass@{p.val_group_size}": pass_at_k(list(per_state.values()), p.val_group_size),
                        f"val/{env}/well_formed_rate": s["well_formed_rate"], f"val/{env}/return": s["return_mean"]})
        return out

    # -------------------------------------------------------------- metrics
    def _log(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.metrics.log_value(k, float(v), window=1)

    @override(Algorithm)
    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """RLlib's state (learners: model, critic, torch optimizers; metrics; iteration) plus ours:
        policy_version, seed counter, store run id, RNG states, and each learner's DeepSpeed
        optimizer partition (RLlib's learner-group state asks learner 0 only)."""
        import random

        state = super().get_state(*args, **kwargs)
        backend = sorted(_all(self.learner_group.foreach_learner(lambda lrn: (_rank(), lrn.backend_state()))),
                         key=lambda x: x[0])
        state["starpo"] = {"policy_version": self.policy_version, "seed_counter": self.seed_counter,
                           "run_id": self.store.run_id,
                           "rng": {"python": random.getstate(), "numpy": np.random.get_state(),
                                   "torch": torch.get_rng_state()},
                           "learner_backend": [s for _, s in backend] if any(s for _, s in backend) else None}
        return state

    @override(Algorithm)
    def set_state(self, state: dict[str, Any]) -> None:
        """Restore ``get_state``; then every env runner loads the restored policy (same version)."""
        import random

        super().set_state(state)
        s = state.get("starpo")
        if not s:
            return
        self.policy_version, self.seed_counter = int(s["policy_version"]), int(s["seed_counter"])
        if s.get("run_id") and not self.config.run_name:  # no run named in the config: continue the checkpoint's
            self.store = TrajectoryStore(self.config.run_dir, s["run_id"])
        if self.store.run_id == s.get("run_id"):  # continuing that run: later iterations will be redone
            self.set_aside = self.store.set_aside_after(self.iteration - 1)
        rng = s.get("rng") or {}
        if rng:
            random.setstate(rng["python"])
            np.random.set_state(rng["numpy"])
            torch.set_rng_state(rng["torch"])
        if s.get("learner_backend"):
            states = s["learner_backend"]
            _all(self.learner_group.foreach_learner(lambda lrn: lrn.load_backend_state(states)))
        self.runners.broadcast(self._learner_weights, self.policy_version)


class _timer:
    def __init__(self, sink: dict[str, float], name: str) -> None:
        self.sink, self.name = sink, name

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: Any) -> None:
        self.sink[self.name] = time.perf_counter() - self.t0


def update_batch(t: dict[str, torch.Tensor], mode: Mode, **fields: Any) -> UpdateBatch:
    """The ``UpdateBatch`` of padded trajectory tensors (``to_padded_tensors``) plus ``fields``."""
    return UpdateBatch(mode=mode, token_ids=t[Col.TOKEN_IDS].numpy(), attention_mask=t["attention_mask"].numpy(),
                       loss_mask=t[Col.LOSS_MASK].numpy(), sample_logprobs=t[Col.SAMPLE_LOGPROBS].numpy(),
                       policy_version=t[Col.POLICY_VERSION].numpy(), **fields)


def _check_on_policy(versions: np.ndarray, policy_version: int) -> None:
    if np.any(versions != policy_version):
        raise RuntimeError(f"off-policy rows: algorithm at policy_version {policy_version}, rows carry "
                           f"{sorted(set(int(v) for v in versions))}")


def _pad_token_turn(table: Any, shape: tuple[int, ...]) -> torch.Tensor:
    out = torch.full(shape, -1, dtype=torch.int64)
    for i, tt in enumerate(table[Col.TOKEN_TURN].to_pylist()):
        out[i, : len(tt)] = torch.as_tensor(tt, dtype=torch.int64)
    return out


def _rollout_metrics(table: Any, stats: dict[str, float]) -> dict[str, float]:
    from ragen_rllib.prompting.chat_format import think_text
    from ragen_rllib.tracking.echo_trap import identical_response_fraction

    s = summarize(table)
    m = {f"rollout/{k}": v for k, v in s.items()}
    replies = ["\x1e".join(r) for r in table[Col.TURN_RESPONSES].to_pylist()]
    m["rollout/identical_response_frac"] = identical_response_fraction(replies, table[Col.GROUP_ID].to_pylist())
    m["rollout/response_length_mean"] = s["tokens_per_turn"]
    thinks = [think_text(t) for r in table[Col.TURN_RESPONSES].to_pylist() for t in r]
    words = [len(t.split()) for t in thinks if t is not None]
    m["rollout/think_words_mean"] = float(np.mean(words)) if words else 0.0  # reasoning length (Echo Trap: collapse)
    m["rollout/think_turn_frac"] = len(words) / len(thinks) if thinks else 0.0
    m["rollout/tokens_per_s"] = stats["sampled_tokens"] / stats["wall_s"] if stats["wall_s"] > 0 else 0.0
    m["time/generate"] = stats["generate_s"]
    m["time/env"] = stats["env_s"]  # env resets/steps, parsing and prompt tokenisation inside the sample stage
    return m


def _flatten_learner_results(results: Any) -> dict[str, float]:
    """RLlib learner results (one nested dict per learner) -> flat {name: float}, averaged over learners.

    Each learner reports its own shard's losses; the mean over learners describes the whole
    mini-batch and does not depend on which actor Ray lists first (an order that can change
    between a run and its restore). Norms are taken after the all-reduce, so they agree across
    learners anyway.
    """
    per_learner = results if isinstance(results, list) else [results]

    def walk(prefix: str, d: Any, out: dict[str, float]) -> None:
        if isinstance(d, dict):
            for k, v in d.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v, out)
        else:
            try:
                val = d.peek() if hasattr(d, "peek") else d
                out[prefix] = float(val)
            except (TypeError, ValueError):
                pass

    flats = []
    for res in per_learner:
        flat: dict[str, float] = {}
        walk("", res.get(DEFAULT_MODULE_ID, {}) if isinstance(res, dict) else {}, flat)
        flats.append(flat)
    out = {k: math.fsum(f[k] for f in flats if k in f) / sum(k in f for f in flats)
           for k in dict.fromkeys(k for f in flats for k in f)}
    if "gradients_actor_global_norm" in out:  # RLlib's pre-clip global norm of the actor optimizer
        out["actor/grad_norm"] = out["gradients_actor_global_norm"]
    if "gradients_critic_global_norm" in out:
        out["critic/grad_norm"] = out["gradients_critic_global_norm"]
    return {(k if "/" in k and k.split("/")[0] in ("actor", "critic") else f"learner/{k}"): v for k, v in out.items()}
