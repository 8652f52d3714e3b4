"""The pseudo-query step, its one owner: plan once per chunk, measure, hand to compression.

A policy that reads attention names pseudo-query texts (``Policy.pseudo_queries``) and the
layers that read each (``Policy.attention_layers``). Once per chunk, before its prefill,
``plan`` asks the policy once whether the chunk brings the memory over budget and, if so,
which texts to measure. The texts' attention over the cached stream tokens — per text, per
layer, the (N,) mean over heads and the text's tokens — is then taken one of three ways, each
giving what a forward of the text alone would show:

- folded (``pseudo_query="forward"``, the default): the texts ride in the chunk's own prefill,
  after it and masked from it (``prefill_measuring``) — one forward for both;
- forward: one forward of the texts on top of the cache, rolled back (``forward_attention``;
  used when the memory is compressed without a chunk's prefill to ride in);
- approx (the paper's shortcut): every layer projects the texts' raw embeddings
  (``ModelAdapter.query_key_projections``), no forward (``approx_attention``).

The weights are taken inside the model's attention for the texts' rows alone by
``models.attention.RowProbe``; the masks are ``texts_mask``'s.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from policies import Policy

from ..models.attention import RowProbe, row_attention
from ..models.base import EncodedChunk, ModelAdapter
from .cache import KIND_VIDEO, StreamingCache, TokenMeta

Attention = dict[str, list[Tensor | None]]  # pseudo-query name → per layer (N,), None where not read


@dataclass(frozen=True)
class Plan:
    """What one chunk's pseudo-query step does.

    ``compress``: the chunk brings the memory over budget, so a compression follows its prefill.
    ``texts``/``layers``: the pseudo-queries some layer reads and, per text, those layers (empty
    when nothing is compressed or the policy reads no attention). ``fold``: measure them inside
    the chunk's prefill.
    """

    compress: bool = False
    texts: dict[str, str] = field(default_factory=dict)
    layers: dict[str, list[int]] = field(default_factory=dict)
    mode: str = "forward"
    fold: bool = False


def wanted_texts(policy: Policy, history: tuple, num_layers: int) -> tuple[dict[str, str], dict[str, list[int]]]:
    """The policy's pseudo-query texts that some layer reads, and per text those layers."""
    every = list(range(num_layers))
    layers = policy.attention_layers(num_layers)
    texts = policy.pseudo_queries(history)
    return ({name: text for name, text in texts.items() if layers.get(name, every)},
            {name: layers.get(name, every) for name in texts})


def plan(policy: Policy, history: tuple, num_layers: int, *, held: int, chunk_tokens: int, budget: int | None,
         mode: str) -> Plan:
    """The step for a chunk of ``chunk_tokens`` tokens arriving on a memory whose fullest layer
    holds ``held`` stream tokens: ``policy.should_compress`` asked once, for the count after the
    prefill (every layer takes the whole chunk)."""
    if budget is None or not policy.should_compress(held + chunk_tokens, budget):
        return Plan(mode=mode)
    texts, layers = wanted_texts(policy, history, num_layers)
    return Plan(True, texts, layers, mode, fold=bool(texts) and mode == "forward")


def texts_mask(cached: int, chunk: int, sizes: Sequence[int], device) -> Tensor:
    """Boolean attention mask (1, 1, chunk + Q, cached + chunk + Q), True where a query may
    attend, for ``chunk`` stream tokens (0: none) followed by texts of ``sizes`` tokens, all on
    top of ``cached`` tokens.

    Chunk tokens see the cache and, causally, the chunk — never a text. Each text sees the cache,
    the whole chunk and, causally, its own tokens — never another text's.
    """
    total = sum(sizes)
    before = cached + chunk
    allowed = torch.zeros(chunk + total, before + total, dtype=torch.bool)
    allowed[:chunk, :cached] = True
    allowed[:chunk, cached:before] = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    allowed[chunk:, :before] = True
    text = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(list(sizes), dtype=torch.long))
    index = torch.arange(total)
    allowed[chunk:, before:] = (text[:, None] == text[None, :]) & (index[None, :] <= index[:, None])
    return allowed[None, None].to(device)


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as the additive one eager attention takes (0 where allowed, the dtype's minimum elsewhere)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def measure(adapter: ModelAdapter, cache: StreamingCache, texts: dict[str, str], start: int, mode: str,
            layers: dict[str, list[int]] | None = None) -> Attention:
    """The texts' attention over the memory as it is (placed from position ``start``), by
    ``mode`` (``forward`` or ``approx``), in the ``layers`` that want it (default: all); the
    memory is left as it was."""
    if mode == "approx":
        return approx_means(adapter, cache, texts, start, layers)
    return forward_attention(adapter, cache, texts, start, layers)


