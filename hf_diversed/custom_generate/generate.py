"""DIVERSED relaxed speculative decoding as a transformers ``custom_generate`` recipe.

This file ships in every DIVERSED head repository (``custom_generate/generate.py``) and is standalone: it
imports only torch, transformers' public API, huggingface_hub, safetensors and the standard library, so it
runs without hf-diversed installed::

    out = target.generate(
        input_ids, assistant_model=draft, custom_generate="org/head-gsm8k", trust_remote_code=True,
        do_sample=True, max_new_tokens=128,
    )

The maths. ``p_t`` is the target's and ``q_t`` the draft's next-token distribution at position ``t``, after
the logits processors (repetition penalty; with sampling also temperature, top-k, top-p, in transformers'
order), applied once to each model's logits, as in hf-diversed (transformers' own assisted drafting applies the
sampling warpers to the draft twice); see also ``DRAFT_MASKS_PAD_TOKENS``. The ensemble head maps the two models'
last hidden states at the position that predicts token ``t`` (the inputs of their LM heads) to a weight::

    z_t = f([n(h_draft_t); n(h_target_t)])                 n: RMS norm (if normalize_features), f: Linear or
    w_t = w0 + tanh(z_t) * (1 - w0 if z_t > 0 else w0)    Linear-SiLU-Linear, all in float32, w_t in [0, 1]

and verification targets the mixture ``nu_t = w_t * p_t + (1 - w_t) * q_t``. Per round the draft proposes
``N`` tokens (``num_assistant_tokens``, fixed) and the target scores them in one forward pass.

- Sampling: ``x_t ~ q_t`` is accepted with probability ``min(1, nu_t(x)/q_t(x)) = min(1, 1 - w_t + w_t
  p_t(x)/q_t(x))``; at the first rejection the token is resampled from ``norm(max(0, p_t - q_t))`` (equal to
  ``norm(max(0, nu_t - q_t))`` because ``nu_t - q_t = w_t (p_t - q_t)``); after a fully accepted block a bonus
  token is drawn from ``p_{N+1}``. Every emitted token is distributed exactly as ``nu_t`` given its prefix
  (the bonus as ``p``), and a drafted token is accepted with probability ``1 - w_t * TV(p_t, q_t)``.
- Greedy (``do_sample=False``): the draft proposes ``argmax q_t``; it is accepted iff it equals
  ``argmax nu_t``; the first rejected position emits ``argmax nu_t``; the bonus is ``argmax p_{N+1}``.

A draft with fewer ids than the target, its vocabulary a prefix of the target's (one tokenizer, the target's extra
rows padding, e.g. Qwen2.5-0.5B for Qwen2.5-7B), works as it is: ``q_t`` is 0 on the ids only the target has, so
the residual keeps ``p_t``'s mass there, and the draft reads such an id in its context as its own last id.

These are the rules of hf-diversed's ``Diversed`` verifier, with the same random draws in the same order, so
with a fixed ``num_assistant_tokens`` the tokens equal those of ``target.generate(..., diversed_head=...)``
with hf-diversed (greedy, and sampling under the same seed). Differences: the draft length is fixed (default
``DEFAULT_NUM_ASSISTANT_TOKENS`` where neither the call nor the draft's generation_config sets it, where
transformers would draft up to 20 tokens and stop early below a confidence of 0.4); an adaptive length (a
schedule other than "constant", ``assistant_confidence_threshold > 0``) raises. What this file does not
implement (batches, beams, returning dicts, user logits processors or stopping criteria, other sampling
options, ...) raises a ``ValueError`` that names the fix; install hf-diversed for full ``generate`` support.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download
from safetensors.torch import load_file
from transformers import (
    DynamicCache,
    GenerationConfig,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

# The head this repository holds; the hf-diversed exporter writes the repository id (or directory) here.
HEAD_REPO_ID = "__DIVERSED_HEAD_REPO_ID__"
_PLACEHOLDER = "__DIVERSED_" + "HEAD_REPO_ID__"  # spelled apart, so that the exporter rewrites only the line above

DEFAULT_NUM_ASSISTANT_TOKENS = 5
# As transformers 5.23's assisted generation and hf-diversed: each round the draft's generate call infers an
# attention mask from its input, so tokens equal to pad_token_id (when it differs from EOS) are masked out of
# the draft's context. False lets the draft attend to every token.
DRAFT_MASKS_PAD_TOKENS = True
_FULL_SUPPORT = (
    "install hf-diversed for full generate support: pip install hf-diversed; then call "
    "target.generate(..., assistant_model=draft, diversed_head=<this head>) without custom_generate"
)

# Generation options this file implements. Everything else must be unset or at its neutral value.
_HONOURED = {
    "max_new_tokens",
    "max_length",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "eos_token_id",
    "pad_token_id",
    "bos_token_id",
    "use_cache",
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
}
# Options without any effect on single-beam assisted decoding (bookkeeping, beam-only, compile-only).
_NO_EFFECT = {
    "transformers_version",
    "_from_model_config",
    "decoder_start_token_id",
    "assistant_lookbehind",
    "target_lookbehind",
    "early_stopping",
    "length_penalty",
    "max_matching_ngram_size",
    "disable_compile",
    "compile_config",
    "low_memory",
    "is_assistant",
}
_NEUTRAL: dict[str, tuple] = {
    "num_beams": (1,),
    "num_beam_groups": (1,),
    "num_return_sequences": (1,),
    "min_length": (0,),
    "min_new_tokens": (0,),
    "typical_p": (1.0,),
    "epsilon_cutoff": (0.0,),
    "eta_cutoff": (0.0,),
    "encoder_repetition_penalty": (1.0,),
    "encoder_no_repeat_ngram_size": (0,),
    "no_repeat_ngram_size": (0,),
    "remove_invalid_values": (False,),
    "renormalize_logits": (False,),
    "output_attentions": (False,),
    "output_hidden_states": (False,),
    "output_scores": (False,),
    "output_logits": (False,),
    "return_dict_in_generate": (False,),
    "diversity_penalty": (0.0,),
    "guidance_scale": (1.0,),
    "token_healing": (False,),
    "use_mtp": (False,),
    "cache_implementation": ("dynamic", "hybrid"),  # transformers treats "hybrid" as the default dynamic cache
}
# Options transformers gives a default to, so that a draft's own generation_config never supplies them.
_HAS_GLOBAL_DEFAULT = {
    "max_length",
    "min_length",
    "do_sample",
    "use_cache",
    "early_stopping",
    "num_beams",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "num_return_sequences",
    "output_scores",
    "return_dict_in_generate",
    "remove_invalid_values",
    "epsilon_cutoff",
    "eta_cutoff",
    "encoder_repetition_penalty",
}
_HINTS = {
    "return_dict_in_generate": "this custom_generate returns a LongTensor of sequences only",
    "num_beams": "speculative decoding runs one beam",
    "num_return_sequences": "call generate once per sample",
    "assistant_ensemble_weight": "the head chooses the mixture weight; drop assistant_ensemble_weight",
    "prompt_lookup_num_tokens": "that selects prompt-lookup decoding instead of a draft model",
    "assistant_early_exit": "that selects self-speculation instead of a draft model",
}


# ----------------------------------------------------------------------------------------------- the head


def _rms_normalize(h: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


class EnsembleHead:
    """The DIVERSED head's forward (``DiversedHead`` of hf-diversed) from its config and safetensors weights.

    ``weight(h_draft (B, T, D_draft), h_target (B, T, D_target)[, p, q (B, T, V)]) -> w (B, T)`` in float32;
    a head with ``use_distribution_features`` also reads max p, max q and TV(p, q) per position.
    """

    def __init__(self, config: dict[str, Any], weights: dict[str, torch.Tensor], name: str = "head"):
        if config.get("model_type") != "diversed_head":
            raise ValueError(
                f"{name!r} holds a {config.get('model_type')!r} model, not a DIVERSED head (model_type "
                "'diversed_head'). Pass diversed_head=<a DIVERSED head repository or directory>."
            )
        if config.get("verification", "mixture") != "mixture":
            raise ValueError(
                f"{name!r} is a lenience head (it sets lossy SD's lenience per position), which this generate does "
                "not run: pip install hf-diversed and call target.generate(..., assistant_model=draft, "
                "diversed_head=<this head>) without custom_generate."
            )
        self.name = name
        self.config = config
        self.draft_hidden_size = int(config["draft_hidden_size"])
        self.target_hidden_size = int(config["target_hidden_size"])
        self.init_weight = float(config.get("init_weight", 0.5))
        self.normalize_features = bool(config.get("normalize_features", True))
        self.has_hidden = int(config.get("head_hidden_size", 0) or 0) > 0
        self.use_distribution_features = bool(config.get("use_distribution_features", False))
        needed = ["out.weight", "out.bias"] + (["hidden.weight", "hidden.bias"] if self.has_hidden else [])
        missing = [key for key in needed if key not in weights]
        if missing:
            raise ValueError(f"The DIVERSED head {name!r} lacks the weights {missing}; re-export it with hf-diversed.")
        self.params = {key: weights[key].float() for key in needed}

    def to(self, device: torch.device | str) -> EnsembleHead:
        self.params = {key: value.to(device) for key, value in self.params.items()}
        return self

    def check_models(self, target: torch.nn.Module, draft: torch.nn.Module) -> None:
        """Raise unless the head was built for the hidden sizes of ``target`` and ``draft``."""
        actual = (target.config.get_text_config().hidden_size, draft.config.get_text_config().hidden_size)
        expected = (self.target_hidden_size, self.draft_hidden_size)
        if actual != expected:
            raise ValueError(
                f"The DIVERSED head {self.name!r} was built for target/draft hidden sizes {expected[0]}/{expected[1]}, "
                f"but the models have {actual[0]}/{actual[1]}. Use the models it was trained for (target_model="
                f"{self.config.get('target_model')!r}, draft_model={self.config.get('draft_model')!r}), or a head "
                "trained for your pair: pass diversed_head=<that head's repository or directory>."
            )

    def weight(
        self,
        draft_hidden_states: torch.Tensor,
        target_hidden_states: torch.Tensor,
        p: torch.Tensor | None = None,
        q: torch.Tensor | None = None,
    ) -> torch.Tensor:
        sizes = (draft_hidden_states.shape[-1], target_hidden_states.shape[-1])
        if sizes != (self.draft_hidden_size, self.target_hidden_size):
            raise ValueError(
                f"The DIVERSED head {self.name!r} expects draft/target hidden states of widths "
                f"{self.draft_hidden_size}/{self.target_hidden_size}, got {sizes[0]}/{sizes[1]}. Use a head "
                "trained for this model pair (diversed_head=...)."
            )
        h_d, h_t = draft_hidden_states.float(), target_hidden_states.float()
        if self.normalize_features:
            h_d, h_t = _rms_normalize(h_d), _rms_normalize(h_t)
        parts = [h_d, h_t]
        if self.use_distribution_features:
            if p is None or q is None:
                raise ValueError(f"The DIVERSED head {self.name!r} reads the next-token laws: pass p and q.")
            p, q = p.float(), q.float()
            parts.append(torch.stack([p.amax(-1), q.amax(-1), 0.5 * (p - q).abs().sum(-1)], dim=-1))
        x = torch.cat(parts, dim=-1)
        params = self.params
        if self.has_hidden:
            x = torch.nn.functional.silu(torch.nn.functional.linear(x, params["hidden.weight"], params["hidden.bias"]))
        z = torch.nn.functional.linear(x, params["out.weight"], params["out.bias"]).squeeze(-1)
        w0 = self.init_weight
        return w0 + torch.tanh(z) * torch.where(z > 0, 1.0 - w0, w0)


def load_head(name_or_path: str | os.PathLike) -> EnsembleHead:
    """Load a head from a local directory or a Hub id (the Hub, or the local HF cache when offline)."""
    name = os.fspath(name_or_path)
    if os.path.isdir(name):
        folder = Path(name)
    else:
        try:
            folder = Path(snapshot_download(name, allow_patterns=["config.json", "model.safetensors"]))
        except Exception as err:  # re-raised with the fix named
            offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
            where = "the local Hugging Face cache (HF_HUB_OFFLINE is set)" if offline else "the Hub"
            raise OSError(
                f"Could not load the DIVERSED head {name!r}: it is not a local directory and could not be found in "
                f"{where}. Pass diversed_head=<a directory with config.json and model.safetensors>, or download "
                f"the repository first (`hf download {name}`). Cause: {type(err).__name__}: {err}"
            ) from err
    files = [folder / "config.json", folder / "model.safetensors"]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise OSError(
            f"The DIVERSED head {name!r} lacks {', '.join(missing)} (looked in {folder}). Pass a head saved with "
            "DiversedHead.save_pretrained (config.json + model.safetensors)."
        )
    config = json.loads(files[0].read_text())
    return EnsembleHead(config, load_file(str(files[1])), name=name)


# --------------------------------------------------------------------------------------- verification


def _leading_true(accepted: torch.Tensor) -> torch.Tensor:
    """Length of the all-True prefix of each row: ``(B, gamma) -> (B,)``."""
    return (~accepted).cumsum(-1).eq(0).sum(-1)


def _row_at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[b, index[b]]`` for ``x`` of shape (B, L, V): ``(B, V)``."""
    return x.gather(1, index.view(-1, 1, 1).expand(-1, 1, x.shape[-1])).squeeze(1)


