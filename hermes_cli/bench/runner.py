"""Benchmarks: how time to first token and memory behave as a stream grows, per memory policy;
and how one engine serves many streams at once.

Every benchmark is a client of the engine (``engine.core.Engine``: the thread that runs the
model): it opens streams, submits frames (read ahead into the stream's bounded queue while the
engine prefills) and asks questions. What only the session knows (the cache's exact size, a
gate that holds the engine thread) is read through ``engine.measure`` on the engine thread.

For each policy, ONE stream is fed frame by frame; at each step (e.g. 16, 64, 256, 512 frames)
the stream pauses and the same question is answered ``warmup`` + ``repeats`` times — an answer
leaves the cache exactly as it was — and the medians are recorded.
The stream then continues to the next step: lengths are measured on one continuing stream, not
by restarting per length, so a step costs only the frames since the previous one.

``run_streams`` (``hermes bench --streams 1,4``): N streams fed at once, one client thread each;
the aggregate ingest speed and the resident memory N streams add. ``run_concurrent``
(``--concurrent-questions 1,8``): B streams each with an open answer, decoded together.

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

import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .. import defaults
from ..engine.readouts import current_memory_bytes, peak_memory_bytes, release_free_memory, reset_peak_memory
from ..errors import EXIT_INTERRUPTED, HermesError
from ..models.synthetic import bench_adapter, synthetic_frames

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
    # --profile: ours against the bare model at this step (engine/floor.py); None without --profile
    prefill_vs_bare: float | None = None  # our chunk prefill / a bare text_model forward of the same chunk
    tpot_vs_bare: float | None = None  # our time per output token / a bare one-token forward over the same cache
    chunk_prefill_ms: float | None = None  # ours, one chunk at this step (median)
    bare_prefill_ms: float | None = None
    bare_token_ms: float | None = None
    token_ms: float | None = None  # our greedy step timed beside the bare one (same moment)
    # --notify N: N conditions probed after every chunk (probes only: none fires)
    notify_conditions: int = 0
    notify_ms_per_chunk: float | None = None  # the probes' forward after a chunk
    notify_fraction: float | None = None  # probe time / prefill time over the same chunks

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
        for key in ("prefill_vs_bare", "tpot_vs_bare", "chunk_prefill_ms", "bare_prefill_ms", "bare_token_ms",
                    "token_ms"):
            if d[key] is not None:
                d[key] = round(d[key], 4)
        return d


# -- frames -----------------------------------------------------------------------------------------
def video_frames(path: str, fps: float) -> Iterator[tuple[np.ndarray, float]]:
    """(frame, timestamp) from a video file sampled at ``fps`` (SourceError / ValueError if it cannot)."""
    from ..sources import open_source

    source = open_source(path, fps)
    with source:
        for frame in source:
            yield frame.image, frame.timestamp


# -- measuring -------------------------------------------------------------------------------------------
def median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def measure_answers(stream, question: str, *, repeats: int, warmup: int, max_new_tokens: int):
    """(median TTFT ms, median TPOT ms, TTFT samples): warm-up answers first, then ``repeats``,
    asked of ``stream`` (an engine client).

    Every answer leaves the cache as it was; this is checked.
    """
    from ..engine.measure import cache_mark

    before = stream.engine.call(stream.id, cache_mark)
    for _ in range(warmup):
        stream.answer(question, max_new_tokens=max_new_tokens)
    ttft, tpot = [], []
    for _ in range(repeats):
        a = stream.answer(question, max_new_tokens=max_new_tokens)
        ttft.append(a.ttft_ms)
        tpot.append(a.tpot_ms)
    after = stream.engine.call(stream.id, cache_mark)
    if before != after:  # pragma: no cover - guarded by the session's own tests
        raise RuntimeError(f"answering changed the cache: {before} → {after}")
    return median(ttft), median(tpot), [t for t in ttft if t is not None]


def chunk_reports(events) -> list[dict]:
    """The ``chunk`` events waiting in a stream's subscription queue (each a chunk's report)."""
    import queue

    found: list[dict] = []
    while True:
        try:
            event = events.get_nowait()
        except queue.Empty:
            return found
        if event.kind == "chunk":
            found.append(event.data)


ProgressFn = Callable[[dict], None]


class BenchInterrupted(HermesError):
    """Ctrl-C during a benchmark: ``records`` holds the steps measured before it."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, records: list) -> None:  # BenchRecord, or QuestionRecord for --questions
        super().__init__("interrupted")
        self.records = records


