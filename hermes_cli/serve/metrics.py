"""Prometheus text exposition (format 0.0.4) of the server's counters and latency histograms."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Sequence

__all__ = ["Histogram", "Metrics", "render"]

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """Cumulative buckets, a sum and a count (thread-safe)."""

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.bounds, value)] += 1
            self.sum += value

    def lines(self, name: str) -> list[str]:
        with self._lock:
            counts, total_sum = list(self.counts), self.sum
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        out += [f"{name}_sum {total_sum!r}", f"{name}_count {running}"]
        return out


class Metrics:
    """The server's own counters (the streams' are read from the engine at scrape time)."""

    def __init__(self) -> None:
        self.chunk_prefill_s = Histogram()
        self.answer_ttft_s = Histogram()
        self.answer_s = Histogram()
        self.requests_refused: dict[int, int] = {}
        self._lock = threading.Lock()

    def refused(self, status: int) -> None:
        with self._lock:
            self.requests_refused[status] = self.requests_refused.get(status, 0) + 1


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(families: Iterable[tuple[str, str, str, list[tuple[dict[str, str], float]]]],
           histograms: Iterable[tuple[str, str, Histogram]]) -> str:
    """``families``: (name, type, help, [(labels, value)]); ``histograms``: (name, help, histogram)."""
    lines: list[str] = []
    for name, kind, text, samples in families:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            tag = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{tag}}} {value!r}" if tag else f"{name} {value!r}")
    for name, text, histogram in histograms:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} histogram", *histogram.lines(name)]
    return "\n".join(lines) + "\n"
