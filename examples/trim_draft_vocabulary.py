"""A draft that proposes only from the token ids a task uses (tiny random models, offline, seconds).

The draft's LM head then computes K rows instead of the whole vocabulary; q becomes q renormalised on the kept
ids, so exact SD still outputs exactly p and the relaxed rules mix p with the trimmed q. On the real pair:
``hf-diversed trim-draft --task gsm8k --size 32768 --output DIR`` and ``hf-diversed bench --draft DIR``.

python examples/trim_draft_vocabulary.py
"""

import tempfile

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import hf_diversed


def tiny_llama(hidden: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, initializer_range=0.2, bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


words = ["<s>", "</s>"] + [f"w{i}" for i in range(62)]
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="</s>")),
    bos_token="<s>", eos_token="</s>", pad_token="</s>",
)  # fmt: skip
tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
corpus = ["w3 w4 w5 w3 w9 w10 w3 w4", "w5 w9 w11 w12 w4 w3"]  # the texts of the task the draft will serve

target, draft = tiny_llama(64, seed=0), tiny_llama(32, seed=1)
draft.generation_config.assistant_confidence_threshold = 0.0
hf_diversed.trim_draft_vocabulary(draft, size=8, corpus=corpus, tokenizer=tokenizer)
record = draft.config.diversed_draft_vocabulary
print(f"kept {record['size']} of {record['vocab_size']} ids ({record['source']}); LM head: {draft.lm_head}")

with tempfile.TemporaryDirectory() as directory:  # saved and loaded like any model: the set is in config.json
    draft.save_pretrained(directory)
    draft = AutoModelForCausalLM.from_pretrained(directory).eval()
    draft.generation_config.assistant_confidence_threshold = 0.0

prompt = torch.tensor([[0, 3, 4, 5]])
for rule in ("exact", "static:0.5"):
    out = target.generate(
        prompt, assistant_model=draft, diversed_verifier=rule, do_sample=True, max_new_tokens=16,
        return_dict_in_generate=True,
    )  # fmt: skip
    stats = out.diversed_stats
    print(f"{rule:10s}: {out.sequences[0, 4:].tolist()} acceptance {stats.acceptance_rate:.2f}")
print(f"after generate the loaded draft proposes from its kept ids: {draft.lm_head}")
