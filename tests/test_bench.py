"""``hf-diversed bench`` end to end on tiny random models saved to disk, then kill-and-resume."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import chat_model, chat_tokenizer, require_data_dir
from transformers import LlamaForCausalLM

from hf_diversed import DiversedHead
from hf_diversed.cli import bench as bench_cli
from hf_diversed.evaluation import bench
from hf_diversed.evaluation.bench.costs import costs_key

METHODS = ["ar", "exact", "lossy:0.5", "cascade-opt:0.2", "diversed", "static:0.3", "static:0.7"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Tiny target/draft/head on disk and a 3-row slice of GSM8K and MBPP test."""
    source = require_data_dir()
    root = tmp_path_factory.mktemp("bench")
    data = root / "data"
    texts = []
    for task in ("gsm8k", "mbpp"):
        src = source / task / "test.jsonl"
        if not src.is_file():
            pytest.skip(f"{src} missing")
        lines = src.read_text(encoding="utf-8").splitlines()
        (data / task).mkdir(parents=True)
        (data / task / "test.jsonl").write_text("\n".join(lines[:3]) + "\n", encoding="utf-8")
        texts += [json.dumps(json.loads(line)) for line in lines[:20]]
    tokenizer = chat_tokenizer(texts)
    target, draft = chat_model(tokenizer, 0), chat_model(tokenizer, 1, noise=0.05)
    paths = {"target": root / "target", "draft": root / "draft", "head": root / "head", "data": data}
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    head = DiversedHead.for_models(target, draft, head_hidden_size=8)
    torch.nn.init.normal_(head.out.weight, std=0.5)
    head.save_pretrained(paths["head"])
    paths["draft_model"] = draft
    return paths


def _argv(setup, out: Path, *extra: str, examples: int = 2) -> list[str]:
    return [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k,mbpp", "--methods", "ar,exact,lossy:0.5,cascade-opt:0.2,diversed",
        "--static-sweep", "0.3,0.7", "--head", str(setup["head"]), "--num-examples", str(examples),
        "--timed-examples", "1", "--batch-size", "4", "--max-new-tokens", "8", "--temperature", "1",
        "--dtype", "float32", "--threads", "1", "--output-dir", str(out), "-q", *extra,
    ]  # fmt: skip


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


SAMPLED = [m for m in METHODS if m != "ar"]


def _simulated_clocks(monkeypatch) -> None:
    """The bench times on clocks that read one second later at every reading: each timed generation takes 1 s, and
    the costs' every timed call too (c = 1, v = 1), whatever the machine's speed."""
    import functools
    import itertools

    from hf_diversed.evaluation import methods

    def ticking(fn):
        return functools.partial(fn, clock=functools.partial(next, itertools.count()))

    monkeypatch.setattr(methods, "timed_generate", ticking(methods.timed_generate))
    monkeypatch.setattr(bench.runner, "measure_costs", ticking(bench.runner.measure_costs))


def test_bench_end_to_end_and_resume(setup, tmp_path, monkeypatch):
    """Every example through the sampler (quality, acceptance), the first one also timed with the real loop (on a
    simulated clock: the speed columns are arithmetic on it)."""
    _simulated_clocks(monkeypatch)
    out = tmp_path / "out"
    assert bench_cli.main(_argv(setup, out)) == 0

    results = out / bench.RESULTS_FILE
    records = _lines(results)
    loop = [r for r in records if r["engine"] == "loop"]
    sampled = [r for r in records if r["engine"] == "sampler"]
    assert len(loop) == 2 * 1 * len(METHODS)  # tasks x timed examples x methods
    assert len(sampled) == 2 * 2 * len(SAMPLED)  # tasks x examples x methods with a draft
    assert {r["method"] for r in sampled} == set(SAMPLED)
    assert len({bench.record_key(r) for r in records}) == len(records)
    for r in records:
        assert r["task"] in ("gsm8k", "mbpp") and r["example_index"] in (0, 1)
        assert 0 < r["new_tokens"] <= 8 and r["sample_seed"] == r["example_index"]
        assert r["quality"] in (0.0, 1.0) and isinstance(r["completion"], str)
        assert r["dtype"] == "float32" and r["cpu_capability"]
        if r["engine"] == "loop":
            assert r["seconds"] == 1.0 and r["tokens_per_s"] == r["new_tokens"] and r["example_index"] == 0
        else:
            assert r["seconds"] is None and r["finish_reason"] in ("eos", "length")
        if r["method"] == "ar":
            assert r["N"] is None and r["draft"] is None and r["drafted"] is None
        else:
            assert r["N"] == 5 and r["drafted"] > 0 and 0 <= r["acceptance_rate"] <= 1
            assert r["mean_accepted_per_round"] >= 1
        assert (r["head"] is not None) == (r["method"] == "diversed")

    summary = json.loads((out / bench.SUMMARY_FILE).read_text())
    rows = summary["rows"]
    assert len(rows) == 2 * len(METHODS)
    assert {(r["task"], r["method"]) for r in rows} == {(t, m) for t in ("gsm8k", "mbpp") for m in METHODS}
    for row in rows:
        assert row["n"] == 2 and row["n_timed"] == 1 and row["n_ar"] == 1
        assert row["tokens_per_s"] > 0 and row["speedup"] > 0
        assert row["quality"] is not None and 0 <= row["quality"] <= 100
        if row["method"] == "ar":
            assert row["speedup"] == pytest.approx(1.0) and row["acceptance_rate"] is None
            assert row["quality_from"] == "sampler (exact SD: same law)"
            exact = next(r for r in rows if (r["task"], r["method"]) == (row["task"], "exact"))
            assert row["quality"] == exact["quality"]
            continue
        assert row["quality_from"] == "sampler"
        mine = [r for r in sampled if (r["task"], r["method"]) == (row["task"], row["method"])]
        cut = [r for r in mine if r["new_tokens"] == 8]
        assert row["truncated_rate"] == pytest.approx(len(cut) / 2)  # 8 = --max-new-tokens
        accepted, drafted = sum(r["accepted"] for r in mine), sum(r["drafted"] for r in mine)
        assert row["acceptance_rate"] == pytest.approx(accepted / drafted) and row["mean_accepted_per_round"] >= 1
        assert row["verified_acceptance_rate"] >= row["acceptance_rate"]
        assert row["analytic_speedup_v1"] is not None and row["c"] == 1.0 and row["v"] == 1.0
    exact = next(r for r in rows if r["method"] == "exact")
    alpha, c, v, tau = exact["acceptance_rate"], exact["c"], exact["v"], exact["mean_accepted_per_round"]
    assert exact["mean_weight"] == pytest.approx(1.0)
    assert exact["analytic_speedup_v1"] == pytest.approx(bench.analytic_speedup(alpha, 5, c, 1.0))
    assert exact["tau_speedup_v1"] == pytest.approx(tau / (5 * c + 1))
    assert v is None or exact["analytic_speedup"] == pytest.approx(bench.analytic_speedup(alpha, 5, c, v))
    assert summary["command"].startswith("hf-diversed bench --target")
    assert summary["cpu_capabilities"]

    markdown = (out / bench.MARKDOWN_FILE).read_text()
    assert summary["command"] in markdown.splitlines()[3]
    assert "batched law-exact sampler" in markdown and "real batch-1 loop" in markdown
    table = [line for line in markdown.splitlines() if line.startswith("| gsm8k") or line.startswith("| mbpp")]
    assert len(table) == 2 * len(METHODS)
    assert any("static:0.3" in line for line in table) and any("diversed" in line for line in table)
    for name in (bench.PLOT_FILE, bench.PLOT_ACCEPTANCE_FILE):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # rerun: everything is done, so no model is even loaded and nothing is appended
    def no_models(*args, **kwargs):
        raise AssertionError("a finished run must not load models again")

    with monkeypatch.context() as m:
        m.setattr(bench.runner, "_load_models", no_models)
        assert bench_cli.main(_argv(setup, out)) == 0
        assert bench_cli.main(_argv(setup, out, "--summarize-only")) == 0
    assert _lines(results) == records

    # the run log: one line per invocation that had work (the finished rerun above added none)
    (run,) = _lines(out / bench.RUNS_FILE)
    assert run["command"] == summary["command"] and run["commit"] and run["to_run"] == len(records)
    assert run["batch_size"] == 4 and run["threads"] == 1 and run["cpu_capability"]
    assert summary["runs"]["records"] == len(records) and summary["runs"]["records_before_log"] == 0
    assert summary["runs"]["runs"][0]["sampler_records"] == len(sampled)
    assert "Runs (from `runs.jsonl`" in markdown

    # a run killed mid-write: the last 3 records are lost and the 4th from last is half-written
    raw = results.read_text(encoding="utf-8").splitlines(keepends=True)
    results.write_text("".join(raw[:-4]) + raw[-4][:25], encoding="utf-8")
    measured = []
    real_measure = bench.runner.measure_costs
    monkeypatch.setattr(bench.runner, "measure_costs", lambda *a, **k: measured.append(1) or real_measure(*a, **k))
    assert bench_cli.main(_argv(setup, out)) == 0
    assert measured == []  # the costs of this pair are on disk already
    resumed = bench.load_records(results)
    assert len(resumed) == len(records)
    assert {bench.record_key(r) for r in resumed} == {bench.record_key(r) for r in records}
    # the sampler's records do not depend on which batch a sequence fell in: the redone ones are the same
    before = {bench.record_key(r): r["completion"] for r in records if r["engine"] == "sampler"}
    after = {bench.record_key(r): r["completion"] for r in resumed if r["engine"] == "sampler"}
    assert before == after

    # one more example: only its sampler records are added (the timed subset stays at 1); --remeasure-costs
    # times the models again
    assert bench_cli.main(_argv(setup, out, "--remeasure-costs", examples=3)) == 0
    assert measured == [1]
    grown = bench.load_records(results)
    added = grown[len(resumed) :]
    assert len(added) == 2 * len(SAMPLED) and {r["engine"] for r in added} == {"sampler"}
    assert {r["example_index"] for r in added} == {2}
    summary = json.loads((out / bench.SUMMARY_FILE).read_text())
    assert all(row["n"] == 3 and row["n_timed"] == 1 for row in summary["rows"])
    assert (out / "costs.json").is_file() and summary["costs"]
    assert len(_lines(out / bench.RUNS_FILE)) == 3 and summary["runs"]["records"] == len(grown)

    # a command asking for fewer examples summarizes those, while its run log still counts what every earlier
    # invocation wrote into the folder
    assert bench_cli.main(_argv(setup, out, examples=1)) == 0
    summary = json.loads((out / bench.SUMMARY_FILE).read_text())
    assert all(row["n"] == 1 for row in summary["rows"]) and summary["runs"]["records"] == len(grown)

    # the importable API: summarize an existing output directory
    summary = bench.run_bench(bench.BenchConfig(output_dir=str(out), summarize_only=True, progress=False))
    assert summary["num_records"] == len(grown) and summary["command"].startswith("run_bench(BenchConfig(")
    # rebuilding from the same records leaves summary.json as it was (its generated_at included)
    written = (out / bench.SUMMARY_FILE).read_text()
    time.sleep(1.1)
    bench.run_bench(bench.BenchConfig(output_dir=str(out), summarize_only=True, progress=False))
    assert (out / bench.SUMMARY_FILE).read_text() == written


