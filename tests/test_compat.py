"""Canary: the private transformers internals hf_diversed relies on still exist with the same shape."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import transformers
from conftest import DEVICE, build_tiny, prompts
from transformers import GenerationConfig, LogitsProcessorList, TemperatureLogitsWarper

from hf_diversed.generation import _compat


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
    prepare = list(sigs["AssistedCandidateGenerator._prepare_generation_args"].parameters)
    assert prepare == ["self", "input_ids", "min_new_tokens", "max_new_tokens"]


def test_patch_is_installed_once_and_reversible():
    gm = transformers.GenerationMixin
    assert gm.generate.__hf_diversed_original__ is _compat.original_generate
    assert gm._assisted_decoding is _compat.original_assisted_decoding  # replaced only inside a DIVERSED call
    assert "diversed_head" not in inspect.signature(_compat.original_generate).parameters


def test_only_compat_imports_private_generation_modules():
    import pathlib

    package = pathlib.Path(_compat.__file__).parents[1]  # all of hf_diversed/
    for path in package.rglob("*.py"):
        if path.name == "_compat.py":
            continue
        text = path.read_text()
        assert (
            "transformers.generation.utils" not in text and "transformers.generation.candidate_generator" not in text
        ), path


def test_draft_warpers_apply_once():
    """The drafter passes its ``generation_config`` to the draft's generate, whose ``_get_logits_processor``
    appends warpers built from it after the custom list: ``apply_draft_warpers_once`` leaves none to build."""
    draft = build_tiny("llama", hidden=32, layers=1, seed=3)
    config = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.9,
        min_p=0.1,
        typical_p=0.9,
        epsilon_cutoff=0.01,
        eta_cutoff=0.01,
        top_h=0.5,
        renormalize_logits=True,
        eos_token_id=1,
        max_length=30,
    )
    ids = torch.tensor([[3, 4, 5]])
    drafter = _compat.AssistedCandidateGenerator(ids, draft, config, {}, logits_processor=LogitsProcessorList())
    assert drafter._prepare_generation_args(ids, 0, 2)["generation_config"] is drafter.generation_config

    def built_by_draft_generate(generation_config) -> list[str]:
        resolved, _ = draft._prepare_generation_config(generation_config)
        draft._prepare_special_tokens(resolved, True, device=draft.device, batch_size=1)
        processors = draft._get_logits_processor(
            generation_config=resolved, input_ids_seq_length=3, device=draft.device, model_kwargs={}
        )
        return [type(p).__name__ for p in processors]

    before = built_by_draft_generate(drafter.generation_config)
    assert {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "LogitNormalization"} <= set(before)
    _compat.apply_draft_warpers_once(drafter)
    after = built_by_draft_generate(drafter.generation_config)
    assert not [name for name in after if "Warper" in name or name == "LogitNormalization"], after
    assert config.temperature == 0.7 and config.top_k == 20  # the target's config is untouched
    # Custom processors are still used, once: the draft's generate merges them in.
    merged = draft._merge_criteria_processor_list(
        LogitsProcessorList(), LogitsProcessorList([TemperatureLogitsWarper(0.7)])
    )
    assert [type(p).__name__ for p in merged] == ["TemperatureLogitsWarper"]

    # A min_p on the draft's own generation_config would fill the None: it becomes the no-op 0.0.
    draft.generation_config.min_p = 0.2
    drafter = _compat.AssistedCandidateGenerator(ids, draft, config, {}, logits_processor=LogitsProcessorList())
    _compat.apply_draft_warpers_once(drafter)
    assert drafter.generation_config.min_p == 0.0
    draft.generation_config.top_h = 0.5
    drafter = _compat.AssistedCandidateGenerator(ids, draft, config, {}, logits_processor=LogitsProcessorList())
    with pytest.warns(UserWarning, match="sets top_h"):
        _compat.apply_draft_warpers_once(drafter)


def test_greedy_drafter_keeps_a_valid_generation_config():
    """Greedy builds no sampling warper, so the sampling fields stay as they were: a ``top_k`` of 0 without
    ``do_sample`` is a config transformers flags as invalid (a warning on every user's first greedy call)."""
    draft = build_tiny("llama", hidden=32, layers=1, seed=3)
    config = GenerationConfig(do_sample=False, eos_token_id=1, max_length=30, watermarking_config=None)
    ids = torch.tensor([[3, 4, 5]])
    drafter = _compat.AssistedCandidateGenerator(ids, draft, config, {}, logits_processor=LogitsProcessorList())
    _compat.apply_draft_warpers_once(drafter)
    drafter.generation_config.validate(strict=True)
    assert drafter.generation_config.renormalize_logits is False


def test_greedy_sampler_passes_a_valid_generation_config():
    """The batched sampler's greedy settings leave the sampling fields out (as generate's greedy callers do): a
    ``top_k`` without ``do_sample`` is a config transformers flags as invalid, a warning on every greedy run."""
    from hf_diversed.generation.batched import SamplerConfig

    model = build_tiny("llama", hidden=32, layers=1, seed=0)
    for do_sample in (False, True):
        _, config = _compat.generation_logits_processors(model, **SamplerConfig(do_sample=do_sample).generate_kwargs())
        config.validate(strict=True)


@torch.no_grad()
def test_batched_sampler_internals():
    """What the batched sampler relies on: generate's processor machinery and DynamicCache's layer tensors."""
    from conftest import build_tiny
    from transformers import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

    sigs = _compat.private_signatures()
    assert list(sigs["_prepare_generation_config"].parameters)[:2] == ["self", "generation_config"]
    assert list(sigs["_prepare_special_tokens"].parameters)[:2] == ["self", "generation_config"]
    assert {"generation_config", "input_ids_seq_length", "device", "model_kwargs"} <= set(
        sigs["_get_logits_processor"].parameters
    )
    model = build_tiny("llama", hidden=32, layers=1, seed=0)
    processors, config = _compat.generation_logits_processors(
        model, do_sample=True, temperature=0.5, top_k=0, top_p=1.0, repetition_penalty=1.2
    )
    assert [type(p) for p in processors] == [RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper]
    assert config.eos_token_id == model.generation_config.eos_token_id
    assert _compat.supports_logits_to_keep(model)

    ids = torch.tensor([[3, 4, 5, 6]], device=model.device)
    cache = model(ids, use_cache=True).past_key_values
    _compat.check_batchable_cache(cache, "the model")
    short = model(ids[:, :2], use_cache=True).past_key_values
    stacked = _compat.slot_cache([cache, short], [1, 2])
    assert [layer.keys.shape[:3] for layer in stacked.layers] == [(3, 2, 4)]
    assert torch.equal(stacked.layers[0].keys[1:, :, 2:], short.layers[0].keys.expand(2, -1, -1, -1))
    assert stacked.layers[0].keys[1:, :, :2].abs().sum() == 0  # left padding
    # a decode step through the slot cache equals one through the DynamicCache it was built from
    step = dict(input_ids=torch.tensor([[7]], device=model.device), use_cache=True)
    mask = torch.ones(1, 5, dtype=torch.long, device=model.device)
    dynamic = copy.deepcopy(cache)
    slot = _compat.slot_cache([cache], [1])
    a = model(**step, attention_mask=mask, past_key_values=dynamic).logits
    b = model(**step, attention_mask=mask, past_key_values=slot).logits
    assert torch.equal(a, b) and slot.get_seq_length() == 5
    assert torch.equal(slot.layers[0].keys, dynamic.layers[0].keys)
    for _ in range(_compat.SlotLayer.room + 1):  # past the spare room: the buffers grow
        slot.layers[0].update(*(t[:, :, -1:] for t in (dynamic.layers[0].keys, dynamic.layers[0].values)))
    assert slot.layers[0].keys.shape[2] == 5 + _compat.SlotLayer.room + 1
    assert torch.equal(slot.layers[0].keys[:, :, :5], dynamic.layers[0].keys)
    # rows are slots: overwrite one with a prefix (right-aligned), drop and prepend columns, compact
    _compat.cache_write_rows(stacked, [0], short)
    assert torch.equal(stacked.layers[0].keys[0, :, 2:], short.layers[0].keys[0])
    assert (
        _compat.cache_write_rows(
            stacked, [2], model(torch.arange(3, 9, device=model.device)[None], use_cache=True).past_key_values
        )
        == 2
    )
    assert stacked.get_seq_length() == 6 and stacked.layers[0].keys[:2, :, :2].abs().sum() == 0
    _compat.cache_select_rows(stacked, torch.tensor([2, 1]))  # a CPU index serves a cache on any device
    _compat.cache_drop_leading(stacked, 2)
    assert stacked.layers[0].keys.shape[:3] == (2, 2, 4) and stacked.get_seq_length() == 4
    assert torch.equal(stacked.layers[0].keys[1, :, 2:], short.layers[0].keys[0])
    _compat.cache_add_rows(stacked, 1)
    assert stacked.layers[0].keys.shape[:3] == (3, 2, 4) and stacked.layers[0].keys[2].abs().sum() == 0


def test_grouped_attention_on_cpu_is_scoped_to_its_block():
    """Inside the block, CPU attention with a mask attends grouped key/value heads in place; outside it, and on
    other devices, transformers decides as before."""
    from transformers.integrations import sdpa_attention

    key = value = torch.zeros(1, 2, 5, 8)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    assert sdpa_attention.use_gqa_in_sdpa is _compat.original_use_gqa_in_sdpa  # transformers' own, outside
    assert sdpa_attention.use_gqa_in_sdpa(mask, key, value) is False  # transformers copies the heads
    with _compat.grouped_attention_on_cpu():
        assert sdpa_attention.use_gqa_in_sdpa(mask, key, value) is True
        if torch.cuda.is_available():
            on_gpu = key.cuda()
            assert sdpa_attention.use_gqa_in_sdpa(mask, on_gpu, on_gpu) is False
    assert sdpa_attention.use_gqa_in_sdpa is _compat.original_use_gqa_in_sdpa


@pytest.mark.skipif(DEVICE.type != "cpu", reason="grouped attention in place is a CPU path")
def test_diversed_generate_verifies_without_copying_key_value_heads(llama_pair, monkeypatch):
    """A DIVERSED generate on CPU never calls transformers' ``repeat_kv`` (its verification forwards have a mask
    and N + 1 query positions), and emits the same tokens as with the copies."""
    from transformers.integrations import sdpa_attention

    target, draft = llama_pair
    prompt = prompts(1, length=30)[0]

    def run() -> torch.Tensor:
        torch.manual_seed(0)
        return target.generate(
            prompt, assistant_model=draft, diversed_verifier="static:0.5", do_sample=True, max_new_tokens=40
        )

    copies = []
    repeat_kv = sdpa_attention.repeat_kv

    def counting_repeat_kv(states, n_rep):
        copies.append(n_rep)
        return repeat_kv(states, n_rep)

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counting_repeat_kv)
    grouped = run()
    assert copies == []
    monkeypatch.setattr(_compat.grouped_attention_patch, "replacement", _compat.original_use_gqa_in_sdpa)
    copied = run()
    assert copies  # transformers' own path copies the heads in these forwards
    assert torch.equal(grouped, copied)


