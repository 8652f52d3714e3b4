"""Benchmarks: how time to first token and memory behave as a stream grows, per memory policy.

For each policy, ONE stream is fed frame by frame; at each step (e.g. 16, 64, 256, 512 frames)
the stream pauses and the same question is answered ``warmup`` + ``repeats`` times with
``Session.answer`` — which leaves the cache exactly as it was — and the medians are recorded.
The stream then continues to the next step: lengths are measured on one continuing stream, not
by restarting per length, so a step costs only the frames since the previous one.

Each record holds: ``ttft_ms`` (question in → first token out, median), ``tpot_ms`` (time per
output token after the first, median; answers always run to ``max_new_tokens``: end-of-sequence
is ignored while benchmarking), ``peak_memory_bytes`` (GPU: ``torch.cuda.max_memory_allocated``
since the policy's stream began; CPU: the process's peak resident set size since then, reset per
policy where Linux allows, so it includes the weights), ``kv_bytes`` (the keys and values held),
``cache_tokens`` (tokens per layer: prefix + stream), ``ingest_ms_per_frame`` (encode + prefill +
compression per frame, over the frames since the previous step), ``compress_ms_per_chunk`` (the
policy's compression time per chunk, averaged over the chunks since the previous step, chunks
without a compression counting zero) and ``compress_fraction`` (compression time / prefill time
over those chunks).
"""

from __future__ import annotations

import gc
import math
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

DEFAULT_STEPS = (16, 64, 256, 512)
DEFAULT_QUESTION = "What is happening in the video?"
RECORD_FIELDS = (
    "policy", "frames", "ttft_ms", "tpot_ms", "peak_memory_bytes", "kv_bytes", "cache_tokens",
    "ingest_ms_per_frame", "compress_ms_per_chunk", "compress_fraction",
)


@dataclass
class BenchRecord:
    """One policy at one stream length (the first ten fields are the documented JSON record)."""

    policy: str
    frames: int
    ttft_ms: float
    tpot_ms: float | None
    peak_memory_bytes: int
    kv_bytes: int
    cache_tokens: int
    ingest_ms_per_frame: float
    compress_ms_per_chunk: float
    compress_fraction: float
    stream_tokens: int = 0  # video tokens fed so far (what the full policy would hold)
    memory_kind: str = "rss"  # "gpu" (max_memory_allocated) or "rss" (process peak resident set)
    compressions: int = 0
    ttft_samples_ms: list[float] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        for key in ("ttft_ms", "tpot_ms", "ingest_ms_per_frame", "compress_ms_per_chunk"):
            if d[key] is not None:
                d[key] = round(d[key], 3)
        d["compress_fraction"] = round(d["compress_fraction"], 5)
        d["ttft_samples_ms"] = [round(x, 3) for x in d["ttft_samples_ms"]]
        return d