def test_plot_names_every_head_apart():
    """Heads of different runs share a folder name; the plot's legend names them by run and head."""
    from hf_diversed.evaluation.plotting import point_label

    rows = [
        {"method": "diversed", "head": "docs/training/gsm8k-full/opt0.1-lambda-0.01", "N": 5},
        {"method": "diversed", "head": "docs/training/mbpp-full/opt0.1-lambda-0.01", "N": 5},
        {"method": "diversed", "head": "org/head-gsm8k", "N": 3},
        {"method": "static:0.5", "head": None, "N": 5},
    ]
    labels = [point_label(r) for r in rows]
    assert labels == [
        "diversed gsm8k-full/opt0.1-lambda-0.01",
        "diversed mbpp-full/opt0.1-lambda-0.01",
        "diversed org/head-gsm8k",
        "static:0.5",
    ]
    assert point_label(rows[2], multi_n=True) == "diversed org/head-gsm8k N=3"


def test_frontier_panels_give_each_method_one_color(tmp_path):
    """The time and acceptance panels of Figure 2 order the methods differently along x; each method keeps its
    color and marker in both, so one legend reads both panels."""
    from matplotlib.colors import to_hex

    from hf_diversed.evaluation.plotting import _draw_panel, _figure, plot_quality_frontiers

    def row(method, acceptance, seconds, quality):
        return {"task": "cnndm", "temperature": 0.0, "N": 5, "method": method, "acceptance_rate": acceptance,
                "seconds_per_token": seconds, "quality": quality, "quality_ci": [quality - 1, quality + 1]}  # fmt: skip

    rows = [
        row("ar", None, 0.20, 11.0),
        row("exact", 0.55, 0.16, 11.0),
        *(row(f"static:{w}", 1 - 0.45 * w, 0.12 + 0.04 * w, 10.5 + w) for w in (0, 0.5, 1)),
        row("cascade-opt:0.3", 0.87, 0.14, 11.7),  # the highest acceptance of the points, not the fastest
        row("diversed", 0.86, 0.12, 11.3),
        row("cascade-chow:0.5", 0.70, 0.13, 11.8),
    ]
    fig, axes = _figure(2)
    styles = []
    for ax, x in zip(axes, ("seconds_per_token", "acceptance_rate"), strict=True):
        _draw_panel(ax, rows, x, "cnndm, T=0")
        handles, labels = ax.get_legend_handles_labels()
        points = {label: h for label, h in zip(labels, handles, strict=True) if label in {r["method"] for r in rows}}
        styles.append({label: (to_hex(h[0].get_color()), h[0].get_marker()) for label, h in points.items()})
    time_panel, acceptance_panel = styles
    assert set(acceptance_panel) == {"exact", "cascade-opt:0.3", "diversed", "cascade-chow:0.5"}  # no ar: no acceptance
    assert all(time_panel[m] == acceptance_panel[m] for m in acceptance_panel)
    assert len(set(time_panel.values())) == len(time_panel)  # and no two methods share one
    assert plot_quality_frontiers(rows, tmp_path / "frontier.png").is_file()


def test_greedy_engines_agree_and_lora_draft(setup, tmp_path):
    """At T = 0 the sampler's completions are the real loop's (the LoRA draft and a token-class rule included);
    greedy exact SD is the target alone."""
    from peft import LoraConfig, get_peft_model

    adapter = tmp_path / "lora"
    draft = LlamaForCausalLM.from_pretrained(setup["draft"])
    peft_model = get_peft_model(draft, LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(adapter)

    out = tmp_path / "out"
    argv = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k", "--lora-draft", str(adapter), "--num-examples", "2", "--timed-examples", "2",
        "--ar-examples", "1", "--max-new-tokens", "6", "--temperature", "0", "--num-assistant-tokens", "3",
        "--dtype", "float32", "--output-dir", str(out), "--no-costs", "--no-warmup", "-q",
        "--methods", "ar,exact,token-class:digits:0.0",
    ]  # fmt: skip
    assert bench_cli.main(argv) == 0
    records = _lines(out / bench.RESULTS_FILE)
    loop = {(r["method"], r["example_index"]): r for r in records if r["engine"] == "loop"}
    sampled = {(r["method"], r["example_index"]): r for r in records if r["engine"] == "sampler"}
    drafted = ["exact", "exact+lora-draft", "token-class:digits:0"]  # the spec is normalised
    assert sorted(loop) == [("ar", 0)] + [(m, i) for m in drafted for i in (0, 1)]
    assert sorted(sampled) == [(m, i) for m in drafted for i in (0, 1)]
    assert all(0.0 <= r["mean_weight"] <= 1.0 for r in records if r["method"] == "token-class:digits:0")
    for key, record in sampled.items():
        assert record["completion"] == loop[key]["completion"], key
        for field in ("drafted", "accepted", "rounds", "verified"):
            assert record[field] == loop[key][field], (key, field)
    lora = [r for r in records if r["method"] == "exact+lora-draft"]
    assert all(r["lora_draft"] == str(adapter.resolve()) and r["N"] == 3 for r in lora)
    assert loop["exact", 0]["completion"] == loop["ar", 0]["completion"]  # greedy exact SD reproduces the target
    rows = json.loads((out / bench.SUMMARY_FILE).read_text())["rows"]
    exact_row = next(r for r in rows if r["method"] == "exact")
    assert exact_row["n"] == 2 and exact_row["n_ar"] == 1 and exact_row["speedup_matched"] is not None
    assert exact_row["analytic_speedup_v1"] is None  # --no-costs
    assert "ar n=1" in (out / bench.MARKDOWN_FILE).read_text()


ROOT = Path(__file__).resolve().parents[1]
# what depends only on a sampler record's seed (its batch only moves float sums in the last bits)
SEED_FIELDS = ("completion", "new_tokens", "finish_reason", "quality", "drafted", "accepted", "rounds", "verified")
FLOAT_FIELDS = ("weight_sum", "mean_weight", "mean_tv", "acceptance_rate", "verified_acceptance_rate")


def _free_port() -> int:
    with socket.socket() as sock:  # not accelerate's default 29500: another launched test may hold it
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_data_parallel_under_accelerate_launch(setup, tmp_path):
    """Two CPU processes share the examples and one results file; the main process alone writes the summary."""
    argv = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k,mbpp", "--methods", "ar,exact,static:0.5,diversed", "--head", str(setup["head"]),
        "--num-examples", "3", "--timed-examples", "1", "--batch-size", "4", "--max-new-tokens", "8",
        "--temperature", "1", "--dtype", "float32", "--threads", "1",
    ]  # fmt: skip
    parallel, single = tmp_path / "parallel", tmp_path / "single"
    # `accelerate launch --cpu` starts one process; `--multi_gpu` starts two, joined in a gloo group on CPUs
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--multi_gpu", "--num_processes",
           "2", "--main_process_port", str(_free_port()), "-m", "hf_diversed.cli", "bench", *argv,
           "--output-dir", str(parallel)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert bench_cli.main([*argv, "--output-dir", str(single), "-q"]) == 0

    lines = (parallel / bench.RESULTS_FILE).read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]  # every line whole: one atomic append per record
    expected = {bench.record_key(r): r for r in _lines(single / bench.RESULTS_FILE)}
    keys = [bench.record_key(r) for r in records]
    assert len(keys) == len(set(keys)) == len(expected) == 2 * (4 + 3 * 3)  # loop: 1 example; sampler: 3 x 3
    assert set(keys) == set(expected)
    assert {r["process_index"] for r in records} == {0, 1}
    assert all(r["num_processes"] == 2 and r["example_index"] % 2 == r["process_index"] for r in records)
    assert all(r["num_processes"] == 1 and r["process_index"] == 0 for r in expected.values())
    for record in records:  # each sampler record depends only on its seed, not on the process or the batch
        if record["engine"] == "sampler":
            other = expected[bench.record_key(record)]
            assert {f: record[f] for f in SEED_FIELDS} == {f: other[f] for f in SEED_FIELDS}
            assert {f: record[f] for f in FLOAT_FIELDS} == pytest.approx({f: other[f] for f in FLOAT_FIELDS}, rel=1e-4)

    # the main process alone measured the costs, summarized and printed; the other one stayed quiet
    assert result.stdout.count("records summarized") == 1 and result.stdout.count("# hf-diversed bench") == 1
    assert result.stderr.count("generations planned") == 1 and result.stderr.count("measuring per-token") == 1
    summary = json.loads((parallel / bench.SUMMARY_FILE).read_text())
    assert summary["num_records"] == len(records) and summary["config"]["num_processes"] == 2
    assert {(r["task"], r["method"]) for r in summary["rows"]} == {
        (t, m) for t in ("gsm8k", "mbpp") for m in ("ar", "exact", "static:0.5", "diversed")
    }
    assert all(row["n"] == 3 and row["n_timed"] == 1 for row in summary["rows"])
    assert (parallel / bench.MARKDOWN_FILE).is_file() and summary["costs"]


def _append_many(path: str, worker: int, count: int) -> None:
    appender = bench.plan._Appender(Path(path))
    for i in range(count):
        appender.write({"worker": worker, "i": i, "pad": str(worker) * 20_000})
    appender.close()


