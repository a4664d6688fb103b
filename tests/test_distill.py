"""Draft LoRA distillation (hf_diversed.trainer, TRL DistillationTrainer) on tiny random models saved to disk."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import chat_model, chat_tokenizer, require_data_dir
from transformers import LlamaForCausalLM

from hf_diversed.trainer import DraftDistillConfig, build_distill_dataset, distill_draft
from hf_diversed.trainer.distill_trainer import distillation_args

pytest.importorskip("peft")
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]
NUM_EXAMPLES = 4
MAX_LENGTH = 320


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _sequences(tokenizer, data_dir: Path) -> list[tuple[torch.Tensor, int]]:
    """(input_ids, prompt length) of the training examples, rendered as the trainer renders them."""
    out = []
    for row in build_distill_dataset("gsm8k", "train", NUM_EXAMPLES, data_dir=str(data_dir)):
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
        full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=True)
        prompt, full = list(prompt["input_ids"]), list(full["input_ids"])
        assert full[: len(prompt)] == prompt
        out.append((torch.tensor([full[:MAX_LENGTH]]), len(prompt)))
    return out


@torch.no_grad()
def _mean_kl(target, student, sequences) -> float:
    """Token-mean KL(target || student) over the completion positions of ``sequences``."""
    total, count = 0.0, 0
    for ids, prompt_len in sequences:
        log_p = torch.log_softmax(target(ids).logits[0, prompt_len - 1 : -1].float(), -1)
        log_q = torch.log_softmax(student(ids).logits[0, prompt_len - 1 : -1].float(), -1)
        total += float((log_p.exp() * (log_p - log_q)).sum())
        count += log_p.shape[0]
    return total / count


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Tiny target/draft on disk, 4 GSM8K train rows, and one distillation run of 12 steps."""
    source = require_data_dir() / "gsm8k" / "train.jsonl"
    if not source.is_file():
        pytest.skip(f"{source} missing")
    root = tmp_path_factory.mktemp("distill")
    lines = source.read_text(encoding="utf-8").splitlines()[:NUM_EXAMPLES]
    (root / "data" / "gsm8k").mkdir(parents=True)
    (root / "data" / "gsm8k" / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tokenizer = chat_tokenizer([json.dumps(json.loads(line)) for line in lines])
    target, draft = chat_model(tokenizer, 0), chat_model(tokenizer, 1, noise=0.3)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)

    sequences = _sequences(tokenizer, root / "data")
    kl_before = _mean_kl(target, draft, sequences)
    target_before, draft_before = _state(target), _state(draft)
    config = DraftDistillConfig(
        task="gsm8k", target=str(root / "target"), draft=str(root / "draft"), dtype="float32",
        data_dir=str(root / "data"), max_train_examples=NUM_EXAMPLES, lora_r=4, lora_alpha=8, lora_dropout=0.0,
        target_modules="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", learning_rate=1e-2,
        lr_scheduler_type="constant", max_steps=12, per_device_train_batch_size=2, gradient_accumulation_steps=1,
        max_length=MAX_LENGTH, logging_steps=4, output_dir=str(root / "adapter"),
    )  # fmt: skip
    out = distill_draft(config, target=target, draft=draft, tokenizer=tokenizer)
    return {
        "root": root, "tokenizer": tokenizer, "target": target, "draft": draft, "out": out,
        "sequences": sequences, "kl_before": kl_before, "target_before": target_before,
        "draft_before": draft_before,
    }  # fmt: skip


def test_distill_writes_adapter_and_freezes_base_models(setup):
    from safetensors.torch import load_file

    out = setup["out"]
    assert out == setup["root"] / "adapter"
    assert (out / "adapter_config.json").is_file() and (out / "adapter_model.safetensors").is_file()
    assert (out / "tokenizer.json").is_file() or (out / "tokenizer_config.json").is_file()
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["r"] == 4 and adapter_config["task_type"] == "CAUSAL_LM"
    weights = load_file(out / "adapter_model.safetensors")
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and all(torch.isfinite(v).all() for v in weights.values())
    assert all(v.abs().max() > 0 for v in lora_b)  # LoRA B starts at zero: every one of them moved
    # the target is bit-identical; the caller's draft is back to its base weights and plain modules
    for name, before in (("target", setup["target_before"]), ("draft", setup["draft_before"])):
        after = setup[name].state_dict()
        assert after.keys() == before.keys()
        assert all(torch.equal(after[k], before[k]) for k in before), name
    assert not any("lora" in n for n, _ in setup["draft"].named_modules())
    assert all(p.requires_grad for p in setup["target"].parameters())  # the caller's flags are restored
    assert not setup["target"].training and not setup["draft"].training


