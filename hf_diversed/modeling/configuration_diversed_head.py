"""Configuration of the DIVERSED ensemble head."""

from __future__ import annotations

import math

from transformers import PreTrainedConfig

VERIFICATIONS = ("mixture", "lenience")  # the head's output: the mixture weight w_t, or lossy SD's lenience l_t


class DiversedHeadConfig(PreTrainedConfig):
    """Configuration of a :class:`DiversedHead`.

    Args:
        target_hidden_size: width of the target model's last hidden state (``config.hidden_size``).
        draft_hidden_size: width of the draft model's last hidden state.
        init_weight: the weight w a freshly initialised head outputs for every input (its output layer
            starts at zero), so a fresh head is the static ensemble with this w.
        verification: what the head's output sets per position: ``"mixture"`` (the paper's DIVERSED) the weight w_t of
            nu_t = w_t p_t + (1 - w_t) q_t; ``"lenience"`` the lenience l_t of lossy SD (accept x with
            min(1, p_t(x) / (l_t q_t(x)))), so a fresh lenience head is lossy SD with l = init_weight.
        head_hidden_size: 0 for the paper's single linear layer on ``[h_draft; h_target]``; > 0 adds one
            hidden layer of that width (SiLU).
        normalize_features: RMS-normalise each hidden state before the head (parameter-free), so the
            head's scale does not depend on the language models' activation norms.
        use_distribution_features: also read, per position, max p_t, max q_t and TV(p_t, q_t) (the quantities
            the speculative cascades' deferral rules compare), appended to the hidden states. They depend on the
            context only, never on the drafted token, so the output law stays nu_t.
        initializer_range: std of the normal init of hidden layers.
        target_model, draft_model: provenance, the pair the head was trained for (Hub ids or names).
        training_weights: which weights of that pair it was trained and measured on, ``{"target": {...},
            "draft": {...}}`` (e.g. a GGUF copy's quantization and sha256; see ``hf_diversed.evaluation.weights``).
        vocab_size: the shared vocabulary size of that pair (provenance and a compatibility check).
        draft_vocabulary: fingerprint of the draft's trimmed vocabulary the head was trained with (None: the
            full vocabulary); see ``hf_diversed.trim_draft_vocabulary``.
        task: the task the head was trained on (one head per task).
    """

    model_type = "diversed_head"

    def __init__(
        self,
        target_hidden_size: int = 1536,
        draft_hidden_size: int = 896,
        init_weight: float = 0.5,
        verification: str = "mixture",
        head_hidden_size: int = 0,
        normalize_features: bool = True,
        use_distribution_features: bool = False,
        initializer_range: float = 0.02,
        target_model: str | None = None,
        draft_model: str | None = None,
        vocab_size: int | None = None,
        task: str | None = None,
        draft_vocabulary: str | None = None,
        training_weights: dict | None = None,
        **kwargs,
    ):
        for name, value in (("target_hidden_size", target_hidden_size), ("draft_hidden_size", draft_hidden_size)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive int (the model's config.hidden_size), got {value!r}.")
        if not isinstance(head_hidden_size, int) or head_hidden_size < 0:
            raise ValueError(
                f"`head_hidden_size` must be an int >= 0 (0 = one linear layer), got {head_hidden_size!r}."
            )
        if not (isinstance(init_weight, (int, float)) and 0.0 <= init_weight <= 1.0 and math.isfinite(init_weight)):
            raise ValueError(f"`init_weight` must be in [0, 1], got {init_weight!r}. Pass e.g. init_weight=0.5.")
        if verification not in VERIFICATIONS:
            raise ValueError(
                f"`verification` must be one of {', '.join(map(repr, VERIFICATIONS))} (what the head's output sets), "
                f"got {verification!r}."
            )
        self.target_hidden_size = target_hidden_size
        self.draft_hidden_size = draft_hidden_size
        self.init_weight = float(init_weight)
        self.verification = verification
        self.head_hidden_size = head_hidden_size
        self.normalize_features = normalize_features
        self.use_distribution_features = bool(use_distribution_features)
        self.initializer_range = initializer_range
        self.target_model = target_model
        self.draft_model = draft_model
        self.vocab_size = vocab_size
        self.task = task
        self.draft_vocabulary = draft_vocabulary
        self.training_weights = training_weights
        super().__init__(**kwargs)
