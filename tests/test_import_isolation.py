"""``import hf_diversed`` changes nothing for code that does not pass its arguments (fresh interpreters)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import build_tiny, prompts

from hf_diversed.generation import _compat

PROBE = Path(__file__).with_name("import_probe.py")


def _probe(mode: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(PROBE), mode], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def plain() -> dict:
    result = _probe("plain")
    assert isinstance(result["compile_fullgraph"], list), result["compile_fullgraph"]  # the probe itself works
    return result


@pytest.mark.parametrize("mode", ["imported", "after-call"])
def test_import_changes_nothing_outside_diversed_calls(plain, mode):
    """fullgraph compilation of a grouped-query forward; greedy, sampled, beam, prompt-lookup, assisted and
    static-cache tokens; transformers' log lines and warnings: all as without hf_diversed, after the import
    and after a DIVERSED generate has run and returned."""
    assert _probe(mode) == plain


def test_patches_are_in_place_only_inside_a_diversed_call(llama_pair):
    """Outside a DIVERSED generate transformers' own functions are in place (a plain assisted generate included);
    inside it, hf_diversed's."""
    import transformers
    from transformers.integrations import sdpa_attention

    def patched() -> tuple[bool, bool]:
        return (
            transformers.GenerationMixin._assisted_decoding is not _compat.original_assisted_decoding,
            sdpa_attention.use_gqa_in_sdpa is not _compat.original_use_gqa_in_sdpa,
        )

    target, draft = llama_pair
    seen: list[tuple[bool, bool]] = []
    hook = target.register_forward_pre_hook(lambda *_: seen.append(patched()))
    try:
        assert patched() == (False, False)
        target.generate(prompts(1)[0], assistant_model=draft, diversed_verifier="static:0.5", max_new_tokens=4)
        assert seen and set(seen) == {(True, True)}
        seen.clear()
        target.generate(prompts(1)[0], assistant_model=draft, max_new_tokens=4)
        assert seen and set(seen) == {(False, False)}
        assert patched() == (False, False)
    finally:
        hook.remove()


def test_scoped_patch_nests_and_restores():
    class Owner:
        value = "original"

    patch = _compat.ScopedPatch(Owner, "value", "patched")
    with patch:
        with patch:
            assert Owner.value == "patched" and patch.active
        assert Owner.value == "patched"
    assert Owner.value == "original" and not patch.active
    with pytest.raises(KeyError), patch:
        raise KeyError("an error inside the block still restores")
    assert Owner.value == "original"


def test_grouped_attention_compiles_fullgraph_inside_its_block():
    """Inside the block the replacement is traceable by Dynamo, and the compiled forward equals the eager one."""
    model = build_tiny("llama", hidden=32, layers=2, seed=0, device=torch.device("cpu"))
    ids = prompts(1, length=9)[0].cpu()
    mask = torch.ones_like(ids)
    with torch.no_grad(), _compat.grouped_attention_on_cpu():
        eager = model(ids, attention_mask=mask).logits
        compiled = torch.compile(model.forward, fullgraph=True, backend="eager")(ids, attention_mask=mask).logits
    torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager)
