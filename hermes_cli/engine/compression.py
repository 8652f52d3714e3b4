"""One compression step: signals from the cache → the policy's choice → the cache, compressed.

``compress`` needs no model: tests drive it with hand-made caches. ``pseudo_query_attention``
is the one part that runs the model — the attention of a policy's pseudo-query texts over the
cached stream tokens, per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from policies import LayerChoice, Policy, StreamState
from policies.base import Rotary

from ..models.base import ModelAdapter
from .cache import StreamingCache


@dataclass(frozen=True)
class Signals:
    """What a compression step knows besides the cache itself."""

    budget: int
    tokens_per_frame: int = 1  # stream tokens one unit adds
    attention: dict[str, list[Tensor]] = field(default_factory=dict)  # pseudo-query name → per layer (N,)
    rotary: Rotary | None = None


def stream_state(cache: StreamingCache, signals: Signals) -> StreamState:
    """The cache's stream tokens as a policy sees them."""
    layers = [
        cache.stream_view(l, {name: att[l] for name, att in signals.attention.items()})
        for l in range(cache.num_layers)
    ]
    return StreamState(layers=layers, budget=signals.budget, tokens_per_frame=signals.tokens_per_frame,
                       rotary=signals.rotary)


def compress(cache: StreamingCache, policy: Policy, signals: Signals) -> list[LayerChoice]:
    """Apply ``policy``'s choice to ``cache`` in place; returns the choice (per layer)."""
    choices = policy.select(stream_state(cache, signals))
    cache.apply(choices)
    return choices


def side_by_side_mask(cached: int, sizes: list[int], dtype: torch.dtype, device) -> Tensor:
    """Additive attention mask (1, 1, Q, cached + Q) for texts placed side by side after a cache.

    Every text sees the whole cache and, causally, its own tokens — never another text's.
    """
    total = sum(sizes)
    text = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    index = torch.arange(total)
    allowed = (text[:, None] == text[None, :]) & (index[None, :] <= index[:, None])
    allowed = torch.cat([torch.ones(total, cached, dtype=torch.bool), allowed], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def pseudo_query_attention(adapter: ModelAdapter, cache: StreamingCache, texts: dict[str, str], start: int,
                           mode: str) -> dict[str, list[Tensor]]:
    """Per pseudo-query, per layer: attention (N,) from its tokens to each cached stream token.

    ``forward`` runs every pseudo-query in one real forward on top of the cache — each text at
    the positions from ``start`` and masked from the others, so each sees exactly what a
    forward of its own would — and takes each layer's attention weights, averaged over heads
    and the text's tokens; the tokens are then removed. ``approx`` (the paper's shortcut)
    projects every text's token embeddings through each layer's norm and projections, all
    texts in one batched pass.
    """
    if not texts:
        return {}
    p, length = cache.prefix_length(), cache.length
    ids = {name: adapter.tokens(text) for name, text in texts.items()}
    sizes = [t.shape[0] for t in ids.values()]
    embeds = adapter.embed(torch.cat(list(ids.values())))
    positions = torch.cat([adapter.text_positions(start, n) for n in sizes])
    if mode == "approx":
        means = adapter.approx_attention(embeds, positions, cache.held_keys(), sizes, reduce=True)
        return {name: [m[i, p:length] for m in means] for i, name in enumerate(ids)}
    mask = side_by_side_mask(length, sizes, adapter.dtype, adapter.device)
    mark = cache.mark()
    try:
        _, layer_weights = adapter.forward(embeds, positions, cache, attentions=True, attention_mask=mask)
    finally:
        cache.rollback(mark)
    out: dict[str, list[Tensor]] = {}
    offset = 0
    for name, n in zip(ids, sizes, strict=True):
        out[name] = [w[0, :, offset : offset + n].float().mean(dim=(0, 1))[p:length] for w in layer_weights]
        offset += n
    return out
