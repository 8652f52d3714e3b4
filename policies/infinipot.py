"""``infinipot``: InfiniPot-V continual compression, TaR + VaN, one token set per layer.

InfiniPot-V (Kim et al., "InfiniPot-V: Memory-Constrained KV Cache Compression for Streaming
Video Understanding", NeurIPS 2025, arXiv 2506.15745). When a layer reaches the memory cap
``|M| = budget`` it shrinks to ``|C| = int(ratio · budget)``; the freed room holds the next frames.
Each layer keeps, in this order of priority:

1. the most recent ``int(recent_fraction · f)`` units, where ``f = |M| // tokens_per_frame`` is the
   number of units the cap holds (fixed: Algorithm 2 / Table A2 of the paper and the reference
   code's ``int(current_frame_num · query_ratio)``, taken when the cache is full) — not the
   number of distinct units a layer happens to hold, which grows as old units are thinned;
2. Temporal-axis Redundancy (TaR): the older grid tokens least like the same patch in the
   recent frames, ``s_TaR = −mean_recent cos(K(t, patch), K(t', patch))``, up to
   ``int(alpha · |C|)`` tokens together with step 1;
3. Value Norm (VaN): the largest ``‖V‖₂`` fills the rest, optionally smoothed per frame by the
   layer-adaptive spatial average pooling (2-D, kernel 7 / 5 / 3 / 1 by layer quartile).

``profile=reference`` follows the official code where it differs from the paper's text: the
frame count ``f`` is taken from the layer's length at compression (``n // tokens_per_frame``),
TaR's share is ``|C| − round((1 − α)·|C|)``, every key-value head keeps its own token set from
its own TaR and VaN scores (``per_head``; the paper's text does not say, and by default one set
per layer is chosen from head-averaged scores), and the official code's reshape of the cache
into (frames, tokens_per_frame) *position slots* is kept, whatever tokens the slots hold:

- TaR pairs tokens by slot (``pair_by_slot``): the recent window is the last
  ``int(r · f) · tokens_per_frame`` slots, and older slot ``s`` is compared with slot
  ``s mod tokens_per_frame`` of each recent frame-sized block, keys normalised as ``k / (‖k‖ + 1e−9)``;
- VaN pooling (``van_pool``) pools by slot (``pool_by_slot``): by layer quartile
  ``l // max(1, L // 4)`` 3-D kernel 7 (across frames too), 2-D kernel 5 (each frame), 1-D
  kernel 3 along the slot sequence, none; the first ``n // tokens_per_frame`` frame-sized blocks
  of slots form the (frames, rows, width) grid (the ``n mod tokens_per_frame`` newest slots are
  not pooled), the 2-D/3-D kernel shrinks to ``min(kernel, frames, rows, width)``, one less when
  even, none below 2, and every window divides by ``kernel^dims`` (zero padding counts).

After a first thinning a slot no longer holds the same patch, so both meet unrelated patches.

By default tokens are matched to their grid partner by (frame, patch) identity, so frames
already thinned by earlier steps work: TaR compares a token with the same patch of the recent
frames, and pooling averages a patch with the held patches around it in its own frame. A token
with no partner in the recent frames, a newline token (``patch >= tokens_per_frame``) or a
summary token gets no TaR score and competes on VaN only (unpooled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import (
    LayerChoice,
    LayerTokens,
    Policy,
    StreamState,
    at_rest,
    keep_all,
    param,
    require,
    top_k_sorted,
    top_k_tiered,
)

POOL_KERNELS = (7, 5, 3, 1)  # by layer quartile, shallowest first
REFERENCE_POOLING = ((3, 7), (2, 5), (1, 3), (0, 1))  # official code: (dimensions, kernel) by quartile; 0 = none
PROFILES = ("paper", "reference")


@dataclass
class InfiniPotPolicy(Policy):
    name = "infinipot"
    description = "InfiniPot-V: recent frames + TaR-novel patches + high value norm, at a memory cap"

    ratio: float = param(0.75, "|C| / |M|: tokens kept per layer after a compression, as a fraction of the cap")
    alpha: float = param(0.5, "share of |C| chosen by TaR (recent frames included); VaN fills the rest")
    recent_fraction: float = param(
        0.125, "r: the newest int(r · budget // tokens_per_frame) units are kept whole (paper 0.125; reference code 0.25)"
    )
    van_pool: bool = param(False, "smooth each frame's value-norm map with layer-adaptive average pooling")
    van_grid_width: int = param(0, "tokens per row of a frame's grid for pooling; 0 = round(sqrt(tokens per frame))")
    per_head: bool = param(
        False, "every key-value head keeps its own tokens by its own scores (official code; on under profile=reference)"
    )
    pair_by_slot: bool = param(
        False, "TaR pairs tokens by position slot, not (frame, patch) identity (official code; on under profile=reference)"
    )
    pool_by_slot: bool = param(
        False, "VaN pooling lays position slots out as the frame grid, not (frame, patch) identities (official code; "
        "on under profile=reference)"
    )
    profile: str = param(
        "paper",
        "paper: the paper's method; reference: the official code's frame count, TaR share, pooling, per-head "
        "selection, slot pairing and slot pooling",
    )

    def __post_init__(self) -> None:
        require(0 < self.ratio <= 1, f"infinipot.ratio must be in (0, 1], got {self.ratio}")
        require(0 <= self.alpha <= 1, f"infinipot.alpha must be in [0, 1], got {self.alpha}")
        require(0 < self.recent_fraction <= 1, f"infinipot.recent_fraction must be in (0, 1], got {self.recent_fraction}")
        require(self.van_grid_width >= 0, f"infinipot.van_grid_width must be >= 0, got {self.van_grid_width}")
        require(self.profile in PROFILES, f"infinipot.profile must be one of {', '.join(PROFILES)}, got {self.profile!r}")

    def target(self, budget: int | None, tokens_per_frame: int = 1) -> int | None:
        return None if budget is None else int(self.ratio * budget)

    def should_compress(self, n_tokens: int, budget: int | None) -> bool:
        return budget is not None and n_tokens >= budget

    def keeps_per_head(self) -> bool:
        return self.per_head or self.profile == "reference"

    def slot_pairing(self) -> bool:
        """Whether TaR pairs by position slot (``pair_by_slot``, or the reference profile)."""
        return self.pair_by_slot or self.profile == "reference"

    def slot_pooling(self) -> bool:
        """Whether VaN pooling reads the slot grid (``pool_by_slot``, or the reference profile)."""
        return self.pool_by_slot or self.profile == "reference"

    def recent_units(self, budget: int, tokens_per_frame: int) -> int:
        """``int(r · f)`` with ``f = budget // tokens_per_frame``: the recent window in units.

        Under ``profile=reference`` pass the layer's length as ``budget`` (the official code's f).
        """
        return int(self.recent_fraction * (budget // max(tokens_per_frame, 1)))

    def tar_share(self, target: int) -> int:
        """Tokens of |C| for recent + TaR: ``int(α·|C|)`` (paper), ``|C| − round((1 − α)·|C|)`` (reference)."""
        return target - round((1 - self.alpha) * target) if self.profile == "reference" else int(self.alpha * target)

    def select(self, state: StreamState) -> list[LayerChoice]:
        target = self.target(state.budget)
        if at_rest(self, state):
            return keep_all(state)
        assert target is not None, "select runs only under a budget"
        choices = []
        for index, layer in enumerate(state.layers):
            cap = layer.n if self.profile == "reference" else state.budget
            recent_units = self.recent_units(cap, state.tokens_per_frame)
            args = (index, state.num_layers, state.tokens_per_frame, target, recent_units)
            if self.keeps_per_head():
                keep = torch.stack([self.select_layer(layer.head(h), *args) for h in range(layer.keys.shape[0])])
            else:
                keep = self.select_layer(layer, *args)
            choices.append(LayerChoice(keep))
        return choices

    def select_layer(self, layer: LayerTokens, index: int, num_layers: int, tokens_per_frame: int, target: int,
                     recent_units: int) -> Tensor:
        """``target`` indices: the newest ``recent_units`` units, then TaR picks, then the largest value norms."""
        if self.slot_pairing():
            query = min(recent_units * tokens_per_frame, layer.n)
            recent = torch.arange(layer.n, device=layer.keys.device) >= layer.n - query
            scores = tar_scores_by_slot(layer, query, tokens_per_frame)
        else:
            recent = recent_frames_mask(layer.frame, recent_units)
            scores = tar_scores(layer, recent, tokens_per_frame)
        novel = tar_picks(scores, self.tar_share(target) - int(recent.sum()))
        tier = 2 * recent.long() + novel.long()
        return top_k_tiered(tier, self.salience(layer, index, num_layers, tokens_per_frame), target)

    def salience(self, layer: LayerTokens, index: int, num_layers: int, tokens_per_frame: int) -> Tensor:
        """VaN, pooled when ``van_pool`` is on and the layer's kernel is above 1.

        Paper: 2-D by quartile, over held patches only. Reference: the official quartiles on the
        slot grid, zero padding counted, kernel fitted to the grid.
        """
        van = value_norms(layer.values)
        if not self.van_pool:
            return van
        width = self.van_grid_width or max(1, round(math.sqrt(tokens_per_frame)))
        reference = self.profile == "reference"
        if reference:
            dims, kernel = REFERENCE_POOLING[min(3, index // max(1, num_layers // 4))]
        else:
            dims, kernel = 2, pool_kernel(index, num_layers)
        if dims == 0 or kernel == 1:
            return van
        if dims == 1:
            return pool_sequence(van, kernel)
        if self.slot_pooling():
            return pool_slots(van, tokens_per_frame, width, dims, kernel, official=reference)
        return pool_per_frame(van, layer, tokens_per_frame, width, kernel)


def recent_frames_mask(frame: Tensor, count: int) -> Tensor:
    """Tokens of the newest ``count`` of the distinct units held (none when count <= 0)."""
    if count <= 0:
        return torch.zeros(frame.shape, dtype=torch.bool, device=frame.device)
    held = torch.unique(frame[frame >= 0])
    return torch.isin(frame, held[-count:]) & (frame >= 0)


def on_grid(layer: LayerTokens, tokens_per_frame: int) -> Tensor:
    """Spatial patch tokens: not a summary, not a newline or other extra token of a frame."""
    return (layer.frame >= 0) & (layer.patch >= 0) & (layer.patch < tokens_per_frame) & ~layer.is_summary


def tar_scores(layer: LayerTokens, recent: Tensor, tokens_per_frame: int) -> Tensor:
    """``−mean cos`` to the same patch in each recent frame (head-averaged); −inf without a partner.

    The mean of cosines to unit keys is the dot product with their sum over the partners, so one
    sum per (head, patch) over the recent frames serves every older token.
    """
    grid = on_grid(layer, tokens_per_frame)
    unit = F.normalize(layer.keys.float(), dim=-1)
    partners = torch.nonzero(grid & recent).squeeze(1)
    heads, _, dim = unit.shape
    summed = torch.zeros(heads, tokens_per_frame, dim, device=unit.device)
    summed.index_add_(1, layer.patch[partners], unit.index_select(1, partners))
    count = torch.zeros(tokens_per_frame, device=unit.device)
    count.index_add_(0, layer.patch[partners], torch.ones(partners.numel(), device=unit.device))
    scored = torch.nonzero(grid & ~recent & (count[layer.patch.clamp(0, tokens_per_frame - 1)] > 0)).squeeze(1)
    patch = layer.patch[scored]
    score = torch.full((layer.n,), -math.inf, device=unit.device)
    score[scored] = -(unit.index_select(1, scored) * summed.index_select(1, patch)).sum(-1).mean(0) / count[patch]
    return score


def tar_scores_by_slot(layer: LayerTokens, query: int, tokens_per_frame: int) -> Tensor:
    """The official code's TaR: the last ``query`` slots are the recent frames, laid out as
    (query // tokens_per_frame, tokens_per_frame); older slot ``s`` scores ``−mean cos`` to slot
    ``s mod tokens_per_frame`` of each of them (head-averaged; per head when given one head).
    Recent slots, and every slot when no whole recent frame is held, get −inf.
    """
    n = layer.n
    score = torch.full((n,), -math.inf, device=layer.keys.device)
    frames, older = query // tokens_per_frame, n - query
    if frames == 0 or older <= 0:
        return score
    keys = layer.keys.float()
    unit = keys / (keys.norm(dim=-1, keepdim=True) + 1e-9)
    heads, _, dim = unit.shape
    summed = unit[:, older : older + frames * tokens_per_frame].reshape(heads, frames, tokens_per_frame, dim).sum(1)
    slot = torch.arange(older, device=unit.device) % tokens_per_frame
    score[:older] = -(unit[:, :older] * summed.index_select(1, slot)).sum(-1).mean(0) / frames
    return score


def tar_picks(scores: Tensor, quota: int) -> Tensor:
    """(N,) bool: the ``quota`` highest TaR scores among the tokens that have one."""
    picked = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    picked[top_k_sorted(scores, min(max(quota, 0), int(torch.isfinite(scores).sum())))] = True
    return picked


def value_norms(values: Tensor) -> Tensor:
    """(N,) ``‖V‖₂`` per token, averaged over heads."""
    return values.float().norm(dim=-1).mean(0)


def pool_kernel(index: int, num_layers: int) -> int:
    """Pooling kernel of a layer: 7 / 5 / 3 / 1 by quartile of depth."""
    return POOL_KERNELS[min(len(POOL_KERNELS) - 1, len(POOL_KERNELS) * index // num_layers)]


def pool_sequence(scores: Tensor, kernel: int) -> Tensor:
    """1-D average over ``kernel`` neighbours along the token sequence, zero-padded, divided by ``kernel``."""
    padded = F.pad(scores.double(), (kernel // 2 + 1, kernel // 2))
    running = padded.cumsum(-1)
    return ((running[kernel:] - running[:-kernel]) / kernel).to(scores.dtype)


def pool_per_frame(scores: Tensor, layer: LayerTokens, tokens_per_frame: int, width: int, kernel: int) -> Tensor:
    """Average each grid token's score with its held neighbours in a ``kernel²`` window of its frame.

    Missing patches (evicted earlier) and the padding do not count; other tokens are unchanged.
    """
    grid = on_grid(layer, tokens_per_frame)
    frames, rank = torch.unique(layer.frame[grid], return_inverse=True)
    rows = -(-tokens_per_frame // width)
    cell = (rank, layer.patch[grid])
    total = torch.zeros(frames.numel(), rows * width, dtype=torch.float64, device=scores.device)
    total.index_put_(cell, scores[grid].double())
    count = torch.zeros_like(total).index_put_(cell, torch.ones_like(total[cell]))
    shape = (frames.numel(), rows, width)
    window_mean = box_sum(total.view(shape), kernel) / box_sum(count.view(shape), kernel)
    pooled = scores.clone()
    pooled[grid] = window_mean.reshape(frames.numel(), -1)[cell].to(scores.dtype)
    return pooled


def pool_slots(scores: Tensor, tokens_per_frame: int, width: int, dims: int, kernel: int,
               official: bool = False) -> Tensor:
    """Average pooling over the slot grid: slots, not token identities, as the official code reshapes.

    The first ``n // tokens_per_frame`` frame-sized blocks of slots, each laid out row-major in
    rows of ``width`` (``ceil(tokens_per_frame / width)`` rows; a last partial row is padded),
    pooled 2-D (``dims=2``, each block) or 3-D (across blocks too) with a ``kernel`` window;
    the ``n mod tokens_per_frame`` newest slots keep their scores. ``official``: the kernel
    becomes ``min(kernel, frames, rows, width)``, one less when even, nothing pooled below 2,
    and every window divides by ``kernel^dims`` (zero padding counts); otherwise a window
    divides by the slots it covers.
    """
    frames, rows = scores.shape[0] // tokens_per_frame, -(-tokens_per_frame // width)
    if official:
        kernel = min(kernel, frames, rows, width)
        kernel -= 1 if kernel % 2 == 0 else 0
    if frames == 0 or kernel < 2:
        return scores
    grid = frames * tokens_per_frame
    cells = torch.zeros(frames, rows * width, dtype=torch.float64, device=scores.device)
    cells[:, :tokens_per_frame] = scores[:grid].double().view(frames, tokens_per_frame)
    shape, axes = (frames, rows, width), (-1, -2, -3)[:dims]
    if official:
        divisor: Tensor | float = float(kernel**dims)
    else:
        held = torch.zeros_like(cells)
        held[:, :tokens_per_frame] = 1
        divisor = box_sum(held.view(shape), kernel, axes)
    window_mean = box_sum(cells.view(shape), kernel, axes) / divisor
    pooled = scores.clone()
    pooled[:grid] = window_mean.reshape(frames, -1)[:, :tokens_per_frame].reshape(-1).to(scores.dtype)
    return pooled


def box_sum(maps: Tensor, kernel: int, axes: tuple[int, ...] = (-1, -2)) -> Tensor:
    """Sum over the window of ``kernel`` cells along each of ``axes``, centred on each cell, zero-padded.

    The default sums a ``kernel × kernel`` window of (F, rows, cols) maps; ``(-1, -2, -3)`` a cube.
    """
    for dim in axes:
        padded = F.pad(maps.movedim(dim, -1), (kernel // 2 + 1, kernel // 2))
        running = padded.cumsum(-1)
        maps = (running[..., kernel:] - running[..., :-kernel]).movedim(-1, dim)
    return maps