def test_appends_from_two_processes_never_interleave(tmp_path):
    """Each record is one O_APPEND write: lines longer than any buffer stay whole under concurrent appends."""
    import multiprocessing

    path = tmp_path / "results.jsonl"
    path.write_text('{"torn": ', encoding="utf-8")  # a killed run's half line: the main process ends it first
    bench.plan._repair_torn_line(path)
    workers = [multiprocessing.Process(target=_append_many, args=(str(path), w, 40)) for w in (1, 2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == '{"torn": ' and len(lines) == 81
    records = [json.loads(line) for line in lines[1:]]
    assert all(r["pad"] == str(r["worker"]) * 20_000 for r in records)
    assert sorted((r["worker"], r["i"]) for r in records) == [(w, i) for w in (1, 2) for i in range(40)]


@pytest.mark.parametrize(
    "extra, fix",
    [
        (["--tasks", "gsm9k"], "--tasks"),
        (["--methods", "ar,fast"], "Valid methods"),
        (["--methods", "token-class:vowels:0"], "unknown token class"),
        (["--methods", "diversed"], "--head"),
        (["--methods", "exact+lora-draft"], "--lora-draft"),
        (["--methods", "exact", "--head", "org/h"], "add diversed to --methods"),
        (["--methods", "diversed", "--head", "org/h", "--head", "org/h"], "given twice"),
        (["--num-assistant-tokens", "0"], ">= 1"),
        (["--temperature", "-1"], ">= 0"),
        (["--static-sweep", "0.1,x"], "--static-sweep"),
        (["--cascade-sweep", "fast:0.1"], "VARIANT:A"),
        (["--split", "validation", "--tasks", "gsm8k"], "--split"),
        (["--split", "test[1]", "--tasks", "gsm8k"], "--split"),
        (["--split", "validation[:10]", "--tasks", "gsm8k"], "test[100:]"),
        (["--ar-examples", "9", "--num-examples", "2"], "--ar-examples"),
        (["--timed-examples", "-1"], "--timed-examples"),
        (["--batch-size", "0"], "--batch-size"),
        (["--data-dir", "/nonexistent/data"], "--data-dir"),
        (["--summarize-only"], "without --summarize-only"),
        (["--remeasure-costs", "--no-costs"], "drop one"),
        (["--remeasure-costs", "--summarize-only"], "drop one"),
    ],
)
def test_user_errors_name_the_fix(tmp_path, capsys, extra, fix):
    argv = ["--output-dir", str(tmp_path / "empty"), "-q", *extra]
    assert bench_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hf-diversed bench: error: ") and fix in err


def test_missing_model_names_the_fix(setup, tmp_path, capsys):
    argv = [
        "--target", str(tmp_path / "no-such-model"), "--draft", str(setup["draft"]), "--tasks", "gsm8k",
        "--data-dir", str(setup["data"]), "--num-examples", "1", "--output-dir", str(tmp_path / "o"), "-q",
    ]  # fmt: skip
    assert bench_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--target" in err and "local directory" in err


def test_missing_data_names_the_fix(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    argv = ["--tasks", "gsm8k", "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "o"), "-q"]
    assert bench_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "gsm8k/test.jsonl" in err and "--data-dir" in err


def test_analytic_speedup():
    assert bench.analytic_speedup(0.0, 5, 0.2, 1.0) == pytest.approx(1 / 2.0)
    assert bench.analytic_speedup(1.0, 5, 0.2, 1.0) == pytest.approx(6 / 2.0)
    alpha, gamma, c, v = 0.8, 4, 0.1, 1.2
    expected = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + v))
    assert bench.analytic_speedup(alpha, gamma, c, v) == pytest.approx(expected)
    assert bench.analytic_speedup(None, 5, 0.2) is None and bench.analytic_speedup(math.nan, 5, 0.2) is None


def test_expand_methods():
    assert bench.expand_methods("exact,static:0.50", static_sweep="0.5,0.9", cascade_sweep="opt:0.1") == (
        "ar", "exact", "static:0.5", "static:0.9", "cascade-opt:0.1",
    )  # fmt: skip
    assert bench.expand_methods(None, heads=["h"]) == ("ar", "exact", "diversed")


def test_several_heads_run_side_by_side_each_as_if_alone(setup, tmp_path):
    """`--head A --head B`: method diversed once per head in one run, records keyed by the head; a head's records are
    those it gets when run alone (each sequence depends on its prompt, seed and head, not on its batch)."""
    other = tmp_path / "head-b"
    head = DiversedHead.from_pretrained(setup["head"])
    torch.nn.init.normal_(head.out.weight, std=0.5, generator=torch.Generator().manual_seed(1))
    head.save_pretrained(other)
    common = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k", "--methods", "exact,diversed", "--num-examples", "3", "--timed-examples", "1",
        "--batch-size", "4", "--max-new-tokens", "8", "--dtype", "float32", "--threads", "1", "--no-costs", "-q",
    ]  # fmt: skip
    both, alone = tmp_path / "both", tmp_path / "alone"
    assert bench_cli.main([*common, "--head", str(setup["head"]), "--head", str(other), "--output-dir", str(both)]) == 0
    assert bench_cli.main([*common, "--head", str(other), "--output-dir", str(alone)]) == 0

    def diversed(out):
        return {(r["engine"], r["head"], r["example_index"]): r for r in _lines(out / bench.RESULTS_FILE)
                if r["method"] == "diversed"}  # fmt: skip

    records, single = diversed(both), diversed(alone)
    names = {str(setup["head"].resolve()), str(other.resolve())}
    assert {h for _, h, _ in records} == names
    assert sorted(records) == sorted(
        (e, h, i) for h in names for e, i in [("loop", 0)] + [("sampler", i) for i in range(3)]
    )
    for key, record in single.items():
        assert record["head"] == str(other.resolve())
        assert record["completion"] == records[key]["completion"] and record["accepted"] == records[key]["accepted"]
    rows = json.loads((both / bench.SUMMARY_FILE).read_text())["rows"]
    assert {r["head"] for r in rows if r["method"] == "diversed"} == names
    table = (both / "results.md").read_text()
    assert "| task | T | head | method |" in table  # the heads differ: a column of their own


def test_intervals_and_paired_differences():
    assert bench.wilson_interval(0, 10)[0] == 0.0 and 0.25 < bench.wilson_interval(0, 10)[1] < 0.35
    low, high = bench.wilson_interval(15, 48)
    assert low < 15 / 48 < high and high - low == pytest.approx(0.26, abs=0.02)
    low, high = bench.bootstrap_interval([1.0, 2.0, 3.0, 4.0] * 25)
    assert low < 2.5 < high and high - low < 0.5
    assert bench.bootstrap_interval([1.0, 2.0]) == bench.bootstrap_interval([1.0, 2.0])  # deterministic

    def record(method, index, quality, engine="sampler"):
        return dict(task="gsm8k", split="test", temperature=1.0, target="t", max_new_tokens=8, dtype="float32",
                    seed=0, method=method, N=None if method == "ar" else 5, draft=None if method == "ar" else "d",
                    head=None, lora_draft=None, engine=engine, example_index=index, quality=quality,
                    metric="exact_match", new_tokens=8, seconds=1.0 if engine == "loop" else None,
                    drafted=None if method == "ar" else 10, accepted=5, rounds=3, verified=6,
                    weight_sum=3.0)  # fmt: skip

    exact = [record("exact", i, float(i % 2)) for i in range(20)]
    static = [record("static:0.5", i, 1.0) for i in range(20)]
    rows = {r["method"]: r for r in bench.summarize_records(exact + static + [record("ar", 0, 0.0, "loop")])}
    assert rows["static:0.5"]["paired_diff"] == pytest.approx(50.0) and rows["static:0.5"]["paired_n"] == 20
    low, high = rows["static:0.5"]["paired_diff_ci"]
    assert 25 < low < 50 < high <= 75
    assert rows["exact"]["quality"] == pytest.approx(50.0) and rows["exact"]["paired_diff"] is None
    assert rows["ar"]["quality"] == pytest.approx(50.0) and rows["ar"]["n"] == 20  # exact SD's law
    assert rows["static:0.5"]["quality_ci"][1] == pytest.approx(100.0)


def test_run_log_gives_wall_clock_and_throughput():
    """An invocation owns the records written between its start and the next one's; its wall-clock time runs
    from its start to its last record; one stopped before its first record is counted, not listed."""
    from hf_diversed.evaluation.bench.runs import format_runs, invocation_of, summarize_runs

    def record(stamp, tokens, engine="sampler"):
        return {"time": f"2026-11-26T{stamp}+0000", "new_tokens": tokens, "engine": engine}

    runs = [{"started": "2026-11-26T10:00:00+0000", "commit": "abc"},
            {"started": "2026-11-26T11:45:00+0000", "commit": "killed"},
            {"started": "2026-11-26T12:00:00+0000", "commit": "def"}]  # fmt: skip
    records = [record("09:00:00", 99), record("10:30:00", 300), record("11:00:00", 600),
               record("12:10:00", 50), record("12:20:00", 10, engine="loop")]  # fmt: skip
    summary = summarize_runs(runs, records)
    first, second = summary["runs"]
    assert (first["records"], first["new_tokens"], first["wall_seconds"]) == (2, 900, 3600.0)
    assert first["sampler_tokens_per_s"] == pytest.approx(900 / 3600)
    assert (second["records"], second["sampler_records"], second["wall_seconds"]) == (2, 1, 1200.0)
    assert second["sampler_tokens_per_s"] == pytest.approx(50 / 600)  # to its last sampler record
    assert summary["records_before_log"] == 1 and summary["records"] == 4 and summary["runs_without_records"] == 1
    assert summary["wall_seconds"] == 4800.0 and summary["sampler_tokens_per_s"] == pytest.approx(950 / 4800)
    text = "\n".join(format_runs(summary))
    assert "1.00 h" in text and "1 earlier records predate the log" in text
    assert "killed" not in text and "1 invocation stopped before writing a record" in text
    assert summarize_runs([], records) is None and format_runs(None) == []
    # the invocation that wrote a record: the last started at or before it (the killed one owns nothing after 12:00)
    assert [invocation_of(runs, r) for r in records] == [None, 0, 0, 2, 2]
    assert invocation_of(runs, {"new_tokens": 1}) is None


def _frontier_records(method: str, acceptance: float, quality: float, n: int = 100) -> list[dict]:
    """n sampler records whose pooled acceptance and mean quality are the given ones (10 drafts each)."""
    accepted = round(acceptance * 10 * n)
    return [
        {"engine": "sampler", "method": method, "example_index": i, "drafted": 10, "metric": "exact_match",
         "accepted": accepted // n + (i < accepted % n), "quality": float(i < round(quality * n))}
        for i in range(n)
    ]  # fmt: skip


def test_fitted_frontier_is_the_non_increasing_least_squares_fit():
    """The frontier drawn and read: points sorted by acceptance, quality pooled where it rises (noise)."""
    from hf_diversed.evaluation.bench.frontier import fitted_frontier

    accs, fitted = fitted_frontier([(0.9, 24.0), (0.75, 40.0), (1.0, 28.0), (0.8, 34.0), (0.95, 22.0)])
    assert accs == [0.75, 0.8, 0.9, 0.95, 1.0]
    assert fitted == pytest.approx([40.0, 34.0, 74 / 3, 74 / 3, 74 / 3])  # 24, 22, 28 pool to their mean
    assert all(a >= b for a, b in zip(fitted, fitted[1:], strict=False))


def test_frontier_comparison_places_methods_beyond_on_or_inside():
    """Quality at equal acceptance against the static sweep (+ exact as w = 1), with a paired bootstrap interval."""
    from hf_diversed.evaluation.bench.frontier import _acceptance_at, _decreasing_fit, compare_to_frontier

    assert _decreasing_fit([30, 20, 25, 10, 12, 5]) == [30, 22.5, 22.5, 11, 11, 5]
    assert _acceptance_at(22.5, [0.1, 0.2, 0.3, 0.4], [30, 22.5, 22.5, 11]) == 0.3  # a flat stretch: its far end
    assert _acceptance_at(26.25, [0.1, 0.2, 0.3], [30, 22.5, 22.5]) == pytest.approx(0.15)
    assert _acceptance_at(31, [0.1, 0.2], [30, 20]) is None

    records = (
        _frontier_records("exact", 0.70, 0.60)
        + _frontier_records("static:0.5", 0.85, 0.50)
        + _frontier_records("static:0.1", 0.95, 0.30)
        + _frontier_records("cascade-opt:0.1", 0.90, 0.70)  # above the line through (0.85, 50) and (0.95, 30)
        + _frontier_records("lossy:0.5", 0.85, 0.20)  # far below it
        + _frontier_records("lossy:0.9", 0.80, 0.30)  # reaches static:0.1's quality at lower acceptance
        + _frontier_records("token-class:digits:0", 0.99, 0.55)  # more acceptance than any static point
    )
    beyond = compare_to_frontier(records, "cascade-opt:0.1", resamples=400)
    assert beyond["n"] == 100 and beyond["frontier"] == ["exact", "static:0.1", "static:0.5"]
    assert beyond["frontier_quality"] == pytest.approx(40.0) and beyond["quality_gap"] == pytest.approx(30.0)
    assert beyond["quality_gap_ci"][0] > 0 and beyond["verdict"] == "beyond the frontier"
    assert beyond["frontier_acceptance"] is None  # no static point reaches 70
    inside = compare_to_frontier(records, "lossy:0.5", resamples=400)
    assert inside["quality_gap"] == pytest.approx(-30.0) and inside["verdict"] == "inside the frontier"
    lower = compare_to_frontier(records, "lossy:0.9", resamples=400)
    assert lower["frontier_acceptance"] == pytest.approx(0.95) and lower["acceptance_gap"] == pytest.approx(-0.15)
    assert lower["acceptance_gap_ci"][1] < 0
    on = compare_to_frontier(records, "static:0.5", resamples=400)  # a sweep point against the others
    assert on["frontier"] == ["exact", "static:0.1"] and on["quality_gap"] == pytest.approx(8.0)
    outside = compare_to_frontier(records, "token-class:digits:0", resamples=100)
    assert outside["quality_gap"] is None and outside["verdict"] == "outside the sweep's acceptance range"
    assert compare_to_frontier(records, "diversed") is None
    heads = [{**r, "method": "diversed", "head": head} for head, src in (("org/a", "lossy:0.5"), ("org/b", "lossy:0.9"))
             for r in records if r["method"] == src]  # fmt: skip
    assert compare_to_frontier(records + heads, "diversed@org/a")["quality_gap"] == pytest.approx(-30.0)
    assert compare_to_frontier(records + heads, "diversed@org/b")["acceptance_gap"] == pytest.approx(-0.15)
    assert compare_to_frontier(_frontier_records("exact", 0.7, 0.6) + records[-100:], "token-class:digits:0") is None


def test_the_zero_training_frontier_is_the_upper_envelope_of_every_rule():
    """Every zero-training rule at once: a mixture of two rules reaches the segment between them and a rule serves
    any lower acceptance, so the frontier is the non-increasing upper concave hull; a head under it is inside, one
    above every rule's segment beyond."""
    from hf_diversed.evaluation.bench.frontier import compare_to_frontier, fitted_frontier, zero_training_methods

    accs, front = fitted_frontier([(0.5, 40), (0.6, 45), (0.7, 30), (0.8, 38), (0.9, 20), (0.95, 5)], envelope=True)
    assert accs == [0.5, 0.6, 0.8, 0.9, 0.95] and front == [45, 45, 38, 20, 5]  # 0.7 lies under the 0.6-0.8 chord
    assert fitted_frontier([(0.5, 40), (0.5, 42), (0.9, 20)], envelope=True) == ([0.5, 0.9], [42, 20])
    rules = (
        _frontier_records("exact", 0.70, 0.55)
        + _frontier_records("static:0.5", 0.85, 0.40)
        + _frontier_records("static:0.1", 0.96, 0.20)
        + _frontier_records("cascade-opt:0.1", 0.86, 0.50)
        + _frontier_records("lossy:0.5", 0.95, 0.30)
        + _frontier_records("token-class:digits:0", 0.90, 0.48)
    )
    labels = ["cascade-opt:0.1", "diversed@h", "exact", "lossy:0.5", "static:0.1", "static:0.5", "token-class:digits:0"]
    assert zero_training_methods(labels) == [m for m in labels if m != "diversed@h"]
    frontier = zero_training_methods(labels)

    def head(acceptance, quality):
        return [{**r, "method": "diversed", "head": "h"} for r in _frontier_records("x", acceptance, quality)]

    # at 88%: the segment from cascade-opt (86%, 50) to token-class (90%, 48) gives 49, above the static fit's 40s
    on = compare_to_frontier(rules + head(0.88, 0.49), "diversed@h", frontier=frontier, envelope=True, resamples=300)
    assert on["frontier_quality"] == pytest.approx(49.0) and on["quality_gap"] == pytest.approx(0.0)
    assert on["verdict"] == "on it"
    static_only = compare_to_frontier(rules + head(0.88, 0.49), "diversed@h", resamples=300)
    assert static_only["quality_gap"] > 0  # beyond the static sweep, not beyond every rule
    beyond = compare_to_frontier(rules + head(0.92, 0.52), "diversed@h", frontier=frontier, envelope=True)
    assert beyond["verdict"] == "beyond the frontier"
    assert beyond["acceptance_gap"] == pytest.approx(0.92 - 0.796)  # 52 is reached at 79.6% (exact to cascade-opt)


def test_baseline_comparison_is_paired_with_intervals():
    """A head against the token-class rule: head minus rule in quality and pooled acceptance, paired bootstrap."""
    from hf_diversed.evaluation.bench.frontier import compare_to_baseline

    rule = _frontier_records("token-class:digits:0", 0.98, 0.30)
    head = [{**r, "method": "diversed", "head": "org/h"} for r in _frontier_records("x", 0.90, 0.50)]
    c = compare_to_baseline(rule + head, "diversed@org/h", "token-class:digits:0", resamples=400)
    assert c["n"] == 100 and c["quality"] == pytest.approx(50.0) and c["baseline_quality"] == pytest.approx(30.0)
    assert c["quality_gap"] == pytest.approx(20.0) and c["acceptance_gap"] == pytest.approx(-0.08)
    assert c["quality_gap_ci"][0] > 0 and c["acceptance_gap_ci"][1] < 0  # both differences are clear at n = 100
    same = compare_to_baseline(rule + rule, "token-class:digits:0", "token-class:digits:0", resamples=100)
    assert same["quality_gap"] == 0 and same["quality_gap_ci"] == [0, 0]
    assert compare_to_baseline(rule, "diversed@org/h", "token-class:digits:0") is None
    shifted = [{**r, "example_index": r["example_index"] + 100} for r in head]  # no shared example
    assert compare_to_baseline(rule + shifted, "diversed@org/h", "token-class:digits:0") is None


def test_table1_report_sets_each_head_beside_each_token_class_rule_and_cascade(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import table1_report

    rules = (
        _frontier_records("token-class:digits:0", 0.98, 0.30)
        + _frontier_records("token-class:digits:0.3", 0.9, 0.4)
        + _frontier_records("cascade-opt:0.1", 0.86, 0.45)
    )
    others = _frontier_records("static:0.5", 0.85, 0.3) + _frontier_records("lossy:0.5", 0.84, 0.4)
    heads = [{**r, "method": "diversed", "head": h} for h in ("a", "b") for r in _frontier_records("x", 0.9, 0.5)]
    records = [{**r, "temperature": 1.0, "N": 5, "max_new_tokens": 512} for r in rules + others + heads]
    rows = [line for line in table1_report.baseline_section(records) if line.startswith("| diversed@")]
    assert [row.split(" | ")[:2] for row in rows] == [
        ["| diversed@a", "cascade-opt:0.1"],
        ["| diversed@a", "token-class:digits:0"], ["| diversed@a", "token-class:digits:0.3"],
        ["| diversed@b", "cascade-opt:0.1"],
        ["| diversed@b", "token-class:digits:0"], ["| diversed@b", "token-class:digits:0.3"],
    ]  # fmt: skip
    # static and lossy points are the frontier's business, not baselines
    assert table1_report.baseline_section(records[: len(rules)]) == []  # no head


def test_table1_report_sets_each_head_against_every_zero_training_rule_and_the_target(monkeypatch):
    """The verdict table: each head against the envelope of the rules run on all its rows (a 50-row rule is left
    out of a 100-row head's envelope), and whether its acceptance is >= 85% with the target's quality inside its
    paired interval."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import table1_report

    rules = (
        _frontier_records("exact", 0.70, 0.55)
        + _frontier_records("static:0.5", 0.85, 0.40)
        + _frontier_records("cascade-opt:0.1", 0.86, 0.50)
        + _frontier_records("lossy:0.5", 0.95, 0.30)
        + _frontier_records("lossy:0.8", 0.99, 0.90, n=50)  # too few rows for a 100-row head
    )
    heads = [{**r, "method": "diversed", "head": h} for h, a, q in (("close", 0.88, 0.54), ("far", 0.9, 0.2))
             for r in _frontier_records("x", a, q)]  # fmt: skip
    records = [{**r, "temperature": 1.0, "N": 5, "max_new_tokens": 512} for r in rules + heads]
    rows = [line.split(" | ") for line in table1_report.zero_training_section(records) if line.startswith("| div")]
    assert [(r[0], r[1], r[2], r[9], r[-1]) for r in rows] == [
        ("| diversed@close", "100", "4", "beyond the frontier", "yes |"),
        ("| diversed@far", "100", "4", "inside the frontier", "no |"),
    ]
    assert table1_report.zero_training_section(records[: len(rules)]) == []  # no head


def test_table1_report_sets_the_distilled_draft_beside_the_base_draft_not_against_the_frontier(monkeypatch):
    """Exact SD with the LoRA-distilled draft has the target's law: the report pairs it with exact SD on the base
    draft (what distillation bought is acceptance) and leaves it out of the frontier verdicts."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import table1_report

    sweep = _frontier_records("exact", 0.7, 0.4) + _frontier_records("static:0", 1.0, 0.2)
    tuned = _frontier_records("exact+lora-draft", 0.8, 0.4, n=50)
    records = [{**r, "temperature": 1.0, "N": 5, "max_new_tokens": 512} for r in sweep + tuned]
    (row,) = [line for line in table1_report.draft_section(records) if line.startswith("| exact+lora-draft")]
    assert row.startswith("| exact+lora-draft | 50 | 80.0% | 70.0% | +10.0 [")
    assert not any(line.startswith("| exact+lora-draft") for line in table1_report.frontier_section(records))
    assert table1_report.draft_section(records[: len(sweep)]) == []  # no tuned draft


def test_records_name_a_local_model_by_its_path_inside_the_working_directory(tmp_path, monkeypatch):
    """Records keyed by a head directory stay valid in any clone of a repository run from its root."""
    from hf_diversed.evaluation.bench.config import _canonical_model

    repo, outside = tmp_path / "repo", tmp_path / "elsewhere"
    (repo / "docs" / "head").mkdir(parents=True)
    outside.mkdir()
    monkeypatch.chdir(repo)
    assert _canonical_model("docs/head") == _canonical_model(str(repo / "docs" / "head")) == "docs/head"
    assert _canonical_model(str(outside)) == str(outside.resolve())
    assert _canonical_model("qwen2.5-coder-1.5b-instruct") == "qwen2.5-coder-1.5b-instruct"


def _run_benchmark_on_tiny_configs(name: str, tmp_path: Path, monkeypatch, *args: str) -> dict:
    """Run ``benchmarks/<name>`` with a tiny model's config.json as both target and draft; its JSON record."""
    import runpy

    config = chat_model(chat_tokenizer(["tiny"]), seed=0).config.to_dict()
    tiny, out = tmp_path / "tiny.json", tmp_path / "out.json"
    tiny.write_text(json.dumps(config))
    script = Path(__file__).parent.parent / "benchmarks" / name
    argv = [str(script), "--target-config", str(tiny), "--draft-config", str(tiny), *args, "--output", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(script), run_name="__main__")
    return json.loads(out.read_text())


def test_random_weights_benchmark_runs_on_tiny_configs(tmp_path, monkeypatch, capsys):
    """benchmarks/bench_random_weights.py (the real pair's shapes where its weights cannot go), on tiny shapes."""
    record = _run_benchmark_on_tiny_configs(
        "bench_random_weights.py", tmp_path, monkeypatch, "--device", "cpu", "--dtype", "float32",
        "--batch-sizes", "2,4", "--max-new-tokens", "3", "--prompt-tokens", "5", "--rules-per-prompt", "2",
    )  # fmt: skip
    assert [r["B"] for r in record["sampler"]] == [2, 4] and all(r["tokens"] > 0 for r in record["sampler"])
    assert {"c", "v"} <= set(record["costs"]) and "| 4 |" in capsys.readouterr().out  # values: the machine's


def test_grouped_attention_benchmark_runs_on_tiny_configs(tmp_path, monkeypatch, capsys):
    """benchmarks/bench_grouped_attention.py (key/value head copies against grouped attention), on tiny shapes:
    both ways emit the same tokens."""
    record = _run_benchmark_on_tiny_configs(
        "bench_grouped_attention.py", tmp_path, monkeypatch, "--lengths", "8,16", "--repeats", "1", "--prompts", "2",
        "--prompt-tokens", "5", "--max-new-tokens", "6",
    )  # fmt: skip
    assert [r["L"] for r in record["forwards"]] == [8, 16] and all(r["verify_grouped"] > 0 for r in record["forwards"])
    assert record["generate"]["identical_tokens"] is True and record["generate"]["tokens"] > 0
    assert "| 16 |" in capsys.readouterr().out


def test_weight_floor_benchmark_counts_every_linear_layer_of_a_decode_step(tmp_path, monkeypatch, capsys):
    """benchmarks/bench_weight_floor.py on a tiny config: the weights it reads are exactly the model's linear layers
    (attention projections, MLP, LM head), and it times the three floors."""
    import runpy

    model = chat_model(chat_tokenizer(["tiny"]), seed=0)
    tiny, out = tmp_path / "tiny.json", tmp_path / "out.json"
    tiny.write_text(json.dumps(model.config.to_dict()))
    script = ROOT / "benchmarks" / "bench_weight_floor.py"
    argv = [str(script), "--config", str(tiny), "--dtype", "float32", "--repeats", "2", "--output", str(out)]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(script), run_name="__main__")
    record = json.loads(out.read_text())
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert record["weight_bytes"] == 4 * linear
    assert set(record["seconds"]) == {"streaming read", "F.linear, M = 1", "oneDNN blocked, M = 1"}
    assert "| streaming read |" in capsys.readouterr().out


def test_a_finished_run_and_its_table1_rows_make_the_shipped_card_and_the_paper_row(
    setup, tmp_path, monkeypatch, capsys
):
    """training/ship_head.py: a finished run (one RL step on the tiny pair) and the bench's records of its head
    become a head folder whose card states the training command, the held-out evaluations from its start (here the
    speculative cascade), and the head beside the target alone, the draft alone, the token-class rule and the cascade,
    against the static frontier."""
    monkeypatch.syspath_prepend(str(ROOT / "training"))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import ship_head
    import train

    monkeypatch.chdir(tmp_path)  # the bench names a head inside the working directory by its relative path
    train_args = [
        "--config", str(ROOT / "training" / "recipes" / "gsm8k.yaml"), "--target", str(setup["target"]),
        "--draft", str(setup["draft"]), "--dtype", "float32", "--max_train_prompts", "2", "--num_prompts", "2",
        "--max_steps", "1", "--warmup_steps", "0", "--max_new_tokens", "6", "--eval_split", "test[0:2]",
        "--num_eval_prompts", "2", "--eval_strategy", "steps", "--eval_steps", "1", "--eval_on_start", "true",
        "--save_strategy", "no", "--report_to", "none",
        "--init_head", "cascade-opt:0.1", "--output_dir", "runs/head",
    ]  # fmt: skip
    assert train.main(train_args) == 0
    bench_args = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k", "--methods", "exact,token-class:digits:0,cascade-opt:0.1,diversed", "--head", "runs/head",
        "--static-sweep", "0,0.5", "--num-examples", "3", "--timed-examples", "0", "--no-costs", "--batch-size", "8",
        "--max-new-tokens", "6", "--dtype", "float32", "--threads", "1", "--output-dir", "table1", "-q",
    ]  # fmt: skip
    assert bench_cli.main(bench_args) == 0

    # its timing run beside it (``<table1>-timed``): the card gives the head's real speed over the target alone's
    timed_args = [a for a in bench_args if a not in ("--no-costs", "-q")]
    timed_args[timed_args.index("--methods") + 1] = "ar,exact,cascade-opt:0.1,diversed"
    timed_args[timed_args.index("--timed-examples") + 1] = "2"
    timed_args[timed_args.index("--output-dir") + 1] = "table1-timed"
    assert bench_cli.main([*timed_args, "--no-costs", "-q"]) == 0

    dest = tmp_path / "bundled"
    assert ship_head.main(["--run", "runs/head", "--table1", "table1", "--dest", str(dest), "--", *train_args]) == 0
    assert {p.name for p in dest.iterdir()} == {"config.json", "model.safetensors", "README.md"}
    config = json.loads((dest / "config.json").read_text())
    assert config["task"] == "gsm8k" and config["target_model"] == str(setup["target"])
    assert (dest / "model.safetensors").read_bytes() == (tmp_path / "runs" / "head" / "model.safetensors").read_bytes()
    card = (dest / "README.md").read_text()
    assert "python training/train.py --config" in card and "| max_steps | 1 |" in card
    assert "| start: `cascade-opt:0.1` | 0 |" in card and "| trained | 1 |" in card
    for row in ("| target alone (exact SD's law) | 3 |", "| draft alone (static w = 0) | 3 |", "| this head | 3 |",
                "| token-class:digits:0 | 3 |", "| cascade-opt:0.1 | 3 |"):  # fmt: skip
        assert row in card
    assert "Against the static frontier (exact, static:0, static:0.5" in card
    assert "Head minus `token-class:digits:0` on 3 shared examples" in card
    assert "Head minus `cascade-opt:0.1` on 3 shared examples" in card
    assert "in progress" not in card  # every method holds rows 0..2: a complete run
    assert "Real speed (`table1-timed`): the batch-1 loop on the first 2 examples" in card
    speed = {line.split(" | ")[0][2:]: line for line in card.splitlines() if line.endswith("× |")}
    assert set(speed) == {"target alone", "exact SD", "this head", "cascade-opt:0.1"}
    assert speed["target alone"].endswith("| 1.00× |") and "invocations of the run" not in card
    with pytest.raises(SystemExit, match="no records of the head"):
        ship_head.main(["--run", str(tmp_path / "runs" / "head"), "--table1", "table1", "--dest", str(dest), "--",
                        *train_args])  # fmt: skip

    # the same records in docs/results.md's row beside the paper's Table 1: exact SD's and the head's acceptance, at
    # Table 1's N = 5 though exact SD has a draft length of 3 beside it
    import table1_report

    short = [*bench_args, "--num-assistant-tokens", "3"]
    short[short.index("--methods") + 1] = "exact"
    del short[short.index("--head") : short.index("--head") + 2]
    assert bench_cli.main(short) == 0
    lines = table1_report.task_section("gsm8k", tmp_path / "table1")
    row = next(line for line in lines if line.startswith("| this pair, head `runs/head` |"))
    rows = json.loads((tmp_path / "table1" / bench.SUMMARY_FILE).read_text())["rows"]
    summary = {r["method"]: r for r in rows if r["N"] == 5}
    assert (
        f"| {100 * summary['exact']['acceptance_rate']:.1f}% | {100 * summary['diversed']['acceptance_rate']:.1f}% |"
        in row
    )
    assert any(line.startswith("| 1 | diversed@runs/head | 5 | 3 |") for line in lines)  # heads named apart

    # the cross-task table: a head trained for another task (its config says so), run on GSM8K's rows, is off the
    # diagonal; the GSM8K head is on it
    shutil.copytree(tmp_path / "runs" / "head", tmp_path / "runs" / "code-head")
    config_file = tmp_path / "runs" / "code-head" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "task": "mbpp"}))
    assert bench_cli.main([*bench_args[:8], "--methods", "diversed", "--head", "runs/code-head", *bench_args[12:]]) == 0
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "gsm8k").symlink_to(tmp_path / "table1")
    cross = table1_report.cross_task_section(tmp_path / "root")
    assert cross[0] == "## Heads across tasks"
    assert any(line.startswith("| `runs/head` | gsm8k | gsm8k | 5 | 6 | 3 |") for line in cross)
    assert any(line.startswith("| `runs/code-head` | mbpp | gsm8k | 5 | 6 | 3 |") for line in cross)