def test_static_cache_rewinds_by_position():
    """The static loop's rollback: a StaticCache set back to L positions continues as if only those were written
    (transformers' StaticLayer writes at its own counter, and the causal mask hides what lies beyond it)."""
    model = build_tiny("llama", hidden=64, layers=2, seed=0)
    ids, rejected, accepted = prompts(1, length=9, seed=4)[0], prompts(1, length=4, seed=5)[0], prompts(1, length=3)[0]
    with torch.no_grad():
        reference = model(torch.cat([ids, accepted], 1)).logits[:, -3:]
        cache = _compat.static_cache(model, 64)
        model(ids, past_key_values=cache, use_cache=True)
        model(rejected, past_key_values=cache, use_cache=True)  # a rejected draft block, then set back
        _compat.rewind_static_cache(cache, ids.shape[1])
        assert int(cache.get_seq_length()) == ids.shape[1]
        logits = model(accepted, past_key_values=cache, use_cache=True).logits
        torch.testing.assert_close(logits, reference, atol=1e-4, rtol=0)
        assert _compat.static_cache(model, 32) is cache  # reused (same buffers) by a call that fits, at position 0
        assert int(cache.get_seq_length()) == 0
    delattr(model, "_hf_diversed_static_cache")


def test_windowed_static_layer_matches_transformers_static_cache():
    """The static loop's layers attend over a window of their buffer: for any window covering the written positions
    the logits are transformers' own StaticCache's, whose attention reads the whole buffer, through a rollback."""
    sigs = _compat.private_signatures()
    assert list(sigs["StaticLayer.update"].parameters)[:3] == ["self", "key_states", "value_states"]
    assert list(sigs["StaticLayer.get_mask_sizes"].parameters) == ["self", "query_length"]
    model = build_tiny("llama", hidden=64, layers=2, seed=0)
    ids, rejected, accepted = prompts(1, length=9, seed=4)[0], prompts(1, length=4, seed=5)[0], prompts(1, length=3)[0]

    def run(cache, window_for):
        with torch.no_grad():
            window_for(cache, ids.shape[1])
            model(ids, past_key_values=cache, use_cache=True)
            window_for(cache, ids.shape[1] + rejected.shape[1])
            model(rejected, past_key_values=cache, use_cache=True)
            _compat.rewind_static_cache(cache, ids.shape[1])
            window_for(cache, ids.shape[1] + accepted.shape[1])
            return model(accepted, past_key_values=cache, use_cache=True).logits

    reference = run(_compat.StaticCache(config=model.config, max_cache_len=64), lambda cache, length: None)
    for smallest in (4, 16, 64):
        windows = []

        def window_for(cache, length, smallest=smallest, windows=windows):
            windows.append(_compat.static_window(length, 64, smallest))
            for layer in cache.layers:
                layer.window = windows[-1]

        logits = run(_compat.windowed_static_cache(model.config, 64), window_for)
        torch.testing.assert_close(logits, reference, atol=1e-5, rtol=0)
        assert max(windows) <= 64 and (smallest == 64 or min(windows) < 64), windows


