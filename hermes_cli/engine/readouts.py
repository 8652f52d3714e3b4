"""Memory readouts, their one owner: the process's resident set (now, peak, reset), the
accelerator's, and the memory map of a stream (what each layer holds)."""

from __future__ import annotations

import gc
import resource
import sys
from dataclasses import dataclass

import torch

from .records import MemoryStats


def _status_bytes(field: str) -> int | None:
    """A ``/proc/self/status`` size (``VmRSS``, ``VmHWM``) in bytes; None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def rss_bytes() -> int | None:
    """Resident set size of this process now (Linux: /proc; elsewhere the peak as a fallback)."""
    now = _status_bytes("VmRSS")
    return now if now is not None else peak_rss_bytes()


def peak_rss_bytes() -> int:
    """The process's peak resident set: since the last ``reset_peak_memory`` on Linux, else ever."""
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    most = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return most if sys.platform == "darwin" else most * 1024


def release_free_memory() -> None:
    """Give freed memory back to the OS (glibc ``malloc_trim``), so that a reading (and the next
    peak) starts from what is really held, not from the allocator's cached high-water mark."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def current_memory_bytes(device: torch.device) -> int:
    """GPU: allocated bytes; CPU: the resident set now (0 where unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return _status_bytes("VmRSS") or 0


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak: CUDA peak stats, or (Linux) the process's peak RSS. False if it cannot.
    Freed memory is returned to the OS first, so each measured run's peak is its own."""
    release_free_memory()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """(bytes, kind): GPU max_memory_allocated (``gpu``), else the peak RSS since the last reset (``rss``)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "gpu"
    return peak_rss_bytes(), "rss"


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

    def group_held(self, layers: list[int]) -> dict[int, float]:
        """Unit index -> the mean share of that unit's tokens the ``layers`` still hold (a layer
        that holds none of it counts 0; units no layer holds left out): one row of the map."""
        kept = set().union(*(self.shares[i] for i in layers)) if layers else set()
        return {u: sum(self.shares[i].get(u, 0.0) for i in layers) / len(layers) for u in sorted(kept)}

    def group_rows(self) -> list[dict]:
        """Per layer group (in the policy's order, empty groups left out): its layers, each
        unit's mean share held (``group_held``, unrounded), the units kept and the mean summary
        tokens per layer — what the web view's map draws and ``/memory`` shades."""
        rows = []
        for role, layers in self.groups.items():
            if not layers:
                continue
            held = self.group_held(layers)
            rows.append({"group": role, "layers": list(layers), "held": {str(u): s for u, s in held.items()},
                         "units_kept": len(held),
                         "summary_tokens": round(sum(self.summary[i] for i in layers) / len(layers), 2)})
        return rows


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