def test_table1_report_calls_a_run_in_progress_only_while_a_method_lacks_a_prefix_of_the_rows(monkeypatch):
    """Methods run on different row counts by design (150 rows, 50-row extras): each holding rows 0..n-1 is a
    complete run. A method with a hole (short completions recorded first) is one caught mid-run."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import table1_report

    def records(method: str, rows) -> list[dict]:
        return [{"engine": "sampler", "temperature": 1.0, "method": method, "N": 5, "example_index": i} for i in rows]

    complete = records("exact", range(150)) + records("lossy:0.2", range(50))
    assert table1_report._in_progress(complete) == ""
    assert table1_report._in_progress(complete + [{**complete[0], "engine": "loop"}]) == ""
    warning = table1_report._in_progress(complete + records("cascade-chow:0.3", [0, 1, 3]))
    assert "**In progress:** 1 of 3 methods" in warning and "(3–3 examples)" in warning


def test_table1_report_predicts_the_real_timing_with_the_timing_runs_costs_and_names_its_dtype(
    setup, tmp_path, monkeypatch
):
    """A task's timing run (``<task>-timed``) may use another dtype than its sampler records (a later machine with
    fast bf16): the τ model then takes c and v from the timing run, so real / τ model compares like with like, and
    the report names the timing run's dtype."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import table1_report

    common = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k", "--methods", "exact", "--num-examples", "2", "--batch-size", "4", "--max-new-tokens", "6",
        "--threads", "1", "-q",
    ]  # fmt: skip
    table = [
        *common,
        "--timed-examples",
        "0",
        "--no-costs",
        "--dtype",
        "float32",
        "--output-dir",
        str(tmp_path / "gsm8k"),
    ]
    timed = [*common, "--timed-examples", "2", "--dtype", "bfloat16", "--output-dir", str(tmp_path / "gsm8k-timed")]
    assert bench_cli.main(table) == 0 and bench_cli.main(timed) == 0
    assert bench_cli.main([*table, "--num-assistant-tokens", "3"]) == 0  # an N whose v the timing run did not measure

    lines = table1_report.task_section("gsm8k", tmp_path / "gsm8k")
    (cost,) = json.loads((tmp_path / "gsm8k-timed" / bench.COSTS_FILE).read_text()).values()
    rows = {r["N"]: r for r in json.loads((tmp_path / "gsm8k" / bench.SUMMARY_FILE).read_text())["rows"]}
    tau_model = rows[5]["mean_accepted_per_round"] / (5 * cost["c"] + cost["v"]["5"])
    exact_line = next(line for line in lines if line.startswith("| 1 | exact | 5 |"))
    assert f"| {tau_model:.2f}× (" in exact_line
    short_line = next(line for line in lines if line.startswith("| 1 | exact | 3 |"))
    assert f"| - ({rows[3]['mean_accepted_per_round'] / (3 * cost['c'] + 1):.2f}×) |" in short_line  # v = 1 alone
    assert any(line.startswith("Costs measured beside the real timing (bfloat16)") for line in lines)
    speed_line = next(line for line in lines if line.startswith("Real speed:"))
    assert "dtype bfloat16, CPU" in speed_line
    # it names the methods slower than the target alone, or says there are none
    real = float(exact_line.split(" | ")[13].split("×")[0])
    named_slower = "exact at T = 1 (" in speed_line
    assert named_slower == ("Slower than the target alone" in speed_line)
    assert real <= 1.0 if named_slower else real >= 1.0