NOTIFY_CONDITIONS = ("a person enters", "a door opens", "someone waves", "the light changes",
                     "a car passes", "something falls", "a dog appears", "the screen changes")


def bench_notifier(count: int):
    """``count`` --notify conditions whose probes run after every chunk and never fire (an
    on-threshold of 1), so the cost measured is the probes' alone; None for 0."""
    if count <= 0:
        return None
    from ..engine.notify import Notifier, NotifySettings

    names = [NOTIFY_CONDITIONS[i % len(NOTIFY_CONDITIONS)] + ("" if i < len(NOTIFY_CONDITIONS) else f" ({i})")
             for i in range(count)]
    return Notifier(names, NotifySettings(threshold=1.0, margin=1.0))


def run_policy(engine, policy_name: str, steps: list[int], *, budget: int | None, chunk: int, fps: float,
               frames: Iterator[tuple[np.ndarray, float]], repeats: int, warmup: int, max_new_tokens: int,
               question: str = DEFAULT_QUESTION, policy_options: dict | None = None,
               progress: ProgressFn | None = None, records: list[BenchRecord] | None = None,
               pseudo_query: str = defaults.PSEUDO_QUERY, kv_bits: int = defaults.KV_BITS,
               profile: bool = False, notify_conditions: int = 0) -> list[BenchRecord]:
    """One continuing stream on ``engine`` under ``policy_name``, paused at each step to answer;
    a record per step. ``notify_conditions``: that many ``--notify`` conditions probed after every chunk
    (their cost in ``notify_ms_per_chunk`` and ``notify_fraction``; set so that none fires).

    Frames are read here and submitted to the stream's queue (bounded: two chunks), so reading
    the next chunk overlaps the engine's prefill of this one. ``profile``: each record also gets
    ``prefill_vs_bare`` and ``tpot_vs_bare`` (``engine/floor.py``). Records are appended to
    ``records`` (if given) as soon as they are measured, so a caller interrupted by Ctrl-C still
    has them.
    """
    from policies import make_policy

    from ..engine.client import open_stream
    from ..engine.config import SessionConfig
    from ..engine.measure import cache_mark

    device = engine.adapter.device
    config = SessionConfig(budget=budget, chunk_frames=chunk, fps=fps, max_new_tokens=max_new_tokens, history=False,
                           pseudo_query=pseudo_query, kv_bits=kv_bits)
    reset_peak_memory(device)
    baseline = current_memory_bytes(device)
    stream = open_stream(engine, make_policy(policy_name, **(policy_options or {})), config,
                         notifier=bench_notifier(notify_conditions))
    events = stream.subscribe()
    records = [] if records is None else records
    first = len(records)
    fed = 0
    stream_tokens = 0
    notify = progress or (lambda event: None)
    try:
        for step in steps:
            decode_s, seg_frames = 0.0, 0
            started = time.perf_counter()
            while fed < step:
                t0 = time.perf_counter()
                try:
                    frame, ts = next(frames)
                except StopIteration:
                    raise ValueError(
                        f"the video ran out after {fed} frames at {fps:g} fps; ask for fewer --frames or a higher --fps"
                    ) from None
                decode_s += time.perf_counter() - t0
                stream.submit(frame, ts)  # waits while two chunks are queued (bounded read-ahead)
                fed += 1
                seg_frames += 1
                notify({"phase": "ingest", "policy": policy_name, "frames": fed, "step": step})
            stream.flush()  # a step that is not a whole number of chunks ends its partial chunk
            ingest_s = time.perf_counter() - started
            reports = chunk_reports(events)
            stream_tokens += sum(r["tokens"] for r in reports)
            notify({"phase": "answer", "policy": policy_name, "frames": fed, "step": step})
            ttft, tpot, samples = measure_answers(stream, question, repeats=repeats, warmup=warmup,
                                                  max_new_tokens=max_new_tokens)
            peak, kind = peak_memory_bytes(device)
            cache_tokens, kv_bytes, _ = engine.call(stream.id, cache_mark)
            floor = None
            if profile:
                from ..engine.floor import measure_floor

                floor = engine.call(stream.id, measure_floor)
            prefill = sum(r["prefill_ms"] for r in reports)
            compress = sum(r["compress_ms"] for r in reports)
            probes = sum(r["notify_ms"] for r in reports)
            records.append(BenchRecord(
                policy=policy_name,
                frames=fed,
                ttft_ms=ttft if ttft is not None else math.nan,
                tpot_ms=tpot,
                peak_memory_bytes=peak,
                kv_bytes=kv_bytes,
                cache_tokens=cache_tokens,
                ingest_ms_per_frame=ingest_s * 1e3 / max(seg_frames, 1),
                compress_ms_per_chunk=compress / max(len(reports), 1),
                compress_fraction=compress / prefill if prefill > 0 else 0.0,
                stream_tokens=stream_tokens,
                memory_kind=kind,
                compressions=stream.stats().cache.compressions,
                ttft_samples_ms=samples,
                chunks=len(reports),
                folded_chunks=sum(bool(r["folded"]) for r in reports),
                prefill_ms_total=prefill,
                compress_ms_total=compress,
                ingest_s=ingest_s,
                stream_s=seg_frames / fps,
                decode_ms_total=decode_s * 1e3,
                encode_ms_total=sum(r["encode_ms"] for r in reports),
                pseudo_query_ms_total=sum(r["pseudo_query_ms"] for r in reports),
                baseline_memory_bytes=baseline,
                prefill_vs_bare=None if floor is None else floor.prefill_vs_bare,
                tpot_vs_bare=None if floor is None or tpot is None else tpot / floor.bare_token_ms,
                chunk_prefill_ms=None if floor is None else floor.prefill_ms,
                bare_prefill_ms=None if floor is None else floor.bare_prefill_ms,
                bare_token_ms=None if floor is None else floor.bare_token_ms,
                token_ms=None if floor is None else floor.token_ms,
                notify_conditions=notify_conditions,
                notify_ms_per_chunk=probes / max(len(reports), 1) if notify_conditions else None,
                notify_fraction=(probes / prefill if prefill > 0 else 0.0) if notify_conditions else None,
            ))
            notify({"phase": "measured", "policy": policy_name, "frames": fed, "step": step, "record": records[-1]})
    finally:
        _close(stream)
        release_free_memory()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return records[first:]


