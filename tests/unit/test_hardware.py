"""``ragen_rllib.hardware``: which CPUs compute bf16 natively, and what the ``auto`` settings become."""

from __future__ import annotations

import logging

import pytest

from ragen_rllib import hardware as H
from ragen_rllib.algorithms.starpo.params import StarPOParams
from ragen_rllib.errors import ConfigError

# Trimmed /proc/cpuinfo texts of the three kinds that matter.
EPYC_AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx fma avx2 bmi2 sha_ni\n\n" \
            "processor\t: 1\nflags\t\t: fpu sse2 avx fma avx2 bmi2 sha_ni\n"
XEON_SPR = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
NEOVERSE = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\nCPU implementer\t: 0x41\n"


def test_flags_are_read_from_x86_and_arm_lines() -> None:
    assert "avx2" in H.cpu_flags(EPYC_AVX2) and "model" not in H.cpu_flags(EPYC_AVX2)
    assert not H.cpu_flags(EPYC_AVX2) & H.NATIVE_BF16_FLAGS
    assert {"avx512_bf16", "amx_bf16"} <= H.cpu_flags(XEON_SPR)
    assert "bf16" in H.cpu_flags(NEOVERSE)


@pytest.mark.parametrize(("native", "auto_bf16", "dtype"), [(False, False, "float32"), (True, True, "bfloat16")])
def test_auto_follows_the_cpu(monkeypatch: pytest.MonkeyPatch, native: bool, auto_bf16: bool, dtype: str) -> None:
    monkeypatch.setattr(H, "cpu_has_native_bf16", lambda: native)
    assert H.resolve_bf16("auto", "cpu") is auto_bf16
    assert H.resolve_engine_dtype("auto", cuda=False) == dtype
    assert H.resolve_engine_dtype("auto", cuda=True) == "bfloat16"  # GPUs: bf16 whatever the CPU
    assert H.resolve_engine_dtype("float16", cuda=False) == "float16"  # an explicit dtype is kept
    assert H.resolve_bf16(False, "cpu") is False


def test_explicit_bf16_on_an_emulating_cpu_is_kept_with_one_warning(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(H, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(H, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=H.__name__):
        assert H.resolve_bf16(True, "cpu") is True
        assert H.resolve_bf16(True, "cpu") is True
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "starpo.bf16_autocast=auto" in lines[0]


def test_params_accept_auto_and_name_a_bad_value() -> None:
    assert StarPOParams(bf16_autocast="auto").validate().bf16_autocast == "auto"
    with pytest.raises(ConfigError, match=r"bf16_autocast must be true, false or 'auto', got 'yes'"):
        StarPOParams(bf16_autocast="yes").validate()
