"""A lenience head: a DIVERSED head whose output is lossy SD's lenience l_t per position (tiny random models,
offline, seconds).

Lossy SD accepts a drafted x with probability min(1, p(x) / (l q(x))): never a token the target gives no mass, always
one with p(x) >= l q(x). A lenience head sets l per position from the two models' hidden states; a fresh one is lossy
SD at l = init_weight, token for token. Train one with training/train.py and ``verification: lenience`` (see
training/recipes/gsm8k-lenience.yaml).

    python examples/lenience_head.py
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_diversed import DiversedHead


def tiny_llama(hidden: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
        eos_token_id=1,
    )
    return LlamaForCausalLM(config).eval()


target, draft = tiny_llama(64, seed=0), tiny_llama(32, seed=1)
draft.generation_config.assistant_confidence_threshold = 0.0
ids = torch.tensor([[5, 17, 42, 9, 77]])
settings = dict(assistant_model=draft, do_sample=True, max_new_tokens=24, num_assistant_tokens=5, pad_token_id=1)


def draw(seed: int, **rule):
    torch.manual_seed(seed)
    out = target.generate(ids, return_dict_in_generate=True, **settings, **rule)
    return out.sequences[0, ids.shape[1] :].tolist(), out.diversed_stats


fresh = DiversedHead.for_models(target, draft, verification="lenience", init_weight=0.3)
tokens, stats = draw(0, diversed_head=fresh)
lossy, _ = draw(0, diversed_verifier="lossy:0.3")
print(f"fresh lenience head = lossy:0.3 token for token: {tokens == lossy} (acceptance {stats.acceptance_rate:.2f})")

varying = DiversedHead.for_models(target, draft, verification="lenience", init_weight=0.3)
with torch.no_grad():
    varying.out.weight.normal_(0.0, 0.2)  # as if trained: l_t now depends on the hidden states
tokens, stats = draw(1, diversed_head=varying)
print(f"varying lenience head: mean l {stats.mean_weight:.2f}, acceptance {stats.acceptance_rate:.2f}")