def test_distill_lowers_kl_to_target(setup):
    from peft import PeftModel

    draft = LlamaForCausalLM.from_pretrained(setup["root"] / "draft").eval()
    student = PeftModel.from_pretrained(draft, setup["out"]).eval()
    kl_after = _mean_kl(setup["target"], student, setup["sequences"])
    assert kl_after < 0.7 * setup["kl_before"], (setup["kl_before"], kl_after)


def test_adapter_drafts_for_exact_sd(setup):
    from peft import PeftModel

    draft = LlamaForCausalLM.from_pretrained(setup["root"] / "draft").eval()
    peft_draft = PeftModel.from_pretrained(draft, setup["out"]).eval()
    ids = setup["sequences"][0][0][:, : setup["sequences"][0][1]]
    seq = setup["target"].generate(ids, assistant_model=peft_draft, diversed_verifier="exact", max_new_tokens=8)
    assert seq.shape[0] == 1 and ids.shape[1] < seq.shape[1] <= ids.shape[1] + 8
    assert torch.equal(seq[:, : ids.shape[1]], ids)
    # what `hf-diversed bench --lora-draft` runs: the merged adapter gives the same logits
    with torch.no_grad():
        expected = peft_draft(seq).logits
        merged = peft_draft.merge_and_unload()
        torch.testing.assert_close(merged(seq).logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lmbda", [0.0, 1.0])
def test_lmbda_picks_reference_or_sampled_completions(setup, tmp_path, monkeypatch, lmbda):
    from trl import DistillationTrainer

    sampled = []
    original = DistillationTrainer._generate_single_turn

    def spy(self, prompt_ids, *args, **kwargs):
        out = original(self, prompt_ids, *args, **kwargs)
        sampled.append([len(c) for c in out])
        return out

    monkeypatch.setattr(DistillationTrainer, "_generate_single_turn", spy)
    root = setup["root"]
    prompt_len = max(p for _, p in setup["sequences"][:2])
    config = DraftDistillConfig(
        task="gsm8k", target=str(root / "target"), draft=str(root / "draft"), dtype="float32",
        data_dir=str(root / "data"), max_train_examples=2, lora_r=2, max_steps=1, per_device_train_batch_size=2,
        gradient_accumulation_steps=1, max_length=prompt_len + 6, lmbda=lmbda, output_dir=str(tmp_path / "a"),
    )  # fmt: skip
    distill_draft(config, target=setup["target"], draft=setup["draft"], tokenizer=setup["tokenizer"])
    if lmbda == 0.0:
        assert sampled == []  # off-policy: the references, no generation
    else:
        # sampled, no longer than max_length leaves after the shortest prompt (then cut per prompt by the hook)
        shortest = min(p for _, p in setup["sequences"][:2])
        assert len(sampled) == 1 and all(1 <= n <= prompt_len + 6 - shortest for n in sampled[0])


def _cli_argv(root, out, dtype: str, *, batch_size: int, accumulation: int, max_length: int) -> list[str]:
    """``training/train.py --mode distill_draft`` on the tiny pair: the recipe, one step of 2 examples, LoRA r = 2."""
    return [
        "--mode", "distill_draft", "--config", str(ROOT / "training" / "recipes" / "distill_gsm8k.yaml"),
        "--target", str(root / "target"), "--draft", str(root / "draft"), "--dtype", dtype,
        "--data_dir", str(root / "data"), "--max_train_examples", "2", "--max_steps", "1", "--lora_r", "2",
        "--per_device_train_batch_size", str(batch_size), "--gradient_accumulation_steps", str(accumulation),
        "--max_length", str(max_length), "--save_steps", "0", "--report_to", "none", "--output_dir", str(out),
    ]  # fmt: skip


def test_cli_main_runs_distill_mode(setup, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import train

    out = tmp_path / "cli-adapter"
    assert train.main(_cli_argv(setup["root"], out, "float32", batch_size=1, accumulation=2, max_length=256)) == 0
    assert (out / "adapter_model.safetensors").is_file()
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 2


def test_bfloat16_distillation_trains_where_there_is_no_bf16_gpu(setup, tmp_path, monkeypatch):
    """The recipe's ``dtype: auto`` is bf16 on a CPU with AVX512-BF16; transformers' bf16 training then needs
    ``use_cpu``, which the trainer sets where no GPU with bf16 is present."""
    from transformers.utils import is_torch_bf16_gpu_available

    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import train

    out = tmp_path / "bf16-adapter"
    assert train.main(_cli_argv(setup["root"], out, "bfloat16", batch_size=2, accumulation=1, max_length=128)) == 0
    assert (out / "adapter_model.safetensors").is_file()
    args = distillation_args(DraftDistillConfig(task="gsm8k", dtype="bfloat16", output_dir=str(out)))
    assert args.bf16 and args.use_cpu == (not is_torch_bf16_gpu_available())


def test_cli_parses_distill_recipe_with_overrides(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    import train

    path = ROOT / "training" / "recipes" / "distill_gsm8k.yaml"
    argv = ["--mode", "distill_draft", "--config", str(path), "--max_steps", "3", "--lora_r", "8", "--beta", "0.5"]
    config = train.parse_config(argv)
    assert isinstance(config, DraftDistillConfig)
    assert (config.max_steps, config.lora_r, config.beta) == (3, 8, 0.5)
    assert (config.task, config.train_split, config.max_train_examples) == ("gsm8k", "train", 512)
    assert (config.lora_alpha, config.learning_rate, config.max_length, config.lmbda) == (32, 2e-4, 512, 0.0)
    assert config.target_modules_list() == "all-linear"
    # the head mode is unchanged and still the default
    from hf_diversed.trainer import DiversedConfig

    head = train.parse_config(["--config", str(ROOT / "training" / "recipes" / "gsm8k.yaml"), "--max_steps", "2"])
    assert isinstance(head, DiversedConfig) and head.max_steps == 2
    assert "train" in sys.modules


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"task": "nope"}, "unknown task 'nope'.*--task"),
        ({"lora_r": 0}, r"`lora_r` must be an int >= 1.*--lora_r"),
        ({"lora_r": -2}, "lora_r"),
        ({"train_split": "validation"}, "--train_split"),
        ({"train_split": "train[1:2:3]"}, "cannot parse split.*--train_split"),
        ({"beta": 1.5}, "beta"),
        ({"target_modules": "q_proj,lm_head"}, "lm_head"),
        ({"push_to_hub": True}, "hub_model_id"),
        ({"resume_from_checkpoint": "/nonexistent/checkpoint-3"}, "checkpoint-N"),
    ],
)
def test_bad_config_raises_with_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DraftDistillConfig(**kwargs)


