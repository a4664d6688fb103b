"""``pack_linear_weights``: linear layers on oneDNN's blocked weights (CPU), the same products and the same tokens.

- The packed product equals ``F.linear`` (fp32 to 1e-5 relative; bf16 to bf16's rounding) for one row, several rows
  and 3-D inputs, with and without a bias; a wrongly packed weight (the transpose) is caught by the same check.
- Packed tiny models generate the unpacked models' greedy tokens and statistics: the default loop, the static
  loop eager and inductor-compiled (no graph break: ``fullgraph``), the target alone; four rules and the head.
- A packed model keeps its state dict and tied weights, trains through ``nn.Linear``'s own gradients, repacks
  after ``.to(dtype)`` and after an in-place weight change.
- Misuse is refused in one line naming the fix.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from conftest import DEVICE, EOS, build_pair, build_tiny, prompts
from laws import random_head
from torch import nn
from transformers import CompileConfig

from hf_diversed import pack_linear_weights
from hf_diversed.modeling.packed_linear import PackedLinear, packed_linear

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="oneDNN's packed weights are a CPU layout")
BF16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not BF16, reason="no oneDNN bf16"))]


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    return torch.allclose(actual.float(), expected.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 96), (7, 96), (2, 3, 96)])
def test_packed_product_equals_linear(dtype, bias, shape):
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=bias).to(dtype)
    x = torch.randn(shape).to(dtype)
    expected = F.linear(x, linear.weight, linear.bias)
    pack_linear_weights(linear)
    assert type(linear) is PackedLinear
    with torch.no_grad():
        assert _close(linear(x), expected, dtype)
        wrong = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().flip(0), None)  # rows swapped
        x2 = x.reshape(-1, 96).contiguous()
        assert not _close(packed_linear(x2, wrong, linear.bias), expected.reshape(-1, 40), dtype)


@pytest.fixture(scope="module")
def pairs():
    """(unpacked, packed) copies of one tiny pair and head, float32."""
    target, draft = build_pair("llama")
    for model in (target, draft):
        model.generation_config.pad_token_id = model.generation_config.eos_token_id
    head = random_head(target, draft)
    packed = (pack_linear_weights(copy.deepcopy(target)), pack_linear_weights(copy.deepcopy(draft)))
    return (target, draft, head), (*packed, head)


def _generate(pair, ids, rule, **kwargs):
    target, draft, head = pair
    if rule == "ar":
        return target.generate(ids, pad_token_id=EOS, do_sample=False, max_new_tokens=20, **kwargs), None
    chosen = dict(diversed_head=head) if rule == "diversed" else dict(diversed_verifier=rule)
    out = target.generate(
        ids, assistant_model=draft, num_assistant_tokens=3, num_assistant_tokens_schedule="constant",
        return_dict_in_generate=True, pad_token_id=EOS, do_sample=False, max_new_tokens=20, **chosen, **kwargs,
    )  # fmt: skip
    return out.sequences, out.diversed_stats


def _assert_same(expected, actual, what):
    (tokens_a, stats_a), (tokens_b, stats_b) = expected, actual
    assert torch.equal(tokens_a, tokens_b), f"{what}: tokens differ\n{tokens_a}\n{tokens_b}"
    if stats_a is not None:
        assert stats_a.accepted_per_round == stats_b.accepted_per_round, what
        assert stats_a.weight_sum == pytest.approx(stats_b.weight_sum, abs=1e-4), what


@pytest.mark.parametrize("rule", ["ar", "exact", "static:0.5", "cascade-opt:0.1", "diversed"])
def test_packed_models_generate_the_same_tokens(pairs, rule):
    plain, packed = pairs
    for i, ids in enumerate(prompts(2, seed=3)):
        for static in (False, True):
            kwargs = dict(cache_implementation="static") if static else {}
            _assert_same(_generate(plain, ids, rule, **kwargs), _generate(packed, ids, rule, **kwargs),
                         f"{rule}, prompt {i}, static={static}")  # fmt: skip


@pytest.mark.slow
def test_packed_models_compile_to_the_same_tokens(pairs):
    """The inductor compiles the packed steps whole (``fullgraph``), the custom op called as is."""
    plain, packed = pairs
    torch._dynamo.reset()
    config = CompileConfig(mode="default", fullgraph=True, dynamic=False)
    ids = prompts(1, seed=5)[0]
    for rule in ("static:0.5", "diversed"):
        expected = _generate(plain, ids, rule)
        actual = _generate(packed, ids, rule, cache_implementation="static", compile_config=config)
        _assert_same(expected, actual, f"compiled, {rule}")


def test_state_dict_ties_and_gradients_are_nn_linears():
    model = build_tiny("llama", hidden=32, layers=1, seed=0, device=torch.device("cpu"))
    model.config.tie_word_embeddings = True
    model.tie_weights()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = prompts(1)[0].cpu()
    loss_plain = model(ids, labels=ids).loss
    loss_plain.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    pack_linear_weights(model)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.equal(loss, loss_plain)
    for k, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[k]), k


def test_repacks_after_to_and_after_an_in_place_change():
    torch.manual_seed(0)
    linear = pack_linear_weights(nn.Linear(64, 16))
    x = torch.randn(3, 64)
    with torch.no_grad():
        linear.weight.mul_(2.0)  # in place, after packing
        assert _close(linear(x), F.linear(x, linear.weight, linear.bias), torch.float32)
        if BF16:
            linear.to(torch.bfloat16)
            xb = x.to(torch.bfloat16)
            assert linear.packed_weight.dtype == torch.bfloat16
            assert _close(linear(xb), F.linear(xb, linear.weight, linear.bias), torch.bfloat16)
        linear.to("meta")
        assert linear.packed_weight is None  # off the CPU: nn.Linear's product


def test_refusals_name_the_fix():
    with pytest.raises(ValueError, match="no nn.Linear layer"):
        pack_linear_weights(nn.Sequential(nn.ReLU()))
    with pytest.raises(ValueError, match=r"float16.*dtype=torch.bfloat16"):
        pack_linear_weights(nn.Linear(4, 4).to(torch.float16))
    with pytest.raises(ValueError, match="models on the CPU.*compile instead"):
        pack_linear_weights(nn.Linear(4, 4, device="meta"))
