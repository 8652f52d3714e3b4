"""``full``: keep every token (no budget). The unbounded upper bound every policy is compared to."""

from __future__ import annotations

from dataclasses import dataclass

from .base import LayerChoice, Policy, StreamState, keep_all


@dataclass
class FullPolicy(Policy):
    name = "full"
    description = "everything: no budget, memory grows with the stream (upper bound)"

    def target(self, budget: int | None, tokens_per_frame: int = 1) -> int | None:
        return None

    def should_compress(self, n_tokens: int, budget: int | None) -> bool:
        return False

    def select(self, state: StreamState) -> list[LayerChoice]:
        return keep_all(state)
