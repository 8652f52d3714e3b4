"""Benchmarks: how time to first token and memory behave as a stream grows, per memory policy.

For each policy, ONE stream is fed frame by frame; at each step (e.g. 16, 64, 256, 512 frames)
the stream pauses and the same question is answered ``warmup`` + ``repeats`` times with
``Session.answer`` — which leaves the cache exactly as it was — and the medians are recorded.
The stream then continues to the next step: lengths are measured on one continuing stream, not
by restarting per length, so a step costs only the frames since the previous one.

Each record holds: ``ttft_ms`` (question in → first token out, median), ``tpot_ms`` (time per
output token after the first, median; answers always run to ``max_new_tokens``: end-of-sequence
is ignored while benchmarking), ``peak_memory_bytes`` (GPU: ``torch.cuda.max_memory_allocated``
since the policy's stream began; CPU: the process's peak resident set size since then, so it
includes the weights — before each policy, memory freed by the previous one is handed back to the
OS and the peak is reset, so each policy's peak is its own), ``kv_bytes`` (the keys and values held),
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
from typing import cast

import numpy as np
import torch

from .. import defaults
from ..errors import EXIT_INTERRUPTED, HermesError
from ..models.base import ModelAdapter

DEFAULT_QUESTION = defaults.BENCH_QUESTION
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
    # over the chunks since the previous step (for the per-policy summary and --profile)
    chunks: int = 0
    folded_chunks: int = 0  # chunks whose pseudo-queries rode in their own prefill
    prefill_ms_total: float = 0.0  # vision encoding + prefill
    compress_ms_total: float = 0.0  # separate pseudo-query pass + selection + compaction
    ingest_s: float = 0.0  # wall time of ingesting the frames since the previous step (decoding included)
    stream_s: float = 0.0  # stream time those frames cover (frames / fps)
    decode_ms_total: float = 0.0  # waiting for frames (decoding ahead in a thread overlaps the rest)
    encode_ms_total: float = 0.0  # vision encoding
    pseudo_query_ms_total: float = 0.0  # separate pseudo-query passes (folded ones are in prefill)
    baseline_memory_bytes: int = 0  # resident/allocated memory when the policy's stream began

    def to_json(self) -> dict:
        d = asdict(self)
        for key in ("ttft_ms", "tpot_ms", "ingest_ms_per_frame", "compress_ms_per_chunk"):
            if d[key] is not None:
                d[key] = round(d[key], 3)
        d["compress_fraction"] = round(d["compress_fraction"], 5)
        for key in ("prefill_ms_total", "compress_ms_total", "ingest_s", "stream_s", "decode_ms_total",
                    "encode_ms_total", "pseudo_query_ms_total"):
            d[key] = round(d[key], 3)
        d["ttft_samples_ms"] = [round(x, 3) for x in d["ttft_samples_ms"]]
        return d


# -- arguments ------------------------------------------------------------------------------------
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
def release_free_memory() -> None:
    """Give memory freed by an earlier policy back to the OS (glibc ``malloc_trim``), so the next
    policy's peak resident set starts from what is really held, not from a cached high-water mark."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def current_memory_bytes(device: torch.device) -> int:
    """GPU: allocated bytes; CPU: the resident set now (Linux ``VmRSS``; 0 where unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak: CUDA peak stats, or (Linux) the process's peak RSS. False if it cannot.

    Freed memory is returned to the OS first, so each policy's peak is its own."""
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
def bench_adapter(adapter: ModelAdapter, synthetic_vision: bool = False) -> ModelAdapter:
    """``adapter`` as the benchmark drives it (see ``BenchAdapter``), typed as what it stands in for."""
    return cast(ModelAdapter, BenchAdapter(adapter, synthetic_vision))


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