def verify(
    draft_tokens: torch.Tensor,
    draft_logits: torch.Tensor,
    target_logits: torch.Tensor,
    weight: torch.Tensor,
    *,
    do_sample: bool,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify a drafted block against ``nu = w * p + (1 - w) * q`` (see the module docstring for the rules).

    Shapes: ``draft_tokens`` (B, gamma), ``draft_logits`` (B, gamma, V), ``target_logits`` (B, gamma + 1, V)
    (the last row predicts the bonus token), ``weight`` (B, gamma). Logits are after the logits processors.
    Returns ``tokens`` (B, gamma + 1) and ``num_accepted`` (B,): row ``b`` emits ``tokens[b, :num_accepted[b]
    + 1]`` (the accepted drafts, then the correction or bonus token). Randomness comes from ``generator``
    (``None``: torch's global stream), drawn as hf-diversed draws it.
    """
    gamma = draft_tokens.shape[1]
    p = target_logits.softmax(-1)  # (B, gamma + 1, V)
    q = draft_logits.softmax(-1)  # (B, gamma, V)
    p_draft = p[:, :gamma]
    w = weight.to(p.dtype)  # (B, gamma)
    if do_sample:
        p_x = p_draft.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        q_x = q.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        ratio = 1.0 - w + w * (p_x / q_x)  # nu(x) / q(x)
        accepted = torch.rand(ratio.shape, generator=generator, dtype=ratio.dtype, device=ratio.device) <= ratio
        num_accepted = _leading_true(accepted)
        p_n = _row_at(p, num_accepted)  # (B, V)
        if gamma == 0:
            next_token = torch.multinomial(p_n, 1, generator=generator).squeeze(1)
        else:
            residual = (p_draft - q).clamp_min(0)  # max(0, p - q), unnormalised
            res_n = _row_at(residual, num_accepted.clamp(max=gamma - 1))
            mass = res_n.sum(-1, keepdim=True)
            tiny = torch.finfo(mass.dtype).tiny
            usable = (mass > tiny) & (num_accepted < gamma).unsqueeze(1)
            dist = torch.where(usable, res_n / mass.clamp_min(tiny), p_n)  # bonus (or p if p = q) from p
            next_token = torch.multinomial(dist, 1, generator=generator).squeeze(1)
    else:
        w_ = w.unsqueeze(-1)
        targets = (w_ * p_draft + (1.0 - w_) * q).argmax(-1)  # argmax nu, (B, gamma)
        num_accepted = _leading_true(draft_tokens == targets)
        bonus = target_logits[:, gamma].argmax(-1, keepdim=True)
        next_token = torch.cat([targets, bonus], 1).gather(1, num_accepted.unsqueeze(1)).squeeze(1)
    tokens = torch.cat([draft_tokens, draft_tokens.new_zeros(draft_tokens.shape[0], 1)], dim=1)
    tokens = tokens.scatter(1, num_accepted.unsqueeze(1), next_token.view(-1, 1))
    return tokens, num_accepted


# ------------------------------------------------------------------------------------------ arguments


def _unsupported(what: str, fix: str | None = None) -> ValueError:
    return ValueError(
        f"{what} is not supported by this DIVERSED custom_generate (batch size 1, fixed draft length, "
        f"temperature / top-k / top-p / repetition penalty). {fix + '. ' if fix else ''}Or {_FULL_SUPPORT}."
    )


def _is_neutral(key: str, value: Any) -> bool:
    if value is None or (isinstance(value, (list, tuple, dict, set)) and len(value) == 0):
        return True
    return key in _NEUTRAL and value in _NEUTRAL[key]


def _check_option(key: str, value: Any, where: str) -> None:
    """Raise unless ``key=value`` is implemented here, has no effect on this decoding, or is neutral."""
    if key in _HONOURED or key in _NO_EFFECT or key.startswith("_") or _is_neutral(key, value):
        return
    raise _unsupported(f"`{key}={value!r}` ({where})", _HINTS.get(key, f"Drop `{key}` (or set it to its default)"))


def _draft_length(kwargs: dict, user_config: GenerationConfig | None, draft: torch.nn.Module) -> int:
    """num_assistant_tokens: generate kwargs > the generation_config passed > the draft's generation_config."""
    draft_config = getattr(draft, "generation_config", None)
    values, sources = {}, {}
    for name in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
        for source, holder in (("generate()", kwargs), ("generation_config", user_config), ("draft", draft_config)):
            value = holder.get(name) if isinstance(holder, dict) else getattr(holder, name, None)
            if value is not None:
                values[name], sources[name] = value, source
                break
    where = {
        "generate()": "passed to generate",
        "generation_config": "in the generation_config passed to generate",
        "draft": "in assistant_model.generation_config",
    }
    schedule = values.get("num_assistant_tokens_schedule")
    if schedule is not None and schedule != "constant":
        raise _unsupported(
            f"num_assistant_tokens_schedule={schedule!r} ({where[sources['num_assistant_tokens_schedule']]})",
            'Pass num_assistant_tokens_schedule="constant" (the draft proposes num_assistant_tokens every round)',
        )
    threshold = values.get("assistant_confidence_threshold")
    if threshold is not None and threshold > 0:
        raise _unsupported(
            f"assistant_confidence_threshold={threshold!r} ({where[sources['assistant_confidence_threshold']]})",
            "Pass assistant_confidence_threshold=0 (the draft always proposes num_assistant_tokens tokens)",
        )
    n = values.get("num_assistant_tokens", DEFAULT_NUM_ASSISTANT_TOKENS)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`num_assistant_tokens` must be a positive int, got {n!r}. Pass e.g. num_assistant_tokens=5.")
    return n


def _prompt(inputs: torch.Tensor | None, model_kwargs: dict, model: torch.nn.Module) -> tuple[torch.LongTensor, bool]:
    """The prompt (1, L) on the target's device, and whether an attention_mask (of ones) came with it."""
    input_ids = model_kwargs.pop("input_ids", None)
    if inputs is not None and input_ids is not None:
        raise ValueError("Pass the prompt once: either `inputs` or `input_ids`, not both.")
    input_ids = inputs if inputs is not None else input_ids
    if "inputs_embeds" in model_kwargs:
        raise _unsupported("`inputs_embeds`", "Pass input_ids")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("This DIVERSED custom_generate needs a prompt: pass input_ids, a LongTensor of shape (1, L).")
    if input_ids.shape[0] != 1:
        raise _unsupported(
            f"A batch of {input_ids.shape[0]} prompts",
            "Call generate once per prompt (batch size 1, as in transformers' assisted generation)",
        )
    if input_ids.shape[1] == 0:
        raise ValueError("The prompt is empty: pass at least one token (e.g. the BOS token) in input_ids.")
    attention_mask = model_kwargs.pop("attention_mask", None)
    if attention_mask is not None and (
        attention_mask.shape != input_ids.shape or not bool((attention_mask == 1).all())
    ):
        raise _unsupported("An attention_mask with padding (zeros)", "Pass the unpadded prompt of one sequence")
    return input_ids.to(model.device), attention_mask is not None


def _settings(
    model: torch.nn.Module,
    draft: torch.nn.Module,
    generation_config: GenerationConfig | None,
    kwargs: dict,
    input_length: int,
) -> dict[str, Any]:
    """Resolve the generation options as transformers does (generate kwargs > generation_config > the target's
    generation_config > defaults) and reject those this file does not implement."""
    user_kwargs = dict(kwargs)
    config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
    source = {key: "passed to generate" for key in user_kwargs}
    for holder, where in (
        (generation_config, "in the generation_config passed to generate"),
        (getattr(model, "generation_config", None), "in the target's model.generation_config"),
    ):
        for key, value in (holder.to_dict() if holder is not None else {}).items():
            if value is not None:
                source.setdefault(key, where)
    if getattr(model, "generation_config", None) is not None:
        config.update(**model.generation_config.to_dict(), defaults_only=True)
    model_kwargs = config.update(**user_kwargs)
    standard = GenerationConfig().to_dict().keys()
    for key in standard:
        _check_option(key, getattr(config, key, None), source.get(key, "in the generation config"))
    # The draft's generate call takes the options the target leaves unset (those without a transformers
    # default) from the draft's own generation_config.
    draft_config = getattr(draft, "generation_config", None)
    if draft_config is not None:
        for key, value in draft_config.to_dict().items():
            if key in standard and key not in _HAS_GLOBAL_DEFAULT and getattr(config, key, None) is None:
                _check_option(key, value, "in assistant_model.generation_config")
    if config.use_cache is False:
        raise ValueError("DIVERSED assisted decoding requires `use_cache=True`; drop use_cache=False.")
    if model_kwargs:
        raise _unsupported(
            f"The generate arguments {sorted(model_kwargs)}",
            "Drop them (this custom_generate takes input_ids, attention_mask of ones, the generation options above "
            "and diversed_head)",
        )
    if config.max_new_tokens is not None:
        max_length = config.max_new_tokens + input_length
    elif config.max_length is not None:
        max_length = config.max_length
    else:  # transformers' default: 20 new tokens, within the model's context
        max_length = 20 + input_length
        max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        if max_positions is not None:
            max_length = min(max_length, max_positions)
    if input_length >= max_length:
        raise ValueError(
            f"Input length of input_ids is {input_length}, but `max_length` is set to {max_length}. Increase "
            "`max_length` or, better, set `max_new_tokens`."
        )
    eos = config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    do_sample = bool(config.do_sample)
    processors = LogitsProcessorList()
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    warpers = []
    if do_sample:  # transformers' sampling warpers, in its order
        if config.temperature is not None and config.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(config.temperature))
        top_k = 50 if config.top_k is None else config.top_k
        if top_k != 0:
            warpers.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
        if config.top_p is not None and config.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
    processors.extend(warpers)
    pad = config.pad_token_id
    pad = pad[0] if isinstance(pad, (list, tuple)) else pad
    draft_pad = pad if DRAFT_MASKS_PAD_TOKENS and pad is not None and pad not in eos else None
    return {
        "max_length": max_length,
        "do_sample": do_sample,
        "eos": torch.tensor(eos, dtype=torch.long, device=model.device),
        "processors": processors,  # applied once to the target's and to the draft's logits, as hf-diversed does
        "pad_token_id": pad if pad is not None and pad not in eos else None,
        "draft_pad_token_id": draft_pad,
        "num_assistant_tokens": _draft_length(user_kwargs, generation_config, draft),
    }


# ------------------------------------------------------------------------------------------- decoding


class _LastHidden:
    """Records the input of a model's LM head (``get_output_embeddings()``): the last, post-norm hidden states
    at exactly the positions whose logits the forward computes."""

    def __init__(self, model: torch.nn.Module):
        self.module = model.get_output_embeddings()
        if self.module is None:
            raise ValueError(
                f"{type(model).__name__} has no output embedding (LM head) to read hidden states from; DIVERSED "
                "needs causal LMs with `get_output_embeddings()`."
            )
        self.states: list[torch.Tensor] = []
        self._handle = None

    def _hook(self, module, args, kwargs):
        self.states.append((args[0] if args else next(iter(kwargs.values()))).detach())

    def __enter__(self) -> _LastHidden:
        self.states = []
        self._handle = self.module.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


class _Runner:
    """One causal LM with its KV cache; ``forward`` feeds the tokens of ``ids`` the cache has not seen."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.cache.activate_past_recording()  # sliding-window layers keep what a later crop may need
        params = inspect.signature(model.forward).parameters
        self.position_ids = "position_ids" in params
        self.logits_to_keep = "logits_to_keep" in params
        self.recorder = _LastHidden(model)

    def forward(
        self, ids: torch.Tensor, num_logits: int, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 logits and LM-head inputs of the last ``num_logits`` positions of ``ids`` (1, L)."""
        past = self.cache.get_seq_length()
        inputs = {"input_ids": ids[:, past:], "past_key_values": self.cache, "use_cache": True}
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask
        if self.position_ids:
            inputs["position_ids"] = torch.arange(past, ids.shape[1], device=ids.device).unsqueeze(0)
        if self.logits_to_keep:
            inputs["logits_to_keep"] = num_logits
        with self.recorder:
            outputs = self.model(**inputs)
        logits = outputs.logits[:, -num_logits:].to(dtype=torch.float32)
        return logits, self.recorder.states[-1][:, -num_logits:]

    def crop_to(self, length: int) -> None:
        tokens_to_remove = self.cache.get_seq_length() - length
        if tokens_to_remove >= 0:
            self.cache.crop(-tokens_to_remove)


def _draft(
    runner: _Runner, input_ids: torch.Tensor, n: int, settings: dict
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Draft up to ``n`` tokens (stopping after EOS), as transformers' assisted drafter does.

    Returns the drafted tokens (1, gamma), their processed draft logits (1, gamma, V) and the draft's hidden
    states at the positions that predict them (1, gamma, D_draft).
    """
    ids = input_ids.to(runner.model.device)
    if n <= 0:
        return ids[:, :0], None, None
    if settings["draft_vocab_size"] is not None:  # a padded pair: a target-only id is read as the draft's last id
        ids = ids.clamp(max=settings["draft_vocab_size"] - 1)
    runner.crop_to(ids.shape[1] - 2)  # from the 2nd round on: re-feed the last two tokens, as transformers does
    tokens, scores, hidden = [], [], []
    eos = settings["eos"].to(ids.device)
    pad, mask = settings["draft_pad_token_id"], None
    if pad is not None and bool((ids == pad).any()):  # see DRAFT_MASKS_PAD_TOKENS
        mask = (ids != pad).long()
    for _ in range(n):
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(1, ids.shape[1] - mask.shape[1])], dim=-1)
        logits, h = runner.forward(ids, 1, mask)
        step_scores = settings["processors"](ids, logits[:, -1])
        if settings["do_sample"]:
            token = torch.multinomial(step_scores.softmax(-1), num_samples=1).squeeze(1)
        else:
            token = step_scores.argmax(-1)
        ids = torch.cat([ids, token[:, None]], dim=-1)
        tokens.append(token)
        scores.append(step_scores)
        hidden.append(h[:, -1:])
        if bool(torch.isin(token, eos).any()):
            break
    return torch.stack(tokens, 1), torch.stack(scores, 1), torch.cat(hidden, 1)


def _decode(
    model: torch.nn.Module,
    draft: torch.nn.Module,
    head: EnsembleHead,
    input_ids: torch.LongTensor,
    settings: dict,
    streamer: Any,
) -> torch.LongTensor:
    target_runner, draft_runner = _Runner(model), _Runner(draft)
    max_length, eos, n = settings["max_length"], settings["eos"], settings["num_assistant_tokens"]
    if streamer is not None:
        streamer.put(input_ids.cpu())
    while True:
        cur_len = input_ids.shape[1]
        # 1. Draft (never past max_length - 1, so that the target's token always fits).
        draft_tokens, draft_scores, h_draft = _draft(
            draft_runner, input_ids, min(n, max_length - cur_len - 1), settings
        )
        draft_tokens = draft_tokens.to(input_ids.device)
        gamma = draft_tokens.shape[1]
        candidate_ids = torch.cat([input_ids, draft_tokens], dim=-1)
        # 2. One target forward over the draft: gamma + 1 logits, processed with each row's own prefix.
        target_logits, h_target = target_runner.forward(candidate_ids, gamma + 1)
        for i in range(gamma + 1):
            target_logits[:, i] = settings["processors"](candidate_ids[:, : cur_len + i], target_logits[:, i])
        # 3. Verify against nu = w p + (1 - w) q, with w from the head on (draft, target) hidden states.
        if gamma > 0:
            extra = target_logits.shape[-1] - draft_scores.shape[-1]
            if extra < 0:
                raise ValueError(
                    f"The draft's vocabulary ({draft_scores.shape[-1]}) is larger than the target's "
                    f"({target_logits.shape[-1]}); DIVERSED needs a draft that shares the target's tokenizer."
                )
            params_device = head.params["out.weight"].device
            draft_scores = draft_scores.to(device=target_logits.device, dtype=torch.float32)
            # a padded pair: q over the target's vocabulary, 0 on the ids only the target has
            draft_scores = torch.nn.functional.pad(draft_scores, (0, extra), value=float("-inf"))
            laws = ()
            if head.use_distribution_features:
                laws = (target_logits[:, :gamma].float().softmax(-1).to(params_device),
                        draft_scores.softmax(-1).to(params_device))  # fmt: skip
            weight = head.weight(h_draft.to(params_device), h_target[:, :-1].to(params_device), *laws)
        else:
            weight = target_logits.new_ones(1, 0)
            draft_scores = target_logits[:, :0]
        tokens, num_accepted = verify(
            draft_tokens, draft_scores, target_logits, weight.to(target_logits.device), do_sample=settings["do_sample"]
        )
        valid = tokens[:, : int(num_accepted[0]) + 1]
        # 4. Crop to the length budget and the first EOS; roll the target cache back past the accepted prefix.
        valid = valid[:, : max_length - cur_len]
        if eos.numel() > 0:
            hits = torch.isin(valid[0], eos).nonzero()
            if hits.numel() > 0:
                valid = valid[:, : int(hits[0]) + 1]
        n_matches = valid.shape[1] - 1
        input_ids = torch.cat([input_ids, valid], dim=-1)
        if streamer is not None:
            streamer.put(valid.cpu())
        target_runner.cache.crop(-(gamma - n_matches))
        if input_ids.shape[1] >= max_length or (eos.numel() > 0 and bool(torch.isin(valid[0, -1], eos))):
            break
    if streamer is not None:
        streamer.end()
    return input_ids


def generate(
    model: torch.nn.Module,
    inputs: torch.Tensor | None = None,
    generation_config: GenerationConfig | None = None,
    logits_processor: list | None = None,
    stopping_criteria: list | None = None,
    assistant_model: torch.nn.Module | None = None,
    streamer: Any = None,
    diversed_head: str | os.PathLike | None = None,
    **kwargs: Any,
) -> torch.LongTensor:
    """DIVERSED assisted decoding (batch size 1): ``model`` verifies ``assistant_model``'s drafts against the
    mixture ``w_t * p_t + (1 - w_t) * q_t``, ``w_t`` from the ensemble head (see the module docstring).

    Args:
        model: the target causal LM (transformers passes it).
        inputs / input_ids: the prompt, a LongTensor of shape (1, L); ``attention_mask`` may be passed if all ones.
        generation_config, generate kwargs: ``max_new_tokens`` / ``max_length``, ``do_sample``, ``temperature``,
            ``top_k``, ``top_p``, ``repetition_penalty``, ``eos_token_id``, ``num_assistant_tokens`` (the fixed
            draft length N; default: the draft's generation_config, else 5).
        assistant_model: the draft causal LM (same tokenizer as the target). Required.
        streamer: receives the prompt, then each round's tokens (``put``), then ``end()``.
        diversed_head: a head directory or Hub id; default: this repository's head (``HEAD_REPO_ID``).

    Returns:
        The sequences, prompt then new tokens: a LongTensor of shape (1, L + new), stopping after EOS.
    """
    if assistant_model is None:
        raise ValueError(
            "DIVERSED decoding needs a draft model: pass assistant_model=draft (a smaller causal LM with the "
            "target's tokenizer) to generate."
        )
    if logits_processor:
        raise _unsupported(
            "A custom logits_processor list",
            "Drop logits_processor (temperature, top_k, top_p and repetition_penalty are generate arguments)",
        )
    if stopping_criteria:
        raise _unsupported(
            "A custom stopping_criteria list", "Drop stopping_criteria (max_new_tokens and eos_token_id are supported)"
        )
    for name in ("prefix_allowed_tokens_fn", "negative_prompt_ids", "negative_prompt_attention_mask"):
        if kwargs.pop(name, None) is not None:
            raise _unsupported(f"`{name}`", f"Drop {name}")
    if kwargs.pop("synced_gpus", None):
        raise _unsupported("`synced_gpus=True`", "Run on one device")
    if kwargs.pop("assistant_tokenizer", None) is not None:
        raise _unsupported(
            "`assistant_tokenizer` (universal assisted decoding)",
            "DIVERSED mixes the two models' distributions over one vocabulary: use a draft with the target's "
            "tokenizer and drop assistant_tokenizer",
        )
    kwargs.pop("tokenizer", None)  # only used by stop_strings, which are rejected with the other options
    if model.config.is_encoder_decoder or assistant_model.config.is_encoder_decoder:
        raise ValueError("DIVERSED custom_generate supports decoder-only (causal LM) target and draft models.")
    t_vocab = model.config.get_text_config().vocab_size
    d_vocab = assistant_model.config.get_text_config().vocab_size
    if d_vocab > t_vocab:
        raise ValueError(
            f"The target has vocab_size={t_vocab} and the draft {d_vocab}: DIVERSED mixes the two distributions "
            "over the target's vocabulary, which must hold the draft's (one tokenizer; the draft may have fewer ids, "
            "the target's extra rows being padding). Use a draft that shares the target's tokenizer."
        )
    input_ids, has_mask = _prompt(inputs, kwargs, model)
    settings = _settings(model, assistant_model, generation_config, kwargs, input_ids.shape[1])
    settings["draft_vocab_size"] = d_vocab if d_vocab < t_vocab else None
    pad = settings["pad_token_id"]
    if not has_mask and pad is not None and bool((input_ids == pad).any()):
        raise _unsupported(
            f"A prompt holding pad_token_id={pad} without attention_mask (transformers would treat it as padding)",
            "Pass the unpadded prompt with attention_mask=torch.ones_like(input_ids)",
        )
    if diversed_head is None:
        if HEAD_REPO_ID == _PLACEHOLDER:
            raise ValueError(
                "This custom_generate/generate.py was not exported with a head id: pass diversed_head=<a head "
                "directory or Hub id>, or export the repository with hf_diversed.modeling.hub.write_custom_generate."
            )
        diversed_head = HEAD_REPO_ID
    if not isinstance(diversed_head, (str, os.PathLike)):
        raise ValueError(
            f"`diversed_head` expects a Hub id or a local directory, got {type(diversed_head).__name__}. "
            f"To pass a DiversedHead object, {_FULL_SUPPORT}."
        )
    head = load_head(diversed_head)
    head.check_models(model, assistant_model)
    head.to(model.device)
    with torch.no_grad():
        return _decode(model, assistant_model, head, input_ids, settings, streamer)
