"""hf_diversed: relaxed speculative decoding (DIVERSED) for Hugging Face transformers.

``import hf_diversed`` registers the ensemble head with ``AutoConfig``/``AutoModel`` and teaches
``generate`` two arguments: ``diversed_head=`` (a learned per-token verifier) and ``diversed_verifier=``
(a verification rule: exact, static ensemble, lossy, SpecCascade, DIVERSED).
"""

from transformers import AutoConfig, AutoModel

from . import _compat
from .api import decoding_loop, diversed_generate, last_stats
from .batched import SamplerConfig, SampleRequest, sample_batched
from .candidate_generator import DiversedCandidateGenerator
from .configuration_diversed_head import DiversedHeadConfig
from .decoding import DiversedGenerateOutput
from .hub import load_head
from .modeling_diversed_head import DiversedHead
from .stats import DiversedStats
from .verification import (
    Diversed,
    ExactSD,
    LossySD,
    SpecCascade,
    StaticEnsemble,
    TokenClassEnsemble,
    VerificationRule,
    parse_rule,
)

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
    "last_stats",
    "load_head",
    "parse_rule",
    "sample_batched",
]

_compat.check_transformers_version()
AutoConfig.register(DiversedHeadConfig.model_type, DiversedHeadConfig, exist_ok=True)
AutoModel.register(DiversedHeadConfig, DiversedHead, exist_ok=True)
_compat.install(diversed_generate, decoding_loop)