def _close(stream) -> None:
    """Close a benchmark's stream (its memory is freed); an engine that stopped has nothing to free."""
    from ..engine.client import EngineStopped

    with contextlib.suppress(EngineStopped):
        stream.close()


def warm_up(engine, chunk: int, frames: Iterator[tuple[np.ndarray, float]], fps: float) -> None:
    """Stream one unmeasured chunk and answer once, then forget it all, so that the first policy
    does not pay the model's first-run costs (thread pools, kernel selection, allocator growth)
    that the others are spared."""
    from policies import make_policy

    from ..engine.client import open_stream
    from ..engine.config import SessionConfig

    stream = open_stream(engine, make_policy("full"), SessionConfig(budget=None, chunk_frames=chunk, fps=fps,
                                                                     max_new_tokens=2, history=False))
    try:
        for _ in range(chunk):
            frame, ts = next(frames)
            stream.submit(frame, ts)
        stream.flush()
        measure_answers(stream, DEFAULT_QUESTION, repeats=1, warmup=0, max_new_tokens=2)
    except StopIteration:
        pass  # a stream shorter than a chunk: the measured steps will say so
    finally:
        _close(stream)
        release_free_memory()


def start_engine(adapter, synthetic_vision: bool = False):
    """An engine (started) on ``adapter`` as the benchmark drives it (``bench_adapter``)."""
    from ..engine.core import Engine

    return Engine(bench_adapter(adapter, synthetic_vision)).start()


