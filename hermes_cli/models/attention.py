"""Row-only attention weights taken from inside a forward: the pseudo-query probe.

A ``RowProbe`` names some query rows of a forward (each pseudo-query text's tokens), the layers
where each text's attention is wanted, and the key columns of interest (the stream tokens).
While a probe is active (``ModelAdapter.forward(..., probe=...)``) every decoder layer runs its
usual attention for every row — the model's own implementation, SDPA by default — and, in the
layers that want it, additionally computes the softmax weights of those rows alone, per key/value
head group (grouped views, no repeated keys), and keeps only their mean over heads and the text's
tokens for the wanted columns. No full attention matrix is stored and no layer falls back to the
eager path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward

PROBE_IMPLEMENTATION = "hermes_probe"


@dataclass
class RowProbe:
    """What to take from a forward: per text, rows ``[start, stop)`` of the forward's queries.

    ``layers``: per text, the layers that want its attention (others skip the extra work);
    ``columns``: the key range ``[start, stop)`` kept (the stream tokens). After the forward,
    ``weights[name][layer]`` is the (stop − start,) float32 mean attention of the text's rows
    over heads and tokens, or None for a layer that did not want it.
    """

    rows: dict[str, tuple[int, int]]
    layers: dict[str, set[int]]
    columns: tuple[int, int]
    num_layers: int
    weights: dict[str, list[Tensor | None]] = field(default_factory=dict)
    base: Callable | None = None  # the model's own attention function (set while active)

    def __post_init__(self) -> None:
        self.weights = {name: [None] * self.num_layers for name in self.rows}

    def record(self, layer: int, query: Tensor, key: Tensor, mask: Tensor | None, scaling: float) -> None:
        """Take the wanted rows' attention in ``layer`` from this layer's query (B, H, Q, D) and key (B, Hkv, K, D)."""
        for name, (start, stop) in self.rows.items():
            if layer in self.layers.get(name, ()):
                self.weights[name][layer] = row_attention(
                    query[:, :, start:stop], key, None if mask is None else mask[..., start:stop, :], scaling,
                    self.columns,
                )


def row_attention(query: Tensor, key: Tensor, mask: Tensor | None, scaling: float,
                  columns: tuple[int, int]) -> Tensor:
    """Softmax attention of ``query`` rows (1, H, r, D) over ``key`` (1, Hkv, K, D), in float32,
    averaged over heads and rows, restricted to key ``columns``: (stop − start,).

    Heads are grouped by the key/value head they share (H = Hkv × g, head h uses key head h // g),
    so keys are never copied per head. ``mask`` (1 or B, 1, r, K): boolean (True = may attend) or
    additive, as the model's attention takes it.
    """
    b, heads, rows, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    q = query.float().reshape(b, kv_heads, group * rows, dim)
    scores = torch.matmul(q, key.float().transpose(-1, -2)).mul_(scaling)  # (B, Hkv, g·r, K)
    scores = scores.view(b, kv_heads, group, rows, -1)
    if mask is not None:
        m = mask[:, :, None] if mask.dim() == 4 else mask
        if m.dtype == torch.bool:
            scores = scores.masked_fill(~m, float("-inf"))
        else:
            scores = scores + m.float()
    weights = torch.softmax(scores, dim=-1)
    start, stop = columns
    return weights[0, ..., start:stop].sum(dim=(0, 1, 2)) / (heads * rows)


def probe_attention_forward(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                            scaling: float | None = None, **kwargs):
    """The model's own attention, plus the active probe's rows (see module docstring)."""
    probe: RowProbe | None = getattr(module, "hermes_probe", None)
    base = eager_attention_forward if probe is None or probe.base is None else probe.base
    if probe is not None:
        probe.record(module.layer_idx, query, key, attention_mask,
                     scaling if scaling is not None else query.shape[-1] ** -0.5)
    kwargs.pop("output_attentions", None)
    if base is eager_attention_forward and attention_mask is not None and attention_mask.dtype == torch.bool:
        additive = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        attention_mask = additive.masked_fill(~attention_mask, torch.finfo(query.dtype).min)
    return base(module, query, key, value, attention_mask,
                scaling=scaling if scaling is not None else query.shape[-1] ** -0.5, **kwargs)


def register() -> None:
    """Make ``PROBE_IMPLEMENTATION`` known to transformers (idempotent)."""
    AttentionInterface.register(PROBE_IMPLEMENTATION, probe_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(PROBE_IMPLEMENTATION, sdpa_mask)


def base_attention(implementation: str) -> Callable:
    """The attention function transformers runs for ``implementation``."""
    if implementation == "eager":
        return eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)


register()
