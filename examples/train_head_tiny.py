"""Train a DIVERSED head with the REINFORCE++ trainer on tiny random models (offline, about 20 s on 2 cores).

The reward here is the acceptance regularizer alone (a constant task reward), so the head learns to lower w
where target and draft disagree and acceptance rises. With real models, use training/train.py and a recipe.

    python examples/train_head_tiny.py
"""

import tempfile

import datasets
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_diversed.trainer import DiversedConfig, DiversedTrainer

torch.set_num_threads(1)


def tiny_llama(seed: int, noise: float = 0.0) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
        eos_token_id=1,
    )
    model = LlamaForCausalLM(config).eval()
    torch.manual_seed(seed)
    with torch.no_grad():  # the draft: a perturbed copy of the target
        for p in model.parameters():
            p.add_(noise * p.std() * torch.randn_like(p) if p.numel() > 1 else 0)
    model.generation_config.assistant_confidence_threshold = 0.0
    return model


target, draft = tiny_llama(0), tiny_llama(1, noise=0.1)
g = torch.Generator().manual_seed(0)
rows = [{"input_ids": torch.randint(3, 128, (6,), generator=g).tolist()} for _ in range(16)]
prompts = datasets.Dataset.from_list(rows)

config = DiversedConfig(  # a transformers.TrainingArguments: report_to, save_steps, push_to_hub, ... work too
    task=None,
    num_prompts=4,
    max_new_tokens=16,
    num_assistant_tokens=4,
    learning_rate=2e-2,
    warmup_steps=0,
    lr_scheduler_type="constant",
    max_steps=60,  # optimizer updates: 15 rollout batches, 4 updates each (num_iterations)
    acceptance_coef=1.0,
    num_eval_prompts=8,
    save_strategy="no",
    output_dir=tempfile.mkdtemp(prefix="diversed-head-"),
)
trainer = DiversedTrainer(
    target,
    draft,
    config,
    train_dataset=prompts,
    eval_dataset=prompts,
    reward_funcs=[lambda prompts, completions, **kw: [0.0] * len(completions)],
)
trainer.train()
trainer.save_model()
for name in ("untrained", "trained"):
    m = trainer.eval_metrics[name]
    print(f"{name:9s} head: acceptance {m['acceptance_rate']:.2f}, mean w {m['mean_w']:.2f}")
print(f"saved to {config.output_dir} (config.json, model.safetensors, README.md model card)")