def run_bench(adapter, policies: list[str], steps: list[int], *, budget: int | None, chunk: int = 16,
              fps: float = 1.0, repeats: int = 3, warmup: int = 1, max_new_tokens: int = 16,
              frames: Callable[[], Iterator[tuple[np.ndarray, float]]] | None = None,
              synthetic_vision: bool = False, question: str = DEFAULT_QUESTION,
              policy_options: dict[str, dict] | None = None, progress: ProgressFn | None = None,
              pseudo_query: str = defaults.PSEUDO_QUERY, kv_bits: int = defaults.KV_BITS,
              profile: bool = False, notify: int = 0) -> list[BenchRecord]:
    """Benchmark each policy on one growing stream; records in policy order, then stream length.

    One engine serves every policy's stream in turn. With ``warmup``, one unmeasured chunk is
    streamed first (``warm_up``). ``frames`` makes a fresh (frame, timestamp) iterator per policy
    (default: synthetic frames at ``fps``); ``synthetic_vision`` skips the vision tower (random
    embeddings, real layout). Ctrl-C raises ``BenchInterrupted`` carrying the records measured so far.
    """
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    if warmup < 0:
        raise ValueError("--warmup cannot be negative")
    if max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be at least 1")
    steps = sorted(set(steps))
    make_frames = frames or (lambda: synthetic_frames(fps=fps))
    records: list[BenchRecord] = []
    engine = start_engine(adapter, synthetic_vision)
    try:
        if warmup:
            warm_up(engine, chunk, make_frames(), fps)
        for name in policies:
            run_policy(
                engine, name, steps, budget=budget, chunk=chunk, fps=fps, frames=make_frames(),
                repeats=repeats, warmup=warmup, max_new_tokens=max_new_tokens, question=question,
                policy_options=(policy_options or {}).get(name), progress=progress, records=records,
                pseudo_query=pseudo_query, kv_bits=kv_bits, profile=profile, notify_conditions=notify,
            )
    except KeyboardInterrupt:
        raise BenchInterrupted(records) from None
    finally:
        engine.stop()
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

    from ..engine.client import open_stream
    from ..engine.config import SessionConfig

    config = SessionConfig(budget=budget, chunk_frames=chunk, fps=fps, max_new_tokens=max_new_tokens,
                           history_tokens=history_tokens, history_kv=history_kv)
    notify = progress or (lambda event: None)
    records = [] if records is None else records
    engine = start_engine(adapter, synthetic_vision)
    try:
        stream = open_stream(engine, make_policy(policy), config)
        for i in range(frames_before):
            frame, ts = next(frames)
            stream.submit(frame, ts)
            notify({"phase": "ingest", "frames": i + 1})
        stream.flush()
        for i in range(count):
            a = stream.answer(question)
            records.append(QuestionRecord(i + 1, a.ttft_ms or math.nan, a.prompt_tokens, a.context_tokens))
            notify({"phase": "measured", "record": records[-1]})
    except KeyboardInterrupt:
        raise BenchInterrupted(records) from None
    finally:
        engine.stop()
    return records


# -- many streams on one engine ---------------------------------------------------------------------------
STREAMS_FIELDS = ("streams", "frames", "ingest_frames_per_s", "rss_bytes", "kv_bytes_per_stream",
                  "rss_growth_per_stream_vs_kv")


