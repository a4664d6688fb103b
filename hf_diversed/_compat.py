"""The only module that touches transformers' private generation internals.

Tested against transformers 5.23 (pinned in pyproject.toml); ``tests/test_compat.py`` checks that the
private names and signatures used here still exist, and the parity tests pin behaviour against
transformers' own assisted generation.

What is patched, once, on ``import hf_diversed``:
- ``GenerationMixin.generate`` accepts ``diversed_head=`` and ``diversed_verifier=``; without them it is
  the original function, called with the same arguments.
- ``GenerationMixin._assisted_decoding`` runs hf_diversed's loop while a DIVERSED ``generate`` call is in
  progress (a context variable carries its settings), and the original loop otherwise.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any

import transformers
from packaging.version import Version
from transformers.cache_utils import StaticCache
from transformers.generation import AssistedCandidateGenerator, CandidateGenerator, GenerateDecoderOnlyOutput
from transformers.generation.candidate_generator import (
    _prepare_attention_mask,
    _prepare_position_ids,
    _prepare_token_type_ids,
)
from transformers.generation.utils import ALL_CACHE_NAMES, GenerationMixin, _split_model_outputs

TESTED_TRANSFORMERS = (Version("5.23.0"), Version("5.24.0"))  # [low, high)

__all__ = [
    "ALL_CACHE_NAMES",
    "AssistedCandidateGenerator",
    "CandidateGenerator",
    "GenerateDecoderOnlyOutput",
    "StaticCache",
    "active_settings",
    "check_transformers_version",
    "install",
    "original_assisted_decoding",
    "original_generate",
    "prepare_attention_mask",
    "prepare_position_ids",
    "prepare_token_type_ids",
    "split_model_outputs",
]

prepare_attention_mask = _prepare_attention_mask
prepare_position_ids = _prepare_position_ids
prepare_token_type_ids = _prepare_token_type_ids
split_model_outputs = _split_model_outputs

original_generate: Callable[..., Any] = getattr(
    GenerationMixin.generate, "__hf_diversed_original__", GenerationMixin.generate
)
original_assisted_decoding: Callable[..., Any] = getattr(
    GenerationMixin._assisted_decoding, "__hf_diversed_original__", GenerationMixin._assisted_decoding
)

# Settings of the DIVERSED generate call in progress (None outside one).
active_settings: contextvars.ContextVar[Any] = contextvars.ContextVar("hf_diversed_settings", default=None)


def check_transformers_version() -> None:
    """Raise if the installed transformers is outside the range this module was tested with."""
    version = Version(transformers.__version__)
    low, high = TESTED_TRANSFORMERS
    if not (low <= version < high):
        raise ImportError(
            f"hf_diversed supports transformers >={low},<{high} (it hooks into assisted generation internals), "
            f"found {version}. Install a supported version: pip install 'transformers>={low},<{high}'."
        )


def install(generate_hook: Callable[..., Any], decoding_loop: Callable[..., Any]) -> None:
    """Patch ``GenerationMixin`` so ``generate`` routes DIVERSED arguments to ``generate_hook``.

    ``generate_hook(model, original_generate, *args, **kwargs)`` handles calls that carry DIVERSED
    arguments; ``decoding_loop(model, settings, *args, **kwargs)`` replaces the assisted-decoding loop
    while ``active_settings`` is set.
    """

    @functools.wraps(original_generate)
    def generate(self, *args, **kwargs):
        if "diversed_head" in kwargs or "diversed_verifier" in kwargs:
            return generate_hook(self, original_generate, *args, **kwargs)
        return original_generate(self, *args, **kwargs)

    @functools.wraps(original_assisted_decoding)
    def _assisted_decoding(self, *args, **kwargs):
        settings = active_settings.get()
        if settings is None:
            return original_assisted_decoding(self, *args, **kwargs)
        return decoding_loop(self, settings, *args, **kwargs)

    generate.__hf_diversed_original__ = original_generate
    _assisted_decoding.__hf_diversed_original__ = original_assisted_decoding
    GenerationMixin.generate = generate
    GenerationMixin._assisted_decoding = _assisted_decoding


def private_signatures() -> dict[str, inspect.Signature]:
    """Signatures of the private callables this package relies on (checked by a canary test)."""
    return {
        "_assisted_decoding": inspect.signature(original_assisted_decoding),
        "_prepare_attention_mask": inspect.signature(_prepare_attention_mask),
        "_prepare_position_ids": inspect.signature(_prepare_position_ids),
        "_prepare_token_type_ids": inspect.signature(_prepare_token_type_ids),
        "_split_model_outputs": inspect.signature(_split_model_outputs),
        "AssistedCandidateGenerator.__init__": inspect.signature(AssistedCandidateGenerator.__init__),
    }
