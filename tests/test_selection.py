"""Selection by one linear-time pick (``kthvalue``) keeps exactly what two full stable sorts kept.

The two functions below are the selection the policies used before (a stable descending sort of
every score, then a sort of the k winners; tiers by a second stable sort), kept here as the
reference. The new helpers must return the same indices for any scores — ties, ±inf and NaN
included — and every policy must keep the same tokens over long random streams whether it
selects with the new helpers or with these (and InfiniPot-V's TaR scores by boolean masks, as
before, or by ``index_select``).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import policies.hermes
import policies.infinipot
import policies.uniform
from policies import POLICIES, make_policy
from policies.base import top_k_mask, top_k_sorted, top_k_tiered
from tests.test_policies_stream import OPTIONS, Stream, specs


def reference_top_k_sorted(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The former selection: stable descending sort, first k, sorted back into index order."""
    k = max(0, min(k, scores.shape[0]))
    order = torch.sort(scores, descending=True, stable=True).indices[:k]
    return torch.sort(order).values


def reference_top_k_tiered(tier: torch.Tensor, scores: torch.Tensor, k: int) -> torch.Tensor:
    """The former tiered selection: by score (stable), then by tier (stable), first k, index order."""
    k = max(0, min(k, scores.shape[0]))
    by_score = torch.sort(scores, descending=True, stable=True).indices
    by_tier = by_score[torch.sort(tier[by_score], descending=True, stable=True).indices]
    return torch.sort(by_tier[:k]).values


def reference_tar_scores(layer, recent, tokens_per_frame):
    """The former TaR scores (boolean-mask indexing), to check the index_select version against."""
    grid = policies.infinipot.on_grid(layer, tokens_per_frame)
    unit = torch.nn.functional.normalize(layer.keys.float(), dim=-1)
    partners = grid & recent
    heads, _, dim = unit.shape
    summed = torch.zeros(heads, tokens_per_frame, dim)
    summed.index_add_(1, layer.patch[partners], unit[:, partners])
    count = torch.zeros(tokens_per_frame)
    count.index_add_(0, layer.patch[partners], torch.ones(int(partners.sum())))
    scored = grid & ~recent & (count[layer.patch.clamp(0, tokens_per_frame - 1)] > 0)
    patch = layer.patch[scored]
    score = torch.full((layer.n,), -math.inf)
    score[scored] = -(unit[:, scored] * summed[:, patch]).sum(-1).mean(0) / count[patch]
    return score


SPECIAL = st.sampled_from([math.inf, -math.inf, math.nan, 0.0, -0.0])
SCORES = st.lists(st.one_of(st.integers(-3, 3).map(float), st.floats(-1e3, 1e3, width=32), SPECIAL),
                  min_size=0, max_size=60)


@settings(max_examples=300, deadline=None)
@given(values=SCORES, k=st.integers(-2, 70))
def test_top_k_sorted_equals_the_two_sorts(values, k):
    scores = torch.tensor(values, dtype=torch.float32)
    assert torch.equal(top_k_sorted(scores, k), reference_top_k_sorted(scores, k))
    assert int(top_k_mask(scores, k).sum()) == max(0, min(k, len(values)))


@settings(max_examples=300, deadline=None)
@given(data=st.data(), k=st.integers(-2, 70))
def test_top_k_tiered_equals_the_two_sorts(data, k):
    values = data.draw(SCORES)
    tier = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=len(values), max_size=len(values))),
                        dtype=torch.long)
    scores = torch.tensor(values, dtype=torch.float32)
    assert torch.equal(top_k_tiered(tier, scores, k), reference_top_k_tiered(tier, scores, k))


def test_integer_scores_and_large_sizes():
    g = torch.Generator().manual_seed(0)
    for n, k in ((5200, 2000), (8200, 6000), (5200, 5199), (10, 0)):
        scores = torch.randint(0, 50, (n,), generator=g).float()  # many ties at the k-th value
        assert torch.equal(top_k_sorted(scores, k), reference_top_k_sorted(scores, k))
        tier = torch.randint(0, 3, (n,), generator=g)
        assert torch.equal(top_k_tiered(tier, scores, k), reference_top_k_tiered(tier, scores, k))


class CoarseStream(Stream):
    """Keys, values and attention on a coarse grid, so scores tie often (VaN, TaR, attention)."""

    def append_chunk(self) -> None:
        before = self.cache.length
        super().append_chunk()
        for layer in self.cache.stream_layers:
            layer.keys[:, :, before : layer.length].round_()
            layer.values[:, :, before : layer.length].round_()

    def signals(self, budget=None, history=()):
        signals = super().signals(budget, history)
        for per_layer in signals.attention.values():
            for a in per_layer:
                if a is not None:
                    a.mul_(4).round_()
        return signals


def kept(name: str, options: dict, spec, coarse: bool, reference: bool) -> list[list[torch.Tensor]]:
    """Every compression's keep indices, per layer, with the new or the former selection."""
    with pytest.MonkeyPatch.context() as patch:
        if reference:
            for module in (policies.hermes, policies.infinipot):
                patch.setattr(module, "top_k_sorted", reference_top_k_sorted)
            for module in (policies.infinipot, policies.uniform):
                patch.setattr(module, "top_k_tiered", reference_top_k_tiered)
            patch.setattr(policies.infinipot, "tar_scores", reference_tar_scores)
        stream = (CoarseStream if coarse else Stream)(make_policy(name, **options), spec)
        out = []
        for _ in range(spec.chunks):
            stream.append_chunk()
            choices = stream.compress_if_needed()
            if choices is not None:
                out.append([c.keep for c in choices])
        return out


@pytest.mark.parametrize("name", [n for n in POLICIES if n not in ("full", "fifo", "sink")])
@settings(max_examples=12, deadline=None)
@given(data=st.data(), coarse=st.booleans())
def test_policies_keep_the_same_tokens_as_with_the_former_selection(name, data, coarse):
    spec = data.draw(specs(max_chunks=150), label="spec")
    options = data.draw(OPTIONS[name], label="options")
    new, old = kept(name, options, spec, coarse, False), kept(name, options, spec, coarse, True)
    assert len(new) == len(old)
    for step_new, step_old in zip(new, old, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(step_new, step_old, strict=True))
