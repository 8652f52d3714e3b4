"""One compression step: signals from the cache → the policy's choice → the cache, compressed.

``compress`` needs no model: tests drive it with hand-made caches. The pseudo-queries'
attention it may read comes from ``pseudo_query`` (the one part of a compression that runs the
model).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from policies import LayerChoice, Policy, StreamState
from policies.base import Rotary

from .cache import StreamingCache


@dataclass(frozen=True)
class Signals:
    """What a compression step knows besides the cache itself."""

    budget: int
    tokens_per_frame: int = 1  # stream tokens one unit adds
    # pseudo-query name → per layer (N,), None in a layer whose policy role does not read it
    attention: dict[str, list[Tensor | None]] = field(default_factory=dict)
    rotary: Rotary | None = None


def policy_state(cache: StreamingCache, signals: Signals) -> StreamState:
    """The cache's stream tokens as a policy sees them."""
    layers = [
        cache.stream_view(l, {name: a for name, att in signals.attention.items() if (a := att[l]) is not None})
        for l in range(cache.num_layers)
    ]
    return StreamState(layers=layers, budget=signals.budget, tokens_per_frame=signals.tokens_per_frame,
                       rotary=signals.rotary)


def compress(cache: StreamingCache, policy: Policy, signals: Signals) -> list[LayerChoice]:
    """Apply ``policy``'s choice to ``cache`` in place; returns the choice (per layer)."""
    state = policy_state(cache, signals)
    if not policy.keeps_per_head() and any(layer.per_head for layer in state.layers):
        raise ValueError(f"the memory holds a token set per key-value head, which {policy.name!r} cannot "
                         "compress: continue it under infinipot profile=reference")
    choices = policy.select(state)
    cache.apply(choices)
    return choices
