"""Shared by the law tests: a tiny pair with unrelated weights, a varying head, outcomes and a chi-square test.

A sampler (or loop) has generate's law when the first three tokens, the accepted counts per round and the bonus
positions it draws from ``PROMPT`` under ``LAW_CONFIG`` pass two-sample chi-square homogeneity tests against
generate's draws.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_diversed import DiversedHead
from hf_diversed.generation.batched import SamplerConfig


def random_head(target, draft, scale: float = 0.5, seed: int = 0) -> DiversedHead:
    """A head whose w varies per position (a fresh head outputs init_weight everywhere)."""
    head = DiversedHead.for_models(target, draft, init_weight=0.5)
    torch.manual_seed(seed)
    with torch.no_grad():
        head.out.weight.normal_(0.0, scale)
    return head


def tiny_law_model(seed: int, vocab: int = 6) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=1,
        initializer_range=0.5,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    model.generation_config.assistant_confidence_threshold = 0.0
    return model


PROMPT = torch.tensor([[3, 5, 2]])
LAW_CONFIG = SamplerConfig(max_new_tokens=5, do_sample=True, num_assistant_tokens=2)


def outcomes(tokens: list[int], accepted_per_round: list[int]) -> dict[str, tuple]:
    """What is compared: the first three tokens (EOS-ended sequences padded with -1), the accepted counts per
    round, and the positions of bonus tokens (from the counts: a round with all N_r drafts accepted ends on one)."""
    first = tuple(tokens[:3]) + (-1,) * (3 - min(3, len(tokens)))
    bonus, position, generated = [], 0, 0
    for accepted in accepted_per_round:
        n_round = min(LAW_CONFIG.num_assistant_tokens, LAW_CONFIG.max_new_tokens - generated - 1)
        position += accepted
        if accepted == n_round:
            bonus.append(position)
        position += 1
        generated = position
    return {"tokens": first, "accepted": tuple(accepted_per_round), "bonus": tuple(bonus)}


def chi2_pvalue(a: Counter, b: Counter) -> float:
    """Two-sample chi-square homogeneity test; cells with < 25 observations in total are pooled."""
    na, nb = sum(a.values()), sum(b.values())
    cells, pooled = [], [0, 0]
    for key in set(a) | set(b):
        if a[key] + b[key] >= 25:
            cells.append((a[key], b[key]))
        else:
            pooled[0] += a[key]
            pooled[1] += b[key]
    if sum(pooled) > 0:
        cells.append(tuple(pooled))
    stat = 0.0
    for ca, cb in cells:
        total = ca + cb
        ea, eb = na * total / (na + nb), nb * total / (na + nb)
        stat += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    dof = max(len(cells) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0)))


# Per-draw laws (the vLLM tests): each check fails by chance with probability ALPHA.
ALPHA = 1e-4
Z = 3.719  # standard normal quantile at 1 - ALPHA


def chi_square_quantile(df: int) -> float:
    """Wilson-Hilferty: the (1 - ALPHA) quantile of chi-square with ``df`` degrees of freedom."""
    return df * (1 - 2 / (9 * df) + Z * math.sqrt(2 / (9 * df))) ** 3


def wald_statistic(tokens: list[int], laws: torch.Tensor) -> tuple[float, int]:
    """(statistic, degrees of freedom) of the counts of ``tokens`` against the sum of the per-draw ``laws`` (n, V)."""
    laws = laws.double()
    counts = torch.bincount(torch.tensor(tokens), minlength=laws.shape[1]).double()
    expected = laws.sum(0)
    keep = expected >= 5
    # pool the rare categories into one, then drop one category (the counts sum to n)
    pooled = torch.cat([laws[:, keep], laws[:, ~keep].sum(1, keepdim=True)], 1)
    observed = torch.cat([counts[keep], counts[~keep].sum().view(1)])
    mean = pooled.sum(0)
    cov = torch.diag(mean) - pooled.T @ pooled
    d, s = (observed - mean)[:-1], cov[:-1, :-1]
    return float(d @ torch.linalg.solve(s, d)), int(d.numel())
