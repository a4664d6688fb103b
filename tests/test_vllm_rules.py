"""The vLLM plugin's pure parts, without vLLM: which rule and head a request runs, the target law handed to vLLM's
exact verification per request, and the heads' weights per drafted row (``hf_diversed.integrations.vllm.rules`` and
``.heads``; the engine itself is tested in ``test_vllm.py``)."""

from __future__ import annotations

import pytest
import torch

from hf_diversed.generation.verification import Diversed, StaticEnsemble
from hf_diversed.integrations.vllm import Request, RuleError, exact_targets, requested
from hf_diversed.integrations.vllm.heads import check_fits, head_weights, load
from hf_diversed.modeling.modeling_diversed_head import (
    DiversedHead,
    DiversedHeadConfig,
    distribution_features,
    position_weights,
)

DEFAULTS = {"diversed_verifier": "static:0", "diversed_head": "org/default-head"}


@pytest.mark.parametrize(
    ("extra", "defaults", "expected"),
    [
        (None, None, Request("exact")),
        ({"diversed_verifier": "static:0.5"}, None, Request("static:0.5")),
        ({"diversed_head": "org/h"}, None, Request("diversed", "org/h")),
        ({"diversed_head": "org/h", "diversed_verifier": "diversed"}, None, Request("diversed", "org/h")),
        (None, DEFAULTS, Request("static:0")),  # the server's default rule
        ({"diversed_verifier": "diversed"}, DEFAULTS, Request("diversed", "org/default-head")),
        ({"diversed_head": "org/h"}, DEFAULTS, Request("diversed", "org/h")),  # the request's head wins
        ({"diversed_verifier": "exact"}, DEFAULTS, Request("exact")),
        (None, {"diversed_head": "org/default-head"}, Request("diversed", "org/default-head")),
    ],
)
def test_a_request_runs_its_own_rule_or_head_else_the_servers(extra, defaults, expected):
    assert requested(extra, defaults) == expected


@pytest.mark.parametrize(
    ("extra", "defaults", "message"),
    [
        ({"diversed_head": "org/h", "diversed_verifier": "static:0.5"}, None, "only used by the DIVERSED rule"),
        ({"diversed_verifier": "diversed"}, None, 'add "diversed_head"'),
        (None, {"diversed_verifier": "diversed"}, 'add "diversed_head"'),
        ({"diversed_head": ""}, None, "must be a non-empty string"),
        ({"diversed_verifier": 0.5}, None, "must be a non-empty string such as 'static:0.5'"),
    ],
)
def test_a_head_beside_another_rule_or_diversed_without_a_head_is_refused(extra, defaults, message):
    with pytest.raises(RuleError, match=message):
        requested(extra, defaults)


def _laws(rows: int, vocab: int = 11, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=generator) * 2).softmax(-1), torch.randn(
        rows, vocab, generator=generator
    ).softmax(-1)


def _head(features: bool, init_weight: float = 0.5, scale: float = 0.0) -> DiversedHead:
    torch.manual_seed(0)
    head = DiversedHead(DiversedHeadConfig(target_hidden_size=8, draft_hidden_size=6, init_weight=init_weight,
                                           use_distribution_features=features)).eval()  # fmt: skip
    if scale:
        with torch.no_grad():
            head.out.weight.normal_(0.0, scale)
    return head


def test_a_fresh_heads_target_law_is_the_static_ensembles_bit_for_bit():
    p, q = _laws(7)
    counts = [3, 4]
    h_t, h_d = torch.randn(7, 8), torch.randn(7, 6)
    head = _head(features=True, init_weight=0.3)
    weights = head_weights([head, None], counts, p, q, h_t, h_d)
    assert weights[1] is None and torch.equal(weights[0], torch.full((3,), 0.3))
    t = exact_targets([Diversed(), StaticEnsemble(0.3)], counts, p, q, weights)
    assert torch.equal(t, exact_targets([StaticEnsemble(0.3)] * 2, counts, p, q))


@pytest.mark.parametrize("features", [False, True])
def test_each_requests_rows_get_its_heads_weights_on_its_own_rows(features):
    """Rows are drafted positions, requests one after the other: a head's w at each of its request's rows is
    hf-diversed's ``position_weights`` on those rows' hidden states (and laws), and the target law is nu there."""
    p, q = _laws(9, seed=1)
    counts = [2, 0, 4, 3]
    h_t, h_d = torch.randn(9, 8), torch.randn(9, 6)
    a, b = _head(features, scale=0.5), _head(not features, scale=0.7)
    weights = head_weights([a, None, b, None], counts, p, q, h_t, h_d)
    for head, w, rows in ((a, weights[0], slice(0, 2)), (b, weights[2], slice(2, 6))):
        features_in = distribution_features(p[rows], q[rows]) if head.config.use_distribution_features else None
        assert torch.allclose(w, position_weights(head, h_d[rows], h_t[rows], features_in))
    assert weights[1] is None and weights[3] is None and weights[0].std() > 0
    t = exact_targets([Diversed(), StaticEnsemble(0.2), Diversed(), StaticEnsemble(0.9)], counts, p, q, weights)
    assert torch.allclose(t[2:6], weights[2][:, None] * p[2:6] + (1 - weights[2][:, None]) * q[2:6])
    assert torch.allclose(t[6:], 0.9 * p[6:] + 0.1 * q[6:])


def test_heads_that_cannot_run_are_refused_in_one_line(tmp_path):
    with pytest.raises(RuleError, match='"diversed_head": Could not load the DIVERSED head') as caught:
        load(str(tmp_path / "nothing"))
    assert "\n" not in str(caught.value)
    with pytest.raises(RuleError, match="built for target/draft hidden sizes 8/6, but the models have 1536/896"):
        check_fits(_head(features=False), 1536, 896)
    check_fits(_head(features=False), 8, 6)