@dataclass
class StreamsRecord:
    """N streams fed at once on one engine (``hermes bench --streams``)."""

    streams: int
    frames: int  # per stream
    ingest_frames_per_s: float  # all streams' frames / the wall time until every one was in the memory
    ingest_s: float
    rss_bytes: int  # memory with the N streams open and full (process RSS; GPU: allocated bytes)
    baseline_memory_bytes: int  # the same with no stream open (weights, runtime)
    kv_bytes_per_stream: int  # the keys and values one stream holds (mean over the N)
    cache_tokens: int  # tokens per layer of one stream
    memory_growth_per_stream: float  # (rss_bytes − that of the reference) / the streams added
    rss_growth_per_stream_vs_kv: float  # memory_growth_per_stream / kv_bytes_per_stream
    growth_reference: str  # "one stream" (the smallest count measured) or "no stream" (for that count)
    rss_growth_vs_kv_over_no_stream: float  # (rss_bytes − baseline) / streams / kv_bytes_per_stream
    memory_kind: str = "rss"
    chunks: int = 0  # chunks prefilled, all streams
    policy: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        for key in ("ingest_frames_per_s", "ingest_s", "memory_growth_per_stream", "rss_growth_per_stream_vs_kv",
                    "rss_growth_vs_kv_over_no_stream"):
            d[key] = round(d[key], 4)
        return d


def settled_memory_bytes(device: torch.device) -> int:
    """Memory held now, after freed memory is handed back (``release_free_memory``)."""
    release_free_memory()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return current_memory_bytes(device)


def feed_streams(streams: list, frames: list[Iterator[tuple[np.ndarray, float]]], count: int) -> float:
    """Feed ``count`` frames into each stream at once (a client thread per stream) and flush; the
    wall seconds until the last stream's frames are all in its memory."""
    import threading

    start = threading.Barrier(len(streams) + 1)
    failures: list[BaseException] = []

    def feed(stream, source) -> None:
        try:
            start.wait()
            for _ in range(count):
                frame, ts = next(source)
                stream.submit(frame, ts)
            stream.flush()
        except BaseException as exc:  # reported by the caller
            failures.append(exc)

    threads = [threading.Thread(target=feed, args=(s, f), name=f"bench-feed-{i}", daemon=True)
               for i, (s, f) in enumerate(zip(streams, frames, strict=True))]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if failures:
        raise failures[0]
    return elapsed


def open_bench_streams(engine, n: int, *, policy: str, budget: int | None, chunk: int, fps: float,
                       max_new_tokens: int, pseudo_query: str = defaults.PSEUDO_QUERY) -> list:
    from policies import make_policy

    from ..engine.client import open_stream
    from ..engine.config import SessionConfig

    config = SessionConfig(budget=budget, chunk_frames=chunk, fps=fps, max_new_tokens=max_new_tokens, history=False,
                           pseudo_query=pseudo_query)
    return [open_stream(engine, make_policy(policy), config) for _ in range(n)]