def forward_attention(adapter: ModelAdapter, cache: StreamingCache, texts: dict[str, str], start: int,
                      layers: dict[str, list[int]] | None = None) -> Attention:
    """Every text in one real forward on top of the cache — each at the positions from ``start``,
    masked from the others — its rows' attention taken in the ``layers`` that want it (default:
    all); the texts' tokens are then rolled back."""
    if not texts:
        return {}
    sizes, embeds, positions = side_by_side(adapter, texts, start)
    probe = _probe(list(texts), sizes, 0, layers, (cache.prefix_length(), cache.length), adapter.num_layers)
    mark = cache.mark()
    try:
        adapter.forward(embeds, positions, cache, attention_mask=texts_mask(cache.length, 0, sizes, adapter.device),
                        probe=probe)
    finally:
        cache.rollback(mark)
    return probe.weights


def prefill_measuring(adapter: ModelAdapter, cache: StreamingCache, chunk: EncodedChunk, positions: Tensor,
                      texts: dict[str, str], start: int, layers: dict[str, list[int]] | None = None) -> Attention:
    """Prefill a video chunk at ``positions`` and measure the planned texts in the same forward.

    The texts' tokens follow the chunk (at positions from ``start``, masked by ``texts_mask``),
    so each sees exactly what ``forward_attention`` run after the chunk would show it; their
    attention to the stream tokens — the chunk's included — is taken for the ``layers`` that
    want it (default: all). Their keys and values are then dropped: the cache ends as after a plain ``prefill``.
    """
    p, cached = cache.prefix_length(), cache.length
    n = chunk.embeds.shape[1]
    sizes, own, text_positions = side_by_side(adapter, texts, start)
    embeds = torch.cat([chunk.embeds.to(adapter.dtype), own.to(adapter.dtype)], dim=1)
    probe = _probe(list(texts), sizes, n, layers, (p, cached + n), adapter.num_layers)
    mark = cache.mark()
    meta = TokenMeta.new(KIND_VIDEO, cache.new_ids(n), positions, frame=chunk.unit, patch=chunk.patch)
    try:
        adapter.forward(embeds, torch.cat([positions, text_positions.to(positions)]), cache,
                        attention_mask=texts_mask(cached, n, sizes, adapter.device), probe=probe, chunk=chunk)
    except BaseException:
        cache.rollback(mark)
        raise
    cache.drop_tail(sum(sizes))
    cache.record(meta)
    return probe.weights


def approx_means(adapter: ModelAdapter, cache: StreamingCache, texts: dict[str, str], start: int,
                 layers: dict[str, list[int]] | None = None) -> Attention:
    """``approx_attention`` of every text (side by side from ``start``) reduced to its per-layer
    (N,) means over the stream tokens, for the ``layers`` that want it."""
    if not texts:
        return {}
    p, length = cache.prefix_length(), cache.length
    sizes, embeds, positions = side_by_side(adapter, texts, start)
    wanted = _wanted(list(texts), layers, adapter.num_layers)
    means = approx_attention(adapter, embeds, positions, cache.held_keys(), sizes, reduce=True,
                             only=set().union(*wanted.values()))
    return {name: [m[i, p:length] if m is not None and layer in wanted[name] else None
                   for layer, m in enumerate(means)]
            for i, name in enumerate(texts)}


