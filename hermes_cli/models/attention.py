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
# Query rows are scored a block at a time, keeping the (heads × rows × keys) float32 score block
# under this size: below glibc's largest mmap threshold (32 MiB), so its memory is reused from one
# block to the next instead of being mapped and zero-filled afresh each time — which, at a
# 9,000-token memory, tripled the cost of scoring the pseudo-queries.
SCORE_BLOCK_BYTES = 16 << 20


def rows_per_block(heads: int, keys: int) -> int:
    """Query rows whose float32 scores over ``keys`` keys in ``heads`` heads fit ``SCORE_BLOCK_BYTES``."""
    return max(1, SCORE_BLOCK_BYTES // (heads * keys * 4))


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
    additive, as the model's attention takes it. Rows go a block at a time (``rows_per_block``),
    the softmax made in place in each block.
    """
    b, heads, rows, dim = query.shape
    kv_heads, n_keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    keys_t = key.float().transpose(-1, -2)
    start, stop = columns
    total = torch.zeros(stop - start, dtype=torch.float32, device=query.device)
    step = rows_per_block(heads, n_keys)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        q = query[:, :, r0:r1].float().reshape(b, kv_heads, group * (r1 - r0), dim)
        scores = torch.matmul(q, keys_t).mul_(scaling).view(b, kv_heads, group, r1 - r0, n_keys)  # (B, Hkv, g, r, K)
        if mask is not None:
            m = mask[..., r0:r1, :]
            m = m[:, :, None] if m.dim() == 4 else m
            if m.dtype == torch.bool:
                scores.masked_fill_(~m, float("-inf"))
            else:
                scores.add_(m.float())
        scores.sub_(scores.amax(dim=-1, keepdim=True)).exp_()
        scores.div_(scores.sum(dim=-1, keepdim=True))
        total += scores[0, ..., start:stop].sum(dim=(0, 1, 2))
    return total / (heads * rows)


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


def grouped_rows_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                           scaling: float | None = None, **kwargs):
    """Attention of a few query rows per batch row over padded keys — the batched decode step
    (``engine.cache.BatchView``): heads grouped by the key/value head they share, so keys and
    values are read once, never copied per head (transformers' SDPA path repeats them whenever a
    mask is given). ``query`` (B, H, q, D), ``key``/``value`` (B, Hkv, K, D), ``attention_mask``
    (B, 1, q, K) boolean (True = may attend) or additive. Returns (B, q, H, D), None."""
    b, heads, rows, dim = query.shape
    kv_heads, n_keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = scaling if scaling is not None else dim ** -0.5
    q = query.reshape(b, kv_heads, group * rows, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)).float().mul_(scale).view(b, kv_heads, group, rows, n_keys)
    if attention_mask is not None:
        m = attention_mask[:, :, None]  # (B, 1, 1, q, K)
        if m.dtype == torch.bool:
            scores.masked_fill_(~m, float("-inf"))
        else:
            scores.add_(m.float())
    probs = scores.softmax(dim=-1).to(value.dtype).view(b, kv_heads, group * rows, n_keys)
    out = torch.matmul(probs, value).view(b, heads, rows, value.shape[-1])
    return out.transpose(1, 2).contiguous(), None


ROWS_IMPLEMENTATION = "hermes_rows"


def register() -> None:
    """Make ``PROBE_IMPLEMENTATION`` and ``ROWS_IMPLEMENTATION`` known to transformers (idempotent)."""
    AttentionInterface.register(PROBE_IMPLEMENTATION, probe_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(PROBE_IMPLEMENTATION, sdpa_mask)
    AttentionInterface.register(ROWS_IMPLEMENTATION, grouped_rows_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ROWS_IMPLEMENTATION, sdpa_mask)


def base_attention(implementation: str) -> Callable:
    """The attention function transformers runs for ``implementation``."""
    if implementation == "eager":
        return eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)


register()