@pytest.mark.parametrize("timed_suffix", ["-timed", "-draft-timed"])
def test_table1_report_sets_each_draft_length_side_by_side_on_shared_examples(
    setup, tmp_path, monkeypatch, timed_suffix
):
    """A rule run at several N: one row per N on the examples every N shares (N = 3 on rows 0-1 only, so N = 2 is
    cut to them), v(N) and the τ model from the timing run's costs (N = 3 was sampled in another dtype, whose own
    costs are not the timing run's), the real speedup per N, and the fastest N. The timing is Table 1's run
    (``<task>-timed``) or the draft lengths' own (``<task>-draft-timed``, named below)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import table1_report

    common = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k", "--methods", "exact", "--batch-size", "4", "--max-new-tokens", "6", "--threads", "1",
        "-q", "--dtype", "float32",
    ]  # fmt: skip
    table = [*common, "--timed-examples", "0", "--no-costs", "--output-dir", str(tmp_path / "gsm8k")]
    assert bench_cli.main([*table, "--num-examples", "3", "--num-assistant-tokens", "2"]) == 0
    in_bf16 = [*table, "--num-examples", "2", "--num-assistant-tokens", "3"]
    in_bf16[in_bf16.index("float32")] = "bfloat16"
    assert bench_cli.main(in_bf16) == 0
    sampled = bench.load_records(tmp_path / "gsm8k" / bench.RESULTS_FILE)[-1]
    own = {costs_key(sampled["target"], sampled["draft"], "bfloat16"): {"c": 0.9, "v": {"3": 5.0}}}
    (tmp_path / "gsm8k" / bench.COSTS_FILE).write_text(json.dumps(own))  # the sampler's own bf16 costs, far off
    timed_dir = tmp_path / f"gsm8k{timed_suffix}"
    timed = [*common, "--num-examples", "2", "--timed-examples", "2", "--output-dir", str(timed_dir)]
    assert bench_cli.main([*timed, "--num-assistant-tokens", "2,3"]) == 0

    lines = table1_report.task_section("gsm8k", tmp_path / "gsm8k")
    rows = {int(line.split(" | ")[1]): line for line in lines if line.startswith("| exact | ")}
    assert set(rows) == {2, 3}
    assert all(line.split(" | ")[2] == "2" for line in rows.values())  # rows 0-1: the examples both N share
    (cost,) = json.loads((timed_dir / bench.COSTS_FILE).read_text()).values()
    records = bench.load_records(tmp_path / "gsm8k" / bench.RESULTS_FILE)
    real = {}
    for n, line in rows.items():
        cells = line.split(" | ")
        mine = [r for r in records if r["N"] == n and r["example_index"] < 2 and r["method"] == "exact"]
        tau = (sum(r["accepted"] for r in mine) + sum(r["rounds"] for r in mine)) / sum(r["rounds"] for r in mine)
        assert cells[4] == f"{tau:.2f}" and cells[5] == f"{cost['v'][str(n)]:.2f}"
        assert cells[6].startswith(f"{tau / (n * cost['c'] + cost['v'][str(n)]):.2f}× (")
        real[n] = float(cells[7].split("×")[0])
    fastest = [f"Fastest: exact at N = {n} ({x:.2f}×)." for n, x in real.items() if x == max(real.values())]
    assert any(line in lines for line in fastest)
    after = lines[next(i for i, line in enumerate(lines) if line in fastest) :]
    assert any(f"gsm8k{timed_suffix}" in line for line in after[:3]) == (timed_suffix == "-draft-timed")


def test_table1_report_draws_the_greedy_frontier_against_real_time_and_acceptance(setup, tmp_path, monkeypatch):
    """The paper's Figure 2: at T = 0 the static sweep and every other method with the sampler's quality and
    acceptance beside the timing run's ms per token (Σseconds / Σtokens of its loop records); the target alone has
    exact SD's quality at its own speed; a two-panel plot. No section without a sweep of four weights."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import table1_report

    common = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k", "--batch-size", "4", "--max-new-tokens", "6", "--threads", "1", "-q",
        "--dtype", "float32", "--temperature", "0", "--num-examples", "2",
    ]  # fmt: skip
    out = tmp_path / "gsm8k"
    sampled = [*common, "--methods", "exact", "--timed-examples", "0", "--no-costs", "--output-dir", str(out)]
    assert bench_cli.main([*sampled, "--static-sweep", "0,0.5,1"]) == 0
    assert table1_report.greedy_frontier_section("gsm8k", out) == []  # three weights: no frontier yet
    assert bench_cli.main([*sampled, "--static-sweep", "0,0.3,0.5,1"]) == 0
    untimed = table1_report.greedy_frontier_section("gsm8k", out)
    assert any(line.startswith("Real time per token: not yet timed") for line in untimed)
    monkeypatch.setattr(table1_report, "FIGURE2", ("gsm8k", 2, 5))
    records = bench.load_records(out / bench.RESULTS_FILE)
    assert table1_report._figure2_outstanding(tmp_path, records, timed_examples=2) == [
        "gsm8k: the T = 0 frontier, 4 of 5 weights on 2 stories",
        "gsm8k: the T = 0 frontier's timing run",
    ]

    timed_dir = tmp_path / f"gsm8k{table1_report.GREEDY_TIMED_SUFFIX}"
    timed = ["--methods", "ar,exact", "--static-sweep", "0,1", "--timed-examples", "2", "--output-dir", str(timed_dir)]
    assert bench_cli.main([*common, *timed]) == 0
    lines = table1_report.greedy_frontier_section("gsm8k", out)
    rows = {line.split(" | ")[0].removeprefix("| "): line.split(" | ") for line in lines if line.startswith("| ")}
    assert set(rows) >= {"ar", "exact", "static:0", "static:0.3", "static:0.5", "static:1"}
    loop = [r for r in bench.load_records(timed_dir / bench.RESULTS_FILE) if r["engine"] == "loop"]
    for method in ("ar", "exact", "static:0", "static:1"):
        mine = [r for r in loop if r["method"] == method]
        ms = 1000 * sum(r["seconds"] for r in mine) / sum(r["new_tokens"] for r in mine)
        assert rows[method][6] == f"{ms:.1f} (2)"
    assert rows["ar"][2] == rows["exact"][2] and rows["ar"][4] == "-"  # exact SD's quality, no acceptance
    assert rows["static:0.3"][6] == "-"  # sampled, not timed
    assert rows["static:0"][4] == "100.0%"  # w = 0 accepts every draft
    assert (out / table1_report.GREEDY_PLOT_FILE).is_file()
    said = next(line for line in lines if line.startswith("Real speed: "))
    assert "v = 1" not in said  # this table has no v = 1 columns to read
    assert "the v = 1 columns show" in table1_report.timed_section(timed_dir)[1][0]  # Table 1's sections have them
    assert table1_report._figure2_outstanding(tmp_path, records, timed_examples=2) == [
        "gsm8k: the T = 0 frontier, 4 of 5 weights on 2 stories"
    ]
    assert table1_report._figure2_outstanding(tmp_path, records, timed_examples=3)[1:] == [
        "gsm8k: the T = 0 frontier's timing run, at 2 of 3 examples"
    ]


