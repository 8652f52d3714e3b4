"""``fifo``: every layer keeps the newest ``budget`` stream tokens; everything older is lost.

First-in-first-out memory, as in LiveVLM-style streaming caches (see the spec's baselines):
the floor a scored policy must beat, at no compression cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import LayerChoice, Policy, StreamState, at_rest, keep_all, newest


@dataclass
class FifoPolicy(Policy):
    name = "fifo"
    description = "the newest `budget` tokens in every layer (first in, first out)"

    def select(self, state: StreamState) -> list[LayerChoice]:
        if at_rest(self, state):
            return keep_all(state)
        return [LayerChoice(newest(layer.n, state.budget, layer.token_id.device)) for layer in state.layers]
