"""Canary: the private transformers internals hf_diversed relies on still exist with the same shape."""

from __future__ import annotations

import inspect

import transformers

from hf_diversed import _compat


def test_transformers_in_tested_range():
    _compat.check_transformers_version()


def test_private_signatures_unchanged():
    sigs = _compat.private_signatures()
    assert list(sigs["_assisted_decoding"].parameters)[:11] == [
        "self",
        "input_ids",
        "logits_processor",
        "stopping_criteria",
        "generation_config",
        "synced_gpus",
        "streamer",
        "inputs_tensor",
        "assistant_model",
        "assistant_tokenizer",
        "tokenizer",
    ]
    assert list(sigs["_prepare_attention_mask"].parameters) == ["model_kwargs", "new_length", "is_encoder_decoder"]
    assert list(sigs["_prepare_position_ids"].parameters) == ["model_kwargs", "new_length", "is_encoder_decoder"]
    assert list(sigs["_prepare_token_type_ids"].parameters) == ["model_kwargs", "new_length"]
    assert list(sigs["_split_model_outputs"].parameters)[:4] == ["outputs", "new_outputs", "cur_len", "added_len"]
    init = list(sigs["AssistedCandidateGenerator.__init__"].parameters)
    assert init == [
        "self",
        "input_ids",
        "assistant_model",
        "generation_config",
        "model_kwargs",
        "inputs_tensor",
        "logits_processor",
    ]
    assert hasattr(_compat.AssistedCandidateGenerator, "get_candidates")


def test_patch_is_installed_once_and_reversible():
    gm = transformers.GenerationMixin
    assert gm.generate.__hf_diversed_original__ is _compat.original_generate
    assert gm._assisted_decoding.__hf_diversed_original__ is _compat.original_assisted_decoding
    assert "diversed_head" not in inspect.signature(_compat.original_generate).parameters


def test_only_compat_imports_private_generation_modules():
    import pathlib

    package = pathlib.Path(_compat.__file__).parent
    for path in package.rglob("*.py"):
        if path.name == "_compat.py":
            continue
        text = path.read_text()
        assert (
            "transformers.generation.utils" not in text and "transformers.generation.candidate_generator" not in text
        ), path
