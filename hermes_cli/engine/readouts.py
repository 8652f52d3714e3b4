"""Process and accelerator memory readouts."""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass

import torch

from .records import MemoryStats


def rss_bytes() -> int | None:
    """Resident set size of this process now (Linux: /proc; elsewhere the peak as a fallback)."""
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return peak_rss_bytes()


def peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def memory_stats(device: torch.device) -> MemoryStats:
    """Process and (on a GPU) accelerator memory now."""
    gpu = device.type == "cuda" and torch.cuda.is_available()
    return MemoryStats(
        rss_bytes=rss_bytes(),
        peak_rss_bytes=peak_rss_bytes(),
        gpu_peak_bytes=torch.cuda.max_memory_allocated(device) if gpu else None,
        gpu_allocated_bytes=torch.cuda.memory_allocated(device) if gpu else None,
    )


@dataclass(frozen=True)
class MemoryMap:
    """Which moments of the stream each layer still holds: the data behind ``/memory`` and the
    web view's map (JSON-ready with ``to_json``).

    ``units``: each stream unit's (frame, or Qwen-VL temporal patch) start and end time;
    ``shares[layer]``: unit index -> share of that unit's tokens the layer still holds (units
    with none left out); ``groups``: the policy's layer groups; ``summary[layer]``: summary tokens
    held; ``recent_from_s``: where the newest chunk's frames start (the recent window)."""

    units: list[tuple[float, float]]
    shares: list[dict[int, float]]
    groups: dict[str, list[int]]
    summary: list[int]
    frames_per_unit: int
    recent_from_s: float | None

    def to_json(self) -> dict:
        return {
            "units": [[round(a, 3), round(b, 3)] for a, b in self.units],
            "layers": [{"layer": i, "held": {str(u): round(s, 4) for u, s in sorted(shares.items())},
                        "summary_tokens": self.summary[i]} for i, shares in enumerate(self.shares)],
            "groups": self.groups,
            "frames_per_unit": self.frames_per_unit,
            "recent_from_s": self.recent_from_s,
        }


def memory_map(session) -> MemoryMap:
    """The ``MemoryMap`` of ``session`` now (run on the engine thread)."""
    from .cache import KIND_SUMMARY, KIND_VIDEO

    per_unit = max(1, session.tokens_per_unit or 1)
    shares: list[dict[int, float]] = []
    summary: list[int] = []
    for layer in range(session.cache.num_layers):
        if session.cache.stream_layers[layer].meta is None:
            shares.append({})
            summary.append(0)
            continue
        meta = session.cache.meta(layer)
        units = meta.frame[meta.kind == KIND_VIDEO].tolist()  # over all heads, where a layer keeps a set per head
        counts: dict[int, int] = {}
        for u in units:
            counts[u] = counts.get(u, 0) + 1
        shares.append({u: min(1.0, n / (per_unit * meta.heads)) for u, n in counts.items()})
        summary.append(int((meta.head(0).kind == KIND_SUMMARY).sum()))
    times = list(session.unit_times)
    step = session.adapter.frames_per_unit / session.config.fps
    spans = [(t, times[i + 1] if i + 1 < len(times) else t + step) for i, t in enumerate(times)]
    chunk_units = max(1, session.config.chunk_frames // session.adapter.frames_per_unit)
    recent = spans[-min(chunk_units, len(spans))][0] if spans else None  # a stream shorter than a chunk: all of it
    return MemoryMap(spans, shares, session.policy.layer_groups(len(shares)), summary,
                     session.adapter.frames_per_unit, recent)
