"""Which dtype to run the models in: ``--dtype auto`` picks bf16 only where the hardware makes it fast."""

from __future__ import annotations

import torch

DTYPE_CHOICES = ("auto", "bfloat16", "float32")


def _cpu_flag(name: str) -> bool:
    check = getattr(torch.cpu, name, None)  # private in torch 2.x, hence the guard
    try:
        return bool(check()) if check is not None else False
    except Exception:  # noqa: BLE001 - an unknown CPU reports no flag
        return False


def cpu_has_fast_bf16() -> bool:
    """True where the CPU has AVX512-BF16 or AMX (bf16 matmuls about 2x fp32); AVX2-only CPUs emulate bf16."""
    return _cpu_flag("_is_avx512_bf16_supported") or _cpu_flag("_is_amx_tile_supported")


def cpu_capability() -> str:
    """torch's CPU kernel capability (``AVX2``, ``AVX512``, ...) plus ``+bf16`` / ``+amx`` where present."""
    text = torch.backends.cpu.get_cpu_capability()
    if _cpu_flag("_is_avx512_bf16_supported"):
        text += "+bf16"
    if _cpu_flag("_is_amx_tile_supported"):
        text += "+amx"
    return text


def resolve_dtype(name: str) -> str:
    """``"auto"`` -> ``"bfloat16"`` on CUDA or a CPU with fast bf16, else ``"float32"``; other names unchanged."""
    if name not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}; got {name!r}.")
    if name != "auto":
        return name
    return "bfloat16" if torch.cuda.is_available() or cpu_has_fast_bf16() else "float32"
