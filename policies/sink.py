"""``sink``: every layer keeps the first ``n_sink`` stream tokens plus the newest ``budget − n_sink``.

StreamingLLM's attention sinks + sliding window (Xiao et al., "Efficient Streaming Language
Models with Attention Sinks", ICLR 2024, arXiv 2309.17453). The system-prompt prefix is never
evicted and already plays the role of StreamingLLM's four sink tokens, so here the sink is the
*opening of the video*: by default 784 tokens, four LLaVA-OneVision frames (4 × 196) or about
three Qwen2.5-VL frames at 448 × 448 (256 tokens each). The sink takes at most half the budget,
so the window of recent tokens never vanishes when the budget is small.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import LayerChoice, Policy, StreamState, at_rest, keep_all, newest, param, require


@dataclass
class SinkPolicy(Policy):
    name = "sink"
    description = "the first `n_sink` stream tokens + the newest `budget − n_sink` (StreamingLLM)"

    n_sink: int = param(784, "stream tokens kept from the start of the video (784 = 4 LLaVA-OV frames)")

    def __post_init__(self) -> None:
        require(self.n_sink >= 0, f"sink.n_sink must be >= 0, got {self.n_sink}")

    def select(self, state: StreamState) -> list[LayerChoice]:
        if at_rest(self, state):
            return keep_all(state)
        return [LayerChoice(self.sink_and_window(layer.n, state.budget, layer.token_id.device)) for layer in state.layers]

    def sink_and_window(self, n: int, budget: int, device: torch.device) -> torch.Tensor:
        """The oldest ``min(n_sink, budget // 2)`` indices, then the newest ones up to ``budget``."""
        n_sink = min(self.n_sink, budget // 2)
        return torch.cat([torch.arange(n_sink, device=device), newest(n, budget - n_sink, device)])
