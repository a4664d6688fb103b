"""The static-cache, compiled speculative loop: `cache_implementation="static"` plus a `compile_config`.

Same tokens as the default (dynamic-cache) loop; the draft step and the verification are compiled once per
attention window (ahead of time here, with ``compile_windows``) and reused across rounds, prompts and calls. On
tiny random models (runs offline; compiling takes a little while on a CPU, as torch.compile does).

python examples/compiled_generation.py
"""

import time

import torch
from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

import hf_diversed  # noqa: F401  (teaches generate the DIVERSED arguments)
from hf_diversed import DiversedHead, compile_windows, pack_linear_weights


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
        pad_token_id=1,
    )
    return LlamaForCausalLM(config).eval()


target, draft = tiny_llama(64, seed=0), tiny_llama(32, seed=1)
draft.generation_config.assistant_confidence_threshold = 0.0  # the static loop always drafts N tokens
head = DiversedHead.for_models(target, draft, init_weight=0.5)
common = dict(assistant_model=draft, diversed_head=head, num_assistant_tokens=4, max_new_tokens=40, do_sample=False)
common["max_cache_len"] = 64  # caches sized for the longest call: later calls reuse the compiled steps
# On a GPU use the default CompileConfig() (mode="reduce-overhead": CUDA graphs); on a CPU the inductor's default mode.
compile_config = CompileConfig(mode="default", fullgraph=True, dynamic=False)

# Attention reads a window of each static cache (256·2^k positions, one graph each) that grows with the sequence.
# Compiling every window up front means no call compiles mid-generation (here the caches fit in one window).
windows = compile_windows(
    target, draft, max_cache_len=common["max_cache_len"], num_assistant_tokens=common["num_assistant_tokens"],
    compile_config=compile_config, diversed_head=head,
)  # fmt: skip
print(f"compiled ahead for attention windows {windows}")

for prompt in ([5, 17, 42, 9, 77], [3, 8, 13, 21, 34, 55, 89]):
    inputs = torch.tensor([prompt])
    dynamic = target.generate(inputs, **common)
    start = time.perf_counter()
    compiled = target.generate(inputs, cache_implementation="static", compile_config=compile_config, **common)
    seconds = time.perf_counter() - start
    print(f"prompt of {len(prompt)} tokens: compiled {seconds:.1f}s, same tokens as the dynamic loop: "
          f"{torch.equal(dynamic, compiled)}")  # fmt: skip

# Without a compile_config on a CPU (or with disable_compile=True) the same loop runs eagerly on static caches.
eager = target.generate(torch.tensor([[5, 17, 42, 9, 77]]), cache_implementation="static", **common)
print("static cache, eager:", eager[0].tolist())

# On a CPU, linear layers on oneDNN's blocked weights make each step 1.3-2x faster (bf16 or fp32; in place, and
# they compile). The same tokens, up to the summation order of another matmul kernel.
if torch.backends.mkldnn.is_available():
    reference = target.generate(torch.tensor([[5, 17, 42, 9, 77]]), **common)
    pack_linear_weights(target), pack_linear_weights(draft)
    packed = target.generate(torch.tensor([[5, 17, 42, 9, 77]]), cache_implementation="static", **common)
    print(f"packed linear weights, same tokens: {torch.equal(reference, packed)}")