def run_streams(adapter, counts: list[int], *, frames: int, policy: str, budget: int | None, chunk: int,
                fps: float = 1.0, make_frames: Callable[[int], Iterator[tuple[np.ndarray, float]]] | None = None,
                synthetic_vision: bool = False, warmup: int = 1, pseudo_query: str = defaults.PSEUDO_QUERY,
                progress: ProgressFn | None = None, records: list[StreamsRecord] | None = None) -> list[StreamsRecord]:
    """For each N in ``counts``: N streams on one engine, each fed ``frames`` frames at once by its
    own client thread; the aggregate ingest speed, and the memory the N streams hold.

    Memory is read with the streams open after their last chunk, freed memory handed back first;
    for the smallest count it is compared with the engine holding no stream, for the others with
    the smallest count (``growth_reference``) — the growth per stream added, against the keys and
    values one stream holds. ``make_frames(k)``: stream k's frames (default synthetic, seed k).
    Ctrl-C raises ``BenchInterrupted``.
    """
    counts = sorted(set(counts))
    make = make_frames or (lambda k: synthetic_frames(fps=fps, seed=k))
    notify = progress or (lambda event: None)
    records = [] if records is None else records
    engine = start_engine(adapter, synthetic_vision)
    device = engine.adapter.device
    try:
        if warmup:
            warm_up(engine, chunk, make(0), fps)
        baseline = settled_memory_bytes(device)
        reference: tuple[int, int] | None = None  # (streams, memory) of the smallest count
        for n in counts:
            notify({"phase": "ingest", "streams": n})
            streams = open_bench_streams(engine, n, policy=policy, budget=budget, chunk=chunk, fps=fps,
                                         max_new_tokens=2, pseudo_query=pseudo_query)
            events = [s.subscribe() for s in streams]
            try:
                elapsed = feed_streams(streams, [make(k) for k in range(n)], frames)
                stats = [s.fresh_stats() for s in streams]
                held = settled_memory_bytes(device)
            finally:
                for s in streams:
                    _close(s)
            kv = int(statistics.fmean(st.cache.kv_bytes for st in stats))
            if reference is None:
                growth, label = (held - baseline) / n, "no stream"
                reference = (n, held)
            else:
                growth, label = (held - reference[1]) / (n - reference[0]), "one stream" if reference[0] == 1 \
                    else f"{reference[0]} streams"
            records.append(StreamsRecord(
                streams=n, frames=frames, ingest_frames_per_s=n * frames / elapsed, ingest_s=elapsed, rss_bytes=held,
                baseline_memory_bytes=baseline, kv_bytes_per_stream=kv, cache_tokens=stats[0].cache.tokens,
                memory_growth_per_stream=growth, rss_growth_per_stream_vs_kv=growth / kv if kv else math.nan,
                growth_reference=label, rss_growth_vs_kv_over_no_stream=(held - baseline) / n / kv if kv else math.nan,
                memory_kind="gpu" if device.type == "cuda" else "rss",
                chunks=sum(len(chunk_reports(e)) for e in events), policy=policy,
            ))
            notify({"phase": "measured", "record": records[-1]})
            release_free_memory()
    except KeyboardInterrupt:
        raise BenchInterrupted(records) from None
    finally:
        engine.stop()
    return records


DECODE_FIELDS = ("batch", "decode_tokens_per_s")


@dataclass
class DecodeRecord:
    """B streams, each with an open answer, decoded together (``hermes bench --concurrent-questions``)."""

    batch: int
    decode_tokens_per_s: float  # tokens after each answer's first / the wall time spent decoding them
    decode_tokens: int
    decode_s: float  # wall time from the first answer's start to the last answer's end, minus the starts
    start_s: float  # the B answers' starts (question prefill and first token: one at a time)
    tpot_ms_mean: float  # per answer: time per token after the first
    ttft_ms_mean: float
    cache_tokens: int  # tokens per layer of each stream (the same for all)
    max_new_tokens: int
    frames: int  # per stream, before the question
    speedup: float = 1.0  # decode_tokens_per_s over that of the smallest batch measured
    policy: str = ""

    def to_json(self) -> dict:
        d = asdict(self)
        for key in ("decode_tokens_per_s", "decode_s", "start_s", "tpot_ms_mean", "ttft_ms_mean", "speedup"):
            d[key] = round(d[key], 4)
        return d


