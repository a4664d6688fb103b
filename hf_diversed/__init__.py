"""hf_diversed: relaxed speculative decoding (DIVERSED) for Hugging Face transformers.

``import hf_diversed`` registers the ensemble head with ``AutoConfig``/``AutoModel`` and teaches
``generate`` two arguments: ``diversed_head=`` (a learned per-token verifier) and ``diversed_verifier=``
(a verification rule: exact, static ensemble, lossy, SpecCascade, DIVERSED).
"""

from transformers import AutoConfig, AutoModel

from .generation import _compat
from .generation.api import decoding_loop, diversed_generate, last_stats
from .generation.batched import SamplerConfig, SampleRequest, sample_batched
from .generation.candidate_generator import DiversedCandidateGenerator
from .generation.decoding import DiversedGenerateOutput
from .generation.static_loop import compile_windows
from .generation.stats import DiversedStats
from .generation.verification import (
    Diversed,
    ExactSD,
    LossySD,
    SpecCascade,
    StaticEnsemble,
    TokenClassEnsemble,
    VerificationRule,
    parse_rule,
)
from .modeling.configuration_diversed_head import DiversedHeadConfig
from .modeling.draft_vocabulary import trim_draft_vocabulary
from .modeling.hub import load_head
from .modeling.modeling_diversed_head import DiversedHead
from .modeling.packed_linear import pack_linear_weights

__version__ = "0.1.0"

__all__ = [
    "Diversed",
    "DiversedCandidateGenerator",
    "DiversedGenerateOutput",
    "DiversedHead",
    "DiversedHeadConfig",
    "DiversedStats",
    "ExactSD",
    "LossySD",
    "SampleRequest",
    "SamplerConfig",
    "SpecCascade",
    "StaticEnsemble",
    "TokenClassEnsemble",
    "VerificationRule",
    "compile_windows",
    "last_stats",
    "load_head",
    "pack_linear_weights",
    "parse_rule",
    "sample_batched",
    "trim_draft_vocabulary",
]

AutoConfig.register(DiversedHeadConfig.model_type, DiversedHeadConfig, exist_ok=True)
AutoModel.register(DiversedHeadConfig, DiversedHead, exist_ok=True)
_compat.install(diversed_generate, decoding_loop)