def test_table1_report_reads_a_timing_run_stopped_part_way(setup, tmp_path, monkeypatch):
    """A timing run stopped before its summary: the report names its command from the run log, says how many
    examples each method has, and compares each method's speed with the target alone's on the same examples."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import table1_report

    timed_dir = tmp_path / "gsm8k-timed"
    argv = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k", "--methods", "ar,exact", "--num-examples", "2", "--timed-examples", "2",
        "--batch-size", "4", "--max-new-tokens", "6", "--threads", "1", "-q", "--output-dir", str(timed_dir),
    ]  # fmt: skip
    assert bench_cli.main(argv) == 0
    (timed_dir / bench.SUMMARY_FILE).unlink()
    records = bench.load_records(timed_dir / bench.RESULTS_FILE)
    # stopped after the target alone's second example, before exact SD's
    kept = [r for r in records if not (r["method"] == "exact" and r["engine"] == "loop" and r["example_index"] == 1)]
    (timed_dir / bench.RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in kept))

    rows, (line,), _ = table1_report.timed_section(timed_dir)
    assert "the first 1–2 (a run stopped part-way) examples" in line and "every method in one run" in line
    assert "`hf-diversed bench " in line and "--methods ar,exact " in line and "`None`" not in line
    (exact,) = [r for key, r in rows.items() if key[1] == "exact"]
    loop = {(r["method"], r["example_index"]): r for r in kept if r["engine"] == "loop"}
    ar0, exact0 = loop[("ar", 0)], loop[("exact", 0)]
    matched = (exact0["new_tokens"] / exact0["seconds"]) / (ar0["new_tokens"] / ar0["seconds"])
    assert exact["n_timed"] == 1 and exact["speedup_matched"] == pytest.approx(matched)


def test_table1_report_says_when_a_timing_run_was_resumed_in_another_invocation(setup, tmp_path, monkeypatch):
    """A method added to a timing run later is timed in another sitting of the machine: the report says how many
    invocations timed the methods and when each started, instead of "every method in one run"."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import table1_report

    timed_dir = tmp_path / "gsm8k-timed"
    common = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k", "--num-examples", "2", "--timed-examples", "2", "--batch-size", "4",
        "--max-new-tokens", "6", "--threads", "1", "-q", "--no-costs", "--output-dir", str(timed_dir),
    ]  # fmt: skip
    assert bench_cli.main([*common, "--methods", "ar,exact"]) == 0
    time.sleep(1.1)  # the run log and the records are stamped to the second
    assert bench_cli.main([*common, "--methods", "ar,exact,static:0"]) == 0
    config = json.loads((timed_dir / bench.SUMMARY_FILE).read_text())["config"]

    rows, (line,), _ = table1_report.timed_section(timed_dir)
    assert config["methods"] == ["ar", "exact", "static:0"]  # the report's rebuild keeps the bench's configuration
    assert json.loads((timed_dir / bench.SUMMARY_FILE).read_text())["config"] == config
    starts = [run["started"] for run in bench.load_runs(timed_dir)]
    assert len(starts) == 2 and f"timed in 2 invocations (started {starts[0]}, {starts[1]}:" in line
    assert "every method in one run" not in line
    assert {key[1] for key in rows} >= {"exact", "static:0"}


