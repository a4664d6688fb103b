"""A draft with a trimmed vocabulary (``hf-diversed trim-draft``), measured end to end on the real pair.

Three steps, each resumable, then one report (``docs/draft_vocabulary.md``):

    # 1. the trimmed drafts: the K ids most frequent in each task's train split
    for t in gsm8k mbpp; do for k in 16384 32768 65536; do
      hf-diversed trim-draft --task $t --size $k --output ~/.cache/hf_diversed/trimmed/$t-$k; done; done
    # 2. acceptance and tokens per round τ: the batched law-exact sampler, via `hf-diversed bench` per draft
    python benchmarks/bench_draft_vocabulary.py acceptance --drafts-dir ~/.cache/hf_diversed/trimmed
    # 3. costs, on an idle machine: one decode step of each draft and the target's verification, interleaved
    python benchmarks/bench_draft_vocabulary.py timing --drafts-dir ~/.cache/hf_diversed/trimmed --compile
    python benchmarks/bench_draft_vocabulary.py report

Speed over the target alone is the τ model τ / (N·c_K + v_N): c_K is the draft's decode step (vocabulary K)
over the target's, v_N the target's forward on N+1 tokens over one, both measured here at batch 1; τ is the
measured tokens per round. The share of target tokens outside each kept set is counted on the exact-SD
completions (which follow the target's law).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

OUT = Path("docs/draft_vocabulary")
TIMING_FILE = OUT / "timing.json"
COMPILE_FILE = OUT / "timing_compiled.json"
FULL = "full"
HEADS = Path(__file__).resolve().parents[1] / "hf_diversed" / "modeling" / "heads"


def _draft_dirs(args) -> dict[tuple[str, str], str]:
    """(task, size label) -> the draft to load: the built-in draft for "full", else a trimmed directory."""
    from hf_diversed.evaluation.real_models import DRAFT_NAME

    drafts = {}
    for task in args.tasks.split(","):
        drafts[task, FULL] = DRAFT_NAME
        for size in args.sizes.split(","):
            path = Path(args.drafts_dir).expanduser() / f"{task}-{size}"
            if not (path / "config.json").is_file():
                raise SystemExit(f"{path} is missing: build it with `hf-diversed trim-draft --task {task} "
                                 f"--size {size} --output {path}`")  # fmt: skip
            drafts[task, size] = str(path)
    return drafts


# ------------------------------------------------------------------------------------------------ acceptance


def acceptance(args) -> None:
    """`hf-diversed bench` for every (task, draft): sampler records under docs/draft_vocabulary/<task>-<K>/."""
    for (task, size), draft in _draft_dirs(args).items():
        ns = args.ns if size in (FULL, *args.all_n_sizes.split(",")) else args.default_n
        cmd = [
            sys.executable, "-m", "hf_diversed.cli", "bench", "--tasks", task, "--draft", draft,
            "--methods", args.methods, "--num-examples", str(args.num_examples), "--num-assistant-tokens", ns,
            "--max-new-tokens", str(args.max_new_tokens), "--temperature", "1", "--timed-examples", "0",
            "--batch-size", str(args.batch_size), "--threads", str(args.threads), "--dtype", args.dtype,
            "--output-dir", str(OUT / f"{task}-{size}"), "--no-costs",
        ]  # fmt: skip
        if "diversed" in args.methods.split(","):
            cmd += ["--head", str(HEADS / f"diversed-head-qwen2.5-coder-1.5b-{task}")]  # the bundled head of the task
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


# ------------------------------------------------------------------------------------------------ timing


def _step(model, cache, length: int, token: torch.Tensor, k: int) -> None:
    model(token.repeat(1, k), past_key_values=cache, use_cache=True, logits_to_keep=k)
    cache.crop(-(cache.get_seq_length() - length))  # back to the prompt: every step sees the same context


def timing(args) -> None:
    """Median seconds of one forward at batch 1 after a cached GSM8K prompt, all variants interleaved."""
    from hf_diversed.evaluation.models import load_pair
    from hf_diversed.evaluation.real_models import DRAFT_NAME, TARGET_NAME
    from hf_diversed.evaluation.tasks import get_task
    from hf_diversed.modeling.draft_vocabulary import TrimmedLMHead, decode_ids
    from hf_diversed.modeling.dtypes import cpu_capability, resolve_dtype

    torch.set_num_threads(args.threads)
    dtype_name = resolve_dtype(args.dtype)
    tokenizer, target, draft = load_pair(TARGET_NAME, DRAFT_NAME, getattr(torch, dtype_name))
    task = get_task("gsm8k")
    row = task.load("test[:1]")[0]
    ids = tokenizer.apply_chat_template(task.build_messages(row), add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    full_head = draft.get_output_embeddings()
    heads = {FULL: full_head}
    for size in args.sizes.split(","):  # the sets of the first task; the cost depends on K only
        path = Path(args.drafts_dir).expanduser() / f"{args.tasks.split(',')[0]}-{size}"
        record = _config(path).diversed_draft_vocabulary
        heads[size] = TrimmedLMHead(full_head, decode_ids(record["ids"], int(record["vocab_size"])))
    ns = [int(n) for n in args.ns.split(",")]

    results: dict[str, list[float]] = defaultdict(list)
    with torch.no_grad():
        caches = {}
        for name, model in (("target", target), ("draft", draft)):
            out = model(ids, use_cache=True, logits_to_keep=1)
            caches[name] = out.past_key_values
        token, length = ids[:, -1:], ids.shape[1]

        target_variants = [("target x1", lambda: _step(target, caches["target"], length, token, 1))] + [
            (f"target x{n + 1}", lambda n=n: _step(target, caches["target"], length, token, n + 1)) for n in ns
        ]

        def draft_step(head):
            draft.set_output_embeddings(head)
            _step(draft, caches["draft"], length, token, 1)

        draft_variants = [(f"draft {size}", lambda head=head: draft_step(head)) for size, head in heads.items()]
        # the target's and the draft's variants interleave within their own loops (a target step is several draft
        # steps long); the draft's loop runs 4x as many rounds, as its steps are short and the gaps between heads small
        for variants, rounds in ((target_variants, args.repeats), (draft_variants, 4 * args.repeats)):
            for _label, fn in variants:  # warm-up
                fn()
            for _ in range(rounds):
                for label, fn in variants:
                    start = time.perf_counter()
                    fn()
                    results[label].append(time.perf_counter() - start)
        draft.set_output_embeddings(full_head)

        if args.compile:
            chosen = {size: heads[size] for size in args.compile_sizes.split(",")}
            compiled = _compiled_timing(draft, chosen, caches["draft"], length, token, 4 * args.repeats)
            record = {"cpu_capability": cpu_capability(), "dtype": dtype_name, "threads": args.threads,
                      "torch": torch.__version__, "compiled": compiled}  # fmt: skip
            OUT.mkdir(parents=True, exist_ok=True)
            COMPILE_FILE.write_text(json.dumps(record, indent=1) + "\n")

    median = {label: statistics.median(times) for label, times in results.items()}
    t1 = median["target x1"]
    record = {
        "cpu_capability": cpu_capability(), "dtype": dtype_name, "threads": args.threads, "torch": torch.__version__,
        "prompt_tokens": length, "repeats": args.repeats, "seconds": median,
        "c": {size: median[f"draft {size}"] / t1 for size in heads},
        "v": {str(n): median[f"target x{n + 1}"] / t1 for n in ns},
        "samples": {label: [round(t, 5) for t in times] for label, times in results.items()},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    TIMING_FILE.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "samples"}, indent=1))


def _config(path: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path)


def _compiled_timing(draft, heads, cache, length, token, repeats) -> dict:
    """The draft's decode step under ``torch.compile`` (inductor, CPU) for the full and each trimmed head, next to
    eager in the same loop; the compiled logits are checked against eager's."""
    import torch._dynamo

    report = {}
    for size, head in heads.items():
        draft.set_output_embeddings(head)
        torch._dynamo.reset()
        forward = torch.compile(draft, dynamic=False)
        try:
            start = time.perf_counter()
            for _ in range(3):
                _step(forward, cache, length, token, 1)
            warmup = time.perf_counter() - start
            got = forward(token, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            cache.crop(-(cache.get_seq_length() - length))
            want = draft(token, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            cache.crop(-(cache.get_seq_length() - length))
            finite = torch.isfinite(want)
            error = float((got[finite] - want[finite]).abs().max())
            eager, comp = [], []
            for _ in range(repeats):
                for fn, sink in ((draft, eager), (forward, comp)):
                    start = time.perf_counter()
                    _step(fn, cache, length, token, 1)
                    sink.append(time.perf_counter() - start)
            report[size] = {"eager": statistics.median(eager), "compiled": statistics.median(comp),
                            "warmup_seconds": warmup, "max_abs_logit_error": error}  # fmt: skip
            report[size].update(_growing(draft, cache, length, token, max(repeats // 8, 3)))
        except Exception as err:  # noqa: BLE001 - reported, not hidden: compile is an experiment here
            report[size] = {"error": f"{type(err).__name__}: {err}"[:300]}
        print(size, report[size], flush=True)
    torch._dynamo.reset()
    return report


def _growing(draft, cache, length, token, repeats: int, steps: int = 16) -> dict:
    """As in generation: ``steps`` decode steps on a growing cache, compiled with dynamic shapes (one graph for
    every length) next to eager; seconds per step, median over ``repeats`` alternating runs."""
    import torch._dynamo

    torch._dynamo.reset()
    forward = torch.compile(draft, dynamic=True)

    def run(fn) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            fn(token, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.crop(-(cache.get_seq_length() - length))
        return (time.perf_counter() - start) / steps

    start = time.perf_counter()
    run(forward)
    run(forward)  # the first run compiles a static then a dynamic graph; after the crop back, one more
    warmup = time.perf_counter() - start
    eager, comp = [], []
    for _ in range(repeats):
        eager.append(run(draft))
        comp.append(run(forward))
    return {"growing_eager": statistics.median(eager), "growing_compiled": statistics.median(comp),
            "growing_warmup_seconds": warmup}  # fmt: skip


# ------------------------------------------------------------------------------------------------ report


def _outside_share(task: str, sizes: list[str], drafts_dir: Path) -> dict[str, dict[str, float | None]]:
    """Share of tokens outside each kept set: of the target-law tokens (this run's exact-SD completions, plus
    Table 1's where they exist) and of the task's test-split texts (held out from the counted train split)."""
    from transformers import AutoTokenizer

    from hf_diversed.evaluation.bench.plan import load_records
    from hf_diversed.evaluation.real_models import DRAFT_NAME
    from hf_diversed.evaluation.trim_draft import task_corpus
    from hf_diversed.evaluation.weights import resolve_model
    from hf_diversed.modeling.draft_vocabulary import decode_ids

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(DRAFT_NAME, progress=False))
    records = load_records(OUT / f"{task}-{FULL}" / "results.jsonl") + load_records(
        Path("docs/table1") / task / "results.jsonl"
    )
    completions = [r["completion"] for r in records if r["method"] == "exact" and r.get("completion")]

    def tokens(texts: list[str]) -> torch.Tensor:
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        return torch.tensor([t for row in ids for t in row], dtype=torch.long)

    samples = {"target": tokens(completions), "test texts": tokens(task_corpus(task, "test"))}
    share: dict[str, dict[str, float | None]] = {}
    for size in sizes:
        record = _config(drafts_dir / f"{task}-{size}").diversed_draft_vocabulary
        inside = torch.zeros(int(record["vocab_size"]), dtype=torch.bool)
        inside[decode_ids(record["ids"], int(record["vocab_size"]))] = True
        share[size] = {name: float((~inside[t]).float().mean()) if t.numel() else None for name, t in samples.items()}
    share["_counts"] = {name: float(t.numel()) for name, t in samples.items()}
    return share


def report(args) -> None:
    from hf_diversed.evaluation.bench.plan import load_records
    from hf_diversed.evaluation.bench.summary import summarize_records

    timing_record = json.loads(TIMING_FILE.read_text()) if TIMING_FILE.is_file() else None
    sizes = args.sizes.split(",")
    lines = [
        "# A trimmed draft vocabulary on the real pair",
        "",
        "Generated by `python benchmarks/bench_draft_vocabulary.py report` from the records under "
        "`docs/draft_vocabulary/`; how to rerun each step is in the script's docstring. Target "
        "Qwen2.5-Coder-1.5B-Instruct, draft Qwen2.5-Coder-0.5B-Instruct; the trimmed drafts keep the K ids most "
        "frequent in the task's train split (`hf-diversed trim-draft --task T --size K`).",
        "",
    ]
    if timing_record:
        t = timing_record
        lines += [
            f"## Costs (CPU {t['cpu_capability']}, {t['dtype']}, {t['threads']} threads, batch 1, "
            f"{t['prompt_tokens']}-token prompt, median of {t['repeats']} interleaved repeats)",
            "",
            "| draft vocabulary | draft step (ms) | c = draft / target step | vs full |",
            "|---|---|---|---|",
        ]
        for size, c in t["c"].items():
            ms = 1000 * t["seconds"][f"draft {size}"]
            lines.append(f"| {size} | {ms:.1f} | {c:.3f} | {c / t['c'][FULL]:.2f}× |")
        lines += ["", f"Target step {1000 * t['seconds']['target x1']:.0f} ms; verification over N+1 tokens: "
                  + ", ".join(f"v(N={n}) = {v:.2f}" for n, v in t["v"].items()) + ". A round costs N·c + v "
                  "target steps, so with v near 2 on this CPU the verification, not the draft, dominates: the "
                  "last column of the task tables gives the speed a machine with v = 1 (memory-bound "
                  "verification) would reach from the same τ and c.", ""]  # fmt: skip
        compiled = json.loads(COMPILE_FILE.read_text())["compiled"] if COMPILE_FILE.is_file() else None
        if compiled:
            lines += ["`torch.compile` (inductor, CPU) of the draft's decode step, next to eager in one loop: at one "
                      "cache length (static shapes), and over 16 steps on a growing cache as in generation "
                      "(dynamic shapes):", "",
                      "| draft vocabulary | eager (ms) | compiled (ms) | warm-up (s) | growing: eager (ms) | "
                      "growing: compiled (ms) | warm-up (s) | max logit error |",
                      "|---|---|---|---|---|---|---|---|"]  # fmt: skip
            for size, r in compiled.items():
                if "error" in r:
                    lines.append(f"| {size} | - | failed: {r['error']} | - | - | - | - | - |")
                    continue
                growing = [f"{1000 * r[k]:.1f}" if k in r else "-" for k in ("growing_eager", "growing_compiled")]
                lines.append(
                    f"| {size} | {1000 * r['eager']:.1f} | {1000 * r['compiled']:.1f} | "
                    f"{r['warmup_seconds']:.0f} | {growing[0]} | {growing[1]} | "
                    f"{r.get('growing_warmup_seconds', float('nan')):.0f} | {r['max_abs_logit_error']:.1e} |"
                )
            lines.append("")
    for task in args.tasks.split(","):
        share = _outside_share(task, sizes, Path(args.drafts_dir).expanduser())
        counts = share.pop("_counts")
        lines += [f"## {task}", "",
                  f"Tokens outside the kept set: of the target's own tokens ({counts['target']:.0f} tokens of exact-SD "
                  f"completions, which follow the target's law) and of the test split's texts "
                  f"({counts['test texts']:.0f} tokens, held out from the counted train split):", "",
                  "| K | target's tokens outside | test texts outside |", "|---|---|---|"]  # fmt: skip
        for size, values in share.items():
            cells = [f"{100 * values[k]:.2f}%" if values[k] is not None else "-" for k in ("target", "test texts")]
            lines.append(f"| {size} | " + " | ".join(cells) + " |")
        lines += ["", "| method | N | draft vocabulary | n | acceptance | τ | mean w | speed τ/(N·c+v) | vs full draft "
                  "| speed at v = 1 |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        rows = {}
        for size in (FULL, *sizes):
            records = load_records(OUT / f"{task}-{size}" / "results.jsonl")
            for row in summarize_records(records):
                rows[row["method"], row["N"], size] = row
        for method, n, size in sorted(rows, key=lambda k: (k[0], k[1], (FULL, *sizes).index(k[2]))):
            row = rows[method, n, size]
            speed = full_speed = speed_v1 = None
            if timing_record:
                speed_v1 = row["mean_accepted_per_round"] / (n * timing_record["c"][size] + 1.0)
            if timing_record and str(n) in timing_record["v"]:
                v = timing_record["v"][str(n)]
                speed = row["mean_accepted_per_round"] / (n * timing_record["c"][size] + v)
                base = rows.get((method, n, FULL))
                if base:
                    full_speed = base["mean_accepted_per_round"] / (n * timing_record["c"][FULL] + v)
            cells = [method, str(n), size, str(row["n"]), f"{100 * row['acceptance_rate']:.1f}%",
                     f"{row['mean_accepted_per_round']:.2f}", f"{row['mean_weight']:.2f}",
                     f"{speed:.2f}×" if speed else "-",
                     f"{speed / full_speed:.3f}×" if speed and full_speed else "-",
                     f"{speed_v1:.2f}×" if speed_v1 else "-"]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    (OUT.parent / "draft_vocabulary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["acceptance", "timing", "report"])
    parser.add_argument("--drafts-dir", default="~/.cache/hf_diversed/trimmed")
    parser.add_argument("--tasks", default="gsm8k,mbpp")
    parser.add_argument("--sizes", default="16384,32768,65536")
    parser.add_argument("--ns", default="3,5,7")
    parser.add_argument("--default-n", default="5", help="N for the sizes not in --all-n-sizes")
    parser.add_argument("--all-n-sizes", default="32768", help="trimmed sizes measured at every N of --ns")
    parser.add_argument("--methods", default="exact,static:0.5,diversed")
    parser.add_argument("--num-examples", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of the draft's step")
    parser.add_argument("--compile-sizes", default="full,32768", help="draft vocabularies timed compiled")
    args = parser.parse_args()
    {"acceptance": acceptance, "timing": timing, "report": report}[args.step](args)


if __name__ == "__main__":
    main()
