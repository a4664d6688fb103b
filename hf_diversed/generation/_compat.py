"""The only module that touches transformers' private generation internals.

Tested against transformers 5.23 (pinned in pyproject.toml); ``tests/test_compat.py`` checks that the
private names and signatures used here still exist, and the parity tests pin behaviour against
transformers' own assisted generation.

What is patched, and when:
- On ``import hf_diversed``, only ``GenerationMixin.generate``: it accepts ``diversed_head=`` and
  ``diversed_verifier=``; a call without them (and without ``assistant_model``) goes straight to the original
  function with the same arguments, and one with ``assistant_model`` only applies the draft's saved vocabulary.
- While a DIVERSED ``generate`` runs (``diversed_call``), and only then, ``GenerationMixin._assisted_decoding``
  runs hf_diversed's loop for that call (a context variable carries its settings; other threads' calls get the
  original loop) and ``transformers.integrations.sdpa_attention.use_gqa_in_sdpa`` answers True for CPU tensors
  (``grouped_attention_on_cpu``). Both are restored when the last such call returns, so code that never passes
  the DIVERSED arguments runs, traces and compiles exactly as without hf_diversed.
- While a DIVERSED ``generate`` on a padded pair runs (a draft with fewer ids than the target, one tokenizer), and
  only then, ``GenerationMixin._validate_generation_mode`` validates that call without its draft: transformers
  reads differing vocabulary sizes as two tokenizers and asks for universal assisted decoding, which hf_diversed
  refuses; ``check_pair`` has checked the pair instead (``padded_pair_validation``).

Not patches: ``apply_draft_warpers_once`` edits one ``AssistedCandidateGenerator``'s private generation
config so that hf_diversed's loop samples the draft with the user's sampling warpers applied once, and
``draft_with_config_only`` has it pass the draft's ``generate`` that config alone (no generation kwargs); the
static-cache loop sets ``StaticLayer.cumulative_length`` (the cache's write position) back to roll a rejected draft back
(``rewind_static_cache``) and its caches' layers attend over a window of their positions
(``WindowedStaticLayer``, a subclass of transformers' ``StaticLayer``); the benchmarks set
``CompileConfig._compile_all_devices`` so that transformers' own static-cache ``generate`` compiles on a CPU too
(``compile_on_every_device``).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers.cache_utils import DynamicCache, DynamicLayer, StaticCache, StaticLayer
from transformers.generation import (
    AssistedCandidateGenerator,
    CandidateGenerator,
    CompileConfig,
    GenerateDecoderOnlyOutput,
)
from transformers.generation.candidate_generator import (
    _prepare_attention_mask,
    _prepare_position_ids,
    _prepare_token_type_ids,
)
from transformers.generation.utils import ALL_CACHE_NAMES, GenerationMixin, _split_model_outputs
from transformers.integrations import sdpa_attention

TESTED_TRANSFORMERS = (Version("5.23.0"), Version("5.24.0"))  # [low, high)

__all__ = [
    "ALL_CACHE_NAMES",
    "AssistedCandidateGenerator",
    "CandidateGenerator",
    "GenerateDecoderOnlyOutput",
    "ScopedPatch",
    "StaticCache",
    "active_settings",
    "apply_draft_warpers_once",
    "cache_add_rows",
    "cache_drop_leading",
    "cache_select_rows",
    "cache_write_rows",
    "check_batchable_cache",
    "check_transformers_version",
    "compile_on_every_device",
    "diversed_call",
    "generation_logits_processors",
    "grouped_attention_on_cpu",
    "grouped_attention_patch",
    "install",
    "original_assisted_decoding",
    "original_generate",
    "original_validate_generation_mode",
    "padded_pair_validation",
    "prepare_attention_mask",
    "prepare_position_ids",
    "prepare_token_type_ids",
    "WindowedStaticLayer",
    "rewind_static_cache",
    "set_static_window",
    "static_cache",
    "static_window",
    "windowed_static_cache",
    "slot_cache",
    "split_model_outputs",
    "supports_logits_to_keep",
]

prepare_attention_mask = _prepare_attention_mask
prepare_position_ids = _prepare_position_ids
prepare_token_type_ids = _prepare_token_type_ids
split_model_outputs = _split_model_outputs

original_generate: Callable[..., Any] = getattr(
    GenerationMixin.generate, "__hf_diversed_original__", GenerationMixin.generate
)
original_assisted_decoding: Callable[..., Any] = GenerationMixin._assisted_decoding

original_use_gqa_in_sdpa: Callable[..., bool] = sdpa_attention.use_gqa_in_sdpa
original_validate_generation_mode: Callable[..., Any] = GenerationMixin._validate_generation_mode

# Settings of the DIVERSED generate call in progress (None outside one).
active_settings: contextvars.ContextVar[Any] = contextvars.ContextVar("hf_diversed_settings", default=None)
_grouped_on_cpu: contextvars.ContextVar[bool] = contextvars.ContextVar("hf_diversed_grouped", default=False)
# torch's SDPA takes enable_gqa (grouped key/value heads attended in place) from 2.5 on
_SDPA_HAS_GQA = Version(torch.__version__).release >= (2, 5)


def check_transformers_version() -> None:
    """Raise if the installed transformers is outside the range this module was tested with.

    Called where hf_diversed touches transformers' private internals (a DIVERSED ``generate``, the batched sampler),
    not on import: the rules, the head and the vLLM integration also run beside another transformers (vLLM's pin).
    """
    version = Version(transformers.__version__)
    low, high = TESTED_TRANSFORMERS
    if not (low <= version < high):
        raise ImportError(
            f"hf_diversed supports transformers >={low},<{high} (it hooks into assisted generation internals), "
            f"found {version}. Install a supported version: pip install 'transformers>={low},<{high}'."
        )


# GenerationConfig fields from which ``GenerationMixin._get_logits_processor`` appends processors *after*
# merging in a custom ``logits_processor`` list, with values for which it appends none.
DRAFT_NEUTRAL_FIELDS: dict[str, Any] = {
    "temperature": 1.0,
    "top_k": 0,  # not None: the draft's generate would fill in the draft's own top_k or the default 50
    "top_p": 1.0,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "top_h": None,
    "watermarking_config": None,
    "renormalize_logits": False,
}
# The fields above that ``_get_logits_processor`` reads only when ``do_sample`` is set.
SAMPLING_WARPER_FIELDS = frozenset(
    {"temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h"}
)


def apply_draft_warpers_once(drafter: AssistedCandidateGenerator) -> None:
    """Make ``drafter`` sample the draft from the target's logits processors applied once.

    transformers 5.23's ``AssistedCandidateGenerator`` calls ``draft.generate(generation_config=<its copy of
    the target's config>, logits_processor=<the target's processors, sampling warpers included>)``, and that
    ``generate`` appends the sampling warpers (and watermarking, ``LogitNormalization``) built from the config
    once more: temperature T acts as T², top-p cuts twice. This sets those fields of the drafter's copy
    (``drafter.generation_config``, private) to values that build no processor, so the draft's scores are the
    target's list applied once to the draft's logits. The draft's ``generate`` fills fields left ``None`` from
    the draft's own ``generation_config``: a ``min_p`` there becomes the no-op ``min_p=0.0``; a ``top_h`` or
    ``watermarking_config`` there would still apply to the draft, and a warning says so.
    """
    config = drafter.generation_config
    for key, value in DRAFT_NEUTRAL_FIELDS.items():
        # greedy builds no sampling warper, and a top_k of 0 there makes transformers warn that it is unused
        if config.do_sample or key not in SAMPLING_WARPER_FIELDS:
            setattr(config, key, value)
    own = getattr(drafter.assistant_model, "generation_config", None)
    if own is None:
        return
    if getattr(own, "min_p", None) is not None:
        config.min_p = 0.0  # MinPLogitsWarper(0.0) is the identity; None would take the draft's min_p
    leaking = [key for key in ("top_h", "watermarking_config") if getattr(own, key, None) is not None]
    if leaking:
        warnings.warn(
            f"assistant_model.generation_config sets {', '.join(leaking)}: transformers' generate applies it to "
            "every drafted token on top of the target's logits processors, so the draft does not sample at the "
            f"target's settings. Set assistant_model.generation_config.{leaking[0]} = None to draft at them.",
            stacklevel=3,
        )


def draft_with_config_only(drafter: AssistedCandidateGenerator) -> None:
    """Make ``drafter`` hand the draft's ``generate`` one generation config and no generation kwargs.

    transformers 5.23's ``AssistedCandidateGenerator`` calls ``draft.generate(generation_config=<its copy>,
    min_new_tokens=..., max_new_tokens=..., use_cache=...)``, and ``generate`` warns that a config together with
    generation kwargs is deprecated. The kwargs only update a copy of the config, so this sets them on the drafter's
    private copy (``drafter.generation_config``, which ``generate`` copies again) instead: the same config, the same
    draft, no warning.
    """
    config = drafter.generation_config
    if "use_cache" in drafter.assistant_kwargs:
        config.use_cache = drafter.assistant_kwargs.pop("use_cache")
    prepare = drafter._prepare_generation_args

    def prepare_with_config_only(input_ids: torch.LongTensor, min_new_tokens: int, max_new_tokens: int) -> dict:
        args = prepare(input_ids, min_new_tokens, max_new_tokens)
        config.min_new_tokens, config.max_new_tokens = args.pop("min_new_tokens"), args.pop("max_new_tokens")
        return args

    drafter._prepare_generation_args = prepare_with_config_only


class ScopedPatch:
    """``owner.name = replacement`` while at least one ``with patch:`` block runs (in any thread), else the original.

    Reference-counted, so nested and concurrent blocks install once and the last one out restores the original.
    """

    def __init__(self, owner: Any, name: str, replacement: Callable[..., Any]):
        self.owner, self.name, self.replacement = owner, name, replacement
        self.original = getattr(owner, name)
        self._depth = 0
        self._lock = threading.Lock()

    def __enter__(self) -> ScopedPatch:
        with self._lock:
            if self._depth == 0:
                setattr(self.owner, self.name, self.replacement)
            self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                setattr(self.owner, self.name, self.original)

    @property
    def active(self) -> bool:
        return self._depth > 0


def _use_gqa_in_sdpa(attention_mask, key, value) -> bool:
    # Installed only inside grouped_attention_on_cpu(). Under Dynamo (a forward compiled inside such a block) the
    # context variable cannot be traced, and the patch being installed already says the block is open.
    if key.device.type == "cpu" and key.shape[-1] == value.shape[-1] and _SDPA_HAS_GQA:
        if torch.compiler.is_compiling() or _grouped_on_cpu.get():
            return True
    return original_use_gqa_in_sdpa(attention_mask, key, value)


grouped_attention_patch = ScopedPatch(sdpa_attention, "use_gqa_in_sdpa", _use_gqa_in_sdpa)


def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
    # Installed only inside a DIVERSED call on a padded pair, which check_pair accepted; another thread's plain call
    # (no DIVERSED settings in its context) keeps transformers' check.
    if active_settings.get() is not None:
        generation_mode_kwargs = {k: v for k, v in generation_mode_kwargs.items() if k != "assistant_model"}
    return original_validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs)


padded_pair_validation = ScopedPatch(GenerationMixin, "_validate_generation_mode", _validate_generation_mode)
_assisted_decoding_patch: ScopedPatch | None = None  # set by install()


def install(generate_hook: Callable[..., Any], decoding_loop: Callable[..., Any]) -> None:
    """Patch ``GenerationMixin.generate`` so that it routes DIVERSED arguments to ``generate_hook``.

    ``generate_hook(model, original_generate, *args, **kwargs)`` handles calls that carry DIVERSED
    arguments or an ``assistant_model`` (whose saved draft vocabulary it applies);
    ``decoding_loop(model, settings, *args, **kwargs)`` replaces the assisted-decoding loop inside
    ``diversed_call(settings)``, and nowhere else.
    """
    global _assisted_decoding_patch

    @functools.wraps(original_generate)
    def generate(self, *args, **kwargs):
        if "diversed_head" in kwargs or "diversed_verifier" in kwargs:
            check_transformers_version()  # the loop hooks into this transformers' private generation internals
            return generate_hook(self, original_generate, *args, **kwargs)
        if kwargs.get("assistant_model") is not None:
            return generate_hook(self, original_generate, *args, **kwargs)
        return original_generate(self, *args, **kwargs)

    @functools.wraps(original_assisted_decoding)
    def _assisted_decoding(self, *args, **kwargs):
        settings = active_settings.get()
        if settings is None:  # another thread's plain assisted generate while a DIVERSED call runs
            return original_assisted_decoding(self, *args, **kwargs)
        return decoding_loop(self, settings, *args, **kwargs)

    generate.__hf_diversed_original__ = original_generate
    GenerationMixin.generate = generate
    _assisted_decoding_patch = ScopedPatch(GenerationMixin, "_assisted_decoding", _assisted_decoding)


@contextlib.contextmanager
def diversed_call(settings: Any, padded_pair: bool = False):
    """The scope of one DIVERSED ``generate``: its settings, hf_diversed's assisted loop and grouped attention; with
    ``padded_pair`` (a draft with fewer ids than the target, checked by ``check_pair``), transformers' validation
    of the call without its draft's vocabulary size."""
    if _assisted_decoding_patch is None:
        raise RuntimeError("hf_diversed's generate hook is not installed: `import hf_diversed` first.")
    token = active_settings.set(settings)
    try:
        validation = padded_pair_validation if padded_pair else contextlib.nullcontext()
        with _assisted_decoding_patch, grouped_attention_on_cpu(), validation:
            yield
    finally:
        active_settings.reset(token)


