"""``hf-diversed tune``: the choice on hand-made records, end to end on a tiny pair and a JSONL task (resume, records
taken from an earlier run), and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import chat_model, chat_tokenizer
from transformers import AutoModelForCausalLM

from hf_diversed.cli.main import main
from hf_diversed.evaluation import bench, tune
from hf_diversed.evaluation.bench import summarize_records
from hf_diversed.evaluation.bench.frontier import fitted_frontier


def _records(method: str, qualities: list[float], accepted: int, drafted: int = 100) -> list[dict]:
    return [
        {
            "engine": "sampler",
            "task": "gsm8k",
            "split": "test",
            "temperature": 1.0,
            "method": method,
            "N": 5,
            "example_index": i,
            "max_new_tokens": 64,
            "target": "t",
            "draft": "d",
            "dtype": "float32",
            "seed": 0,
            "head": None,
            "lora_draft": None,
            "metric": "exact_match",
            "quality": q,
            "new_tokens": 10,
            "seconds": None,
            "drafted": drafted,
            "accepted": accepted,
            "rounds": 20,
            "verified": drafted,
            "weight_sum": 50.0,
            "mean_tv": 0.1,
        }  # fmt: skip
        for i, q in enumerate(qualities)
    ]


EXACT = [1.0, 0.0] * 20  # 40 rows, quality 50


def test_choice_highest_acceptance_within_budget():
    """static:0.5 matches exact SD row for row (Δ = 0, interval [0, 0]); lossy:0.5 accepts more but loses every
    solved row (Δ = −50); cascade-opt:0.1 matches too but accepts less than static:0.5."""
    records = (
        _records("exact", EXACT, 70)
        + _records("static:0.5", EXACT, 90)
        + _records("lossy:0.5", [0.0] * 40, 95)
        + _records("cascade-opt:0.1", EXACT, 85)
    )
    choice = tune.choose_rule(summarize_records(records), max_drop=1.0)
    points = {p["method"]: p for p in choice["points"]}
    assert points["static:0.5"]["paired_diff"] == 0 and points["static:0.5"]["paired_diff_ci"] == [0, 0]
    assert points["lossy:0.5"]["paired_diff"] == pytest.approx(-50) and not points["lossy:0.5"]["meets_budget"]
    assert points["lossy:0.5"]["budget_needed"] > 1
    assert choice["chosen"]["method"] == "static:0.5" and not choice["fallback"]
    assert choice["chosen"]["acceptance"] == pytest.approx(0.9)
    assert choice["message"].startswith("static:0.5: acceptance 90.0% (exact SD 70.0%)")


def test_choice_no_rule_meets_the_budget_is_exact_sd():
    """Every relaxed rule loses a solved row in four (Δ = −12.5, interval well below −1): exact SD, said so."""
    worse = [0.0 if i % 8 == 0 else q for i, q in enumerate(EXACT)]
    records = _records("exact", EXACT, 70) + _records("static:0.5", worse, 90) + _records("lossy:0.5", worse, 95)
    choice = tune.choose_rule(summarize_records(records), max_drop=1.0)
    assert choice["chosen"]["method"] == "exact" and choice["fallback"]
    assert choice["message"].startswith("no rule meets the budget") and "exact SD" in choice["message"]
    # a budget as loose as the loss's interval allows admits the higher acceptance
    loose = max(p["budget_needed"] for p in choice["points"])
    assert tune.choose_rule(summarize_records(records), max_drop=loose)["chosen"]["method"] == "lossy:0.5"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target/draft on disk and a 4-line JSONL task with numeric answers."""
    root = tmp_path_factory.mktemp("tune")
    lines = [{"prompt": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(4)]
    task = root / "sums.jsonl"
    task.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    tokenizer = chat_tokenizer([line["prompt"] for line in lines] * 5)
    paths = {"task": task, "root": root}
    for name, model in (("target", chat_model(tokenizer, 0)), ("draft", chat_model(tokenizer, 1, noise=0.05))):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        paths[name] = root / name
    return paths


def _argv(pair, out: Path, *extra: str) -> list[str]:
    return [
        "tune", "--task", str(pair["task"]), "--reward", "number", "--target", str(pair["target"]),
        "--draft", str(pair["draft"]), "--calibration-rows", "0:3", "--heldout-rows", "3:4", "--static", "0.2,0.8",
        "--cascade", "opt:0.2", "--lossy", "", "--max-new-tokens", "6", "--batch-size", "4", "--dtype", "float32",
        "--threads", "1", "--max-drop", "1", "--output-dir", str(out), "-q", *extra,
    ]  # fmt: skip


def test_tune_end_to_end_resume_and_records_from(pair, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    assert main(_argv(pair, out)) == 0
    printed = capsys.readouterr().out
    result = json.loads((out / tune.TUNE_FILE).read_text())
    assert (out / tune.FRONTIER_PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    calibration = bench.load_records(out / "calibration" / bench.RESULTS_FILE)
    heldout = bench.load_records(out / "heldout" / bench.RESULTS_FILE)
    rules = ["exact", "static:0.2", "static:0.8", "cascade-opt:0.2", "token-class:digits:0", "token-class:digits:0.3"]
    assert sorted({r["method"] for r in calibration}) == sorted(rules)  # digits: the answers are numbers
    assert sorted((r["method"], r["example_index"]) for r in calibration) == sorted(
        (m, i) for m in rules for i in range(3)
    )
    assert {r["example_index"] for r in heldout} == {3} and {r["sample_seed"] for r in heldout} == {3}
    assert {r["task"] for r in calibration + heldout} == {"sums"}

    # the choice against the records: the frontier is the static sweep with exact SD, non-increasing; the chosen
    # rule meets the budget and no rule that meets it accepts more
    rows = [r for r in summarize_records(calibration) if r["method"] != "ar"]
    frontier = [r for r in rows if r["method"] == "exact" or r["method"].startswith("static:")]
    accs, fitted = fitted_frontier([(r["acceptance_rate"], r["quality"]) for r in frontier])
    assert result["calibration"]["frontier"]["acceptance"] == pytest.approx(accs)
    assert result["calibration"]["frontier"]["quality"] == pytest.approx(fitted)
    assert result["rule"] == tune.choose_rule(rows, 1.0)["chosen"]["method"]
    points = result["calibration"]["points"]
    assert len(points) == len(rules)
    chosen = next(p for p in points if p["method"] == result["rule"])
    assert chosen["meets_budget"] and all(p["acceptance"] <= chosen["acceptance"] for p in points if p["meets_budget"])
    assert result["spec"] == {"diversed_verifier": result["rule"]}
    assert result["heldout"]["n"] == 1 and result["heldout"]["holds"] in (True, False)
    assert result["settings"]["calibration_rows"] == [0, 3] and result["task"]["reward"] == "number"
    assert result["command"].startswith("hf-diversed tune --task")
    assert f'diversed_verifier="{result["rule"]}"' in printed and "extra_args=" in printed

    # a rerun resumes: nothing left to generate, so no model is loaded and no record added
    def no_models(*args, **kwargs):
        raise AssertionError("a finished tune must not load models again")

    monkeypatch.setattr(bench.runner, "_load_models", no_models)
    assert main(_argv(pair, out)) == 0
    assert bench.load_records(out / "calibration" / bench.RESULTS_FILE) == calibration
    assert json.loads((out / tune.TUNE_FILE).read_text())["rule"] == result["rule"]

    # a fresh folder fed the records: copied, not generated, the same choice
    again = tmp_path / "again"
    sources = ["--records-from", str(out / "calibration" / bench.RESULTS_FILE),
               "--records-from", str(out / "heldout" / bench.RESULTS_FILE)]  # fmt: skip
    assert main(_argv(pair, again, *sources)) == 0
    assert len(bench.load_records(again / "calibration" / bench.RESULTS_FILE)) == len(calibration)
    copied = json.loads((again / tune.TUNE_FILE).read_text())
    assert copied["rule"] == result["rule"] and copied["calibration"]["points"] == points

    # the same records with every relaxed rule failing the rows exact SD solves: no rule meets the budget, exact SD
    # is the choice, and the run says so
    edited = tmp_path / "edited.jsonl"
    lines = [{**r, "quality": float(r["method"] == "exact")} for r in calibration + heldout]
    edited.write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    capsys.readouterr()
    assert main(_argv(pair, tmp_path / "strict", "--records-from", str(edited))) == 0
    printed = capsys.readouterr().out
    strict = json.loads((tmp_path / "strict" / tune.TUNE_FILE).read_text())
    assert strict["rule"] == "exact" and strict["fallback_to_exact"]
    assert strict["spec"] == {"diversed_verifier": "exact"}
    assert printed.startswith("chosen: exact (no rule meets the budget") and 'diversed_verifier="exact"' in printed


@pytest.mark.parametrize(
    ("lines", "extra", "message"),
    [
        (None, ["--task", "nosuchtask"], "unknown task 'nosuchtask'; pass one of gsm8k"),
        ([{"prompt": "a", "answer": "1"}, {"prompt": "b"}], ["--reward", "number"],
         'line 2 has no "answer" field, which --reward number reads; add "answer"'),
        ([{"prompt": "a", "answer": "1"}], [], "is a JSONL file: say how to score it with --reward"),
        ([{"answer": "1"}], ["--reward", "number"], 'line 1 has no "prompt" (a string) or "messages"'),
        ([{"prompt": "a", "answer": "1"}], ["--reward", "bleu"], "unknown --reward 'bleu'"),
        ([{"prompt": "a", "reference": "x"}], ["--reward", "rouge", "--heldout-rows", "0:5"], "overlap"),
        ([{"prompt": "a", "answer": "1"}], ["--reward", "number", "--calibration-rows", "5:9", "--target", "none"],
         "has 1 rows, none in --calibration-rows 5:9"),
    ],
)  # fmt: skip
def test_tune_user_errors_are_one_line(tmp_path, capsys, lines, extra, message):
    argv = ["tune", "--output-dir", str(tmp_path / "out")]
    if lines is not None:
        task = tmp_path / "mine.jsonl"
        task.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        argv += ["--task", str(task)]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-diversed tune: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_jsonl_rewards(tmp_path, monkeypatch):
    """Each --reward scores with the built-in tasks' metric code; a callable gets every other field."""
    from hf_diversed.evaluation.tasks import jsonl_task

    def task(line: dict, reward: str):
        path = tmp_path / "t.jsonl"
        path.write_text(json.dumps({"prompt": "p", **line}) + "\n", encoding="utf-8")
        made = jsonl_task(path, reward)
        row = made.load("test")[0]
        return made, {c: [row[c]] for c in made.reward_columns}

    made, cols = task({"answer": 12}, "number")
    assert made.reward(None, ["so 5 + 7\n#### 12", "#### 13"], answer=cols["answer"] * 2) == [1.0, 0.0]
    made, cols = task({"answer": "B"}, r"regex:Answer: ([A-D])")
    assert made.reward(None, ["Answer: A ... Answer: B"], **cols) == [1.0] and made.metric_name == "exact_match"
    made, cols = task({"reference": "the cat sat on the mat"}, "rouge")
    assert made.reward(None, ["the cat sat on the mat"], **cols) == [pytest.approx(100.0)]
    made, cols = task({"tests": ["assert double(2) == 4"]}, "pass@1")
    good, bad = "```python\ndef double(x):\n    return 2 * x\n```", "```python\ndef double(x):\n    return x\n```"
    assert made.reward(None, [good, bad], tests=cols["tests"] * 2) == [1.0, 0.0] and made.metric_name == "pass@1"
    (tmp_path / "my_reward.py").write_text(
        "def length_ok(prompts, completions, limit, **kw):\n"
        "    return [float(len(c) <= n) for c, n in zip(completions, limit)]\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    made, cols = task({"limit": 3}, "my_reward:length_ok")
    assert made.reward_columns == ("limit",) and made.metric_name == "length_ok"
    assert made.reward(None, ["abc"], **cols) == [1.0]


def test_help_states_the_criterion(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    assert "lower end of the 95% paired bootstrap interval" in " ".join(capsys.readouterr().out.split())


def test_tune_sweeps_a_head_beside_the_rules(pair, tmp_path):
    """A --head runs as its own point; chosen, it is named by diversed_head, held out beside exact SD."""
    from hf_diversed import DiversedHead
    from hf_diversed.evaluation.bench.config import _canonical_model

    head_dir = tmp_path / "head"
    target, draft = (AutoModelForCausalLM.from_pretrained(pair[name]) for name in ("target", "draft"))
    DiversedHead.for_models(target, draft, head_hidden_size=8, init_weight=0.01).save_pretrained(head_dir)
    out = tmp_path / "out"
    argv = _argv(pair, out, "--head", str(head_dir), "--static", "0.5", "--cascade", "", "--token-class", "")
    assert main([*argv, "--max-drop", "100"]) == 0  # every rule meets it: the head (w = 0.01) accepts the most
    result = json.loads((out / tune.TUNE_FILE).read_text())
    label = f"diversed@{_canonical_model(str(head_dir))}"
    assert {p["method"] for p in result["calibration"]["points"]} == {"exact", "static:0.5", label}
    assert result["rule"] == "diversed" and result["head"] == str(head_dir)
    assert result["spec"] == {"diversed_head": str(head_dir)} and result["heldout"]["method"] == label
    assert '"diversed_head"' in result["usage"]["vllm"]
