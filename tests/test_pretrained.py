"""Pretrained heads bundled with the package: complete Hub repositories, resolvable offline by Hub id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from conftest import require_data_dir
from safetensors.torch import load_file

from hf_diversed import DiversedHead, DiversedHeadConfig
from hf_diversed.modeling.pretrained import PRETRAINED_HEADS, available_heads, export_head_repo, head_for_task

REPO = Path(__file__).resolve().parents[1]
TARGET_HUB_ID, DRAFT_HUB_ID = "Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct"


def test_every_listed_head_is_bundled():
    assert [h.repo_id for h in available_heads()] == [h.repo_id for h in PRETRAINED_HEADS]
    assert {h.task for h in PRETRAINED_HEADS} == {"gsm8k", "mbpp", "cnndm"}
    assert head_for_task("gsm8k") == "hf-diversed/diversed-head-qwen2.5-coder-1.5b-gsm8k"
    assert head_for_task("xsum") is None


@pytest.mark.parametrize("head", PRETRAINED_HEADS, ids=lambda h: h.task)
def test_bundled_head_is_a_complete_hub_repo_for_the_real_pair(head, tmp_path):
    bundled = {p.relative_to(head.folder).as_posix() for p in head.folder.rglob("*") if p.is_file()}
    assert bundled == {"config.json", "model.safetensors", "README.md"}
    repo = head.write_repo(tmp_path / "repo")
    files = {p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()}
    assert files == bundled | {"custom_generate/generate.py", "custom_generate/requirements.txt"}
    config = json.loads((repo / "config.json").read_text())
    assert config["model_type"] == "diversed_head" and config["task"] == head.task
    assert (config["target_hidden_size"], config["draft_hidden_size"], config["vocab_size"]) == (1536, 896, 151936)
    assert (config["target_model"], config["draft_model"]) == (TARGET_HUB_ID, DRAFT_HUB_ID)
    weights = load_file(repo / "model.safetensors")
    assert weights["out.weight"].abs().sum() > 0, "the output layer is still the zero init: the head is untrained"
    card = (repo / "README.md").read_text()
    assert f'diversed_head="{head.repo_id}"' in card and f'custom_generate="{head.repo_id}"' in card
    assert f"base_model: {TARGET_HUB_ID}" in card and "## Training" in card and "## Evaluation" in card
    assert f'HEAD_REPO_ID = "{head.repo_id}"' in (repo / "custom_generate" / "generate.py").read_text()


def test_heads_command_exports_and_pushes_complete_repos(tmp_path, monkeypatch, capsys):
    from huggingface_hub import HfApi

    from hf_diversed import cli

    pushed: dict[str, set[str]] = {}
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: repo_id)

    def upload_folder(self, repo_id, folder_path, allow_patterns, **kw):
        pushed[repo_id] = {p for p in allow_patterns if (Path(folder_path) / p).is_file()}
        return f"https://huggingface.co/{repo_id}/commit/0"

    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    argv = ["heads", "--cache-dir", str(tmp_path / "hub"), "--export", str(tmp_path / "repos"), "--push"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    for head in PRETRAINED_HEADS:
        assert (tmp_path / "repos" / head.folder.name / "custom_generate" / "generate.py").is_file()
        assert pushed[head.repo_id] >= {"config.json", "model.safetensors", "README.md", "custom_generate/generate.py"}
        assert f"{head.repo_id}\t{head.task}\t{tmp_path / 'hub'}" in out
        snapshot = next((tmp_path / "hub" / f"models--{head.repo_id.replace('/', '--')}" / "snapshots").iterdir())
        assert (snapshot / "custom_generate" / "generate.py").is_file()


def _run(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("network", ["HF_HUB_OFFLINE=1", "unreachable Hub"])
def test_seeded_heads_load_by_hub_id_without_network(tmp_path, network):
    """After `hf-diversed heads`, every bundled head loads by its Hub id in a fresh process, offline."""
    env = {"HF_HOME": str(tmp_path / "hf_home")}
    if network == "HF_HUB_OFFLINE=1":
        env["HF_HUB_OFFLINE"] = "1"
    else:  # no offline flag: the Hub lookup fails fast and the cache answers
        env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    seeded = subprocess.run(
        [sys.executable, "-m", "hf_diversed.cli", "heads"],
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert seeded.returncode == 0, seeded.stderr[-2000:]
    assert all(h.repo_id in seeded.stdout for h in PRETRAINED_HEADS)
    script = textwrap.dedent(
        """
        from safetensors.torch import load_file
        from hf_diversed import load_head
        from hf_diversed.modeling.pretrained import PRETRAINED_HEADS
        for h in PRETRAINED_HEADS:
            head = load_head(h.repo_id)
            expected = load_file(str(h.folder / "model.safetensors"))
            assert all((p == expected[n]).all() for n, p in head.state_dict().items()), h.repo_id
            assert head.config.task == h.task
        print("OK")
        """
    )
    result = _run(script, env)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def test_export_head_repo_renders_the_card_and_custom_generate(tmp_path):
    head = DiversedHead(DiversedHeadConfig(target_hidden_size=64, draft_hidden_size=32, task="gsm8k"))
    head.save_pretrained(tmp_path / "run")
    (tmp_path / "run" / "README.md").write_text(
        "# old\n\n## Use\n\nold usage\n\n## Training\n\nlr 5e-4, 3 steps\n\n## Evaluation\n\n| a | b |\n"
    )
    (tmp_path / "run" / "checkpoint-1").mkdir()  # training leftovers are not exported
    dest = export_head_repo(tmp_path / "run", tmp_path / "repo", "org/head-x", target_model="t/T", draft_model="d/D")
    card = (dest / "README.md").read_text()
    assert "lr 5e-4, 3 steps" in card and "| a | b |" in card and "old usage" not in card
    assert 'diversed_head="org/head-x"' in card and 'custom_generate="org/head-x"' in card
    config = json.loads((dest / "config.json").read_text())
    assert (config["target_model"], config["draft_model"]) == ("t/T", "d/D")
    assert not (dest / "checkpoint-1").exists()
    assert 'HEAD_REPO_ID = "org/head-x"' in (dest / "custom_generate" / "generate.py").read_text()
    reloaded = DiversedHead.from_pretrained(dest)
    assert all(torch.equal(p, head.state_dict()[n]) for n, p in reloaded.state_dict().items())
    with pytest.raises(FileNotFoundError, match="output_dir of a finished training run"):
        export_head_repo(tmp_path / "nothing", tmp_path / "repo2", "org/y")


@pytest.mark.parametrize("task", ["gsm8k", "mbpp", "humaneval", "cnndm", "xsum"])
def test_the_card_usage_example_prompts_in_the_format_the_head_was_trained_on(task, tmp_path, monkeypatch):
    from hf_diversed.evaluation.tasks import get_task
    from hf_diversed.modeling.model_card import render_head_card

    fields = dict(repo_id="org/h", target_model="t/T", draft_model="d/D", vocab_size=8, weights="", training="",
                  evaluation="")  # fmt: skip
    card = render_head_card(task=task, **fields)
    lines = card[: card.index("inputs = tokenizer.apply_chat_template")].splitlines()
    code = "\n".join(lines[next(i for i, line in enumerate(lines) if line.startswith("draft = ")) + 1 :])
    article = "Officials said on Monday that the bridge will reopen in May."
    (tmp_path / "article.txt").write_text(article)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(code, namespace)
    content = namespace["messages"][0]["content"]
    spec = get_task(task)
    assert namespace["messages"] == spec.build_messages({"article": article, "document": article} | _card_row(task))
    assert (task in ("cnndm", "xsum")) == content.endswith(article)
    recipe = Path(__file__).resolve().parents[1] / "training" / "recipes" / f"{task}-full.yaml"
    if recipe.is_file():  # the length the task's head is trained and evaluated at, so answers are not cut
        assert namespace["max_new_tokens"] == yaml.safe_load(recipe.read_text())["max_new_tokens"]
    assert "max_new_tokens=max_new_tokens," in card and "max_new_tokens=256" not in card
    other = render_head_card(task="a-task-of-my-own", **fields)
    assert '"content": "..."}]  # a prompt in the format the head was trained on' in other
    assert "\nmax_new_tokens = 256\n" in other


# The real rows behind model_cards/usage/<task>.py: GSM8K train row 0, MBPP task 602 (train), HumanEval/0.
_CARD_ROWS: dict[str, dict] = {
    "gsm8k": {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?"
    },
    "mbpp": {
        "text": "Write a python function to find the first repeated character in a given string.",
        "test_list": ['assert first_repeated_char("abcabc") == "a"'],
    },
    "humaneval": {
        "prompt": "from typing import List\n\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
        "    given threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n"
        '    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n    True\n    """\n'
    },
}


