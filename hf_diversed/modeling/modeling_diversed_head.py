"""The DIVERSED ensemble head: per-token mixture weight w_t from the two models' last hidden states.

    z_t = f([n(h_draft_t); n(h_target_t)])          f: Linear (or Linear-SiLU-Linear), n: RMS norm
    z_t = f([n(h_draft_t); n(h_target_t); max p_t; max q_t; TV(p_t, q_t)])   (use_distribution_features)
    w_t = w0 + tanh(z_t) * (1 - w0 if z_t > 0 else w0)   in [0, 1], w0 = config.init_weight

The output layer starts at zero, so z_t = 0 and w_t = w0 exactly for every input: a fresh head is the
static ensemble with w = w0. The map z -> w is continuous and increasing, saturating at 0 and 1. All maths
runs in float32 whatever the language models' dtype. A lenience head (``config.verification == "lenience"``)
outputs the same number but it is lossy SD's lenience l_t (``DiversedLossy``): fresh, it is lossy SD with l = w0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from .configuration_diversed_head import DiversedHeadConfig
from .distances import total_variation
from .draft_vocabulary import draft_vocabulary_fingerprint


@dataclass
class DiversedHeadOutput(ModelOutput):
    """``weight``: w_t in [0, 1], shape (B, T); ``logits``: the pre-activation z_t, shape (B, T)."""

    weight: torch.Tensor | None = None
    logits: torch.Tensor | None = None


DISTRIBUTION_FEATURES = ("max_p", "max_q", "tv")


def distribution_features(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The head's optional per-position inputs from the two next-token laws: probabilities ``p``, ``q``
    (..., V) -> (..., 3) = [max_v p(v), max_v q(v), TV(p, q) = 1/2 sum_v |p(v) - q(v)|], float32."""
    p, q = p.float(), q.float()
    return torch.stack([p.amax(-1), q.amax(-1), total_variation(p, q)], dim=-1)


