"""Many sequences at once with exactly generate's law: the batched sampler (tiny random models, offline, seconds).

Quality and acceptance depend only on the law of what a rule emits, so an evaluation or a head's rollouts can
draw their sequences B at a time instead of one speculative-decoding call at a time.

python examples/batched_sampling.py
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_diversed import DiversedHead, SamplerConfig, SampleRequest, sample_batched


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
draft.generation_config.assistant_confidence_threshold = 0.0  # generate then drafts N tokens a round, as the walk
head = DiversedHead.for_models(target, draft, init_weight=0.5)
prompts = [torch.tensor([5, 17, 42, 9, 77]), torch.tensor([8, 3, 99])]
config = SamplerConfig(max_new_tokens=24, do_sample=True, temperature=1.0, num_assistant_tokens=5)

# One request per (prompt, rule, seed); requests sharing a prompt share its prefill.
requests = [
    SampleRequest(prompt, rule, head=head if rule == "diversed" else None, seed=seed, tag=(i, rule, seed))
    for i, prompt in enumerate(prompts)
    for rule in ("exact", "static:0.5", "diversed")
    for seed in range(4)
]
for result in sample_batched(target, draft, requests, config, batch_size=8):
    prompt_index, rule, seed = result.tag
    stats = result.stats
    print(
        f"prompt {prompt_index} {rule:10s} seed {seed}: {len(result.completion_ids):2d} tokens "
        f"({result.finish_reason}), acceptance {stats.acceptance_rate:.2f}, accepted/round "
        f"{stats.mean_accepted_per_round:.2f}"
    )

# The same law, one sequence at a time through generate (same settings, a different random stream):
ids = prompts[0].unsqueeze(0)
out = target.generate(
    ids, assistant_model=draft, diversed_head=head, return_dict_in_generate=True, **config.generate_kwargs()
)
print("generate, prompt 0 diversed:", out.sequences[0, ids.shape[1] :].tolist())
