"""The one owner of a stream's positions: video clock, next free position, limit, re-indexing.

Positions never come from the cache's physical length (evicted tokens leave gaps). The adapter
says how a chunk lays out (``chunk_positions``: 1-D consecutive, or M-RoPE t/h/w from the
clock); this tracker decides where it starts, re-indexes when the model's limit comes near, and
refuses to pass the limit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import HermesError
from ..models.base import EncodedChunk, ModelAdapter
from ..positions.layout import VideoClock, compact_positions, next_position_after
from .cache import StreamingCache


class PositionLimitError(HermesError, RuntimeError):
    """The stream would pass the model's position limit."""


class PositionTracker:
    """Positions of one stream on one cache.

    ``mode``: ``lazy`` compacts only when the next chunk would pass ``limit - margin``;
    ``eager`` after every compression (the session calls ``reindex``); ``off`` never.
    """

    def __init__(self, adapter: ModelAdapter, cache: StreamingCache, fps: float, mode: str,
                 margin: int | None = None, spacing: str = "rank") -> None:
        self.adapter = adapter
        self.cache = cache
        self.fps = fps
        self.mode = mode
        self.spacing = spacing
        self.limit = adapter.max_positions
        self.margin = margin if margin is not None else min(1024, self.limit // 4)
        self.reindex_count = 0
        self.clock: VideoClock = adapter.video_clock(0, fps)

    def start_video(self) -> None:
        """Start the video clock where the next token goes (call once, after the prefix)."""
        self.clock = self.adapter.video_clock(self.next(), self.fps)

    def next(self) -> int:
        """Where text appended now would start: the largest position held + 1, on every axis."""
        held = self.cache.max_positions()
        return 0 if held is None else next_position_after(held)

    def next_per_axis(self) -> int | list[int]:
        nxt = self.next()
        return nxt if self.adapter.position_axes == 1 else [nxt] * self.adapter.position_axes

    def text(self, n: int, start: int | None = None) -> Tensor:
        """Positions (n, A) of n text tokens appended after the cache (or from ``start``)."""
        return self.adapter.text_positions(self.next() if start is None else start, n)

    def for_chunk(self, chunk: EncodedChunk, units_seen: int, *, bounded: bool) -> Tensor:
        """Positions of a chunk appended now; re-indexes first when lazy and near the limit.

        ``bounded``: whether the policy caps the memory (only used to name the way out).
        """
        positions = self.adapter.chunk_positions(chunk, self.clock, self.next())
        if self.mode == "lazy" and int(positions.max()) >= self.limit - self.margin:
            self.reindex(units_seen)
            positions = self.adapter.chunk_positions(chunk, self.clock, self.next())
        if int(positions.max()) >= self.limit:
            if self.mode == "off":
                hint = "use --reindex lazy or eager"
            elif not bounded:
                hint = "this policy keeps every token: use one with a budget (e.g. --policy hermes)"
            else:
                hint = "the memory holds more tokens than the model has positions: set a smaller --budget"
            raise PositionLimitError(f"the stream reached the model's position limit ({self.limit}) — {hint}")
        return positions

    def reindex(self, units_seen: int) -> None:
        """Compact positions: the prefix stays, stream tokens get offset + dense rank per axis.

        ``spacing="rank"`` (paper Eq. 11, official code): plain dense rank on every axis, and the
        next unit starts right after the compacted ones. ``"interval"`` (ours): the temporal axis
        of M-RoPE keeps its native spacing (rank × interval), so a stream with nothing evicted
        keeps its positions. Cached keys are rotated by the position delta in place (no
        recomputation).
        """
        cache = self.cache
        p = cache.prefix_length()
        spaced = self.spacing == "interval"
        steps = [self.clock.interval if spaced else 1.0] + [1.0] * (self.adapter.position_axes - 1)
        distinct_units = 0
        for layer in range(cache.num_layers):
            old = cache.meta(layer).select(slice(p, None)).positions
            # A layer holding a set per head ranks the union of its heads' positions: one token,
            # one position, whichever heads keep it.
            new = compact_positions(old.flatten(0, -2), p, steps).view(old.shape)
            cache.reposition(layer, new, self.adapter.rotary)
            distinct_units = max(distinct_units, int(torch.unique(new[..., 0]).numel()))
        self.reindex_count += 1
        if spaced:
            self.clock = VideoClock(p, p, units_seen - distinct_units, self.clock.interval)
        else:
            self.clock = VideoClock(p + distinct_units, p, units_seen, self.clock.interval)

    # -- snapshots ------------------------------------------------------------------------------
    def state(self) -> dict:
        """What this tracker adds to the cache's positions (JSON-ready): the clock, the re-index count."""
        c = self.clock
        return {
            "clock": {"t_origin": int(c.t_origin), "hw_origin": int(c.hw_origin),
                      "unit_origin": int(c.unit_origin), "interval": float(c.interval)},
            "reindex_count": int(self.reindex_count),
        }

    def restore(self, state: dict) -> None:
        """Take back a ``state()`` (the cache's positions come with the cache)."""
        c = state["clock"]
        self.clock = VideoClock(int(c["t_origin"]), int(c["hw_origin"]), int(c["unit_origin"]), float(c["interval"]))
        self.reindex_count = int(state["reindex_count"])