@torch.no_grad()
def approx_attention(adapter: ModelAdapter, embeds: Tensor, positions: Tensor, cached_keys: Sequence[Tensor],
                     sizes: Sequence[int] | None = None, reduce: bool = False,
                     only: Collection[int] | None = None) -> list[Tensor | None]:
    """The HERMES paper's cheap pseudo-query attention, per layer.

    As in the paper and its reference code: every layer takes the *raw* token embeddings (no
    hidden states from the layers below) through its own projections
    (``adapter.query_key_projections``). Each text's softmax runs over the cached keys followed by
    its own keys, with no causal mask, in float32 (the reference's fp16 softmax is a precision
    quirk, not kept). ``cached_keys``: each layer's cached keys (1, kv_heads, cached, D).

    ``embeds`` may hold several texts side by side (``sizes``: their lengths; default one text);
    none sees another's keys. Returns per layer the weights (1, heads, q, cached + q) (other
    texts' columns 0), or with ``reduce`` only their mean over heads and each text's tokens on the
    cached columns, (texts, cached) — ``row_attention`` per text, the computation the folded probe
    uses. ``only``: the layers to compute (others give None).
    """
    n = embeds.shape[1]
    sizes = list(sizes) if sizes is not None else [n]
    text = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    bounds = torch.tensor([0, *sizes]).cumsum(0).tolist()
    total = cached_keys[0].shape[2]  # the cache's length, the same in every layer
    out: list[Tensor | None] = [None] * len(cached_keys)
    for index, q, own, scaling in adapter.query_key_projections(embeds, positions, only):
        cached = cached_keys[index].to(q.device, torch.float32)  # (1, KV, N, D)
        if reduce:  # per text: its rows over the cache and its own keys, nothing to mask
            out[index] = torch.stack([
                row_attention(q[:, :, a:b], torch.cat([cached, own[:, :, a:b]], dim=2), None, scaling, (0, total))
                for a, b in itertools.pairwise(bounds)
            ])
            continue
        keys = torch.cat([cached, own], dim=2)
        # (n, N + n): each text sees the cache and its own keys
        sees = torch.cat([torch.ones(n, total, dtype=torch.bool), text[:, None] == text[None, :]], dim=1)
        kv, heads = keys.shape[1], q.shape[1]
        scores = (q.reshape(1, kv, -1, q.shape[-1]) @ keys.transpose(-1, -2)).view(1, heads, n, -1) * scaling
        out[index] = torch.softmax(scores.masked_fill(~sees.to(q.device)[None, None], float("-inf")), dim=-1)
    return out


def side_by_side(adapter: ModelAdapter, texts: dict[str, str], start: int) -> tuple[list[int], Tensor, Tensor]:
    """The texts as one input, side by side, each at the positions from ``start``: (their token
    counts, embeddings (1, Q, hidden), positions (Q, A))."""
    ids = [adapter.tokens(text) for text in texts.values()]
    sizes = [t.shape[0] for t in ids]
    return sizes, adapter.embed(torch.cat(ids)), torch.cat([adapter.text_positions(start, n) for n in sizes])


def _probe(names: list[str], sizes: list[int], first_row: int, layers: dict[str, list[int]] | None,
           columns: tuple[int, int], num_layers: int) -> RowProbe:
    rows, offset = {}, first_row
    for name, n in zip(names, sizes, strict=True):
        rows[name] = (offset, offset + n)
        offset += n
    return RowProbe(rows=rows, layers=_wanted(names, layers, num_layers), columns=columns, num_layers=num_layers)


def _wanted(names: list[str], layers: dict[str, list[int]] | None, num_layers: int) -> dict[str, set[int]]:
    """Per text, the layers whose attention is measured (all, unless ``layers`` names them)."""
    everywhere = set(range(num_layers))
    return {name: everywhere if layers is None else set(layers.get(name, ())) for name in names}
