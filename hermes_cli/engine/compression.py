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

from ..models.attention import RowProbe
from ..models.base import EncodedChunk, ModelAdapter
from .cache import KIND_VIDEO, StreamingCache, TokenMeta


@dataclass(frozen=True)
class Signals:
    """What a compression step knows besides the cache itself."""

    budget: int
    tokens_per_frame: int = 1  # stream tokens one unit adds
    # pseudo-query name → per layer (N,), None in a layer whose policy role does not read it
    attention: dict[str, list[Tensor | None]] = field(default_factory=dict)
    rotary: Rotary | None = None


def stream_state(cache: StreamingCache, signals: Signals) -> StreamState:
    """The cache's stream tokens as a policy sees them."""
    layers = [
        cache.stream_view(l, {name: a for name, att in signals.attention.items() if (a := att[l]) is not None})
        for l in range(cache.num_layers)
    ]
    return StreamState(layers=layers, budget=signals.budget, tokens_per_frame=signals.tokens_per_frame,
                       rotary=signals.rotary)


def compress(cache: StreamingCache, policy: Policy, signals: Signals) -> list[LayerChoice]:
    """Apply ``policy``'s choice to ``cache`` in place; returns the choice (per layer)."""
    state = stream_state(cache, signals)
    if not policy.keeps_per_head() and any(layer.per_head for layer in state.layers):
        raise ValueError(f"the memory holds a token set per key-value head, which {policy.name!r} cannot "
                         "compress: continue it under infinipot profile=reference")
    choices = policy.select(state)
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
                           mode: str, layers: dict[str, list[int]] | None = None) -> dict[str, list[Tensor | None]]:
    """Per pseudo-query, per layer: attention (N,) from its tokens to each cached stream token.

    ``forward`` runs every pseudo-query in one real forward on top of the cache — each text at
    the positions from ``start`` and masked from the others, so each sees exactly what a
    forward of its own would — and takes each layer's attention weights, averaged over heads
    and the text's tokens, for those rows alone from inside the model's attention (see
    ``models.attention``); the tokens are then removed. ``approx`` (the paper's shortcut)
    projects every text's token embeddings through each layer's norm and projections, all texts
    in one batched pass. ``layers`` names, per text, the layers whose attention is wanted
    (default: all); other entries are None.
    """
    if not texts:
        return {}
    p, length = cache.prefix_length(), cache.length
    ids = {name: adapter.tokens(text) for name, text in texts.items()}
    sizes = [t.shape[0] for t in ids.values()]
    embeds = adapter.embed(torch.cat(list(ids.values())))
    positions = torch.cat([adapter.text_positions(start, n) for n in sizes])
    mask = side_by_side_mask(length, sizes, adapter.dtype, adapter.device)
    if mode == "approx":
        wanted = _wanted(ids, layers, adapter.num_layers)
        means = adapter.approx_attention(embeds, positions, cache.held_keys(), sizes, reduce=True,
                                         only=set().union(*wanted.values()))
        return {name: [m[i, p:length] if m is not None and layer in wanted[name] else None
                       for layer, m in enumerate(means)]
                for i, name in enumerate(ids)}
    probe = _probe(ids, sizes, 0, layers, (p, length), adapter.num_layers)
    mark = cache.mark()
    try:
        adapter.forward(embeds, positions, cache, attention_mask=mask, probe=probe)
    finally:
        cache.rollback(mark)
    return probe.weights


def _probe(ids: dict[str, Tensor], sizes: list[int], first_row: int, layers: dict[str, list[int]] | None,
           columns: tuple[int, int], num_layers: int) -> RowProbe:
    rows, offset = {}, first_row
    for name, n in zip(ids, sizes, strict=True):
        rows[name] = (offset, offset + n)
        offset += n
    return RowProbe(rows=rows, layers=_wanted(ids, layers, num_layers), columns=columns, num_layers=num_layers)


def _wanted(ids: dict[str, Tensor], layers: dict[str, list[int]] | None, num_layers: int) -> dict[str, set[int]]:
    """Per text, the layers whose attention is measured (all, unless ``layers`` names them)."""
    everywhere = set(range(num_layers))
    return {name: everywhere if layers is None else set(layers.get(name, ())) for name in ids}


def folded_mask(cached: int, chunk: int, sizes: list[int], device) -> Tensor:
    """Boolean mask (1, 1, chunk + Q, cached + chunk + Q), True where a query may attend, for a
    chunk prefilled together with pseudo-query texts placed after it.

    Chunk tokens see the cache and, causally, the chunk — never a pseudo-query. Each text sees
    the cache, the whole chunk and, causally, its own tokens — never another text's.
    """
    total = sum(sizes)
    before = cached + chunk
    allowed = torch.zeros(chunk + total, before + total, dtype=torch.bool)
    allowed[:chunk, :cached] = True
    allowed[:chunk, cached:before] = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    allowed[chunk:, :before] = True
    text = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.long))
    index = torch.arange(total)
    allowed[chunk:, before:] = (text[:, None] == text[None, :]) & (index[None, :] <= index[:, None])
    return allowed[None, None].to(device)


def prefill_with_pseudo_queries(adapter: ModelAdapter, cache: StreamingCache, chunk: EncodedChunk,
                                positions: Tensor, texts: dict[str, str], start: int,
                                layers: dict[str, list[int]] | None = None) -> dict[str, list[Tensor | None]]:
    """Prefill a video chunk and measure the pseudo-queries' attention in the same forward.

    The texts' tokens follow the chunk in one forward (at positions from ``start``, masked by
    ``folded_mask``), so each sees exactly what ``pseudo_query_attention`` run after the chunk
    would show it; their attention to the stream tokens — the chunk's included — is taken for
    the ``layers`` that want it. Their keys and values are then dropped: the cache ends as after
    a plain ``prefill`` of the chunk. Returns what ``pseudo_query_attention`` returns.
    """
    p, cached = cache.prefix_length(), cache.length
    n = chunk.embeds.shape[1]
    ids = {name: adapter.tokens(text) for name, text in texts.items()}
    sizes = [t.shape[0] for t in ids.values()]
    embeds = torch.cat([chunk.embeds.to(adapter.dtype), adapter.embed(torch.cat(list(ids.values()))).to(adapter.dtype)],
                       dim=1)
    text_positions = torch.cat([adapter.text_positions(start, k) for k in sizes]).to(positions)
    all_positions = torch.cat([positions, text_positions])
    probe = _probe(ids, sizes, n, layers, (p, cached + n), adapter.num_layers)
    mark = cache.mark()
    meta = TokenMeta.new(KIND_VIDEO, cache.new_ids(n), positions, frame=chunk.unit, patch=chunk.patch)
    mask = folded_mask(cached, n, sizes, adapter.device)
    try:
        adapter.forward(embeds, all_positions, cache, attention_mask=mask, probe=probe, chunk=chunk)
    except BaseException:
        cache.rollback(mark)
        raise
    cache.drop_tail(sum(sizes))
    cache.record(meta)
    return probe.weights
