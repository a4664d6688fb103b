"""The real pair served by vLLM's OpenAI server with hf-diversed's rules: tokens/s, acceptance and task quality.

The client (this script, in the main environment: the tasks, their prompts and rewards) talks over HTTP to vLLM's
OpenAI server started in vLLM's environment (``--vllm-python``, e.g. ``.venv-vllm/bin/python``; docs/vllm.md). Two
servers are started in turn, the target alone and the target with the draft (``draft_model``, N probabilistic
drafts); each (task, method, concurrency) is one phase: the task's first ``--num-prompts`` test prompts (the chat
prompts of Table 1, sent as token ids), at most ``c`` requests in flight at once, T = 1. A phase's tokens/s is its
completion tokens over its wall-clock time; its acceptance is the growth of the server's spec-decode counters over
the phase. Method ``diversed`` is the task's bundled DIVERSED head (``extra_args["diversed_head"]``, from the Hugging
Face cache the script seeds); its mean w and per-position acceptance mean(1 - w TV), over every drafted position
(those after a rejection in the same step too), come from the plugin's weight log (``HF_DIVERSED_VLLM_WEIGHT_LOG``),
beside vLLM's acceptance (accepted over drafted tokens: a rejection ends a block). Every request is a JSON line in
``<output-dir>/records.jsonl`` and each phase a line in ``phases.jsonl``, written as they finish, each with its
sitting (the machine's boot: one sitting shares one host's load and clocks). A rerun skips the phases already there
(``--remeasure``: those of this sitting only) and times the target alone again where this sitting times a rule without
it. The report (``results.md``) pairs each method with the target alone at the same concurrency and sitting.
A method ``RULE@policy`` runs on a server with the draft-length policy (``--policy-costs``, from
``python -m hf_diversed.integrations.vllm.calibrate``), ``RULE@sched:CUT:K`` on one with vLLM's own batch-size
schedule (K drafts up to CUT requests in flight, none beyond); each server kind is started once per run.

    python benchmarks/bench_vllm.py --vllm-python .venv-vllm/bin/python --tasks gsm8k,mbpp --num-prompts 32 \\
        --max-new-tokens 512 --concurrency 1,8,32 --output-dir docs/vllm/bench
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SPEC_COUNTERS = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")
DEFAULT_METHODS = "ar,exact,static:0.5,cascade-opt:0.1,token-class:digits:0.3,diversed"


def _policy_settings(text: str) -> dict:
    """``--policy-settings``: a JSON object; a ``step_log`` path is made absolute (the server runs elsewhere)."""
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err}); give an object such as '{{\"force_k\": 0}}'") from None
    if not isinstance(settings, dict):
        raise argparse.ArgumentTypeError(f"give a JSON object such as '{{\"force_k\": 0}}', not {text}")
    if "step_log" in settings:
        settings["step_log"] = str(Path(settings["step_log"]).resolve())
    return settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """vLLM's OpenAI server (the module behind ``vllm serve``) in vLLM's environment, on 127.0.0.1."""

    def __init__(self, args, target: Path, draft: Path | None, dtype: str, log: Path, engine: str = "spec"):
        self.port = _free_port()
        max_num_seqs = max(args.concurrency)
        command = [
            args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--host",
            "127.0.0.1", "--port", str(self.port), "--dtype", dtype, "--max-model-len", str(args.max_model_len),
            "--served-model-name", "target", "--seed", "0", "--max-num-seqs", str(max_num_seqs),
        ]  # fmt: skip
        if not args.compile:
            command.append("--enforce-eager")
        if args.no_prefix_caching or engine == "policy":
            command.append("--no-enable-prefix-caching")
        if draft is not None:
            spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": args.num_draft,
                    "draft_sample_method": "probabilistic"}  # fmt: skip
            if engine.startswith("sched:"):
                spec["num_speculative_tokens_per_batch_size"] = hand_schedule(engine, max_num_seqs)
            command += ["--speculative-config", json.dumps(spec)]
            if engine == "policy":
                if not args.policy_costs:
                    raise SystemExit("a method@policy needs --policy-costs (python -m "
                                     "hf_diversed.integrations.vllm.calibrate writes it): add it.")  # fmt: skip
                policy = {"step_costs": str(Path(args.policy_costs).resolve()), **args.policy_settings}
                command += ["--additional-config", json.dumps({"diversed_draft_policy": policy})]
        self.weight_log = log.with_name(log.stem + "-weights.jsonl")
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(args.kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND":
               args.omp_bind, "HF_DIVERSED_VLLM_WEIGHT_LOG": str(self.weight_log)}  # fmt: skip
        self.log = open(log, "a")  # noqa: SIM115 - closed in stop()
        # its own process group: vLLM's engine core and CPU worker are children that outlive a killed server
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 1800
        try:
            while True:
                try:
                    urllib.request.urlopen(f"{self.base}/health", timeout=5)
                    return
                except OSError:
                    if self.process.poll() is not None or time.time() > deadline:
                        raise SystemExit(f"the vLLM server did not start; see {log}") from None
                    time.sleep(3)
        except BaseException:  # a failed start, or the bench stopped while the server loads
            self.stop()
            raise

    def counters(self) -> dict[str, float]:
        text = urllib.request.urlopen(f"{self.base}/metrics", timeout=30).read().decode()
        out = dict.fromkeys(SPEC_COUNTERS, 0.0)
        for line in text.splitlines():
            for name in SPEC_COUNTERS:
                if line.startswith(name):
                    out[name] += float(line.rsplit(" ", 1)[1])
        return out

    def weights(self) -> list[dict]:
        """The plugin's weight log so far (one line per verification step and head)."""
        return _load(self.weight_log)

    def complete(self, prompt_ids: list[int], xargs: dict | None, seed: int, max_tokens: int) -> dict:
        body = {"model": "target", "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed}
        if xargs:
            body["vllm_xargs"] = xargs
        request = urllib.request.Request(
            f"{self.base}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=3600) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        """The server and every process it started: SIGTERM to its group, SIGKILL to what is left after 120 s."""
        stop_process_group(self.process)
        self.log.close()


def stop_process_group(process: subprocess.Popen, timeout: float = 120.0) -> None:
    """Stop ``process`` (started with ``start_new_session=True``) and its whole group, children included."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(process.pid, signal.SIGKILL)  # workers that outlived their parent
    process.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _append(path: Path, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _gpu(vllm_python: str) -> dict:
    """On a GPU: its name, CUDA's version and vLLM's (from vLLM's own environment); nothing on a CPU."""
    import torch

    if not torch.cuda.is_available():
        return {}
    done = subprocess.run([vllm_python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True)
    return {"gpu": torch.cuda.get_device_name(), "cuda": torch.version.cuda, "vllm": done.stdout.strip() or None}


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor string."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


MACHINE_KEYS = ("cpu", "cpu_capability", "dtype", "threads", "torch", "compiled", "omp_bind", "gpu", "vllm")
OMP_BIND = "0"  # phases recorded before --omp-bind existed ran with it


def _sitting() -> str:
    """This boot of the machine (the kernel's boot id, else the host and its boot time)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return f"{socket.gethostname()}@{round(time.time() - time.monotonic(), -2):.0f}"


def plan_phases(
    phases: list[dict],
    tasks: list[str],
    methods: list[str],
    concurrency: list[int],
    sitting: str,
    remeasure: bool = False,
) -> tuple[list[tuple], list[tuple]]:
    """The (task, method, c) phases to run, the target alone's apart from the rules'.

    A phase is done when the directory has it (with ``remeasure``: from this sitting). The target alone runs again
    where this sitting times a rule of its task and c (now or earlier) and has no target alone of its own, so that
    every ratio pairs two phases of one sitting.
    """  # fmt: skip
    here = [p for p in phases if p.get("sitting") == sitting]
    done = {(p["task"], p["method"], p["concurrency"]) for p in (here if remeasure else phases)}
    rules = [(t, m, c) for t in tasks for m in methods if m != "ar" for c in concurrency if (t, m, c) not in done]
    timed_here = {(p["task"], p["concurrency"]) for p in here} | {(t, c) for t, _, c in rules}
    based_here = {(p["task"], p["concurrency"]) for p in here if p["method"] == "ar"}
    ar = [(t, "ar", c) for t in tasks for c in concurrency if "ar" in methods and (t, c) not in based_here
          and ((t, "ar", c) not in done or (t, c) in timed_here)]  # fmt: skip
    return ar, rules


def check_same_machine(phases: list[dict], machine: dict, out: Path) -> None:
    """Ratios pair phases of one directory, so every phase there must come from one machine class and setting."""
    for phase in phases:
        phase = {"omp_bind": OMP_BIND, **phase}
        differ = [k for k in MACHINE_KEYS if k in phase and phase[k] != machine[k]]
        if differ:
            was, now = ({k: m[k] for k in differ} for m in (phase, machine))
            raise SystemExit(f"{out} holds phases run with {was}, this run has {now}: pass a new --output-dir.")


def engine_of(method: str) -> str:
    """The server a method runs on: ``ar`` (the target alone), ``spec`` (N drafts at every step), ``policy``
    (``RULE@policy``: the draft-length policy) or ``sched:CUT:K`` (``RULE@sched:CUT:K``: vLLM's own batch-size
    schedule, K drafts up to CUT requests in flight, none beyond)."""
    if method == "ar":
        return "ar"
    return method.split("@", 1)[1] if "@" in method else "spec"


def hand_schedule(engine: str, max_num_seqs: int) -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` for ``sched:CUT:K``."""
    try:
        _, cut, k = engine.split(":")
        cut, k = int(cut), int(k)
    except ValueError:
        raise SystemExit(f"{engine!r} is not sched:CUT:K (e.g. exact@sched:4:5): fix --methods.") from None
    return [[1, cut, k]] + ([[cut + 1, max_num_seqs, 0]] if cut < max_num_seqs else [])


def _xargs(method: str, task_name: str) -> dict | None:
    """The request's vLLM extra args: none for the target alone, the task's bundled head for ``diversed``."""
    method = method.split("@", 1)[0]
    if method == "ar":
        return None
    if method == "diversed":
        from hf_diversed.modeling.pretrained import head_for_task

        head = head_for_task(task_name)
        if head is None:
            raise SystemExit(f"no bundled head for task {task_name!r}: drop 'diversed' from --methods.")
        return {"diversed_head": head}
    return {"diversed_verifier": method}


def run_phase(server: Server, task, rows, prompts, method: str, concurrency: int, args, out: Path, machine: dict):
    xargs = _xargs(method, task.name)
    before, logged = server.counters(), len(server.weights())
    start = time.perf_counter()

    def one(i: int) -> dict:
        t0 = time.perf_counter()
        response = server.complete(prompts[i], xargs, seed=args.seed + i, max_tokens=args.max_new_tokens)
        choice = response["choices"][0]
        reward = task.reward_fn(None, [choice["text"]], **{c: [rows[i][c]] for c in task.reward_columns})[0]
        return {
            "task": task.name, "method": method, "concurrency": concurrency, "example_index": i,
            "example_id": str(rows[i][task.id_column]), "completion": choice["text"],
            "completion_tokens": response["usage"]["completion_tokens"], "finish_reason": choice["finish_reason"],
            "quality": reward, "seconds": time.perf_counter() - t0, "sitting": machine["sitting"],
        }  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        records = list(pool.map(one, range(len(prompts))))
    seconds = time.perf_counter() - start
    after = server.counters()
    drafted, accepted = (after[name] - before[name] for name in SPEC_COUNTERS)
    weights = server.weights()[logged:]
    positions = sum(line["positions"] for line in weights)
    for record in records:
        _append(out / "records.jsonl", record)
    tokens = sum(r["completion_tokens"] for r in records)
    phase = {
        "task": task.name, "method": method, "concurrency": concurrency, "n": len(records), "tokens": tokens,
        "seconds": seconds, "tokens_per_s": tokens / seconds, "drafted": drafted, "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None, "num_draft": args.num_draft,
        "from_drafts": accepted / tokens if tokens else None, "prefix_caching": not (args.no_prefix_caching or
                                                                                     engine_of(method) == "policy"),
        "head": (xargs or {}).get("diversed_head"), "weight_positions": positions,
        "policy_settings": args.policy_settings if engine_of(method) == "policy" else None,
        "mean_w": sum(line["sum_w"] for line in weights) / positions if positions else None,
        "expected_acceptance": sum(line["sum_expected_acceptance"] for line in weights) / positions if positions
        else None,
        "max_new_tokens": args.max_new_tokens, **machine,
    }  # fmt: skip
    _append(out / "phases.jsonl", phase)
    print(f"[bench_vllm] {task.name} {method} c={concurrency}: {phase['tokens_per_s']:.2f} tok/s, acceptance "
          f"{phase['acceptance']}", file=sys.stderr, flush=True)  # fmt: skip


def report(out: Path) -> str:
    from hf_diversed.evaluation.bench import bootstrap_interval, wilson_interval

    phases, records = _load(out / "phases.jsonl"), _load(out / "records.jsonl")
    lines = ["| task | method | c | sitting | in flight | n | tok/s | × target alone | acceptance | from drafts | "
             "mean w (per position: mean 1 − w·TV) | quality ×100 [95% CI] | cut at max |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    sittings = list(dict.fromkeys(p["sitting"] for p in phases if p.get("sitting")))

    def key(r: dict, *names: str) -> tuple:
        return (*(r[n] for n in names), r.get("sitting"))

    base = {key(p, "task", "concurrency"): p["tokens_per_s"] for p in phases if p["method"] == "ar"}

    def number(p: dict) -> int:  # 0: recorded before sittings were
        return sittings.index(p["sitting"]) + 1 if p.get("sitting") else 0

    for p in sorted(phases, key=lambda p: (p["task"], p["concurrency"], number(p), p["method"] != "ar", p["method"])):
        mine = [r for r in records if key(r, "task", "method", "concurrency") == key(p, "task", "method",
                                                                                      "concurrency")]  # fmt: skip
        values = [r["quality"] for r in mine]
        binary = all(v in (0.0, 1.0) for v in values)
        interval = wilson_interval(sum(values), len(values)) if binary else bootstrap_interval(values)
        ci = f" [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]" if interval and binary else (
            f" [{interval[0]:.1f}, {interval[1]:.1f}]" if interval else "")  # fmt: skip
        mean = statistics.fmean(values) if values else float("nan")
        quality = f"{100 * mean:.1f}{ci}" if binary else f"{mean:.1f}{ci}"
        paired = key(p, "task", "concurrency")
        ratio = f"{p['tokens_per_s'] / base[paired]:.2f}×" if paired in base else "-"
        sitting = number(p) or "-"
        acceptance = "-" if p["acceptance"] is None else f"{100 * p['acceptance']:.1f}%"
        from_drafts = "-" if p.get("from_drafts") is None else f"{100 * p['from_drafts']:.1f}%"
        cut = sum(r["finish_reason"] == "length" for r in mine) / max(len(mine), 1)
        mean_w = "-" if p.get("mean_w") is None else f"{p['mean_w']:.3f} ({100 * p['expected_acceptance']:.1f}%)"
        in_flight = sum(r["seconds"] for r in mine) / p["seconds"]  # requests' own time over the phase's
        lines.append(
            f"| {p['task']} | {p['method']} | {p['concurrency']} | {sitting} | {in_flight:.1f} | {p['n']} | "
            f"{p['tokens_per_s']:.2f} | {ratio} | "
            f"{acceptance} | {from_drafts} | {mean_w} | {quality} | {100 * cut:.0f}% |"
        )
    machines = sorted({(p.get("gpu") or p.get("cpu", "-"), p.get("cpu_capability"), p.get("dtype"), p.get("threads"),
                        p.get("omp_bind", OMP_BIND)) for p in phases})  # fmt: skip
    lines.append("")
    lines.append("Acceptance: accepted over drafted tokens; from drafts: the share of the completion tokens that were "
                 "accepted drafts (a step that drafts nothing emits the target's own sample). Methods: RULE at N "
                 "drafts every step, RULE@policy with the draft-length policy, RULE@sched:CUT:K with vLLM's "
                 "batch-size schedule (K drafts up to CUT requests in flight, none beyond).")  # fmt: skip
    lines.append("In flight: the mean number of requests in flight over the phase (the sum of the requests' times, "
                 "queueing included, over the phase's time); a phase with as many prompts as its concurrency drains "
                 "to one request at its end.")  # fmt: skip
    lines.append(
        "Sitting: the phases timed in one boot of the machine, numbered in order ('-': recorded before "
        "sittings were); × target alone pairs a phase with the target alone of its own sitting."
    )
    lines.append(f"Machines (GPU or CPU, capability, dtype, cores, the worker's cores as VLLM_CPU_OMP_THREADS_BIND): "
                 f"{machines}.")  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python", help="python of vLLM's environment")
    parser.add_argument("--tasks", default="gsm8k,mbpp")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="ar (the target alone) and rules")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--concurrency", default="1,8,32", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--num-draft", type=int, default=5)
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-cache-gib", type=int, default=4)
    parser.add_argument("--compile", action="store_true", help="let vLLM compile the models (default: eager)")
    parser.add_argument("--omp-bind", default=OMP_BIND,
                        help="the cores of vLLM's model worker (VLLM_CPU_OMP_THREADS_BIND): 0 runs it on core 0 and "
                             "leaves the others to the engine loop and the server, as vLLM's 'auto' reserves one; "
                             "e.g. 0-1 for two cores")  # fmt: skip
    parser.add_argument("--target", default=None, help="the target's Hub id or folder (default: the GGUF copies)")
    parser.add_argument("--draft", default=None, help="the draft's Hub id or folder (with --target)")
    parser.add_argument("--weights", default=None, choices=["auto", "hub", "gguf"], help="see docs/models.md")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="docs/vllm/bench")
    parser.add_argument(
        "--remeasure",
        action="store_true",
        help="time the phases again in this sitting where the directory has them from another",
    )
    parser.add_argument(
        "--policy-costs",
        default=None,
        help="step costs for RULE@policy methods (python -m hf_diversed.integrations.vllm.calibrate)",
    )
    parser.add_argument(
        "--policy-settings",
        default={},
        type=_policy_settings,
        help='more settings of the policy\'s server, as JSON (e.g. \'{"step_log": "steps.jsonl"}\' or '
        "'{\"force_k\": 0}'; docs/vllm.md lists them)",
    )
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="start every server with --no-enable-prefix-caching (the policy's server always is)",
    )
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        # a stopped bench (kill, timeout) unwinds, so each started server's group is stopped with it
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        import torch
        from transformers import AutoTokenizer

        from hf_diversed.evaluation.real_models import ensure_pair
        from hf_diversed.evaluation.tasks import get_task
        from hf_diversed.modeling.dtypes import cpu_capability, resolve_dtype

        dtype = "bfloat16" if torch.cuda.is_available() and args.dtype == "auto" else resolve_dtype(args.dtype)
        machine = {"cpu": _cpu_model(), "cpu_capability": cpu_capability(), "dtype": dtype,
                   "threads": os.cpu_count(), "torch": torch.__version__, "compiled": args.compile,
                   "omp_bind": args.omp_bind, "sitting": _sitting(), **_gpu(args.vllm_python)}  # fmt: skip
        check_same_machine(_load(out / "phases.jsonl"), machine, out)
        from hf_diversed.modeling.pretrained import seed_pretrained_heads

        if args.target is None:
            target, draft = ensure_pair()
        else:
            from hf_diversed.evaluation.weights import resolve_model

            target, draft = (resolve_model(name, args.weights) for name in (args.target, args.draft))
        seed_pretrained_heads()  # "diversed" requests name the bundled heads by Hub id; the server finds them here
        tokenizer = AutoTokenizer.from_pretrained(target)
        data = {}
        for name in args.tasks.split(","):
            task = get_task(name)
            rows = list(task.load(f"test[:{args.num_prompts}]"))
            prompts = [
                tokenizer.apply_chat_template(task.build_messages(r), add_generation_prompt=True)["input_ids"]
                for r in rows
            ]
            data[name] = (task, rows, prompts)
        plan = plan_phases(_load(out / "phases.jsonl"), list(data), args.methods.split(","), args.concurrency,
                           machine["sitting"], args.remeasure)  # fmt: skip
        ar, rules = plan
        engines = {"ar": ar} if ar else {}
        for phase in rules:
            engines.setdefault(engine_of(phase[1]), []).append(phase)
        for engine, todo in engines.items():
            log = out / f"server-{engine.replace(':', '-')}.log"
            server = Server(args, target, None if engine == "ar" else draft, dtype, log, engine)
            try:
                for name, method, concurrency in todo:
                    task, rows, prompts = data[name]
                    run_phase(server, task, rows, prompts, method, concurrency, args, out, machine)
            finally:
                server.stop()
    text = report(out)
    (out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