def test_dataset_is_conversational_prompt_completion(setup):
    data = build_distill_dataset("gsm8k", "train", 2, data_dir=str(setup["root"] / "data"))
    assert len(data) == 2 and set(data.column_names) == {"prompt", "completion"}
    row = data[0]
    assert row["prompt"][0]["role"] == "user" and "Question:" in row["prompt"][0]["content"]
    assert row["completion"][0]["role"] == "assistant"
    assert "####" in row["completion"][0]["content"] and "<<" not in row["completion"][0]["content"]


def test_a_sliced_split_selects_its_rows(setup):
    """CNN/DM ships only its test split, so its draft trains on ``test[100:]``, the rows Table 1 does not use."""
    config = DraftDistillConfig(task="cnndm", train_split="test[100:]")
    assert config.train_split == "test[100:]"
    data_dir = str(setup["root"] / "data")
    whole = build_distill_dataset("gsm8k", "train", None, data_dir=data_dir)
    tail = build_distill_dataset("gsm8k", "train[1:]", None, data_dir=data_dir)
    assert len(tail) == len(whole) - 1 and tail[0] == whole[1]


@pytest.mark.slow
@pytest.mark.real_weights
def test_an_adapter_of_the_real_draft_names_its_hub_model_as_its_base(setup):
    """The real draft is converted offline into a local cache, but its adapter (``base_model_name_or_path``, the
    model card) must name the Hub model it adapts, so that it loads and reads right anywhere."""
    pytest.importorskip("gguf")
    from hf_diversed.trainer.distill_trainer import _load_missing

    config = DraftDistillConfig(task="gsm8k", draft="qwen2.5-coder-0.5b-instruct", dtype="float32")
    _, draft, _ = _load_missing(config, setup["target"], None, setup["tokenizer"])
    assert draft.name_or_path == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    peft = pytest.importorskip("peft")
    adapted = peft.get_peft_model(draft, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    assert adapted.peft_config["default"].base_model_name_or_path == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