# A speculative cascade (Narasimhan et al., ICLR 2025) defers to the target (delta_t = 1) where a margin m_t > 0,
# m_t = a . [max p_t, max q_t, TV(p_t, q_t)] + b, linear in the features: (a, b) per rule and lenience alpha.
CASCADE_MARGINS = {
    "chow": lambda alpha: ((0.0, -1.0, 0.0), 1.0 - alpha),  # m = 1 - alpha - max q
    "diff": lambda alpha: ((1.0, -1.0, 0.0), -alpha),  # m = max p - max q - alpha
    "opt": lambda alpha: ((1.0, -1.0, -alpha), 0.0),  # m = max p - max q - alpha * TV
}


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
        in_features += len(DISTRIBUTION_FEATURES) if config.use_distribution_features else 0
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
        self,
        draft_hidden_states: torch.Tensor,
        target_hidden_states: torch.Tensor,
        distribution_features: torch.Tensor | None = None,
        **kwargs,
    ) -> DiversedHeadOutput:
        """draft_hidden_states (B, T, D_draft), target_hidden_states (B, T, D_target) -> w (B, T).

        ``distribution_features`` (B, T, 3), from :func:`distribution_features`: required when
        ``config.use_distribution_features`` is set, refused otherwise."""
        if kwargs:
            raise TypeError(f"DiversedHead.forward got unexpected arguments: {sorted(kwargs)}.")
        self._check_sizes(draft_hidden_states.shape[-1], target_hidden_states.shape[-1])
        h_d, h_t = draft_hidden_states.float(), target_hidden_states.float()
        if self.config.normalize_features:
            h_d, h_t = _rms_normalize(h_d), _rms_normalize(h_t)
        parts = [h_d, h_t]
        if self.config.use_distribution_features:
            if distribution_features is None:
                raise ValueError(
                    "This DIVERSED head reads the two models' next-token laws (use_distribution_features=True): pass "
                    "distribution_features=hf_diversed.modeling.modeling_diversed_head.distribution_features(p, q)."
                )
            if distribution_features.shape != (*h_d.shape[:-1], len(DISTRIBUTION_FEATURES)):
                raise ValueError(
                    f"distribution_features must have shape {(*h_d.shape[:-1], len(DISTRIBUTION_FEATURES))} "
                    f"({', '.join(DISTRIBUTION_FEATURES)} per position), got {tuple(distribution_features.shape)}."
                )
            parts.append(distribution_features.float())
        elif distribution_features is not None:
            raise ValueError(
                "This DIVERSED head reads hidden states only (use_distribution_features=False), but "
                "distribution_features were passed; drop them, or use a head built with use_distribution_features."
            )
        x = torch.cat(parts, dim=-1)  # (B, T, D_draft + D_target [+ 3])
        params = {name: p.float() for name, p in self.named_parameters()}
        if self.hidden is not None:
            x = nn.functional.silu(nn.functional.linear(x, params["hidden.weight"], params["hidden.bias"]))
        z = nn.functional.linear(x, params["out.weight"], params["out.bias"]).squeeze(-1)  # (B, T)
        return DiversedHeadOutput(weight=self.weight_from_logits(z), logits=z)

    def check_pair(self, target_hidden_size: int, draft_hidden_size: int) -> None:
        """Refuse a model pair whose hidden sizes are not the ones this head was built for (ValueError)."""
        expected = (self.config.target_hidden_size, self.config.draft_hidden_size)
        if expected != (target_hidden_size, draft_hidden_size):
            raise ValueError(
                f"The DIVERSED head was built for target/draft hidden sizes {expected[0]}/{expected[1]}, but the "
                f"models have {target_hidden_size}/{draft_hidden_size}. Use a head trained for this pair (head "
                f"config: target_model={self.config.target_model!r}, draft_model={self.config.draft_model!r}), or "
                "DiversedHead.for_models(target, draft) for a fresh one."
            )

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

    @classmethod
    def from_cascade(
        cls,
        target: nn.Module,
        draft: nn.Module,
        rule: str = "opt",
        alpha: float = 0.1,
        sharpness: float = 50.0,
        **config_kwargs,
    ) -> DiversedHead:
        """A head that starts as the speculative cascade ``rule`` ("chow", "diff" or "opt") with lenience ``alpha``.

        It reads the next-token laws, gives the hidden states weight 0 and sets z_t = k * m_t with the cascade's
        margin m_t (:data:`CASCADE_MARGINS`; the cascade defers, delta_t = 1, where m_t > 0), k = ``sharpness``. So
        w_t > w0 exactly where the cascade defers, and |w_t - delta_t| <= max(w0, 1 - w0) * (1 - tanh(k |m_t|)):
        the cascade as k grows, a head RL can still move (tanh's slope) for moderate k.

        With ``head_hidden_size`` = H >= 2 (an MLP) the same z_t comes out exactly, since SiLU(m) - SiLU(-m) = m:
        hidden units 0 and 1 read +m_t and -m_t, the output weighs them k and -k; units 2..H-1 keep their random
        init and output weight 0, so they count for nothing until training moves them.
        """
        if rule not in CASCADE_MARGINS:
            raise ValueError(f"Unknown cascade rule {rule!r}; use one of {', '.join(CASCADE_MARGINS)}.")
        if not 0.0 <= alpha <= 1.0 or not sharpness > 0:
            raise ValueError(f"A cascade head needs alpha in [0, 1] and sharpness > 0, got {alpha} and {sharpness}.")
        if config_kwargs.setdefault("use_distribution_features", True) is not True:
            raise ValueError(
                "A head set to a cascade reads the next-token laws, so it needs use_distribution_features=True; drop "
                f"use_distribution_features={config_kwargs['use_distribution_features']!r}."
            )
        if config_kwargs.get("head_hidden_size", 0) == 1:
            raise ValueError(
                "An MLP head set to a cascade needs head_hidden_size >= 2 (two hidden units carry +m and -m); pass "
                "head_hidden_size=0 for a linear head or a width of 2 or more."
            )
        head = cls.for_models(target, draft, **config_kwargs)
        slope, offset = CASCADE_MARGINS[rule](float(alpha))
        margin = torch.tensor(slope)
        n = len(DISTRIBUTION_FEATURES)
        with torch.no_grad():
            head.out.weight.zero_()
            head.out.bias.zero_()
            if head.hidden is None:
                head.out.weight[0, -n:] = sharpness * margin
                head.out.bias.fill_(sharpness * offset)
            else:
                for unit, sign in ((0, 1.0), (1, -1.0)):
                    head.hidden.weight[unit].zero_()
                    head.hidden.weight[unit, -n:] = sign * margin
                    head.hidden.bias[unit] = sign * offset
                    head.out.weight[0, unit] = sign * sharpness
        return head


def reads_distribution_features(head: nn.Module) -> bool:
    """Whether ``head`` (or the head inside a wrapper such as DistributedDataParallel) needs
    ``distribution_features``."""
    config = getattr(getattr(head, "module", head), "config", None)
    return bool(getattr(config, "use_distribution_features", False))


def head_verification(head: nn.Module) -> str:
    """What ``head``'s output sets (``config.verification``): ``"mixture"`` (w_t) or ``"lenience"`` (l_t); a wrapped
    head (DistributedDataParallel) too, and ``"mixture"`` for a head saved before the field existed."""
    config = getattr(getattr(head, "module", head), "config", None)
    return getattr(config, "verification", "mixture")


def position_weights(
    head: nn.Module, h_draft: torch.Tensor, h_target: torch.Tensor, features: torch.Tensor | None = None
) -> torch.Tensor:
    """w_t at n positions given as rows, h_draft (n, D_draft), h_target (n, D_target) and, for a head that reads
    them, features (n, 3) (:func:`distribution_features`) -> (n,); a head that does not read them ignores them.

    Computed where ``head`` lives (a wrapped head too, e.g. by DistributedDataParallel) and returned on the
    features' device: rollout traces stay on the CPU while the head may sit on an accelerator."""
    device = next(head.parameters()).device
    kwargs = {}
    if reads_distribution_features(head):
        if features is None:
            raise ValueError(
                "This head reads the two models' next-token laws (use_distribution_features=True), but these "
                "positions carry none (rollouts drawn before hf-diversed recorded max_p and max_q); draw them again."
            )
        kwargs["distribution_features"] = features[None].to(device)
    w = head(draft_hidden_states=h_draft[None].to(device), target_hidden_states=h_target[None].to(device), **kwargs)
    return w.weight[0].to(h_draft.device)