@contextlib.contextmanager
def grouped_attention_on_cpu():
    """Within this block, SDPA attention on CPU attends grouped key/value heads in place (``enable_gqa``).

    transformers' SDPA path copies each key/value head ``num_key_value_groups`` times whenever a forward has
    several query positions and a mask, which is every verification forward of speculative decoding (the
    target scores N + 1 positions) and every multi-token draft forward. torch's CPU kernel computes the same
    attention from the grouped heads directly; the copies cost up to ~7x the attention itself at 700 cached
    positions (``benchmarks/bench_grouped_attention.py``). transformers keeps the copies on CUDA because its
    fused kernels take no mask with grouped heads, so this leaves other devices as they are. The replacement is
    installed for the block only (``ScopedPatch``): outside every block transformers' own function is in place.
    """
    token = _grouped_on_cpu.set(True)
    try:
        with grouped_attention_patch:
            yield
    finally:
        _grouped_on_cpu.reset(token)


# ------------------------------------------------------------------ batched sampler: processors and KV caches
# The batched sampler keeps one DynamicCache per model for a batch of right-aligned rows (left padding) and
# edits it in place when rows leave or join: the functions below are the only code touching cache internals.


def generation_logits_processors(model, **generate_kwargs):
    """The logits processors ``model.generate(**generate_kwargs)`` would build, and its generation config.

    Built by transformers' own ``generate`` machinery (model defaults overridden by ``generate_kwargs``), so a
    sampler applying this list applies exactly what ``generate`` applies, in the same order.
    """
    config, _ = model._prepare_generation_config(None, **generate_kwargs)
    config = copy.deepcopy(config)
    model._prepare_special_tokens(config, True, device=model.device, batch_size=1)
    processors = model._get_logits_processor(
        generation_config=config, input_ids_seq_length=1, device=model.device, model_kwargs={}
    )
    return processors, config


