"""Where tokens sit: position layouts, the video clock, compaction (torch only).

Layout: ``(N, A)`` int64, one row per token, one column per position axis — ``A = 1`` for 1-D
RoPE, ``A = 3`` (t, h, w) for M-RoPE. transformers takes ``(A, batch, N)``; see
:func:`to_model_position_ids` / :func:`from_model_position_ids`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VideoClock:
    """Where the next video unit's positions start (M-RoPE: per axis; 1-D: ``t`` only).

    A unit ``u`` gets temporal position ``t_origin + floor((u - unit_origin) * interval)``; its
    cells get ``hw_origin + row`` / ``hw_origin + col``.
    """

    t_origin: int
    hw_origin: int
    unit_origin: int
    interval: float


def time_interval(tokens_per_second: float, temporal_patch: int, fps: float) -> float:
    """Temporal position step per unit for Qwen-VL M-RoPE: tokens/s × seconds per temporal patch."""
    return tokens_per_second * (temporal_patch / fps)


def compact_positions(
    positions: torch.Tensor, offset: int | torch.Tensor = 0, step: float | Sequence[float] = 1.0
) -> torch.Tensor:
    """Re-index positions densely: ``new = offset + floor(dense_rank(old) × step)``, per axis.

    Args:
        positions: int ``(N, A)`` (or ``(N,)``) retained positions, any order.
        offset: int, or int ``(A,)`` per axis — the first free position after the kept prefix.
        step: float, or one per axis — the axis's native spacing. 1 everywhere gives plain dense
            ranks. For M-RoPE video the temporal axis advances by ``interval`` (tokens/s × 2/fps)
            per unit; giving it as the step keeps that spacing, so positions laid out as
            ``offset + floor(u × interval)`` with nothing evicted come back unchanged. The
            product is taken in float32 and truncated, as transformers computes it.
    Returns:
        int64 of the same shape. Per axis, equal old values map to equal new values and order
        is preserved (``a < b`` ⇒ ``new(a) <= new(b)``, strictly when the step is ≥ 1); the
        distinct values of an axis become ``offset + floor(k × step)``, k = 0, 1, …. Already
        compact positions come back unchanged.
    """
    positions = torch.as_tensor(positions)
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise TypeError(f"positions must be an integer tensor, got {positions.dtype}")
    squeeze = positions.ndim == 1
    p = (positions[:, None] if squeeze else positions).to(torch.int64)
    if p.ndim != 2:
        raise ValueError(f"positions must be (N, A), got {tuple(positions.shape)}")
    off = torch.as_tensor(offset, dtype=torch.int64, device=p.device).reshape(-1)
    if off.numel() not in (1, p.shape[1]):
        raise ValueError(f"offset has {off.numel()} entries for {p.shape[1]} axes")
    off = off.expand(p.shape[1])
    steps = torch.as_tensor(step, dtype=torch.float32).reshape(-1)
    if steps.numel() not in (1, p.shape[1]) or not bool((steps > 0).all()):
        raise ValueError(f"step must be positive, one value or one per axis; got {step}")
    steps = steps.expand(p.shape[1])
    out = torch.empty_like(p)
    for a in range(p.shape[1]):
        _, rank = torch.unique(p[:, a], sorted=True, return_inverse=True)
        spaced = rank if float(steps[a]) == 1.0 else scaled_positions(rank, float(steps[a]))
        out[:, a] = spaced + off[a]
    return out[:, 0] if squeeze else out


def scaled_positions(index: torch.Tensor, step: float) -> torch.Tensor:
    """floor(index × step) exactly as transformers computes temporal positions: a float32
    product, truncated (Qwen-VL's ``(arange(t) * time_interval).long()``)."""
    return (index.to(torch.float32) * torch.tensor(step, dtype=torch.float32, device=index.device)).long()


def next_position_after(positions: torch.Tensor, floor: int = 0) -> int:
    """The next free text position: ``max(floor, max over all tokens and axes + 1)``.

    Qwen text after vision tokens continues from max + 1 on *all* axes, so one integer serves
    every axis. ``floor`` is the answer for an empty set (e.g. the prefix length). Returns a
    Python int (a device sync if ``positions`` lives on an accelerator; keep positions on CPU).
    """
    positions = torch.as_tensor(positions)
    if positions.numel() == 0:
        return int(floor)
    return max(int(floor), int(positions.max()) + 1)


def text_positions(start: int, n: int, num_axes: int = 1, device=None) -> torch.Tensor:
    """Positions of ``n`` text tokens from ``start``: int64 ``(n, num_axes)``, all axes equal."""
    return torch.arange(start, start + n, dtype=torch.int64, device=device)[:, None].expand(
        n, num_axes
    ).contiguous()


def to_model_position_ids(positions: torch.Tensor) -> torch.Tensor:
    """``(N, A)`` → transformers' ``position_ids`` for batch 1: ``(1, N)`` if A == 1, else ``(A, 1, N)``."""
    positions = torch.as_tensor(positions)
    if positions.ndim == 1:
        positions = positions[:, None]
    if positions.shape[1] == 1:
        return positions[:, 0][None, :].contiguous()
    return positions.T[:, None, :].contiguous()


def from_model_position_ids(position_ids: torch.Tensor, batch_index: int = 0) -> torch.Tensor:
    """transformers' ``(B, N)`` or ``(A, B, N)`` position_ids → ``(N, A)`` for one batch row.

    A 4-row M-RoPE tensor (text row first, as packed by ``get_rope_index``) drops the text row.
    """
    position_ids = torch.as_tensor(position_ids)
    if position_ids.ndim == 2:
        return position_ids[batch_index][:, None].clone()
    if position_ids.ndim != 3:
        raise ValueError(f"position_ids must be (B, N) or (A, B, N), got {tuple(position_ids.shape)}")
    if position_ids.shape[0] == 4:
        position_ids = position_ids[1:]
    return position_ids[:, batch_index, :].T.contiguous()
