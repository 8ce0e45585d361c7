"""Whether this machine computes bfloat16 natively, and what ``"auto"`` dtype settings resolve to.

bf16 on a CPU without bf16 instructions is emulated: on a 2-core AVX2 AMD EPYC (no AVX-512),
SmolLM2-135M forward+backward under bf16 autocast took 17-25x as long as in fp32, and vLLM generated
4.4-4.7x more slowly in bf16 than in fp32 (``benchmarks/bf16_cpu.py``). On CPUs with ``avx512_bf16`` /
``amx_bf16`` bf16 is the faster choice. So the ``cpu`` profiles say ``auto`` and this module decides.

Stdlib only at import; torch is imported lazily for the CUDA query.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

log = logging.getLogger(__name__)

#: /proc/cpuinfo flags that mean native bf16 arithmetic: x86 AVX-512 BF16 or AMX, Arm's BF16 extension.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of a ``/proc/cpuinfo`` text (x86 ``flags``, Arm ``Features`` lines)."""
    out: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            out.update(value.split())
    return frozenset(out)


@functools.lru_cache(maxsize=1)
def native_bf16_cpu_flags() -> frozenset[str]:
    """This CPU's flags among ``NATIVE_BF16_FLAGS`` (empty where ``/proc/cpuinfo`` is unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return cpu_flags(text) & NATIVE_BF16_FLAGS


def cpu_has_native_bf16() -> bool:
    """True when this CPU has bf16 instructions."""
    return bool(native_bf16_cpu_flags())


def native_bf16(device_type: str) -> bool:
    """Whether ``device_type`` (``"cpu"`` or ``"cuda"``) computes bf16 natively."""
    if device_type == "cuda":
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    return cpu_has_native_bf16()


_warned: set[str] = set()


def resolve_bf16(setting: bool | str, device_type: str) -> bool:
    """``bf16_autocast`` for ``device_type``: ``"auto"`` = native bf16 there; a bool is kept as given.

    An explicit ``True`` on a CPU without bf16 instructions is kept, with one warning naming the fix.
    """
    if setting == "auto":
        return native_bf16(device_type)
    if setting and device_type == "cpu" and not cpu_has_native_bf16() and "cpu" not in _warned:
        _warned.add("cpu")
        log.warning("bf16_autocast=true on a CPU without bf16 instructions (no avx512_bf16/amx_bf16): PyTorch "
                    "emulates bf16 there, ~25x slower than fp32 measured; set starpo.bf16_autocast=auto")
    return bool(setting)


def resolve_engine_dtype(setting: str, cuda: bool) -> str:
    """vLLM ``engine_dtype``: ``"auto"`` = bfloat16 on a GPU or a CPU with bf16 instructions, else float32."""
    if setting != "auto":
        return setting
    return "bfloat16" if cuda or cpu_has_native_bf16() else "float32"
