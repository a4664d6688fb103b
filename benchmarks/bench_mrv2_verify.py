"""What the plugin adds to one verification step of vLLM's Model Runner V2 (its Triton kernels), on a GPU.

Times ``rejection_sample`` (MRV2's verification) alone, as vLLM runs it for exact requests, against the plugin's
patched call for a batch of relaxed requests (static 0.5; cascade-opt 0.1; a DIVERSED head on the real pair's
hidden sizes), at a real vocabulary (Qwen2.5's 151,936), N = 5 drafts per request and 1 to 64 requests: the patch
computes p and q over every row and hands the kernels log t. CUDA events, median of ``--reps`` after warm-up, each
row of the table measured side by side in one run.

Where vLLM is not installed (a GPU machine it cannot travel to), ``tests/mrv2_bundle.py`` copies the kernels'
sources; put its folder on ``PYTHONPATH``. Run: ``python benchmarks/bench_mrv2_verify.py --batch 1,8,64``.
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics

import torch


def layout(requests: int, steps: int, vocab: int, device: torch.device, gen: torch.Generator) -> dict:
    """MRV2's ``rejection_sample`` arguments for ``requests`` requests with ``steps`` drafts each (random laws)."""
    rows = requests * (steps + 1)
    cu = torch.arange(0, rows + 1, steps + 1, dtype=torch.int32)
    return {
        "target_logits": torch.randn(rows, vocab, generator=gen).to(device) * 3,
        "draft_logits": (torch.randn(requests, steps, vocab, generator=gen) * 3).to(device, torch.bfloat16),
        "draft_sampled": torch.randint(0, vocab, (rows,), generator=gen, dtype=torch.int32).to(device),
        "cu_num_logits": cu.to(device),
        "pos": torch.arange(rows, dtype=torch.int64).to(device),
        "idx_mapping": torch.arange(requests, dtype=torch.int32).to(device),
        "expanded_idx_mapping": torch.arange(requests, dtype=torch.int32).repeat_interleave(steps + 1).to(device),
        "expanded_local_pos": torch.arange(steps + 1, dtype=torch.int32).repeat(requests).to(device),
        "temperature": torch.ones(requests).to(device),
        "seed": torch.arange(requests, dtype=torch.int64).to(device),
        "num_speculative_steps": steps,
    }


def median_ms(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", default="1,8,64", help="requests per verification step, comma-separated")
    parser.add_argument("--num-draft", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_mrv2_verify.py times MRV2's Triton kernels on a GPU; none is visible here.")

    import triton
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample

    from hf_diversed.generation.verification import parse_rule
    from hf_diversed.integrations.vllm import _mrv2
    from hf_diversed.modeling.modeling_diversed_head import DiversedHead, DiversedHeadConfig

    device = torch.device("cuda")
    patched = _mrv2.relaxed_rejection_sample(rejection_sample)
    head = DiversedHead(DiversedHeadConfig(target_hidden_size=1536, draft_hidden_size=896)).to(device).eval()
    print(
        f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda}), triton "
        f"{triton.__version__}, python {platform.python_version()}; V = {args.vocab}, N = {args.num_draft}"
    )
    print("| requests | vLLM alone (exact) ms | static:0.5 ms | cascade-opt:0.1 ms | head ms | static × alone |")
    print("|---:|---:|---:|---:|---:|---:|")
    gen = torch.Generator().manual_seed(0)
    for requests in (int(b) for b in args.batch.split(",")):
        inputs = layout(requests, args.num_draft, args.vocab, device, gen)
        head_inputs = head_inputs_for(inputs, requests, args.num_draft, device)
        ms = [median_ms(functools.partial(rejection_sample, **inputs), args.reps)]
        for row in (_mrv2.Row(parse_rule("static:0.5")), _mrv2.Row(parse_rule("cascade-opt:0.1")),
                    _mrv2.Row(parse_rule("diversed"), head)):  # fmt: skip
            chunk = _mrv2.Chunk([row], list(range(requests)), [0] * requests, head_inputs)
            ms.append(median_ms(functools.partial(verify_relaxed, patched, inputs, chunk), args.reps))
        print(f"| {requests} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[2]:.3f} | {ms[3]:.3f} | {ms[1] / ms[0]:.2f} |")


def head_inputs_for(inputs: dict, requests: int, steps: int, device: torch.device):
    """Random hidden states of the real pair's sizes (1536 and 896) at every row, as the runner keeps them."""
    from hf_diversed.integrations.vllm import _mrv2

    kept = _mrv2.HeadInputs(requests, steps)
    rows = requests * (steps + 1)
    kept.keep("target", torch.randn(rows, 1536, device=device), inputs["expanded_idx_mapping"],
              inputs["expanded_local_pos"])  # fmt: skip
    for j in range(steps):
        kept.keep("draft", torch.randn(requests, 896, device=device), inputs["idx_mapping"],
                  torch.full((requests,), j, device=device))  # fmt: skip
    return kept


def verify_relaxed(patched, inputs: dict, chunk) -> None:
    from hf_diversed.integrations.vllm import _mrv2

    token = _mrv2.verifying(chunk)
    try:
        patched(**inputs)
    finally:
        _mrv2._chunk.reset(token)


if __name__ == "__main__":
    main()