def test_padded_pair_validation_is_scoped_to_a_diversed_call():
    """transformers reads a draft with fewer ids as another tokenizer; inside a DIVERSED call on such a pair (and only
    there) ``_validate_generation_mode`` runs without the draft, after hf_diversed's own ``check_pair``."""
    sigs = _compat.private_signatures()
    params = ["self", "generation_mode", "generation_config", "generation_mode_kwargs"]
    assert list(sigs["_validate_generation_mode"].parameters) == params
    gm = transformers.GenerationMixin
    assert gm._validate_generation_mode is _compat.original_validate_generation_mode
    target = build_tiny("llama", hidden=32, layers=1, seed=0)
    draft = build_tiny("llama", hidden=32, layers=1, seed=1)
    target.resize_token_embeddings(target.config.vocab_size + 16, mean_resizing=False)
    ids = prompts(1)[0]
    with pytest.raises(ValueError, match="different tokenizers"):  # a plain assisted call: transformers' own check
        target.generate(ids, assistant_model=draft, max_new_tokens=2)
    seen = []
    hook = target.register_forward_pre_hook(lambda *_: seen.append(gm._validate_generation_mode))
    try:
        target.generate(ids, assistant_model=draft, diversed_verifier="exact", max_new_tokens=2)
    finally:
        hook.remove()
    assert seen and seen[0] is _compat.padded_pair_validation.replacement
    assert gm._validate_generation_mode is _compat.original_validate_generation_mode
