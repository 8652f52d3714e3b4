"""``uniform``: whole frames spread evenly over the stream so far, the same frames in every layer.

Offline uniform frame sampling, the usual base-model setting (InfiniPot-V reports it as the
"uniform frame selection" baseline, arXiv 2506.15745). After each compression a layer holds
``floor(budget / tokens_per_frame)`` whole frames: for each point of an evenly spaced grid over
the frames seen so far, the nearest frame still held that no earlier grid point took.

- Grid: evenly spaced points from frame 0 to the newest frame, both included (one frame: the
  newest). The span is read from the tokens' frame indices, so it is always in the same unit
  as ``LayerTokens.frame`` (for Qwen a temporal patch, not a raw frame).
- Extra tokens of a frame (LLaVA-OneVision's newline token, ``patch >= tokens_per_frame``) belong
  to their frame, but the target counts whole frames × ``tokens_per_frame``, so they are the first
  to go when a layer would otherwise exceed it; a layer short of whole frames is filled with the
  newest remaining tokens. Either way every layer ends with exactly ``target`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .base import LayerChoice, LayerTokens, Policy, StreamState, at_rest, keep_all, top_k_tiered


@dataclass
class UniformPolicy(Policy):
    name = "uniform"
    description = "whole frames spread evenly over the stream so far, the same in every layer"

    def target(self, budget: int | None, tokens_per_frame: int = 1) -> int | None:
        if budget is None:
            return None
        return budget // tokens_per_frame * tokens_per_frame

    def select(self, state: StreamState) -> list[LayerChoice]:
        target = self.target(state.budget, state.tokens_per_frame)
        if at_rest(self, state):
            return keep_all(state)
        assert target is not None, "select runs only under a budget"
        held = frames_held(state.layers[0])
        chosen = evenly_spaced_frames(held, target // state.tokens_per_frame)
        return [LayerChoice(keep_frames(layer, chosen, state.tokens_per_frame, target)) for layer in state.layers]


def frames_held(layer: LayerTokens) -> list[int]:
    """Sorted frame indices with at least one token in the layer (summary tokens excluded)."""
    return torch.unique(layer.frame[layer.frame >= 0]).tolist()


def evenly_spaced_frames(held: list[int], count: int) -> list[int]:
    """``count`` held frames, each the nearest still free one to a point of an even grid.

    The grid runs from frame 0 to the newest held frame (the newest alone when count is 1);
    equal distances go to the older frame.
    """
    if count <= 0 or not held:
        return []
    if count >= len(held):
        return list(held)
    last = held[-1]
    grid = [last * j / (count - 1) for j in range(count)] if count > 1 else [float(last)]
    free = list(held)
    chosen = []
    for point in grid:
        nearest = min(free, key=lambda f: (abs(f - point), f))
        free.remove(nearest)
        chosen.append(nearest)
    return sorted(chosen)


def keep_frames(layer: LayerTokens, chosen: list[int], tokens_per_frame: int, target: int) -> Tensor:
    """Exactly ``target`` indices: chosen frames' grid tokens, then their extra tokens, then newest."""
    in_chosen = torch.isin(layer.frame, torch.tensor(chosen, dtype=layer.frame.dtype, device=layer.frame.device))
    on_grid = (layer.patch >= 0) & (layer.patch < tokens_per_frame)
    tier = 2 * in_chosen.long() + (in_chosen & on_grid).long()
    recency = torch.arange(layer.n, device=layer.frame.device, dtype=torch.float32)
    return top_k_tiered(tier, recency, target)
