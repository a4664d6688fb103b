"""Linear layers on oneDNN's blocked weight layout, for decoding on a CPU (the only module using torch's private
``mkldnn`` linear ops).

A decode step multiplies one row by every weight matrix. torch's ``F.linear`` at one row reads bf16 weights at a
fraction of the memory bandwidth; the same product y = x Wᵀ + b on W reordered once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, then ``_linear_pointwise``, the pair the inductor's ``freezing`` emits)
is 1.3-2x faster on the real pair's steps (``benchmarks/bench_packed_linear.py``). The result is the same product;
the summation order may differ, as between any two GEMM kernels.

``pack_linear_weights(model)`` turns each ``nn.Linear`` into a ``PackedLinear`` in place: same parameters, state
dict, tied weights and hooks, plus a non-persistent buffer with the packed copy (one more copy of the linear
weights in memory). Packed products run where autograd is off (``generate``, ``torch.no_grad``); with gradients on,
the layer is ``nn.Linear`` unchanged. ``model.to(...)`` repacks (or, off the CPU, drops the pack). An eager forward
repacks a weight changed in place since; a compiled graph does not see such a change, so pack after training.
They compile: the packed product is one custom op (``hf_diversed::packed_linear``) that the inductor calls as is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PACKED_DTYPES = (torch.bfloat16, torch.float32)


def _mkldnn_ops_available() -> bool:
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise")
    )


@torch.library.custom_op("hf_diversed::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x Wᵀ + b for a 2-D ``x`` and W in oneDNN's blocked layout (``packed_weight``, logical shape (out, in))."""
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], packed_weight.shape[0])


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def _version(weight: torch.Tensor) -> int:
    return -1 if weight.is_inference() else weight._version  # inference tensors keep no version counter


def _packable(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype in PACKED_DTYPES


class PackedLinear(nn.Linear):
    """``nn.Linear`` whose no-grad forward computes y = x Wᵀ + b on a copy of W in oneDNN's blocked layout."""

    packed_weight: torch.Tensor | None

    def repack(self) -> None:
        """Pack the current weight (a CPU bf16/fp32 one; otherwise keep no pack and run ``F.linear``)."""
        packed = _pack(self.weight) if _packable(self.weight) else None
        self.register_buffer("packed_weight", packed, persistent=False)
        self._packed_version = _version(self.weight)

    def _apply(self, fn, recurse: bool = True):
        self.register_buffer("packed_weight", None, persistent=False)  # a blocked copy must not be cast or moved
        out = super()._apply(fn, recurse)
        self.repack()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_weight is None or torch.is_grad_enabled() or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        if not torch.compiler.is_compiling() and _version(self.weight) != self._packed_version:
            self.repack()  # the weight was changed in place since it was packed
        y = packed_linear(x.reshape(-1, x.shape[-1]).contiguous(), self.packed_weight, self.bias)
        return y.view(*x.shape[:-1], y.shape[-1])


def pack_linear_weights(model: nn.Module) -> nn.Module:
    """Run every ``nn.Linear`` of ``model`` on oneDNN's blocked weights (in place; returns ``model``).

    For CPU inference in bf16 or fp32: 1.3-2x faster decode and verification steps on the real pair. Subclasses of
    ``nn.Linear`` (PEFT's LoRA layers, quantized layers) keep their own forward and are not packed.

    >>> import hf_diversed
    >>> target = hf_diversed.pack_linear_weights(target)  # doctest: +SKIP
    """
    if not _mkldnn_ops_available():
        raise ValueError(
            "pack_linear_weights needs torch's oneDNN (mkldnn) linear ops, which this torch build lacks; "
            "leave the weights unpacked."
        )
    linears = [m for m in model.modules() if type(m) in (nn.Linear, PackedLinear)]
    if not linears:
        raise ValueError(f"pack_linear_weights found no nn.Linear layer in {type(model).__name__}; nothing to pack.")
    for module in linears:
        weight = module.weight
        if weight.device.type != "cpu":
            raise ValueError(
                f"pack_linear_weights is for models on the CPU; {type(model).__name__} has weights on {weight.device} "
                "(on a GPU, compile instead: cache_implementation='static' with a compile_config)."
            )
        if weight.dtype not in PACKED_DTYPES:
            raise ValueError(
                f"pack_linear_weights packs bfloat16 or float32 weights; {type(model).__name__} has {weight.dtype}: "
                "load the model with dtype=torch.bfloat16 (or float32) first."
            )
    if any(m.weight.dtype == torch.bfloat16 for m in linears) and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise ValueError(
            "this CPU has no oneDNN bf16 support, so packed bf16 weights would be slow; load the model in float32 "
            "(dtype=torch.float32) and pack that."
        )
    for module in linears:
        module.__class__ = PackedLinear
        module.repack()
    return model
