"""Process and accelerator memory readouts."""

from __future__ import annotations

import os
import resource
import sys

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
