"""Relaxed speculative decoding in one `generate` call, on tiny random models (runs offline in seconds).

python examples/quickstart.py
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_diversed
from hf_diversed import DiversedHead, LossySD, SpecCascade, StaticEnsemble


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
draft.generation_config.num_assistant_tokens = 5  # draft length N
draft.generation_config.assistant_confidence_threshold = 0.0  # always draft N tokens (no early stop)
inputs = torch.tensor([[5, 17, 42, 9, 77]])

# 1. DIVERSED: a head (a DiversedHead, a local directory or a Hub id like "org/head-gsm8k").
head = DiversedHead.for_models(target, draft, init_weight=0.5)  # fresh head == static ensemble w=0.5
out = target.generate(
    inputs, assistant_model=draft, diversed_head=head, max_new_tokens=32, do_sample=True, return_dict_in_generate=True
)
print("DIVERSED       ", out.sequences[0].tolist())
print("  stats        ", out.diversed_stats.to_dict())

# 2. Every other rule through `diversed_verifier`: a name or a rule object.
for verifier in ["exact", StaticEnsemble(0.3), LossySD(0.5), SpecCascade("opt", 0.2), "cascade-chow:0.3"]:
    seq = target.generate(inputs, assistant_model=draft, diversed_verifier=verifier, max_new_tokens=32, do_sample=True)
    stats = hf_diversed.last_stats(target)  # the accessor when return_dict_in_generate is off
    name = verifier if isinstance(verifier, str) else verifier.spec()
    print(f"{name:15s} acceptance {stats.acceptance_rate:.2f}, {stats.mean_accepted_per_round:.2f} tokens/round")

# 3. Save the head the Hub way and load it back by path (push_to_hub("org/name") uploads the same files).
head.save_pretrained("/tmp/hf_diversed_quickstart_head")
seq = target.generate(inputs, assistant_model=draft, diversed_head="/tmp/hf_diversed_quickstart_head", max_new_tokens=8)
print("loaded head    ", seq[0].tolist())
