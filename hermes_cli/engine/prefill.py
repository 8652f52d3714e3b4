"""Appending tokens to the cache: one forward of the language model plus the tokens' identities."""

from __future__ import annotations

from torch import Tensor

from ..models.base import EncodedChunk, ModelAdapter
from .cache import StreamingCache, TokenMeta


def prefill(adapter: ModelAdapter, cache: StreamingCache, embeds: Tensor, positions: Tensor, kind: int,
            chunk: EncodedChunk | None = None) -> Tensor:
    """Run ``embeds`` at ``positions`` on top of ``cache`` and record what was appended.

    Video tokens (``chunk`` given) carry their unit and patch; others get -1. Returns the last
    hidden states (1, n, hidden).
    """
    first_id = cache.new_ids(embeds.shape[1])
    if chunk is None:
        meta = TokenMeta.new(kind, first_id, positions)
    else:
        meta = TokenMeta.new(kind, first_id, positions, frame=chunk.unit, patch=chunk.patch)
    hidden, _ = adapter.forward(embeds, positions, cache, chunk=chunk)
    cache.record(meta)
    return hidden