# -- arguments ------------------------------------------------------------------------------------
def parse_steps(text: str) -> list[int]:
    """``"512"`` → the default steps up to 512 (16, 64, 256, 512); ``"16,64,256"`` → those steps."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--frames expects a number or a comma-separated list of numbers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"--frames needs positive frame counts, got {text!r}")
    if len(values) == 1:
        top = values[0]
        return [s for s in DEFAULT_STEPS if s < top] + [top]
    return sorted(set(values))


def parse_policies(text: str) -> list[str]:
    names = [p.strip() for p in str(text).split(",") if p.strip()]
    if not names:
        raise ValueError("--policies needs at least one policy name")
    from policies import policy_class

    for name in names:
        policy_class(name)  # ValueError naming the choices
    return list(dict.fromkeys(names))


# -- frames -----------------------------------------------------------------------------------------
def synthetic_frames(size: tuple[int, int] = (360, 640), fps: float = 1.0, seed: int = 0) -> Iterator[tuple[np.ndarray, float]]:
    """Endless (frame, timestamp): a moving coloured square on a noisy background, ``size`` = (H, W)."""
    rng = np.random.default_rng(seed)
    h, w = size
    side = max(4, min(h, w) // 5)
    background = rng.integers(0, 40, size=(h, w, 3), dtype=np.uint8)
    i = 0
    while True:
        frame = background.copy()
        x = (i * 13) % max(1, w - side)
        y = (i * 7) % max(1, h - side)
        frame[y : y + side, x : x + side] = [(50 * i) % 256, 200, 255 - (30 * i) % 256]
        yield frame, i / fps
        i += 1


def video_frames(path: str, fps: float) -> Iterator[tuple[np.ndarray, float]]:
    """(frame, timestamp) from a video file sampled at ``fps`` (SourceError / ValueError if it cannot)."""
    from ..sources import open_source

    source = open_source(path, fps)
    with source:
        for frame in source:
            yield frame.image, frame.timestamp


# -- memory -----------------------------------------------------------------------------------------
def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak: CUDA peak stats, or (Linux) the process's peak RSS. False if it cannot."""
    gc.collect()
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
    """(bytes, kind): GPU max_memory_allocated, else the peak RSS since the last reset."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "gpu"
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, "rss"
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (peak if sys.platform == "darwin" else peak * 1024), "rss"


# -- the adapter as the benchmark drives it -------------------------------------------------------------
class BenchAdapter:
    """The model adapter with two benchmark changes, everything else passed through.

    Answers run to ``max_new_tokens`` (no end-of-sequence token), so TPOT is always measured;
    with ``synthetic_vision`` each chunk gets random visual embeddings of the real token layout
    (``synthetic_encode``) instead of running the vision tower.
    """

    def __init__(self, adapter, synthetic_vision: bool = False) -> None:
        if synthetic_vision and not hasattr(adapter, "synthetic_encode"):
            raise ValueError(f"{adapter.family} has no synthetic vision mode")
        self._adapter = adapter
        self.synthetic_vision = synthetic_vision

    def __getattr__(self, name):
        return getattr(self._adapter, name)

    @property
    def eos_token_ids(self) -> set[int]:
        return set()

    def encode(self, frames: np.ndarray, first_unit: int, times=None):
        if self.synthetic_vision:
            return self._adapter.synthetic_encode(frames.shape[0], first_unit, tuple(frames.shape[1:3]))
        return self._adapter.encode(frames, first_unit, times)


# -- measuring -------------------------------------------------------------------------------------------
def median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def measure_answers(session, question: str, *, repeats: int, warmup: int, max_new_tokens: int):
    """(median TTFT ms, median TPOT ms, TTFT samples): warm-up answers first, then ``repeats``.

    Every answer leaves the cache as it was; this is checked.
    """
    before = (session.cache.length, session.cache.kv_bytes(), session.cache.next_id)
    for _ in range(warmup):
        session.answer(question, max_new_tokens=max_new_tokens)
    ttft, tpot = [], []
    for _ in range(repeats):
        a = session.answer(question, max_new_tokens=max_new_tokens)
        ttft.append(a.ttft_ms)
        tpot.append(a.tpot_ms)
    after = (session.cache.length, session.cache.kv_bytes(), session.cache.next_id)
    if before != after:  # pragma: no cover - guarded by the session's own tests
        raise RuntimeError(f"answering changed the cache: {before} → {after}")
    return median(ttft), median(tpot), [t for t in ttft if t is not None]


ProgressFn = Callable[[dict], None]


def run_policy(adapter, policy_name: str, steps: list[int], *, budget: int | None, chunk: int, fps: float,
               frames: Iterator[tuple[np.ndarray, float]], repeats: int, warmup: int, max_new_tokens: int,
               question: str = DEFAULT_QUESTION, policy_options: dict | None = None,
               progress: ProgressFn | None = None) -> list[BenchRecord]:
    """One continuing stream under ``policy_name``, paused at each step to answer; a record per step."""
    from policies import make_policy

    from ..engine.session import Session, SessionConfig

    device = adapter.device
    config = SessionConfig(budget=budget, chunk_frames=chunk, fps=fps, max_new_tokens=max_new_tokens, history=False)
    reset_peak_memory(device)
    session = Session(adapter, make_policy(policy_name, **(policy_options or {})), config)
    records: list[BenchRecord] = []
    fed = 0
    stream_tokens = 0
    notify = progress or (lambda event: None)
    try:
        for step in steps:
            reports, ingest_s, seg_frames = [], 0.0, 0
            while fed < step:
                try:
                    frame, ts = next(frames)
                except StopIteration:
                    raise ValueError(
                        f"the video ran out after {fed} frames at {fps:g} fps; ask for fewer --frames or a higher --fps"
                    ) from None
                t0 = time.perf_counter()
                reports += session.ingest([frame], [ts])
                ingest_s += time.perf_counter() - t0
                fed += 1
                seg_frames += 1
                notify({"phase": "ingest", "policy": policy_name, "frames": fed, "step": step})
            t0 = time.perf_counter()
            last = session.flush()  # a step that is not a whole number of chunks ends its partial chunk
            ingest_s += time.perf_counter() - t0
            if last is not None:
                reports.append(last)
            stream_tokens += sum(r.tokens for r in reports)
            notify({"phase": "answer", "policy": policy_name, "frames": fed, "step": step})
            ttft, tpot, samples = measure_answers(session, question, repeats=repeats, warmup=warmup,
                                                  max_new_tokens=max_new_tokens)
            peak, kind = peak_memory_bytes(device)
            prefill = sum(r.prefill_ms for r in reports)
            compress = sum(r.compress_ms for r in reports)
            records.append(BenchRecord(
                policy=policy_name,
                frames=fed,
                ttft_ms=ttft if ttft is not None else math.nan,
                tpot_ms=tpot,
                peak_memory_bytes=peak,
                kv_bytes=session.cache.kv_bytes(),
                cache_tokens=session.cache.length,
                ingest_ms_per_frame=ingest_s * 1e3 / max(seg_frames, 1),
                compress_ms_per_chunk=compress / max(len(reports), 1),
                compress_fraction=compress / prefill if prefill > 0 else 0.0,
                stream_tokens=stream_tokens,
                memory_kind=kind,
                compressions=session.compressions,
                ttft_samples_ms=samples,
            ))
            notify({"phase": "measured", "policy": policy_name, "frames": fed, "step": step, "record": records[-1]})
    finally:
        del session
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return records


def run_bench(adapter, policies: list[str], steps: list[int], *, budget: int | None, chunk: int = 16,
              fps: float = 1.0, repeats: int = 3, warmup: int = 1, max_new_tokens: int = 16,
              frames: Callable[[], Iterator[tuple[np.ndarray, float]]] | None = None,
              synthetic_vision: bool = False, question: str = DEFAULT_QUESTION,
              policy_options: dict[str, dict] | None = None, progress: ProgressFn | None = None) -> list[BenchRecord]:
    """Benchmark each policy on one growing stream; records in policy order, then stream length.

    ``frames`` makes a fresh (frame, timestamp) iterator per policy (default: synthetic frames at
    ``fps``); ``synthetic_vision`` skips the vision tower (random embeddings, real layout).
    """
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if warmup < 0:
        raise ValueError("--warmup cannot be negative")
    if max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be at least 1")
    steps = sorted(set(steps))
    bench_adapter = BenchAdapter(adapter, synthetic_vision)
    make_frames = frames or (lambda: synthetic_frames(fps=fps))
    records: list[BenchRecord] = []
    for name in policies:
        records += run_policy(
            bench_adapter, name, steps, budget=budget, chunk=chunk, fps=fps, frames=make_frames(),
            repeats=repeats, warmup=warmup, max_new_tokens=max_new_tokens, question=question,
            policy_options=(policy_options or {}).get(name), progress=progress,
        )
    return records


# -- summaries ---------------------------------------------------------------------------------------------
@dataclass
class PolicySummary:
    policy: str
    frames_fewest: int
    frames_most: int
    ttft_ratio: float
    memory_ratio: float
    kv_ratio: float


def summarise(records: list[BenchRecord]) -> list[PolicySummary]:
    """Per policy: TTFT(most frames)/TTFT(fewest), peak memory and KV-cache bytes likewise."""
    out = []
    for name in dict.fromkeys(r.policy for r in records):
        rows = sorted((r for r in records if r.policy == name), key=lambda r: r.frames)
        first, last = rows[0], rows[-1]
        out.append(PolicySummary(
            policy=name, frames_fewest=first.frames, frames_most=last.frames,
            ttft_ratio=_ratio(last.ttft_ms, first.ttft_ms),
            memory_ratio=_ratio(last.peak_memory_bytes, first.peak_memory_bytes),
            kv_ratio=_ratio(last.kv_bytes, first.kv_bytes),
        ))
    return out


def _ratio(a, b) -> float:
    return float(a) / float(b) if b else math.nan


def ttft_versus(records: list[BenchRecord], policy: str, other: str) -> float | None:
    """TTFT of ``policy`` over that of ``other`` at the longest stream both were measured at."""
    a = {r.frames: r.ttft_ms for r in records if r.policy == policy}
    b = {r.frames: r.ttft_ms for r in records if r.policy == other}
    common = sorted(set(a) & set(b))
    return _ratio(a[common[-1]], b[common[-1]]) if common else None


# -- plotting --------------------------------------------------------------------------------------------
def plot_figure(records: list[BenchRecord], title: str = ""):
    """A matplotlib figure: TTFT, peak memory and KV-cache size against frames, one line per policy."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (
        ("TTFT (ms)", lambda r: r.ttft_ms),
        ("peak memory (MiB)" + (" — GPU" if records and records[0].memory_kind == "gpu" else " — process RSS"),
         lambda r: r.peak_memory_bytes / 2**20),
        ("KV cache (MiB)", lambda r: r.kv_bytes / 2**20),
    )
    for ax, (label, value) in zip(axes, panels, strict=True):
        for name in dict.fromkeys(r.policy for r in records):
            rows = sorted((r for r in records if r.policy == name), key=lambda r: r.frames)
            ax.plot([r.frames for r in rows], [value(r) for r in rows], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("frames streamed")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_records(records: list[BenchRecord], path: str | os.PathLike, title: str = "") -> None:
    """Write the figure of ``plot_figure`` to ``path`` (PNG, or any format matplotlib knows)."""
    import matplotlib.pyplot as plt

    fig = plot_figure(records, title)
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def matplotlib_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None
