"""``hf-diversed bench``: Spec-Bench-style speed / acceptance / quality benchmark of decoding methods.

Two engines. Quality, acceptance (accepted / drafted), accepted tokens per round (counting the bonus token),
mean w and TV come from the batched law-exact sampler (:mod:`hf_diversed.generation.batched`) on every example: the
sequences it draws have exactly the law of the real loop's. Speed comes from the real batch-1 loop on the
first ``--timed-examples`` examples (Spec-Bench: every method timed on the same machine in the same run,
speedup = tokens/s of a method / tokens/s of autoregressive decoding, "ar"). Each record says which engine
produced it (``engine``: ``sampler`` or ``loop``), and the summary which column came from which.

Every generation is one JSON line in ``<output-dir>/results.jsonl`` (written and fsync-ed as soon as it
finishes); a rerun first reads that file and skips what is already there, so a killed run resumes where it
stopped. At the end (or with ``--summarize-only``) the records are pooled into ``summary.json``,
``results.md`` and ``quality_speed.png`` / ``quality_acceptance.png``. Each invocation that has work appends its
start (command, commit, machine) to ``runs.jsonl``; the summary turns that log into the run's wall-clock time and
the sampler's throughput.

Data-parallel: the same command under ``accelerate launch --multi_gpu --num_processes K`` (CPUs too) splits the
examples (process r takes those with index i % K == r, every method of an example on one process); all processes
append to the one ``results.jsonl`` (one atomic ``O_APPEND`` write per record) and the main process writes the
summary.

Programmatic use::

    from hf_diversed.evaluation.bench import BenchConfig, run_bench
    summary = run_bench(BenchConfig(tasks=("gsm8k",), methods=("ar", "exact", "static:0.5"), num_examples=5))

One module per stage: ``config`` (options, methods, output files, errors), ``plan`` (record keys, the plan,
the results file), ``runner`` (the models, the sampler and the timed loop), ``costs`` (per-token costs, speed
models), ``frontier`` (a method against the static sweep and a baseline), ``runs`` (the run log), ``summary``
(pooled rows, intervals), ``report`` (summary.json, results.md, plots); the command line is
:mod:`hf_diversed.cli.bench`.
"""

from .config import (
    COSTS_FILE,
    DEFAULT_TASKS,
    LORA_METHOD,
    MARKDOWN_FILE,
    METHOD_FORMS,
    PLOT_ACCEPTANCE_FILE,
    PLOT_FILE,
    RESULTS_FILE,
    RUNS_FILE,
    SCHEMA_VERSION,
    SUMMARY_FILE,
    BenchConfig,
    BenchError,
    BenchMethod,
    expand_methods,
)
from .costs import (
    analytic_speedup,
    measure_costs,
    tau_speedup,
)
from .frontier import (
    compare_to_baseline,
    compare_to_frontier,
)
from .plan import (
    ENGINES,
    KEY_FIELDS,
    load_records,
    record_key,
)
from .report import (
    ASSUMPTIONS,
    summarize,
    write_markdown,
)
from .runner import (
    run_bench,
)
from .runs import (
    load_runs,
    summarize_runs,
)
from .summary import (
    AR_FIELDS,
    GROUP_FIELDS,
    bootstrap_interval,
    summarize_records,
    wilson_interval,
)

__all__ = [
    "AR_FIELDS",
    "ASSUMPTIONS",
    "COSTS_FILE",
    "DEFAULT_TASKS",
    "ENGINES",
    "GROUP_FIELDS",
    "KEY_FIELDS",
    "LORA_METHOD",
    "MARKDOWN_FILE",
    "METHOD_FORMS",
    "PLOT_ACCEPTANCE_FILE",
    "PLOT_FILE",
    "RESULTS_FILE",
    "RUNS_FILE",
    "SCHEMA_VERSION",
    "SUMMARY_FILE",
    "BenchConfig",
    "BenchError",
    "BenchMethod",
    "analytic_speedup",
    "bootstrap_interval",
    "compare_to_baseline",
    "compare_to_frontier",
    "expand_methods",
    "load_records",
    "load_runs",
    "measure_costs",
    "record_key",
    "run_bench",
    "summarize",
    "summarize_records",
    "summarize_runs",
    "tau_speedup",
    "wilson_interval",
    "write_markdown",
]
