"""The contract between the stream cache and a memory policy.

A policy answers one question after each chunk: which of the cached stream tokens does each
decoder layer keep? It sees *signals* (keys, values, token identities, positions and, when it
asks for them, pseudo-query attention) and returns, per layer, sorted indices to keep and an
optional summary token. Policies are pure: torch only, they never call the model and never
slice the cache themselves (``hermes_cli/engine/cache.py`` applies their choice).

Budget semantics shared by every policy: ``budget`` counts stream tokens (video and summary)
per layer; the system-prompt prefix is never shown to a policy and never evicted. After a
compression every layer must hold the same number of tokens, at most ``budget``.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch
from torch import Tensor


class Rotary(Protocol):
    """Rotates post-RoPE keys by a position delta (see ``hermes_cli/positions/rope.py``)."""

    def rotate(self, keys: Tensor, delta: Tensor) -> Tensor:
        """keys (..., N, D); delta (N, A) int, A = 1 (1-D RoPE) or 3 (M-RoPE t, h, w)."""
        ...


@dataclass(frozen=True)
class LayerTokens:
    """The stream tokens one decoder layer holds, in physical order (oldest first).

    N tokens; H key/value heads; D head size; A position axes (1, or 3 for M-RoPE). Where an
    earlier step kept a token set per head (``per_head``), the identities have a leading head
    axis — (H, N), positions (H, N, A) — and slot j of each head is its own token.
    """

    keys: Tensor  # (H, N, D), post-RoPE, as cached
    values: Tensor  # (H, N, D)
    token_id: Tensor  # (N,) int64 identity: the same id is the same token in every layer
    frame: Tensor  # (N,) int64 frame index in the stream (a temporal patch for Qwen); -1 summary
    patch: Tensor  # (N,) int64 index inside the frame; -1 for a summary token
    positions: Tensor  # (N, A) int64 rotary positions the keys were rotated with
    is_summary: Tensor  # (N,) bool
    attention: dict[str, Tensor] = field(default_factory=dict)  # pseudo-query name -> (N,)

    @property
    def n(self) -> int:
        return int(self.token_id.shape[-1])

    @property
    def per_head(self) -> bool:
        return self.token_id.dim() == 2

    def head(self, h: int) -> LayerTokens:
        """Key-value head ``h`` alone: keys/values (1, N, D), identities (N,)."""
        pick = (lambda t: t[h]) if self.per_head else (lambda t: t)
        return LayerTokens(
            keys=self.keys[h : h + 1], values=self.values[h : h + 1], token_id=pick(self.token_id),
            frame=pick(self.frame), patch=pick(self.patch), positions=pick(self.positions),
            is_summary=pick(self.is_summary), attention=self.attention,
        )


@dataclass(frozen=True)
class StreamState:
    """Everything a policy may look at when it compresses."""

    layers: list[LayerTokens]
    budget: int
    tokens_per_frame: int  # stream tokens one frame adds (for Qwen: one temporal patch)
    rotary: Rotary | None = None

    @property
    def num_layers(self) -> int:
        return len(self.layers)


@dataclass(frozen=True)
class Summary:
    """One token appended after a layer's kept tokens."""

    key: Tensor  # (H, D)
    value: Tensor  # (H, D)
    position: Tensor  # (A,) int64


@dataclass(frozen=True)
class LayerChoice:
    """What one layer keeps: ``keep`` indices (sorted, into LayerTokens) plus an optional summary.

    ``keep`` (H, K) keeps a set per key-value head (only from a policy whose ``keeps_per_head``).
    """

    keep: Tensor  # (K,) or (H, K) int64, strictly increasing (per row)
    summary: Summary | None = None

    @property
    def size(self) -> int:
        return int(self.keep.shape[-1]) + (self.summary is not None)


class Policy(ABC):
    """A memory policy. Subclasses are dataclasses whose fields are their parameters.

    Each field's ``metadata["help"]`` says what it does; its default is the paper's value.
    """

    name: ClassVar[str]
    description: ClassVar[str]  # one line: what it keeps

    def pseudo_queries(self, history: tuple[tuple[str, str], ...]) -> dict[str, str]:
        """Texts whose attention over the cache the policy needs, by name. Default: none."""
        return {}

    def keeps_per_head(self) -> bool:
        """Whether ``select`` may keep a token set per key-value head (and reads such layers)."""
        return False

    def attention_layers(self, num_layers: int) -> dict[str, list[int]]:
        """Per pseudo-query name, the layers whose ``select`` reads its attention. Default: all."""
        return {name: list(range(num_layers)) for name in self.pseudo_queries(())}

    def target(self, budget: int | None, tokens_per_frame: int = 1) -> int | None:
        """Tokens per layer after a compression (None: never compress).

        ``tokens_per_frame`` matters only to policies that keep whole frames (``uniform``).
        """
        return budget

    def should_compress(self, n_tokens: int, budget: int | None) -> bool:
        """Whether a layer holding ``n_tokens`` stream tokens must be compressed now."""
        return budget is not None and n_tokens > budget

    def layer_groups(self, num_layers: int) -> dict[str, list[int]]:
        """Layers that keep alike, by group name, for readouts. Default: one group of all layers."""
        return {"all": list(range(num_layers))}

    @abstractmethod
    def select(self, state: StreamState) -> list[LayerChoice]:
        """Choose what each layer keeps.

        Every layer's ``size`` equals ``target(budget, tokens_per_frame)``. When no layer needs
        compressing (``should_compress``), every layer keeps everything: the engine does not call
        then, but may.
        """

    @classmethod
    def parameters(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.init] if dataclasses.is_dataclass(cls) else []


def param(default, help: str):
    """A policy parameter: a dataclass field with its default and a one-line help."""
    return field(default=default, metadata={"help": help})


def require(condition: bool, message: str) -> None:
    """Raise ValueError(message) unless ``condition``: parameter checks in ``__post_init__``."""
    if not condition:
        raise ValueError(message)


def at_rest(policy: Policy, state: StreamState) -> bool:
    """Whether no layer needs compressing: then ``select`` keeps everything."""
    return not any(policy.should_compress(layer.n, state.budget) for layer in state.layers)


def keep_all(state: StreamState) -> list[LayerChoice]:
    """Every layer keeps every token, no summary."""
    return [LayerChoice(torch.arange(layer.n, device=layer.token_id.device)) for layer in state.layers]


def newest(n: int, k: int, device: torch.device | None = None) -> Tensor:
    """Indices of the newest ``k`` of ``n`` tokens (all of them when k >= n)."""
    return torch.arange(max(0, n - max(k, 0)), n, device=device)


def top_k_sorted(scores: Tensor, k: int) -> Tensor:
    """Indices of the k largest scores, in increasing index order (ties: the older token wins)."""
    k = max(0, min(k, scores.shape[0]))
    # A stable descending sort keeps ties in index order, so results are deterministic.
    order = torch.sort(scores, descending=True, stable=True).indices[:k]
    return torch.sort(order).values


def top_k_tiered(tier: Tensor, scores: Tensor, k: int) -> Tensor:
    """Indices of the k best tokens ranked by ``tier`` first, then ``scores``; increasing order.

    Forcing tokens in by tier avoids adding a large constant to the scores, which would
    erase the differences between them in floating point. Ties: the older token wins.
    """
    k = max(0, min(k, scores.shape[0]))
    by_score = torch.sort(scores, descending=True, stable=True).indices
    by_tier = by_score[torch.sort(tier[by_score], descending=True, stable=True).indices]
    return torch.sort(by_tier[:k]).values