class BenchInterrupted(HermesError):
    """Ctrl-C during a benchmark: ``records`` holds the steps measured before it."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, records: list) -> None:  # BenchRecord, or QuestionRecord for --questions
        super().__init__("interrupted")
        self.records = records


def run_policy(adapter, policy_name: str, steps: list[int], *, budget: int | None, chunk: int, fps: float,
               frames: Iterator[tuple[np.ndarray, float]], repeats: int, warmup: int, max_new_tokens: int,
               question: str = DEFAULT_QUESTION, policy_options: dict | None = None,
               progress: ProgressFn | None = None, records: list[BenchRecord] | None = None,
               pseudo_query: str = defaults.PSEUDO_QUERY) -> list[BenchRecord]:
    """One continuing stream under ``policy_name``, paused at each step to answer; a record per step.

    Records are appended to ``records`` (if given) as soon as they are measured, so a caller
    interrupted by Ctrl-C still has them.
    """
    from policies import make_policy

    from ..engine.session import Session, SessionConfig

    device = adapter.device
    config = SessionConfig(budget=budget, chunk_frames=chunk, fps=fps, max_new_tokens=max_new_tokens, history=False,
                           pseudo_query=pseudo_query)
    reset_peak_memory(device)
    baseline = current_memory_bytes(device)
    session = Session(adapter, make_policy(policy_name, **(policy_options or {})), config)
    records = [] if records is None else records
    first = len(records)
    fed = 0
    stream_tokens = 0
    notify = progress or (lambda event: None)
    try:
        for step in steps:
            reports, ingest_s, decode_s, seg_frames = [], 0.0, 0.0, 0
            while fed < step:
                t0 = time.perf_counter()
                try:
                    frame, ts = next(frames)
                except StopIteration:
                    raise ValueError(
                        f"the video ran out after {fed} frames at {fps:g} fps; ask for fewer --frames or a higher --fps"
                    ) from None
                t1 = time.perf_counter()
                reports += session.ingest([frame], [ts])
                t2 = time.perf_counter()
                decode_s += t1 - t0
                ingest_s += t2 - t0
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
                chunks=len(reports),
                folded_chunks=sum(r.folded for r in reports),
                prefill_ms_total=prefill,
                compress_ms_total=compress,
                ingest_s=ingest_s,
                stream_s=seg_frames / fps,
                decode_ms_total=decode_s * 1e3,
                encode_ms_total=sum(r.encode_ms for r in reports),
                pseudo_query_ms_total=sum(r.pseudo_query_ms for r in reports),
                baseline_memory_bytes=baseline,
            ))
            notify({"phase": "measured", "policy": policy_name, "frames": fed, "step": step, "record": records[-1]})
    finally:
        del session
        release_free_memory()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return records[first:]


def warm_up(adapter, chunk: int, frames: Iterator[tuple[np.ndarray, float]], fps: float) -> None:
    """Stream one unmeasured chunk and answer once, then forget it all, so that the first policy
    does not pay the model's first-run costs (thread pools, kernel selection, allocator growth)
    that the others are spared."""
    from policies import make_policy

    from ..engine.session import Session, SessionConfig

    session = Session(adapter, make_policy("full"), SessionConfig(budget=None, chunk_frames=chunk, fps=fps,
                                                                   max_new_tokens=2, history=False))
    try:
        for _ in range(chunk):
            frame, ts = next(frames)
            session.ingest([frame], [ts])
        session.flush()
        measure_answers(session, DEFAULT_QUESTION, repeats=1, warmup=0, max_new_tokens=2)
    except StopIteration:
        pass  # a stream shorter than a chunk: the measured steps will say so
    finally:
        del session
        release_free_memory()


def run_bench(adapter, policies: list[str], steps: list[int], *, budget: int | None, chunk: int = 16,
              fps: float = 1.0, repeats: int = 3, warmup: int = 1, max_new_tokens: int = 16,
              frames: Callable[[], Iterator[tuple[np.ndarray, float]]] | None = None,
              synthetic_vision: bool = False, question: str = DEFAULT_QUESTION,
              policy_options: dict[str, dict] | None = None, progress: ProgressFn | None = None,
              pseudo_query: str = defaults.PSEUDO_QUERY) -> list[BenchRecord]:
    """Benchmark each policy on one growing stream; records in policy order, then stream length.

    With ``warmup``, one unmeasured chunk is streamed first (``warm_up``). ``frames`` makes a
    fresh (frame, timestamp) iterator per policy (default: synthetic frames at ``fps``); ``synthetic_vision`` skips the vision tower (random embeddings, real layout).
    Ctrl-C raises ``BenchInterrupted`` carrying the records measured so far.
    """
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if warmup < 0:
        raise ValueError("--warmup cannot be negative")
    if max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be at least 1")
    steps = sorted(set(steps))
    driven = bench_adapter(adapter, synthetic_vision)
    make_frames = frames or (lambda: synthetic_frames(fps=fps))
    records: list[BenchRecord] = []
    from ..app.prefetch import prefetched

    try:
        if warmup:
            warm_up(driven, chunk, make_frames(), fps)
        for name in policies:
            source = prefetched(make_frames(), chunk)  # the next chunk decodes while this one prefills
            try:
                run_policy(
                    driven, name, steps, budget=budget, chunk=chunk, fps=fps, frames=source,
                    repeats=repeats, warmup=warmup, max_new_tokens=max_new_tokens, question=question,
                    policy_options=(policy_options or {}).get(name), progress=progress, records=records,
                    pseudo_query=pseudo_query,
                )
            finally:
                source.close()
    except KeyboardInterrupt:
        raise BenchInterrupted(records) from None
    return records


def default_budget(adapter, steps: list[int], chunk: int, frame_hw: tuple[int, int]) -> tuple[int, int]:
    """(budget, stream tokens at the longest step) for a run that sets no budget: a quarter of
    what the longest step streams (at least two chunks), so every policy reaches it early.

    Tokens per chunk come from the family's real token layout for frames of ``frame_hw``.
    """
    per = adapter.frames_per_unit
    frames = max(per, chunk - chunk % per)
    tokens = int(adapter.synthetic_encode(frames, 0, frame_hw).embeds.shape[1])
    stream = math.ceil(steps[-1] / frames) * tokens
    return max(2 * tokens, stream // 4), stream


# -- many questions on one stream ----------------------------------------------------------------------
@dataclass
class QuestionRecord:
    """One of many questions asked in turn on one stream (history on)."""

    index: int
    ttft_ms: float
    prompt_tokens: int  # tokens prefilled for it
    context_tokens: int  # earlier turns in front of it (kept or re-encoded)

    def to_json(self) -> dict:
        return {**asdict(self), "ttft_ms": round(self.ttft_ms, 3)}


def run_questions(adapter, count: int, *, frames_before: int, policy: str, budget: int | None, chunk: int,
                  fps: float, frames: Iterator[tuple[np.ndarray, float]], max_new_tokens: int,
                  history_tokens: int, history_kv: bool = True, question: str = DEFAULT_QUESTION,
                  synthetic_vision: bool = False, progress: ProgressFn | None = None,
                  records: list[QuestionRecord] | None = None) -> list[QuestionRecord]:
    """Stream ``frames_before`` frames, then ask ``question`` ``count`` times in a row, each turn
    remembered (history on): TTFT per question. Ctrl-C raises ``BenchInterrupted``."""
    from policies import make_policy

    from ..engine.session import Session, SessionConfig

    config = SessionConfig(budget=budget, chunk_frames=chunk, fps=fps, max_new_tokens=max_new_tokens,
                           history_tokens=history_tokens, history_kv=history_kv)
    session = Session(bench_adapter(adapter, synthetic_vision), make_policy(policy), config)
    notify = progress or (lambda event: None)
    records = [] if records is None else records
    try:
        for i in range(frames_before):
            frame, ts = next(frames)
            session.ingest([frame], [ts])
            notify({"phase": "ingest", "frames": i + 1})
        session.flush()
        for i in range(count):
            a = session.answer(question)
            records.append(QuestionRecord(i + 1, a.ttft_ms or math.nan, a.prompt_tokens, a.context_tokens))
            notify({"phase": "measured", "record": records[-1]})
    except KeyboardInterrupt:
        raise BenchInterrupted(records) from None
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
    compress_fraction: float = 0.0  # compression / prefill time over the whole stream
    peak_memory_bytes: int = 0  # this policy's own peak (measured from its own start)
    realtime: float = math.nan  # stream time / ingest wall time (×real time; > 1: faster than real time)
    budget_reached: bool = False  # some step held fewer tokens than it streamed
    kv_bytes: int = 0  # at the longest step


def policy_summaries(records: list[BenchRecord]) -> list[PolicySummary]:
    """Per policy: TTFT(most frames)/TTFT(fewest), peak memory and KV-cache bytes likewise, and
    over the whole stream its compression share, own peak memory and ingest speed."""
    out = []
    for name in dict.fromkeys(r.policy for r in records):
        rows = sorted((r for r in records if r.policy == name), key=lambda r: r.frames)
        first, last = rows[0], rows[-1]
        prefill = sum(r.prefill_ms_total for r in rows)
        ingest = sum(r.ingest_s for r in rows)
        out.append(PolicySummary(
            policy=name, frames_fewest=first.frames, frames_most=last.frames,
            ttft_ratio=_ratio(last.ttft_ms, first.ttft_ms),
            memory_ratio=_ratio(last.peak_memory_bytes, first.peak_memory_bytes),
            kv_ratio=_ratio(last.kv_bytes, first.kv_bytes),
            compress_fraction=sum(r.compress_ms_total for r in rows) / prefill if prefill > 0 else 0.0,
            peak_memory_bytes=max(r.peak_memory_bytes for r in rows),
            realtime=sum(r.stream_s for r in rows) / ingest if ingest > 0 else math.nan,
            budget_reached=any(r.compressions > 0 for r in rows),
            kv_bytes=last.kv_bytes,
        ))
    return out


def profile(records: list[BenchRecord]) -> list[dict]:
    """Per policy, a chunk's time split (ms per chunk, means over the stream): decode (producing
    frames), vision encoding, prefill (without encoding), separate pseudo-query pass, selection
    (compression without the pseudo-query pass), and how many chunks folded their pseudo-queries."""
    out = []
    for name in dict.fromkeys(r.policy for r in records):
        rows = [r for r in records if r.policy == name]
        chunks = max(sum(r.chunks for r in rows), 1)
        encode = sum(r.encode_ms_total for r in rows)
        pseudo = sum(r.pseudo_query_ms_total for r in rows)
        out.append({
            "policy": name,
            "chunks": chunks,
            "folded_chunks": sum(r.folded_chunks for r in rows),
            "decode_ms": sum(r.decode_ms_total for r in rows) / chunks,
            "encode_ms": encode / chunks,
            "prefill_ms": (sum(r.prefill_ms_total for r in rows) - encode) / chunks,
            "pseudo_query_ms": pseudo / chunks,
            "select_ms": (sum(r.compress_ms_total for r in rows) - pseudo) / chunks,
        })
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
