"""The DIVERSED ensemble head: per-token mixture weight w_t from the two models' last hidden states.

    z_t = f([n(h_draft_t); n(h_target_t)])          f: Linear (or Linear-SiLU-Linear), n: RMS norm
    w_t = w0 + tanh(z_t) * (1 - w0 if z_t > 0 else w0)   in [0, 1], w0 = config.init_weight

The output layer starts at zero, so z_t = 0 and w_t = w0 exactly for every input: a fresh head is the
static ensemble with w = w0. The map z -> w is continuous and increasing, saturating at 0 and 1. All maths
runs in float32 whatever the language models' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from .configuration_diversed_head import DiversedHeadConfig
from .draft_vocabulary import draft_vocabulary_fingerprint


@dataclass
class DiversedHeadOutput(ModelOutput):
    """``weight``: w_t in [0, 1], shape (B, T); ``logits``: the pre-activation z_t, shape (B, T)."""

    weight: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def _rms_normalize(h: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


class DiversedHead(PreTrainedModel):
    """Maps (draft, target) last hidden states at the position predicting token t to w_t in [0, 1]."""

    config_class = DiversedHeadConfig
    config: DiversedHeadConfig
    base_model_prefix = "diversed_head"
    main_input_name = "target_hidden_states"
    _no_split_modules: list[str] = []

    def __init__(self, config: DiversedHeadConfig):
        super().__init__(config)
        in_features = config.draft_hidden_size + config.target_hidden_size
        if config.head_hidden_size > 0:
            self.hidden = nn.Linear(in_features, config.head_hidden_size)
            self.out = nn.Linear(config.head_hidden_size, 1)
        else:
            self.hidden = None
            self.out = nn.Linear(in_features, 1)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if module is self.out:
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            init.zeros_(module.bias)

    def weight_from_logits(self, z: torch.Tensor) -> torch.Tensor:
        """w = w0 + tanh(z) * (1 - w0 if z > 0 else w0)."""
        w0 = self.config.init_weight
        return w0 + torch.tanh(z) * torch.where(z > 0, 1.0 - w0, w0)

    def forward(
        self, draft_hidden_states: torch.Tensor, target_hidden_states: torch.Tensor, **kwargs
    ) -> DiversedHeadOutput:
        """draft_hidden_states (B, T, D_draft), target_hidden_states (B, T, D_target) -> w (B, T)."""
        if kwargs:
            raise TypeError(f"DiversedHead.forward got unexpected arguments: {sorted(kwargs)}.")
        self._check_sizes(draft_hidden_states.shape[-1], target_hidden_states.shape[-1])
        h_d, h_t = draft_hidden_states.float(), target_hidden_states.float()
        if self.config.normalize_features:
            h_d, h_t = _rms_normalize(h_d), _rms_normalize(h_t)
        x = torch.cat([h_d, h_t], dim=-1)  # (B, T, D_draft + D_target)
        params = {name: p.float() for name, p in self.named_parameters()}
        if self.hidden is not None:
            x = nn.functional.silu(nn.functional.linear(x, params["hidden.weight"], params["hidden.bias"]))
        z = nn.functional.linear(x, params["out.weight"], params["out.bias"]).squeeze(-1)  # (B, T)
        return DiversedHeadOutput(weight=self.weight_from_logits(z), logits=z)

    def _check_sizes(self, draft_size: int, target_size: int) -> None:
        expected = (self.config.draft_hidden_size, self.config.target_hidden_size)
        if (draft_size, target_size) != expected:
            raise ValueError(
                f"This DIVERSED head expects draft/target hidden sizes {expected[0]}/{expected[1]}, got "
                f"{draft_size}/{target_size}. Use a head trained for this model pair, or build a fresh one with "
                f"DiversedHead.for_models(target, draft)."
            )

    @classmethod
    def for_models(cls, target: nn.Module, draft: nn.Module, **config_kwargs) -> DiversedHead:
        """A freshly initialised head sized for ``target`` and ``draft`` (provenance filled in)."""
        t_cfg, d_cfg = target.config.get_text_config(), draft.config.get_text_config()
        config = DiversedHeadConfig(
            target_hidden_size=t_cfg.hidden_size,
            draft_hidden_size=d_cfg.hidden_size,
            target_model=config_kwargs.pop("target_model", getattr(target.config, "_name_or_path", None) or None),
            draft_model=config_kwargs.pop("draft_model", getattr(draft.config, "_name_or_path", None) or None),
            vocab_size=config_kwargs.pop("vocab_size", t_cfg.vocab_size),
            draft_vocabulary=config_kwargs.pop("draft_vocabulary", draft_vocabulary_fingerprint(draft)),
            **config_kwargs,
        )
        return cls(config)


def position_weights(head: nn.Module, h_draft: torch.Tensor, h_target: torch.Tensor) -> torch.Tensor:
    """w_t at n positions given as rows, h_draft (n, D_draft) and h_target (n, D_target) -> (n,).

    Computed where ``head`` lives (a wrapped head too, e.g. by DistributedDataParallel) and returned on the
    features' device: rollout traces stay on the CPU while the head may sit on an accelerator."""
    device = next(head.parameters()).device
    w = head(draft_hidden_states=h_draft[None].to(device), target_hidden_states=h_target[None].to(device)).weight[0]
    return w.to(h_draft.device)
