"""Prototype of the block-verification walk (design: docs/sampler.md, "the next lever"), checked against the walk.

Each round, every row drafts N tokens with one-token draft forwards, then the target scores [c, x_1..x_N] in one
forward (c: the row's last emitted token), and the verdicts run position by position. Each row draws its three
uniforms per position from its own generator; where a draft is rejected at position i, the generator is restored
to the round's start and advanced by the i triples the walk would have drawn, so every row emits what
``sample_batched`` (today's walk) emits from the same seed. Rejected drafts leave masked dead columns in the caches.

Scope of the prototype: rows share one prompt (no left padding, no joining), constant schedule, sampling at T = 1,
no logits processors, no head, no traces. What it shows: on the tests' tiny pair, for N in {1, 2, 3, 5}, rules
exact, static (0, 0.1, 0.5), lossy 0.7 and cascade-opt 0.3, EOS and max_new_tokens, its completions equal the
walk's for every seed (144 of 144 on 2026-11-27). Run from the repository root:

    python benchmarks/prototype_block_walk.py
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import build_pair, prompts  # noqa: E402

from hf_diversed.generation.batched import SamplerConfig, SampleRequest, _inverse_cdf, sample_batched  # noqa: E402
from hf_diversed.generation.verification import parse_rule  # noqa: E402


def append(mask, colmask):
    mask = torch.cat([mask, colmask], 1)
    W = colmask.shape[1]
    return mask, (mask.cumsum(1) - 1)[:, -W:].clamp_min(0)


def fwd(model, ids, mask, pos, cache):
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
    return out.logits.float(), out.past_key_values


def block_sample(target, draft, prompt, rules, seeds, N, M, eos):
    B = len(rules)
    rules = [parse_rule(r) for r in rules]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    ids = prompt.expand(B, -1)
    P = ids.shape[1]
    with torch.no_grad():
        t_out = target(ids, use_cache=True)
        d_out = draft(ids, use_cache=True)
    t_cache, d_cache = t_out.past_key_values, d_out.past_key_values
    t_mask = torch.ones(B, P, dtype=torch.long)
    d_mask = torch.ones(B, P, dtype=torch.long)
    p_first = t_out.logits[:, -1].float().softmax(-1)  # p_1 for the first round (pending)
    q_first = d_out.logits[:, -1].float().softmax(-1)
    completion = [[] for _ in range(B)]
    done = [False] * B
    c = None  # last emitted token per row, not yet processed by the target
    d_feed = None  # tokens the draft must process before drafting: list of lists
    first = True
    while not all(done):
        live = [i for i in range(B) if not done[i]]
        rn = [0 if done[i] else max(0, min(N, M - len(completion[i]) - 1)) for i in range(B)]
        states = [g.get_state() for g in gens]
        # ---- draft phase
        with torch.no_grad():
            if first:
                q_cur = q_first
            else:  # the draft processes its pending tokens (1 or 2 columns, left column dead when 1)
                cols = torch.tensor([[f[0], f[1]] if len(f) == 2 else [0, f[0]] for f in d_feed])
                colmask = torch.tensor([[1, 1] if len(f) == 2 else [0, 1] for f in d_feed])
                for i in range(B):
                    if done[i]:
                        colmask[i] = 0
                d_mask, posids = append(d_mask, colmask)
                logits, d_cache = fwd(draft, cols, d_mask, posids, d_cache)
                q_cur = logits[:, -1].softmax(-1)
            qs, xs, us = [], [], []
            stopped = [False] * B  # drafted EOS
            nd = [0] * B  # drafted count per row
            for j in range(N):
                u = torch.zeros(B, 3)
                x = torch.zeros(B, dtype=torch.long)
                active = [i for i in range(B) if j < rn[i] and not stopped[i]]
                for i in active:
                    u[i] = torch.rand(3, generator=gens[i])
                if active:
                    a = torch.tensor(active)
                    x[a] = _inverse_cdf(q_cur[a], u[a, 0])
                for i in active:
                    nd[i] += 1
                    if int(x[i]) in eos:
                        stopped[i] = True
                qs.append(q_cur), xs.append(x), us.append(u)
                if j < N - 1:  # feed x_j to the draft (dead where not active)
                    colmask = torch.zeros(B, 1, dtype=torch.long)
                    for i in active:
                        if not stopped[i]:
                            colmask[i] = 1
                    d_mask, posids = append(d_mask, colmask)
                    logits, d_cache = fwd(draft, x.view(B, 1), d_mask, posids, d_cache)
                    q_cur = logits[:, -1].softmax(-1)
            # ---- target phase: [c, x_1..x_N]
            X = torch.stack(xs, 1)  # (B, N)
            if first:
                cols = torch.cat([torch.zeros(B, 1, dtype=torch.long), X], 1)
                cm = torch.zeros(B, N + 1, dtype=torch.long)
            else:
                cols = torch.cat([torch.tensor(c).view(B, 1), X], 1)
                cm = torch.zeros(B, N + 1, dtype=torch.long)
                for i in live:
                    cm[i, 0] = 1
            for i in live:
                cm[i, 1 : 1 + nd[i]] = 1
            t_mask, posids = append(t_mask, cm)
            logits, t_cache = fwd(target, cols, t_mask, posids, t_cache)
            ps_all = logits.softmax(-1)  # column 0 -> p_1, column j -> p_{j+1}
        if first:
            ps = [p_first] + [ps_all[:, j] for j in range(1, N + 1)]
        else:
            ps = [ps_all[:, j] for j in range(N + 1)]
        # ---- verdicts, per row
        new_c, new_feed = [0] * B, [[0] for _ in range(B)]
        for i in range(B):
            if done[i]:
                continue
            rule = rules[i]
            k, y = 0, None
            for j in range(nd[i]):
                p_j, q_j = ps[j][i : i + 1].unsqueeze(1), qs[j][i : i + 1].unsqueeze(1)
                w = rule.weights(p_j, q_j, None)
                xj = int(xs[j][i])
                ratio = rule.acceptance_ratio(p_j[0, 0, xj].view(1, 1), q_j[0, 0, xj].view(1, 1), w)
                if float(us[j][i, 1]) <= float(ratio):
                    k += 1
                    if xj in eos:
                        break
                else:
                    res = rule.residual(p_j, q_j, w.view(-1, 1)).squeeze(1)
                    mass = res.sum(-1, keepdim=True)
                    dist = res / mass if float(mass) > torch.finfo(mass.dtype).tiny else ps[j][i : i + 1]
                    y = int(_inverse_cdf(dist, us[j][i, 2:3]))
                    # the walk consumed j + 1 triples: restore and redraw
                    gens[i].set_state(states[i])
                    for _ in range(j + 1):
                        torch.rand(3, generator=gens[i])
                    break
            emitted = [int(xs[j][i]) for j in range(k)]
            if y is None and not (emitted and emitted[-1] in eos):  # bonus from p_{k+1}
                u = torch.rand(3, generator=gens[i])
                y = int(_inverse_cdf(ps[k][i : i + 1], u[2:3]))
            tokens = emitted + ([y] if y is not None else [])
            # cut at max / eos
            for t in tokens:
                completion[i].append(t)
                if t in eos or len(completion[i]) >= M:
                    done[i] = True
                    break
            # masks: dead target columns beyond k accepted drafts
            width = N + 1
            start = t_mask.shape[1] - width
            t_mask[i, start + 1 + k : start + width] = 0
            # draft: columns for x_1..x_{N-1} fed; valid through x_min(k, N-1)
            dstart = d_mask.shape[1] - (N - 1)
            if N > 1:
                d_mask[i, dstart + min(k, N - 1) : dstart + N - 1] = 0
            new_c[i] = y if y is not None else 0
            new_feed[i] = [int(xs[N - 1][i]), new_c[i]] if k == N else [new_c[i]]
        c = new_c
        d_feed = new_feed
        first = False
    return completion


def main() -> None:
    torch.set_num_threads(1)
    target, draft = build_pair("llama")
    for model in (target, draft):
        model.generation_config.pad_token_id = model.generation_config.eos_token_id
    total = same = 0
    for n in (1, 2, 3, 5):
        for shift in (1, 7):
            prompt = prompts(1, length=5 + shift, seed=shift)[0]
            rules = ["exact", "static:0.5", "static:0.1", "lossy:0.7", "cascade-opt:0.3", "static:0"] * 3
            seeds = [100 * n + i for i in range(len(rules))]
            ours = block_sample(target, draft, prompt, rules, seeds, n, 40, {1})
            config = SamplerConfig(max_new_tokens=40, num_assistant_tokens=n, eos_token_id=1)
            requests = [SampleRequest(prompt, r, seed=s) for r, s in zip(rules, seeds, strict=True)]
            walk = {r.index: r.completion_ids.tolist() for r in sample_batched(target, draft, requests, config)}
            for i, rule in enumerate(rules):
                total += 1
                same += ours[i] == walk[i]
                if ours[i] != walk[i]:
                    print(f"N = {n}, {rule}, seed {seeds[i]}:\n  block {ours[i]}\n  walk  {walk[i]}")
    print(f"identical completions: {same} of {total}")


if __name__ == "__main__":
    main()