def test_table1_report_says_what_table1_still_lacks(setup, tmp_path, monkeypatch):
    """Until every task has its records, SD with the distilled draft, a head trained on it, a full timing run, and draft
    lengths 3 and 7 with their timing run, the report names what is missing (and the title says "in progress" while
    anything is)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import table1_report

    common = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k", "--num-examples", "2", "--batch-size", "4", "--max-new-tokens", "6", "--threads", "1",
        "-q", "--no-costs",
    ]  # fmt: skip
    assert (
        bench_cli.main(
            [*common, "--methods", "exact", "--timed-examples", "0", "--output-dir", str(tmp_path / "gsm8k")]
        )
        == 0
    )
    assert table1_report.outstanding(tmp_path, timed_examples=2) == [
        "gsm8k: SD with the LoRA-distilled draft",
        "gsm8k: a head trained on it",
        "gsm8k: the real-speed timing run",
        "gsm8k: draft lengths 3 and 7",
        "gsm8k: the draft lengths' timing run",
        "mbpp: every record",
        "cnndm: every record",
        "xsum: every record",
    ]
    timed = ["--methods", "ar,exact", "--timed-examples", "2", "--output-dir", str(tmp_path / "gsm8k-timed")]
    assert bench_cli.main([*common, *timed]) == 0
    assert "gsm8k: the real-speed timing run" not in table1_report.outstanding(tmp_path, timed_examples=2)
    lengths = ["--methods", "exact", "--timed-examples", "0", "--output-dir", str(tmp_path / "gsm8k")]
    assert bench_cli.main([*common, *lengths, "--num-assistant-tokens", "3,7"]) == 0
    assert table1_report.outstanding(tmp_path, timed_examples=2)[:4] == [
        "gsm8k: SD with the LoRA-distilled draft",
        "gsm8k: a head trained on it",
        "gsm8k: the draft lengths' timing run",
        "mbpp: every record",
    ]
    assert "gsm8k: the timing run, at 2 of 3 examples" in table1_report.outstanding(tmp_path, timed_examples=3)
    draft_timed = ["--methods", "exact", "--timed-examples", "2", "--output-dir", str(tmp_path / "gsm8k-draft-timed")]
    assert bench_cli.main([*common, *draft_timed, "--num-assistant-tokens", "3,5,7"]) == 0
    assert "gsm8k: the draft lengths' timing run" not in table1_report.outstanding(tmp_path, timed_examples=2)
    assert "gsm8k: the draft lengths' timing run, at 2 of 3 examples" in table1_report.outstanding(
        tmp_path, timed_examples=3
    )


def test_pilot_report_sets_a_pilots_methods_beside_the_tables_on_the_pilots_rows(setup, tmp_path, monkeypatch, capsys):
    """The pilot that picks Table 1's second lenience and α: its methods and the table's, over the pilot's rows only
    (the table has more), sorted by acceptance, each with its quality count, Wilson interval and mean w."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import pilot_report

    common = [
        "--target", str(setup["target"]), "--draft", str(setup["draft"]), "--data-dir", str(setup["data"]),
        "--tasks", "gsm8k", "--batch-size", "4", "--max-new-tokens", "6", "--threads", "1", "-q",
        "--timed-examples", "0", "--no-costs",
    ]  # fmt: skip
    assert (
        bench_cli.main(
            [*common, "--methods", "exact,static:0", "--num-examples", "3", "--output-dir", str(tmp_path / "t")]
        )
        == 0
    )
    assert (
        bench_cli.main([*common, "--methods", "lossy:0.3", "--num-examples", "2", "--output-dir", str(tmp_path / "p")])
        == 0
    )

    pilot_report.main(["--pilot", str(tmp_path / "p"), "--table", str(tmp_path / "t")])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 1 |")]
    acceptances = [float(row.split(" | ")[6].rstrip("%")) for row in rows]
    assert acceptances == sorted(acceptances, reverse=True)
    assert "| 100.0% | 0.00 |" in next(row for row in rows if "| static:0 |" in row)  # w = 0 accepts every draft
    assert {tuple(row.split(" | ")[1:3]) for row in rows} == {
        ("exact", "table"),
        ("static:0", "table"),
        ("lossy:0.3", "pilot"),
    }
    assert all(" | 2 | " in row for row in rows)  # the table's third row is left out
    records = bench.load_records(tmp_path / "t" / bench.RESULTS_FILE)
    exact = [r for r in records if r["method"] == "exact" and r["example_index"] < 2]
    accepted, drafted = sum(r["accepted"] for r in exact), sum(r["drafted"] for r in exact)
    assert f"| {100 * accepted / drafted:.1f}% |" in next(row for row in rows if "| exact |" in row)


def test_pilot_report_gives_rouge_as_a_mean_with_a_bootstrap_interval(monkeypatch):
    """ROUGE-2 is recorded in points, not as 0/1: the pilot table shows its mean and a bootstrap interval."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import pilot_report

    from hf_diversed.evaluation.bench.summary import bootstrap_interval

    scores = [6.0, 9.5, 12.25, 3.0]
    records = [
        {"engine": "sampler", "example_index": i, "method": "exact", "temperature": 1.0, "dtype": "bfloat16",
         "quality": q, "metric": "rouge2", "drafted": 10, "accepted": 4, "weight_sum": 5.0, "verified": 5}
        for i, q in enumerate(scores)
    ]  # fmt: skip
    (row,) = pilot_report.format_rows(pilot_report.pilot_rows(records, [], rows=4))[2:]
    low, high = bootstrap_interval(scores)
    assert f"| exact | pilot | bfloat16 | 4 | 7.69 [{low:.2f}, {high:.2f}] | 40.0% | 1.00 |" in row


def test_vllm_bench_pairs_each_rule_with_the_target_alone_of_its_own_sitting(monkeypatch, tmp_path):
    """One host's speed differs between boots of the machine, so a resumed run times the target alone again where a
    new sitting times a rule, and the report's ratio pairs phases of one sitting (or of none: older records)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_vllm

    def phase(method, tokens_per_s, sitting=None, task="gsm8k", c=1):
        p = {"task": task, "method": method, "concurrency": c, "n": 1, "tokens": 10, "seconds": 10 / tokens_per_s,
             "tokens_per_s": tokens_per_s, "acceptance": None if method == "ar" else 0.8}  # fmt: skip
        return p if sitting is None else {**p, "sitting": sitting}

    older = [phase("ar", 4.0), phase("diversed", 6.0)]
    tasks, methods = ["gsm8k", "mbpp"], ["ar", "exact", "diversed"]
    ar, rules = bench_vllm.plan_phases(older, tasks, methods, [1], "boot-b")
    assert rules == [("gsm8k", "exact", 1), ("mbpp", "exact", 1), ("mbpp", "diversed", 1)]
    assert ar == [("gsm8k", "ar", 1), ("mbpp", "ar", 1)]  # gsm8k's older target alone is another sitting's
    assert bench_vllm.plan_phases(older, ["gsm8k"], ["ar", "diversed"], [1], "boot-b") == ([], [])
    ar, rules = bench_vllm.plan_phases(older, ["gsm8k"], ["ar", "diversed"], [1], "boot-b", remeasure=True)
    assert (ar, rules) == ([("gsm8k", "ar", 1)], [("gsm8k", "diversed", 1)])
    now = [*older, phase("exact", 9.0, "boot-b"), phase("ar", 6.0, "boot-b")]
    assert bench_vllm.plan_phases(now, ["gsm8k"], methods, [1], "boot-b", remeasure=True) == (
        [], [("gsm8k", "diversed", 1)])  # fmt: skip
    assert bench_vllm.plan_phases(now, ["gsm8k"], ["exact"], [1], "boot-b") == ([], [])  # no target alone asked

    records = [{"task": p["task"], "method": p["method"], "concurrency": 1, "quality": 1.0, "seconds": 1.0,
                "finish_reason": "stop", **{k: p[k] for k in ("sitting",) if k in p}} for p in now]  # fmt: skip
    (tmp_path / "phases.jsonl").write_text("".join(json.dumps(p) + "\n" for p in now))
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    rows = [line for line in bench_vllm.report(tmp_path).splitlines() if line.startswith("| gsm8k")]
    assert [row.split(" | ")[1:4] + [row.split(" | ")[7]] for row in rows] == [
        ["ar", "1", "-", "1.00×"], ["diversed", "1", "-", "1.50×"],
        ["ar", "1", "1", "1.00×"], ["exact", "1", "1", "1.50×"],
    ]  # fmt: skip