def run_concurrent(adapter, batches: list[int], *, frames: int, policy: str, budget: int | None, chunk: int,
                   fps: float = 1.0, max_new_tokens: int = 16, question: str = DEFAULT_QUESTION,
                   make_frames: Callable[[int], Iterator[tuple[np.ndarray, float]]] | None = None,
                   synthetic_vision: bool = False, warmup: int = 1, pseudo_query: str = defaults.PSEUDO_QUERY,
                   progress: ProgressFn | None = None, records: list[DecodeRecord] | None = None) -> list[DecodeRecord]:
    """For each B in ``batches``: B streams of ``frames`` frames each, then one question on every
    stream at once; the engine decodes the B open answers together (batched decode).

    The engine thread is held (``engine.measure.hold``) while the B questions are queued, so all
    B start back to back (a start is one question's prefill and first token, stream by stream)
    and every later token comes from a batched step of all B. ``decode_tokens_per_s`` counts
    those later tokens over the wall time of the run minus the starts' own time. End of sequence
    is ignored: every answer has ``max_new_tokens`` tokens. Ctrl-C raises ``BenchInterrupted``.
    """
    from ..engine.measure import hold

    batches = sorted(set(batches))
    make = make_frames or (lambda k: synthetic_frames(fps=fps, seed=k))
    notify = progress or (lambda event: None)
    records = [] if records is None else records
    engine = start_engine(adapter, synthetic_vision)
    if max(batches) > engine.max_batch:
        engine.max_batch = max(batches)
    try:
        if warmup:
            warm_up(engine, chunk, make(0), fps)
        for b in batches:
            notify({"phase": "ingest", "batch": b})
            streams = open_bench_streams(engine, b, policy=policy, budget=budget, chunk=chunk, fps=fps,
                                         max_new_tokens=max_new_tokens, pseudo_query=pseudo_query)
            try:
                feed_streams(streams, [make(k) for k in range(b)], frames)
                if warmup:  # one unmeasured batch: the batched path's first-run costs
                    _decode_together(engine, streams, question, 2, hold)
                notify({"phase": "answer", "batch": b})
                wall, answers = _decode_together(engine, streams, question, max_new_tokens, hold)
                cache_tokens = streams[0].fresh_stats().cache.tokens
            finally:
                for s in streams:
                    _close(s)
            start_s = sum((a.ttft_ms or 0.0) for a in answers) / 1e3
            tokens = sum(max(0, len(a.tokens) - 1) for a in answers)
            decode_s = max(wall - start_s, 1e-9)
            rate = tokens / decode_s
            records.append(DecodeRecord(
                batch=b, decode_tokens_per_s=rate, decode_tokens=tokens, decode_s=decode_s, start_s=start_s,
                tpot_ms_mean=statistics.fmean(a.tpot_ms or 0.0 for a in answers),
                ttft_ms_mean=statistics.fmean(a.ttft_ms or 0.0 for a in answers), cache_tokens=cache_tokens,
                max_new_tokens=max_new_tokens, frames=frames,
                speedup=rate / records[0].decode_tokens_per_s if records else 1.0, policy=policy,
            ))
            notify({"phase": "measured", "record": records[-1]})
            release_free_memory()
    except KeyboardInterrupt:
        raise BenchInterrupted(records) from None
    finally:
        engine.stop()
    return records


def _decode_together(engine, streams: list, question: str, max_new_tokens: int, hold) -> tuple[float, list]:
    """Queue one question per stream while the engine thread is held, release it, read every
    answer to its end: (wall seconds from the release, the answers)."""
    import threading

    gate, held = threading.Event(), threading.Event()
    holder = threading.Thread(target=engine.call, args=(streams[0].id, hold(gate, held)), daemon=True)
    holder.start()
    held.wait(60)
    try:
        handles = [s.ask(question, max_new_tokens=max_new_tokens) for s in streams]
    finally:
        t0 = time.perf_counter()
        gate.set()
    answers = []
    for handle in handles:
        for _ in handle:
            pass
        answers.append(handle.answer)
    wall = time.perf_counter() - t0
    holder.join()
    return wall, answers


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
    (compression without the pseudo-query pass), how many chunks folded their pseudo-queries, and
    the medians over the steps of ``prefill_vs_bare`` and ``tpot_vs_bare`` (None unless measured)."""
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
            "prefill_vs_bare": median(r.prefill_vs_bare for r in rows),
            "tpot_vs_bare": median(r.tpot_vs_bare for r in rows),
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
