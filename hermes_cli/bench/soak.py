"""Soak benchmark: a long stream through the session worker, with questions asked as it runs.

    python -m hermes_cli.bench.soak --frames 10000 --budget 256 --every 500

A feeder thread submits synthetic frames (a square moving over noise, generated one at a time so
the frames themselves take no memory) to a ``SessionWorker`` as fast as the model takes them;
every ``--every`` frames the main thread asks a question (``--repeats`` times) while ingestion
goes on. At each question it records the process's resident memory, the cache size, the answer's time to first
token (decoding only) and how long the question waited for the worker (the chunk in flight).

Checks (exit status 1 if one fails): a question waits for at most the chunk in flight (with
slack for scheduling); the resident memory at the end is within ``--rss-tolerance``
(2%) of that after the first ``--baseline`` (1,000) frames; the median TTFT of the last quarter
of the questions is at most ``--ttft-tolerance`` (1.25×) that of the first quarter after the
baseline; and every frame is accounted for (all in the memory after the final flush).
Conversation history is off by default (``--history`` turns it on): a growing conversation makes
every prompt longer by design, which is not what this measures.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..engine.config import SessionConfig
from ..engine.readouts import rss_bytes
from ..engine.session import Session
from ..engine.worker import SessionWorker
from ..settings import add_arguments

# The session settings the soak takes (flags, types and help from the schema), at the soak's defaults.
SESSION = {"model": "tiny", "policy": "hermes", "budget": 256, "chunk": 4, "fps": 10.0, "max_new_tokens": 8,
           "history": False}
MACHINE = {"device": "cpu", "dtype": "fp32"}


@dataclass(frozen=True)
class SoakPoint:
    """The state of the run when one question was asked."""

    frames: int  # frames submitted when the question was asked
    stream_time_s: float
    cache_tokens: int  # stream tokens in the fullest layer
    kv_bytes: int
    rss_bytes: int
    ttft_ms: float  # decoding only; the median of the question's repeats
    wait_ms: float  # from ask() to the first piece, minus the TTFT (time queued behind the worker); the max


def synthetic_frame(i: int, size: int) -> np.ndarray:
    """Frame ``i``: noise with a coloured square that moves one step per frame (deterministic)."""
    rng = np.random.default_rng(i)
    frame = rng.integers(0, 40, size=(size, size, 3), dtype=np.uint8)
    side = max(4, size // 4)
    x, y = (i * 7) % (size - side), (i * 5) % (size - side)
    frame[y : y + side, x : x + side] = [(37 * i) % 256, 200, 255 - (11 * i) % 256]
    return frame


def run_soak(args: argparse.Namespace) -> dict:
    from policies import make_policy

    from ..models.loading import load_model

    torch.set_num_threads(args.threads)
    adapter = load_model(args.model, device=args.device, dtype=args.dtype)
    config = SessionConfig(budget=args.budget, chunk_frames=args.chunk, fps=args.fps,
                           max_new_tokens=args.max_new_tokens, history=args.history)
    worker = SessionWorker(Session(adapter, make_policy(args.policy), config)).start()
    marks = {k: threading.Event() for k in range(args.every, args.frames + 1, args.every)}
    baseline_mark = threading.Event()
    failure: list[BaseException] = []
    chunk_ms: list[float] = []  # written by the feeder only

    def feed() -> None:
        try:
            for i in range(args.frames):
                for report in worker.ingest([synthetic_frame(i, args.size)], [i / args.fps]):
                    chunk_ms.append(report.prefill_ms + report.compress_ms)
                if i + 1 == args.baseline:
                    baseline_mark.set()
                if i + 1 in marks:
                    marks[i + 1].set()
            worker.flush()
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)
            for event in (baseline_mark, *marks.values()):
                event.set()

    points: list[SoakPoint] = []
    started = time.perf_counter()
    feeder = threading.Thread(target=feed, name="soak-feeder", daemon=True)
    feeder.start()
    baseline_rss = None
    for frames, mark in marks.items():
        if baseline_rss is None and frames > args.baseline:
            baseline_mark.wait()
            gc.collect()
            baseline_rss = rss_bytes()
        mark.wait()
        if failure:
            break
        ttfts, waits = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            stream = worker.ask(args.question)
            first = None
            for _ in stream:
                first = first or time.perf_counter()
            answer = stream.answer
            latency_ms = ((first or time.perf_counter()) - t0) * 1e3
            ttfts.append(answer.ttft_ms or 0.0)
            waits.append(max(0.0, latency_ms - (answer.ttft_ms or 0.0)))
        stats = worker.stats()
        gc.collect()
        points.append(SoakPoint(frames, stats.stream_time_s, stats.cache.stream_tokens, stats.cache.kv_bytes,
                                rss_bytes() or 0, statistics.median(ttfts), max(waits)))
        if not args.quiet_:
            p = points[-1]
            print(f"{p.frames:>7} frames  {p.stream_time_s:>8.1f}s  cache {p.cache_tokens:>5} tok  "
                  f"RSS {p.rss_bytes / 2**20:8.1f} MiB  TTFT {p.ttft_ms:6.1f} ms  wait {p.wait_ms:6.1f} ms",
                  flush=True)
    feeder.join()
    if baseline_rss is None:  # fewer questions than frames in the baseline
        gc.collect()
        baseline_rss = rss_bytes()
    gc.collect()
    end_rss = rss_bytes() or 0
    counts = worker.counts()
    worker.stop()
    if failure:
        raise failure[0]
    elapsed = time.perf_counter() - started
    return soak_summary(args, points, baseline_rss or 0, end_rss, counts, elapsed, chunk_ms)


def soak_summary(args, points: list[SoakPoint], baseline_rss: int, end_rss: int, counts, elapsed_s: float,
              chunk_ms: list[float]) -> dict:
    after = [p for p in points if p.frames > args.baseline] or points
    quarter = max(1, len(after) // 4)
    first_q = statistics.median(p.ttft_ms for p in after[:quarter])
    last_q = statistics.median(p.ttft_ms for p in after[-quarter:])
    rss_growth = end_rss / baseline_rss - 1 if baseline_rss else float("nan")
    chunk_max = max(chunk_ms, default=0.0)
    wait_max = max((p.wait_ms for p in points), default=0.0)
    checks = {
        "rss_within_tolerance": abs(rss_growth) <= args.rss_tolerance,
        "ttft_not_growing": last_q <= args.ttft_tolerance * first_q,
        # a question waits for the chunk in flight only (generous: scheduling noise on a shared CPU)
        "wait_at_most_one_chunk": wait_max <= 2 * chunk_max + 20,
        "every_frame_in_memory": counts.frames_taken == counts.frames_seen == args.frames
        and counts.frames_pending == 0,
    }
    return {
        "settings": {**{k: getattr(args, k) for k in SESSION},
                     **{k: getattr(args, k) for k in ("frames", "every", "size", "threads", "baseline", "repeats")}},
        "elapsed_s": round(elapsed_s, 1),
        "frames_per_s": round(args.frames / elapsed_s, 1),
        "rss_after_baseline_bytes": baseline_rss,
        "rss_end_bytes": end_rss,
        "rss_growth": rss_growth,
        "ttft_ms_first_quarter_median": first_q,
        "ttft_ms_last_quarter_median": last_q,
        "wait_ms_max": wait_max,
        "chunk_ms_max": chunk_max,
        "chunk_ms_median": statistics.median(chunk_ms) if chunk_ms else 0.0,
        "counts": asdict(counts),
        "checks": checks,
        "points": [asdict(p) for p in points],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hermes_cli.bench.soak", description=__doc__.splitlines()[0])
    add_arguments(parser, {**SESSION, **MACHINE}, helps={
        "fps": "the stream clock: frame i is at i/fps seconds",
        "history": "keep the conversation (prompts then grow)"})
    parser.add_argument("--frames", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=500, help="ask a question every N frames")
    parser.add_argument("--size", type=int, default=56, help="frame side in pixels")
    parser.add_argument("--question", default="What is happening in the video?")
    parser.add_argument("--repeats", type=int, default=5, help="times each question is asked (TTFT: the median)")
    parser.add_argument("--baseline", type=int, default=1000, help="frames before the reference RSS reading")
    parser.add_argument("--rss-tolerance", type=float, default=0.02)
    parser.add_argument("--ttft-tolerance", type=float, default=1.25)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", help="write the full record here")
    add_arguments(parser, {"quiet_": False}, helps={"quiet_": "no line per question"})
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_soak(args)
    mib = 2**20
    print(f"{args.frames} frames in {result['elapsed_s']} s ({result['frames_per_s']} frames/s); "
          f"RSS after {args.baseline} frames {result['rss_after_baseline_bytes'] / mib:.1f} MiB, "
          f"at the end {result['rss_end_bytes'] / mib:.1f} MiB ({100 * result['rss_growth']:+.2f}%); "
          f"TTFT median {result['ttft_ms_first_quarter_median']:.1f} ms (first quarter) → "
          f"{result['ttft_ms_last_quarter_median']:.1f} ms (last quarter); "
          f"longest wait for the worker {result['wait_ms_max']:.1f} ms "
          f"(chunks: median {result['chunk_ms_median']:.1f} ms, longest {result['chunk_ms_max']:.1f} ms)")
    for name, ok in result["checks"].items():
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