def test_vllm_bench_runs_each_method_on_its_server_kind(monkeypatch):
    """A method names the server it needs: the target alone, N drafts every step, the draft-length policy, or
    vLLM's own batch-size schedule written in vLLM's format."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_vllm

    kinds = [bench_vllm.engine_of(m) for m in ("ar", "exact", "cascade-opt:0.1@policy", "diversed@sched:4:3")]
    assert kinds == ["ar", "spec", "policy", "sched:4:3"]
    assert bench_vllm.hand_schedule("sched:4:3", 32) == [[1, 4, 3], [5, 32, 0]]
    assert bench_vllm.hand_schedule("sched:32:5", 32) == [[1, 32, 5]]
    assert bench_vllm._xargs("cascade-opt:0.1@policy", "gsm8k") == {"diversed_verifier": "cascade-opt:0.1"}
    with pytest.raises(SystemExit, match="is not sched:CUT:K"):
        bench_vllm.hand_schedule("sched:4", 32)


def test_vllm_grid_report_reads_each_schedule_where_it_runs_and_chooses_the_best(tmp_path, monkeypatch):
    """benchmarks/vllm_grid_report.py: at c, sched:CUT:K with CUT >= c is fixed N (K = N) or the phase of the
    smallest cut >= c (K < N); the best (CUT, K) has the highest geometric mean of x target alone over the loads."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import vllm_grid_report

    def phase(method, c, tokens_per_s, sitting="s"):
        return {"task": "gsm8k", "method": method, "concurrency": c, "tokens_per_s": tokens_per_s, "num_draft": 5,
                "acceptance": None if method == "ar" else 0.8, "from_drafts": 0.5, "sitting": sitting}  # fmt: skip

    rule = "cascade-opt:0.1"
    c1 = [phase("ar", 1, 4.0), phase(rule, 1, 8.0), phase(f"{rule}@policy", 1, 7.0), phase(f"{rule}@sched:2:3", 1, 6.0)]
    c8 = [
        phase("ar", 8, 20.0),
        phase(rule, 8, 15.0),
        phase(f"{rule}@policy", 8, 19.6),
        phase(f"{rule}@sched:2:3", 8, 19.0),
        phase(f"{rule}@sched:2:5", 8, 18.0),
        phase(f"{rule}@sched:4:3", 8, 18.5),
        phase(f"{rule}@sched:4:5", 8, 17.0),
        phase("ar", 8, 40.0, "other"),
    ]
    for name, phases in (("gsm8k-c1", c1), ("gsm8k-c8", c8)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "phases.jsonl").write_text("".join(json.dumps(p) + "\n" for p in phases))
    table = vllm_grid_report.ratios(vllm_grid_report.load_phases(tmp_path))
    assert table[("gsm8k", 8, rule)]["ratio"] == 0.75  # paired with its own sitting's target alone
    cuts, ks = vllm_grid_report.schedules_in(c1 + c8)
    at = lambda c, cut, k: vllm_grid_report.schedule_ratio(table, "gsm8k", c, rule, cut, k, cuts, 5)  # noqa: E731
    assert (at(1, 4, 5), at(1, 4, 3), at(8, 2, 3)) == (2.0, 1.5, 0.95)
    # geometric means: 2:3 sqrt(1.5 x 0.95), 2:5 sqrt(2 x 0.9), 4:3 sqrt(1.5 x 0.925), 4:5 sqrt(2 x 0.85)
    assert vllm_grid_report.best_schedule(table, "gsm8k", rule, [1, 8], cuts, ks, 5) == (2, 5)
    text = vllm_grid_report.report(tmp_path, "gsm8k", rule)
    assert "sched:2:5" in text
    row = next(line for line in text.splitlines() if line.startswith("| gsm8k | 8 |"))
    assert row.split(" | ")[4:] == ["0.75×", "0.98× (80.0%; 50.0%)", "-", "0.90×", "0.98 |"]  # 0.98 / max(1, 0.9)

    # the policy timed again beside a target alone of its own: two pairs (policy first, then the target alone first)
    # read 0.90 and 1.00; a directory whose target alone is of another sitting, or missing, pairs nothing
    pairs = {
        "gsm8k-c8-beside/a": [phase(f"{rule}@policy", 8, 18.0), phase("ar", 8, 20.0)],
        "gsm8k-c8-beside/b": [phase("ar", 8, 19.0), phase(f"{rule}@policy", 8, 19.0)],
        "gsm8k-c8-beside/c": [phase(f"{rule}@policy", 8, 5.0), phase("ar", 8, 50.0, "other")],
        "gsm8k-c8-beside/d": [phase(f"{rule}@policy", 8, 5.0)],
    }
    for name, phases in pairs.items():
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "phases.jsonl").write_text("".join(json.dumps(p) + "\n" for p in phases))
    assert vllm_grid_report.beside_ratios(tmp_path) == {("gsm8k", 8, f"{rule}@policy"): 0.95}
    assert table == vllm_grid_report.ratios(vllm_grid_report.load_phases(tmp_path))  # the grid's own pairs unchanged
    text = vllm_grid_report.report(tmp_path, "gsm8k", rule)
    row = next(line for line in text.splitlines() if line.startswith("| gsm8k | 8 |"))
    assert row.split(" | ")[4:] == ["0.75×", "0.98× (80.0%; 50.0%)", "0.95×", "0.90×", "0.95 |"]  # 0.95 / max(1, 0.9)
    row = next(line for line in text.splitlines() if line.startswith("| gsm8k | 1 |"))
    assert row.split(" | ")[6] == "-"


def test_vllm_bench_refuses_to_pair_phases_from_another_machine(monkeypatch, tmp_path):
    """benchmarks/bench_vllm.py pairs every phase with the target alone from the same directory, so it resumes only
    on the machine class and setting that wrote it; phases from before the CPU's name was recorded compare the rest,
    and those from before the worker's cores were recorded ran on core 0."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_vllm

    here = {"cpu": "Xeon", "cpu_capability": "AVX512+bf16+amx", "dtype": "bfloat16", "threads": 2,
            "torch": "2.13.0+cpu", "compiled": False, "omp_bind": "0"}  # fmt: skip
    older = [{k: v for k, v in here.items() if k not in ("cpu", "omp_bind")}]
    bench_vllm.check_same_machine([here, *older], here, tmp_path)
    with pytest.raises(SystemExit, match="holds phases run with {'omp_bind': '0'}, this run has {'omp_bind': '0-1'}"):
        bench_vllm.check_same_machine(older, {**here, "omp_bind": "0-1"}, tmp_path)
    for key, other in (("cpu", "EPYC"), ("cpu_capability", "AVX512+bf16"), ("dtype", "float32"), ("threads", 4),
                       ("omp_bind", "0-1")):  # fmt: skip
        with pytest.raises(SystemExit, match=f"holds phases run with {{'{key}'.*pass a new --output-dir"):
            bench_vllm.check_same_machine([here, {**here, key: other}], here, tmp_path)


def test_vllm_load_grid_times_the_policy_beside_a_target_alone_of_its_own_from_4_in_flight():
    """benchmarks/vllm_load_grid.sh (DRY=1 prints its bench_vllm invocations): from BESIDE (4) in flight on, after the
    grid's own invocation, each rule's policy phase and a target alone, one invocation each, in
    <task>-c<c>-beside/<rule>/, which of the two runs first alternating from rule to rule; none below BESIDE."""
    root = Path(__file__).resolve().parents[1]
    script = root / "benchmarks" / "vllm_load_grid.sh"
    out = subprocess.run(["bash", str(script), "gsm8k", "2,8", "exact,cascade-opt:0.1"], env={**os.environ, "DRY": "1"},
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    runs = [re.search(r"--output-dir (\S+) --methods (\S+)", line).groups() for line in out.splitlines()]
    grid = "docs/vllm/load-grid"
    assert [d for d, _ in runs[:2]] == [f"{grid}/gsm8k-c2", f"{grid}/gsm8k-c8"]
    assert runs[2:] == [
        (f"{grid}/gsm8k-c8-beside/exact", "exact@policy"),
        (f"{grid}/gsm8k-c8-beside/exact", "ar"),
        (f"{grid}/gsm8k-c8-beside/cascade-opt-0.1", "ar"),
        (f"{grid}/gsm8k-c8-beside/cascade-opt-0.1", "cascade-opt:0.1@policy"),
    ]
    none = subprocess.run(["bash", str(script), "gsm8k", "8"], env={**os.environ, "DRY": "1", "BESIDE": ""},
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert len(none.splitlines()) == 1


def test_vllm_load_grid_runs_each_configuration_once_per_concurrency():
    """benchmarks/vllm_load_grid.sh: at c in flight, a grid cut below c is its own phase, the smallest cut >= c
    stands for every cut from c on (K = 3 only: at K = 5 it is fixed N = 5), and a chosen schedule (SCHEDULES) that
    drafts 5 up to a cut >= c is fixed N = 5 there, so it is not timed twice."""
    root = Path(__file__).resolve().parents[1]
    script = root / "benchmarks" / "vllm_load_grid.sh"

    def methods(task: str, c: int, **env: str) -> list[str]:
        out = subprocess.run(["bash", str(script), task, str(c), "exact"], capture_output=True, text=True, check=True,
                             env={**os.environ, "DRY": "1", "BESIDE": "", **env}).stdout  # fmt: skip
        return re.search(r"--methods (\S+)", out).group(1).split(",")

    assert methods("gsm8k", 8) == ["ar", "exact", "exact@policy"] + [
        f"cascade-opt:0.1@sched:{cut}:{k}" for cut, k in [(2, 3), (4, 3), (8, 3), (2, 5), (4, 5)]
    ]
    assert methods("gsm8k", 1, GRID_RULE="") == ["ar", "exact", "exact@policy"]
    reused = {"GRID_RULE": "", "SCHEDULES": "sched:16:5,sched:4:3"}
    assert methods("mbpp", 8, **reused) == ["ar", "exact", "exact@policy", "exact@sched:4:3"]
    assert methods("mbpp", 32, **reused) == ["ar", "exact", "exact@policy", "exact@sched:16:5", "exact@sched:4:3"]


def _reap(pid: int) -> int:
    """Wait for ``pid``, an orphaned descendant of this process (made its subreaper), and return the signal that
    ended it (0: it exited on its own). No clock: an orphan that was not killed ends its 300 s sleep and reads 0."""
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


def test_bench_vllm_stops_the_servers_children_with_it(tmp_path, monkeypatch, request):
    """benchmarks/bench_vllm.py starts vLLM's server in a process group of its own and stops the whole group: a
    child that ignores SIGTERM and outlives the server (as vLLM's CPU worker can) is killed, also when the server
    fails to start."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import ctypes

    import bench_vllm

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans come back to this process, to be reaped below
    request.addfinalizer(lambda: prctl(36, 0))
    fake = tmp_path / "python"  # stands for vLLM's python: leaves a stubborn child, then fails
    fake.write_text(f'#!/bin/bash\n(trap "" TERM; exec sleep 300) &\necho $! > {tmp_path}/child\nsleep 1\nexit 1\n')
    fake.chmod(0o755)
    args = argparse.Namespace(vllm_python=str(fake), concurrency=[1], max_model_len=64, compile=False,
                              no_prefix_caching=True, kv_cache_gib=1, omp_bind="0")  # fmt: skip
    with pytest.raises(SystemExit, match="did not start"):
        bench_vllm.Server(args, tmp_path, None, "float32", tmp_path / "server.log", "ar")
    assert _reap(int((tmp_path / "child").read_text())) == signal.SIGKILL

    started = subprocess.Popen(["bash", "-c", f'(trap "" TERM; exec sleep 300) & echo $! > {tmp_path}/kept; wait'],
                               start_new_session=True)  # fmt: skip
    while not (tmp_path / "kept").is_file() or not (tmp_path / "kept").read_text().strip():
        time.sleep(0.05)
    bench_vllm.stop_process_group(started, timeout=5)
    assert started.returncode is not None and _reap(int((tmp_path / "kept").read_text())) == signal.SIGKILL


def test_cascade_frontier_draws_every_rule_in_one_sampler_call_in_its_tasks_table1_dtype():
    """benchmarks/cascade_frontier.sh (DRY=1 prints its bench invocation): the frontier's rules that Table 1 has not
    run on 150 rows, in one resumable invocation (the sampler keeps its 128 rows full across them), at the dtype of
    the task's Table 1 rows; an unknown task is refused in one line."""
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "cascade_frontier.sh"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(script), *args], env={**os.environ, "DRY": "1"}, capture_output=True,
                              text=True)  # fmt: skip

    (line,) = run("gsm8k").stdout.splitlines()
    assert re.search(r"--methods (\S+)", line).group(1).split(",") == [
        "cascade-opt:0.2", "cascade-opt:0.05", "lossy:0.8", "cascade-opt:0.3", "lossy:0.2", "cascade-opt:0.5",
    ]  # fmt: skip
    assert "--dtype float32" in line and "--batch-size 128" in line and "--output-dir docs/table1/gsm8k" in line
    assert "--dtype bfloat16 " in run("mbpp", "lossy:0.2").stdout
    refused = run("xsum")
    assert refused.returncode == 2 and refused.stderr.strip() == "unknown task 'xsum': pass gsm8k or mbpp"