def _card_row(task: str) -> dict:
    return dict(_CARD_ROWS.get(task, {}))


def test_the_card_examples_are_real_rows():
    from hf_diversed.evaluation.tasks import get_task

    if not (Path(require_data_dir()) / "gsm8k" / "train.jsonl").is_file():
        pytest.skip("needs the task data folder")
    gsm8k, mbpp = get_task("gsm8k").load("train"), get_task("mbpp").load("train")
    assert gsm8k[0]["question"] == _card_row("gsm8k")["question"]
    row = next(r for r in mbpp if r["task_id"] == 602)
    assert (row["text"], row["test_list"][0]) == (_card_row("mbpp")["text"], _card_row("mbpp")["test_list"][0])
    assert get_task("humaneval").load("test")[0]["prompt"] == _card_row("humaneval")["prompt"]


@pytest.mark.slow
@pytest.mark.real_weights
def test_bundled_gsm8k_head_on_the_real_pair_hf_diversed_equals_custom_generate(tmp_path, monkeypatch):
    """The shipped GSM8K head drives the real pair by Hub id, through hf-diversed and through `custom_generate`
    (the repository's standalone recipe), with identical greedy tokens. Needs the real pair (`hf-diversed models`,
    ~6 min on a cold cache)."""
    pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_diversed.evaluation.demo import demo_row
    from hf_diversed.evaluation.real_models import ensure_pair
    from hf_diversed.evaluation.tasks import get_task
    from hf_diversed.modeling.pretrained import seed_pretrained_heads

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    seed_pretrained_heads(tmp_path / "hub")
    target_path, draft_path = ensure_pair()
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.bfloat16).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=torch.bfloat16).eval()
    task = get_task("gsm8k")
    messages = task.build_messages(demo_row("gsm8k", 0))  # GSM8K test row 0, shipped with the package
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    repo_id = head_for_task("gsm8k")
    common = dict(assistant_model=draft, do_sample=False, max_new_tokens=24, num_assistant_tokens=5)
    native = target.generate(
        ids,
        diversed_head=repo_id,
        num_assistant_tokens_schedule="constant",
        assistant_confidence_threshold=0.0,
        return_dict_in_generate=True,
        **common,
    )
    custom = target.generate(ids, custom_generate=repo_id, trust_remote_code=True, **common)
    assert torch.equal(custom, native.sequences)
    stats = native.diversed_stats
    assert stats.num_drafted > 0 and 0 < stats.acceptance_rate <= 1 and 0 <= stats.mean_weight <= 1
    assert tokenizer.decode(custom[0, ids.shape[1] :]).strip()