def supports_logits_to_keep(model) -> bool:
    """Whether ``model``'s forward takes ``logits_to_keep`` (prefill then computes only the last position's logits)."""
    check = getattr(model, "_supports_logits_to_keep", None)
    return bool(check()) if check is not None else False


def check_batchable_cache(cache, model_name: str) -> None:
    """Raise unless every layer of ``cache`` is a plain full-attention ``DynamicLayer``."""
    if not isinstance(cache, DynamicCache) or any(type(layer) is not DynamicLayer for layer in cache.layers):
        kinds = sorted({type(layer).__name__ for layer in getattr(cache, "layers", [])}) or [type(cache).__name__]
        raise ValueError(
            f"The batched sampler supports models whose KV cache is a full-attention DynamicCache; {model_name} uses "
            f"{', '.join(kinds)} (e.g. sliding-window layers). Use generate(...) one sequence at a time for it."
        )


class SlotLayer(DynamicLayer):
    """A full-attention cache layer over preallocated buffers (rows, heads, capacity, head_dim).

    ``keys`` / ``values`` are views of the buffers' columns [start, end). A decode step writes its column in place;
    a ``DynamicLayer`` instead copies the whole cache with ``torch.cat`` at every step, which for 128 rows of ~500
    positions costs about a third of a decode step on a CPU. Rows are slots: the sampler overwrites a finished
    row's slot with a new prompt instead of copying the cache to drop one row and append another.
    """

    room = 64  # spare columns added when the buffers are full: one copy of the cache per `room` decode steps

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._reallocate(keys, values, left=0, right=self.room)

    def _reallocate(self, keys: torch.Tensor, values: torch.Tensor, left: int, right: int) -> None:
        """New buffers holding ``keys`` / ``values`` after ``left`` zero columns (part of the live range) and
        before ``right`` spare ones."""
        rows, heads, length, dim = keys.shape
        self._k = keys.new_empty(rows, heads, left + length + right, dim)
        self._v = values.new_empty(rows, heads, left + length + right, dim)
        self._k[:, :, :left].zero_()
        self._v[:, :, :left].zero_()
        self._k[:, :, left : left + length] = keys
        self._v[:, :, left : left + length] = values
        self.start, self.end = 0, left + length
        self._expose()

    def _expose(self) -> None:
        self.keys = self._k[:, :, self.start : self.end]
        self.values = self._v[:, :, self.start : self.end]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        if self.end + n > self._k.shape[2]:
            self._reallocate(self.keys, self.values, left=0, right=n + self.room)
        self._k[:, :, self.end : self.end + n] = key_states
        self._v[:, :, self.end : self.end + n] = value_states
        self.end += n
        self._expose()
        return self.keys, self.values

    def select_rows(self, index: torch.Tensor) -> None:
        index = index.to(self.keys.device)
        self._reallocate(self.keys.index_select(0, index), self.values.index_select(0, index), 0, self.room)

    def add_rows(self, n: int) -> None:
        zeros = self.keys.new_zeros(n, *self.keys.shape[1:])
        self._reallocate(torch.cat([self.keys, zeros]), torch.cat([self.values, zeros]), 0, self.room)

    def drop_leading(self, n: int) -> None:
        self.start += n
        self._expose()

    def extend_left(self, n: int) -> None:
        """Prepend ``n`` zero columns to every row."""
        if n <= self.start:
            self.start -= n
            self._k[:, :, self.start : self.start + n].zero_()
            self._v[:, :, self.start : self.start + n].zero_()
            self._expose()
        else:
            self._reallocate(self.keys, self.values, left=n, right=self._k.shape[2] - self.end)

    def write_rows(self, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Overwrite rows ``slots`` with ``keys`` / ``values`` (1, heads, P, dim), right-aligned: the last P columns."""
        length = keys.shape[2]
        self._k[slots, :, self.end - length : self.end] = keys.expand(len(slots), -1, -1, -1)
        self._v[slots, :, self.end - length : self.end] = values.expand(len(slots), -1, -1, -1)


def slot_cache(caches: list, repeats: list[int]):
    """A new cache of ``SlotLayer`` s holding ``repeats[i]`` copies of the row(s) of each ``caches[i]``.

    Rows are right-aligned: shorter ones are left-padded with zeros (the caller masks those positions). The
    inputs are left unchanged.
    """
    out = copy.copy(caches[0])
    out.layers = []
    for i in range(len(caches[0].layers)):
        keys = [c.layers[i].keys.repeat_interleave(r, 0) for c, r in zip(caches, repeats, strict=True)]
        values = [c.layers[i].values.repeat_interleave(r, 0) for c, r in zip(caches, repeats, strict=True)]
        length = max(k.shape[2] for k in keys)
        out.layers.append(
            SlotLayer(
                torch.cat([_left_pad(k, length) for k in keys]), torch.cat([_left_pad(v, length) for v in values])
            )
        )
    return out


def cache_write_rows(cache, slots: list[int], prefix) -> int:
    """Put the one-row cache ``prefix`` into rows ``slots`` of ``cache``, right-aligned (rows' earlier columns are
    left as they are: the caller masks them). Prepends zero columns to every row first if the prefix is longer
    than the cache. Returns how many columns were prepended."""
    extra = max(0, prefix.get_seq_length() - cache.get_seq_length())
    index = torch.tensor(slots, dtype=torch.long, device=cache.layers[0].keys.device)
    for layer, source in zip(cache.layers, prefix.layers, strict=True):
        if extra:
            layer.extend_left(extra)
        layer.write_rows(index, source.keys, source.values)
    return extra


def cache_select_rows(cache, index: torch.Tensor) -> None:
    """Keep only the batch rows ``index`` (in that order), in place."""
    for layer in cache.layers:
        layer.select_rows(index)


def cache_add_rows(cache, n: int) -> None:
    """Append ``n`` zero rows, in place."""
    for layer in cache.layers:
        layer.add_rows(n)


def cache_drop_leading(cache, n: int) -> None:
    """Drop the first ``n`` positions of every row (columns that are padding in all rows), in place."""
    if n > 0:
        for layer in cache.layers:
            layer.drop_leading(n)


# ------------------------------------------------------------------ static-cache loop: caches and compilation
# transformers' StaticLayer writes each update at its own device counter ``cumulative_length`` (not at a
# ``cache_position`` argument), and models derive positions and the causal mask from it. Setting that counter
# back is a rollback: later writes overwrite the rejected entries, and the mask hides them until then.

_STATIC_CACHE_ATTR = "_hf_diversed_static_cache"

# The smallest attention window of the loop's static caches; windows are WINDOW_MIN * 2**k, capped at the cache's
# length, so a generation of L positions runs at most 1 + log2(L / WINDOW_MIN) graphs per step shape.
WINDOW_MIN = 256


class WindowedStaticLayer(StaticLayer):
    """A ``StaticLayer`` whose attention reads only its first ``window`` positions.

    Writes go to the whole buffer as in ``StaticLayer``; ``update`` returns the views ``keys[:, :, :window]`` and
    ``values[:, :, :window]`` and the causal mask is ``window`` wide. Attention over a static cache costs its length
    at every step (the mask hides what is not written, it does not skip it), so a window just past the written
    positions makes a step's cost follow the sequence, as a dynamic cache's does, with static shapes: ``window``
    is a Python int, so each value is one compiled graph (Dynamo guards on it), and no buffer moves.
    """

    def __init__(self, max_cache_len: int, **kwargs):
        super().__init__(max_cache_len, **kwargs)
        self.window = max_cache_len

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        return keys[:, :, : self.window], values[:, :, : self.window]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.window, 0


def static_cache(model, max_cache_len: int) -> StaticCache:
    """A full-attention ``StaticCache`` of at least ``max_cache_len`` positions for ``model``, rewound to 0, whose
    layers are :class:`WindowedStaticLayer` (window: the whole cache until :func:`set_static_window`).

    Kept on the model and reused by later calls that fit in it (as ``generate`` keeps its own static cache): the
    buffers keep their addresses, so compiled steps and CUDA graphs recorded on them stay valid.
    """
    cache = getattr(model, _STATIC_CACHE_ATTR, None)
    if cache is None or cache.layers[0].max_cache_len < max_cache_len:
        cache = windowed_static_cache(model.config, max_cache_len)
        sliding = [type(layer).__name__ for layer in cache.layers if getattr(layer, "is_sliding", False)]
        if sliding:
            raise ValueError(
                f"cache_implementation='static' with speculative decoding supports full-attention models; "
                f"{type(model).__name__} has {len(sliding)} sliding-window layers, which a rejected draft cannot be "
                "rolled back in. Omit cache_implementation to use the dynamic-cache loop."
            )
        setattr(model, _STATIC_CACHE_ATTR, cache)
    rewind_static_cache(cache, 0)
    return cache


def windowed_static_cache(config, max_cache_len: int) -> StaticCache:
    """A new ``StaticCache`` of ``max_cache_len`` positions whose full-attention layers are
    :class:`WindowedStaticLayer`, as the static loop runs them (sliding-window layers stay as they are, for the
    loop to refuse; measurements of its forwards build their caches here, the loop uses :func:`static_cache`)."""
    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    cache.layers = [
        layer if getattr(layer, "is_sliding", False) else WindowedStaticLayer(max_cache_len=max_cache_len)
        for layer in cache.layers
    ]
    return cache


def static_window(length: int, max_cache_len: int, smallest: int | None = None) -> int:
    """The attention window for ``length`` positions: the smallest ``smallest * 2**k >= length`` (``smallest``
    defaults to :data:`WINDOW_MIN`), capped at ``max_cache_len``."""
    window = smallest or WINDOW_MIN
    while window < length:
        window *= 2
    return min(window, max_cache_len)


def set_static_window(cache: StaticCache, length: int) -> int:
    """Let the next forwards on ``cache`` attend over ``static_window(length)`` positions (they must not write past
    ``length``); returns the window."""
    window = static_window(length, cache.layers[0].max_cache_len)
    for layer in cache.layers:
        layer.window = window
    return window


def rewind_static_cache(cache: StaticCache, length: int) -> None:
    """Make ``cache`` hold its first ``length`` positions (in place, on the device: no copy, no host sync)."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(length)  # a tensor from construction on (moved to the device on first use)


def compile_on_every_device(config: CompileConfig | None = None) -> CompileConfig:
    """A copy of ``config`` with which ``generate`` compiles the forward on any device, the CPU included.

    transformers compiles a static-cache ``generate`` automatically only on accelerators; its flag for other
    devices is private (``CompileConfig._compile_all_devices``). The benchmarks use this for the target-alone
    baseline at its best on a CPU.
    """
    config = copy.deepcopy(config) if config is not None else CompileConfig()
    config._compile_all_devices = True
    return config


def _left_pad(x: torch.Tensor, length: int) -> torch.Tensor:
    pad = length - x.shape[2]
    return x if pad == 0 else torch.cat([x.new_zeros(*x.shape[:2], pad, x.shape[3]), x], dim=2)


def private_signatures() -> dict[str, inspect.Signature]:
    """Signatures of the private callables this package relies on (checked by a canary test)."""
    return {
        "_assisted_decoding": inspect.signature(original_assisted_decoding),
        "_prepare_attention_mask": inspect.signature(_prepare_attention_mask),
        "_prepare_position_ids": inspect.signature(_prepare_position_ids),
        "_prepare_token_type_ids": inspect.signature(_prepare_token_type_ids),
        "_split_model_outputs": inspect.signature(_split_model_outputs),
        "AssistedCandidateGenerator.__init__": inspect.signature(AssistedCandidateGenerator.__init__),
        "AssistedCandidateGenerator._prepare_generation_args": inspect.signature(
            AssistedCandidateGenerator._prepare_generation_args
        ),
        "_prepare_generation_config": inspect.signature(GenerationMixin._prepare_generation_config),
        "_prepare_special_tokens": inspect.signature(GenerationMixin._prepare_special_tokens),
        "_get_logits_processor": inspect.signature(GenerationMixin._get_logits_processor),
        "_validate_generation_mode": inspect.signature(original_validate_generation_mode),
        "use_gqa_in_sdpa": inspect.signature(original_use_gqa_in_sdpa),
        "StaticLayer.update": inspect.signature(StaticLayer.update),
        "StaticLayer.get_mask_sizes": inspect.signature(StaticLayer.get_mask_sizes),
    }
