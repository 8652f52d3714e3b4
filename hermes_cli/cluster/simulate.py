"""A cost-model simulation of a cluster (no torch, no Ray): the registry's placement
(``placement.py``) against ingest and answers as queues, at a scale these machines cannot run.

Each engine is one server, its GPU-owner thread, with a sustained prefill rate. Each placed
stream produces a chunk of ``chunk_frames`` frames every ``chunk_frames / fps`` seconds, at a
random phase; a chunk costs ``chunk_frames × tokens per frame × (1 + c)`` tokens at that rate.
Questions arrive per stream as a Poisson process and cost their prompt's prefill plus one
decode step per answer token. Like the engine, a server finishes the job in flight, then serves
questions first, then chunks round-robin over its streams (one chunk per stream per turn).

A chunk's *lag* is the time from its last frame's capture to the chunk being in memory (a frame
also waits for its chunk to fill: at most one chunk period). A stream is *starved* when one of
its chunks is still unserved ``grace_s`` after the last arrival.

Failover (``fail_engine``): at ``fail_at_s`` the engine dies with its queue; after ``detect_s``
(a missed heartbeat) the registry re-places its streams (``PlacementTable.fail``). Each moved
stream first costs ``restore_s`` on its new engine (loading its snapshot), then a file source
(not pinned) re-ingests every chunk its last autosave (every ``autosave_s``) did not hold,
while a live camera (pinned) resumes at now and its missed chunks are a gap. Streams no engine
can take are reported as unplaced.

``python -m hermes_cli.cluster.simulate --streams 200 --engines 4`` prints the summary.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, NoReturn

from hermes_cli.cluster.placement import (
    COMPRESSION_OVERHEAD,
    MAX_BUSY,
    Engine,
    NoFit,
    PlacementError,
    PlacementTable,
    Stream,
)
from hermes_cli.defaults import CHUNK_FRAMES

MODEL = "llava-onevision-7b"


@dataclass(frozen=True)
class Workload:
    """What is simulated. Figures marked (est.) are docs/cluster.md's estimates, not measurements."""

    streams: int = 200
    engines: int = 4
    nodes: int = 2  # engines are spread round-robin over the nodes
    duration_s: float = 1800.0
    fps: tuple[float, ...] = (0.5, 1.0, 1.0, 1.5)  # each stream draws one at random (mean 1)
    tokens_per_frame: int = 196  # LLaVA-OneVision: 14 × 14 after pooling
    overhead: float = COMPRESSION_OVERHEAD
    chunk_frames: int = CHUNK_FRAMES
    prefill_tps: float = 15000.0  # (est.) a 7B model on one GPU, from the scale-out design note
    slots: int = 64  # streams per engine by memory (50 × 0.34 GB ≈ 17 GB beside 15 GB of weights)
    pinned_share: float = 0.25  # streams that are local cameras, pinned to their node
    question_every_s: float = 900.0  # mean seconds between questions, per stream
    question_tokens: int = 600  # a question's prompt prefill: template, question, earlier turns (≤ 512)
    answer_tokens: int = 64
    tpot_s: float = 0.025  # (est.) one decode step of a 7B model, unbatched
    max_busy: float = MAX_BUSY
    answer_aware: bool = True  # the registry counts each stream's expected answer load (False: ingest alone)
    grace_s: float = 60.0
    fail_engine: str | None = None  # e.g. "e3"
    fail_at_s: float = 930.0  # half an autosave interval after the last one: the mean loss
    detect_s: float = 2.0  # heartbeat interval: the registry notices within one
    restore_s: float = 0.5  # (est.) loading a 0.34 GB snapshot onto the GPU
    autosave_s: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.streams >= 1, f"--streams must be at least 1, not {self.streams}"),
            (self.engines >= 1, f"--engines must be at least 1, not {self.engines}"),
            (self.nodes >= 1, f"--nodes must be at least 1, not {self.nodes}"),
            (self.duration_s > 0, f"--duration must be positive, not {self.duration_s}"),
            (bool(self.fps) and all(f > 0 for f in self.fps), f"--fps must be positive numbers, not {self.fps}"),
            (self.chunk_frames >= 1, f"--chunk must be at least 1, not {self.chunk_frames}"),
            (self.prefill_tps > 0, f"--prefill-tps must be positive, not {self.prefill_tps}"),
            (self.question_every_s > 0, f"--question-every must be positive, not {self.question_every_s}"),
            (0 <= self.pinned_share <= 1, f"--pinned-share must be in [0, 1], not {self.pinned_share}"),
            (self.autosave_s > 0, f"--autosave must be positive, not {self.autosave_s}"),
            (self.tokens_per_frame >= 1, f"--tokens-per-frame must be at least 1, not {self.tokens_per_frame}"),
            (self.slots >= 1, f"--slots must be at least 1, not {self.slots}"),
            (0 < self.max_busy <= 1, f"--max-busy must be in (0, 1], not {self.max_busy}"),
            (self.tpot_s >= 0 and self.answer_tokens >= 0 and self.question_tokens >= 0,
             "--tpot and --answer-tokens must be 0 or more"),
            (self.overhead >= 0, f"the compression overhead must be 0 or more, not {self.overhead}"),
        ]
        for ok, message in checks:
            if not ok:
                raise PlacementError(message)
        if self.fail_engine is not None and self.fail_engine not in self.engine_ids():
            raise PlacementError(f"--fail {self.fail_engine}: no such engine; they are {', '.join(self.engine_ids())}")

    def engine_ids(self) -> list[str]:
        return [f"e{i}" for i in range(self.engines)]

    @property
    def question_cost_s(self) -> float:
        return self.question_tokens / self.prefill_tps + self.answer_tokens * self.tpot_s

    @property
    def answer_load(self) -> float:
        """What the registry expects a stream's questions to take of an engine (what it would
        measure: questions per second × seconds per answer)."""
        return self.question_cost_s / self.question_every_s if self.answer_aware else 0.0


def build(workload: Workload) -> tuple[list[Engine], list[Stream]]:
    """The engines and streams of ``workload``; streams drawn from its seed."""
    rng = random.Random(workload.seed)
    engines = [Engine(eid, MODEL, workload.slots, workload.prefill_tps, f"node-{i % workload.nodes}")
               for i, eid in enumerate(workload.engine_ids())]
    streams = []
    for i in range(workload.streams):
        fps = rng.choice(workload.fps)
        pinned = rng.random() < workload.pinned_share
        node = f"node-{rng.randrange(workload.nodes)}" if pinned else None
        streams.append(Stream(f"s{i:04d}", MODEL, fps, workload.tokens_per_frame, workload.overhead, node,
                              answer_load=min(workload.answer_load, 0.99)))
    return engines, streams


@dataclass
class _Chunk:
    stream: str
    index: int
    captured: float  # when its last frame was captured
    done: float | None = None


@dataclass
class _Server:
    engine: str
    alive: bool = True
    busy_until: float = 0.0
    busy_s: float = 0.0  # within [0, duration]
    job: tuple | None = None
    urgent: deque = field(default_factory=deque)  # questions and restores, first come first served
    chunks: dict[str, deque] = field(default_factory=dict)  # per stream, oldest first
    turn: deque = field(default_factory=deque)  # streams with chunks waiting, round-robin order


@dataclass
class Summary:
    """The simulation's figures (times in seconds); ``docs/cluster.md`` cites them."""

    streams: int
    engines: int
    placed: int
    refused: int
    refusals: list[str]
    max_planned_utilisation: float  # placed cost (ingest + expected answers) / prefill rate, busiest engine
    max_engine_utilisation: float  # measured busy time / duration, busiest engine (answers included)
    chunks: int
    chunks_served: int
    lag_p50_s: float
    lag_p99_s: float
    lag_max_s: float
    starved: int  # placed streams with a chunk unserved at the end
    questions: int
    answered: int
    refused_questions: int  # answered with a retryable 503 (no live engine held the stream)
    answer_p50_s: float
    answer_p99_s: float
    answer_max_s: float
    failover: dict | None = None

    def lines(self) -> list[str]:
        out = [
            f"streams {self.streams} on {self.engines} engines: placed {self.placed}, refused {self.refused}",
            *(f"  refused: {r}" for r in self.refusals[:3]),
            f"engine utilisation: planned max {self.max_planned_utilisation:.1%}, "
            f"measured busy max {self.max_engine_utilisation:.1%} (answers included)",
            f"chunks {self.chunks}, served {self.chunks_served}; lag p50 {self.lag_p50_s:.2f} s, "
            f"p99 {self.lag_p99_s:.2f} s, max {self.lag_max_s:.2f} s",
            f"starved streams {self.starved}",
            f"questions {self.questions}, answered {self.answered}, refused with 503 {self.refused_questions}; answer time p50 {self.answer_p50_s:.2f} s, "
            f"p99 {self.answer_p99_s:.2f} s, max {self.answer_max_s:.2f} s",
        ]
        if self.failover:
            f = self.failover
            out.append(f"failover of {f['engine']} at {f['at_s']:.0f} s: {f['orphans']} streams, re-placed {f['moved']}, "
                       f"unplaced {f['unplaced']} (reported); re-ingested {f['reingested_chunks']} chunks "
                       f"(file sources), live gap {f['gap_chunks']} chunks; every moved stream restored {f['restored_s']:.1f} s "
                       f"and caught up "
                       f"{f['caught_up_s']:.1f} s after the death")
        return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def simulate(workload: Workload, assignment: dict[str, str] | None = None) -> Summary:
    """Run ``workload``. ``assignment`` (stream → engine) bypasses the registry's placement — to
    show what the rules prevent; by default every stream goes through ``PlacementTable.add_stream``."""
    if assignment is not None and workload.fail_engine is not None:
        raise PlacementError("a forced assignment has no registry to fail over with: drop fail_engine")
    engines, streams = build(workload)
    table = PlacementTable(engines, max_busy=workload.max_busy)
    by_id = {s.id: s for s in streams}
    where: dict[str, str | None] = {}
    refusals: list[str] = []
    if assignment is None:
        for stream in streams:
            try:
                where[stream.id] = table.add_stream(stream).target
            except NoFit as exc:
                refusals.append(str(exc))
    else:
        where = {s: e for s, e in assignment.items() if s in by_id}
    placed = [s for s in streams if where.get(s.id)]
    planned: dict[str, float] = {e.id: 0.0 for e in engines}
    for s in placed:
        planned[str(where[s.id])] += s.cost(workload.prefill_tps) / workload.prefill_tps

    rng = random.Random(workload.seed + 1)
    events: list[tuple[float, int, str, Any]] = []
    seq = 0

    def push(time: float, kind: str, payload: Any) -> None:
        nonlocal seq
        heapq.heappush(events, (time, seq, kind, payload))
        seq += 1

    chunks: dict[str, list[_Chunk]] = {}
    for s in placed:
        period = workload.chunk_frames / s.fps
        t, k = rng.uniform(0, period), 0
        chunks[s.id] = []
        while t <= workload.duration_s:
            chunk = _Chunk(s.id, k, t)
            chunks[s.id].append(chunk)
            push(t, "chunk", chunk)
            t, k = t + period, k + 1
        t = rng.expovariate(1 / workload.question_every_s)
        while t <= workload.duration_s:
            push(t, "question", (s.id, t))
            t += rng.expovariate(1 / workload.question_every_s)
    if workload.fail_engine is not None:
        push(workload.fail_at_s, "fail", workload.fail_engine)
        push(workload.fail_at_s + workload.detect_s, "detect", workload.fail_engine)

    servers = {e.id: _Server(e.id) for e in engines}
    end = workload.duration_s + workload.grace_s
    answers: list[float] = []
    asked = 0
    refused_questions = 0  # asked while the stream had no live engine: a retryable 503, never lost silently
    gap_chunks = 0
    backlog: dict[str, list[_Chunk]] = {}  # moved file streams: the chunks re-ingested after the restore
    restored: dict[str, float] = {}  # moved streams: when their snapshot was loaded
    failover: dict | None = None
    moved_streams: set[str] = set()
    live_gap: set[str] = set()  # pinned streams whose engine is dead and not yet detected

    def chunk_cost(stream_id: str) -> float:
        stream = by_id[stream_id]
        return workload.chunk_frames * stream.demand / stream.fps / workload.prefill_tps

    def enqueue_chunk(server: _Server, chunk: _Chunk) -> None:
        queue = server.chunks.setdefault(chunk.stream, deque())
        if not queue:
            server.turn.append(chunk.stream)
        queue.append(chunk)

    def start(server: _Server, now: float) -> None:
        if not server.alive or server.job is not None:
            return
        if server.urgent:
            job = server.urgent.popleft()
        elif server.turn:
            stream_id = server.turn.popleft()
            queue = server.chunks[stream_id]
            job = ("chunk", queue.popleft(), chunk_cost(stream_id))
            if queue:
                server.turn.append(stream_id)
        else:
            return
        server.job = job
        server.busy_until = now + job[2]
        server.busy_s += max(0.0, min(server.busy_until, workload.duration_s) - min(now, workload.duration_s))
        push(server.busy_until, "done", server.engine)

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if now > end:
            break
        if kind == "chunk":
            chunk = payload
            engine_id = where.get(chunk.stream)
            server = servers[engine_id] if engine_id else None
            if server is None or not server.alive:
                if by_id[chunk.stream].pinned and chunk.stream in live_gap:
                    gap_chunks += 1
                    chunk.done = -1.0  # lost at the source: a gap, not a starved chunk
                continue
            enqueue_chunk(server, chunk)
            start(server, now)
        elif kind == "question":
            stream_id, asked_at = payload
            asked += 1
            engine_id = where.get(stream_id)
            if engine_id and servers[engine_id].alive:
                servers[engine_id].urgent.append(("question", asked_at, workload.question_cost_s))
                start(servers[engine_id], now)
            else:
                refused_questions += 1
        elif kind == "done":
            server = servers[payload]
            if not server.alive or server.job is None or server.busy_until != now:
                continue
            job, server.job = server.job, None
            if job[0] == "chunk":
                job[1].done = now
            elif job[0] == "question":
                answers.append(now - job[1])
            elif job[0] == "restore":
                restored[job[1]] = now
            start(server, now)
        elif kind == "fail":
            server = servers[payload]
            lost = [server.job] if server.job is not None else []
            refused_questions += sum(job[0] == "question" for job in [*lost, *server.urgent])
            server.alive, server.job = False, None
            server.urgent.clear()
            server.chunks.clear()
            server.turn.clear()
            live_gap.update(s for s, e in where.items() if e == payload)
        elif kind == "detect":
            tick = math.floor(workload.fail_at_s / workload.autosave_s) * workload.autosave_s
            outcome = table.fail(payload)
            orphans = [s for s, e in where.items() if e == payload]
            for move in outcome.moved:
                where[move.stream] = move.target
                moved_streams.add(move.stream)
                target = servers[move.target]
                target.urgent.append(("restore", move.stream, workload.restore_s))
                for chunk in chunks[move.stream]:
                    in_snapshot = chunk.done is not None and 0 <= chunk.done <= tick
                    if chunk.captured > now or in_snapshot or (chunk.done is not None and chunk.done < 0):
                        continue
                    if by_id[move.stream].pinned:  # live: resumes at now; what the memory lost is a gap
                        chunk.done = -1.0
                        gap_chunks += 1
                        continue
                    chunk.done = None  # a file source seeks back to the snapshot's time
                    backlog.setdefault(move.stream, []).append(chunk)
                    enqueue_chunk(target, chunk)
                live_gap.discard(move.stream)
                start(target, now)
            for decision in outcome.unplaced:
                where[decision.stream] = None
                live_gap.discard(decision.stream)
            failover = {"engine": payload, "at_s": workload.fail_at_s, "orphans": len(orphans),
                        "moved": len(outcome.moved), "unplaced": len(outcome.unplaced),
                        "unplaced_reasons": [d.reason for d in outcome.unplaced[:3]]}

    lags: list[float] = []
    starved = 0
    unplaced = set() if failover is None else {s for s, e in where.items() if e is None}
    served = total = 0
    for stream_id, stream_chunks in chunks.items():
        hungry = False
        for chunk in stream_chunks:
            if chunk.done is not None and chunk.done < 0:
                continue  # a live gap
            total += 1
            if chunk.done is None:
                hungry = True
            else:
                served += 1
                lags.append(chunk.done - chunk.captured)
        if hungry and stream_id not in unplaced:
            starved += 1
    if failover is not None:
        caught = [max([restored.get(s, math.inf), *(c.done if c.done is not None else math.inf for c in backlog.get(s, []))])
                  for s in moved_streams]
        failover.update(restored_s=max(restored.values(), default=workload.fail_at_s) - workload.fail_at_s,
                        reingested_chunks=sum(len(b) for b in backlog.values()), gap_chunks=gap_chunks,
                        caught_up_s=max(caught, default=workload.fail_at_s) - workload.fail_at_s)
    return Summary(
        streams=workload.streams, engines=workload.engines, placed=len(placed), refused=len(refusals),
        refusals=refusals, max_planned_utilisation=max(planned.values()),
        max_engine_utilisation=max(s.busy_s for s in servers.values()) / workload.duration_s,
        chunks=total, chunks_served=served,
        lag_p50_s=percentile(lags, 50), lag_p99_s=percentile(lags, 99), lag_max_s=max(lags, default=0.0),
        starved=starved, questions=asked, answered=len(answers), refused_questions=refused_questions,
        answer_p50_s=percentile(answers, 50), answer_p99_s=percentile(answers, 99),
        answer_max_s=max(answers, default=0.0), failover=failover,
    )


@dataclass(frozen=True)
class MeasuredRates:
    """An engine's rates read from ``hermes bench --json`` records of one policy."""

    policy: str
    frames: int
    prefill_tps: float  # video tokens / (vision encoding + prefill) seconds
    tokens_per_frame: int
    overhead: float  # compression time / prefill time
    tpot_s: float | None  # median time per answer token

    def line(self) -> str:
        tpot = "n/a" if self.tpot_s is None else f"{self.tpot_s * 1000:.1f} ms"
        return (f"measured ({self.policy}, {self.frames} frames): prefill {self.prefill_tps:.0f} tokens/s, "
                f"{self.tokens_per_frame} tokens/frame, compression overhead {self.overhead:.2%}, tpot {tpot}")


def rates_from_bench(records: list[dict], policy: str | None = None) -> MeasuredRates:
    """Prefill rate, tokens per frame, compression overhead and TPOT from the step records of one
    ``hermes bench --json`` run (``policy``: default hermes if present, else the first). Each
    record's ``prefill_ms_total`` and ``compress_ms_total`` cover the frames since the previous step."""
    names = [r["policy"] for r in records if "policy" in r and "stream_tokens" in r]
    if not names:
        raise PlacementError("no `hermes bench --json` step records found (a line per policy and step)")
    chosen = policy or ("hermes" if "hermes" in names else names[0])
    rows = sorted((r for r in records if r.get("policy") == chosen and "stream_tokens" in r), key=lambda r: r["frames"])
    if not rows:
        raise PlacementError(f"no records of policy {chosen!r}; the file has {', '.join(sorted(set(names)))}")
    prefill_ms = sum(r["prefill_ms_total"] for r in rows)
    compress_ms = sum(r["compress_ms_total"] for r in rows)
    tokens, frames = rows[-1]["stream_tokens"], rows[-1]["frames"]
    if prefill_ms <= 0 or tokens <= 0 or frames <= 0:
        raise PlacementError(f"the {chosen} records hold no prefill time or no video tokens")
    tpots = sorted(r["tpot_ms"] for r in rows if r.get("tpot_ms"))
    return MeasuredRates(chosen, frames, tokens / (prefill_ms / 1000), round(tokens / frames), compress_ms / prefill_ms,
                         tpots[len(tpots) // 2] / 1000 if tpots else None)


def read_bench(path: str, policy: str | None = None) -> MeasuredRates:
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise PlacementError(f"--from-bench {path}: {exc.strerror or exc}") from None
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the summary lines around the records
        if isinstance(record, dict):
            records.append(record)
    try:
        return rates_from_bench(records, policy)
    except PlacementError as exc:
        raise PlacementError(f"--from-bench {path}: {exc}") from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not the whole usage
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m hermes_cli.cluster.simulate",
                                     description="Simulate the registry's placement against a cost model of ingest and answers.")
    d = Workload()
    parser.add_argument("--streams", type=int, default=d.streams)
    parser.add_argument("--engines", type=int, default=d.engines)
    parser.add_argument("--nodes", type=int, default=d.nodes)
    parser.add_argument("--duration", type=float, default=d.duration_s, help="stream seconds (default %(default)s)")
    parser.add_argument("--fps", default=",".join(str(f) for f in d.fps), help="each stream draws one (default %(default)s)")
    parser.add_argument("--tokens-per-frame", type=int, default=None, help=f"default {d.tokens_per_frame} (LLaVA-OneVision)")
    parser.add_argument("--chunk", type=int, default=d.chunk_frames, help="frames per chunk")
    parser.add_argument("--prefill-tps", type=float, default=None,
                        help=f"engine prefill tokens/s (default {d.prefill_tps:.0f}, an estimate for a 7B model on one GPU)")
    parser.add_argument("--slots", type=int, default=d.slots)
    parser.add_argument("--pinned-share", type=float, default=d.pinned_share, help="share of streams pinned to a node")
    parser.add_argument("--question-every", type=float, default=d.question_every_s, help="mean seconds between a stream's questions")
    parser.add_argument("--answer-tokens", type=int, default=d.answer_tokens)
    parser.add_argument("--tpot", type=float, default=None, help=f"seconds per answer token (default {d.tpot_s}, an estimate)")
    parser.add_argument("--from-bench", metavar="FILE", default=None,
                        help="take prefill rate, tokens/frame, compression overhead and tpot from `hermes bench --json` output")
    parser.add_argument("--bench-policy", default=None, help="the policy's records to read (default hermes)")
    parser.add_argument("--max-busy", type=float, default=d.max_busy,
                        help="share of an engine that placed ingest and expected answers may claim (default %(default)s)")
    parser.add_argument("--ingest-only", action="store_true",
                        help="place by ingest alone, ignoring the streams' expected answer load")
    parser.add_argument("--fail", default=None, metavar="ENGINE", help="kill this engine (e.g. e3) at --fail-at")
    parser.add_argument("--fail-at", type=float, default=d.fail_at_s)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = parser.parse_args(argv)
    try:
        fps = tuple(float(f) for f in args.fps.split(","))
    except ValueError:
        parser.error(f"--fps must be numbers separated by commas, not {args.fps!r}")
    try:
        measured = read_bench(args.from_bench, args.bench_policy) if args.from_bench else None
        rates = {"tokens_per_frame": d.tokens_per_frame, "prefill_tps": d.prefill_tps, "tpot_s": d.tpot_s,
                 "overhead": d.overhead}
        if measured is not None:
            rates.update(tokens_per_frame=measured.tokens_per_frame, prefill_tps=measured.prefill_tps,
                         overhead=measured.overhead, tpot_s=measured.tpot_s if measured.tpot_s is not None else d.tpot_s)
        given = {"tokens_per_frame": args.tokens_per_frame, "prefill_tps": args.prefill_tps, "tpot_s": args.tpot}
        rates.update({k: v for k, v in given.items() if v is not None})
        workload = Workload(streams=args.streams, engines=args.engines, nodes=args.nodes, duration_s=args.duration,
                            fps=fps, chunk_frames=args.chunk, slots=args.slots, pinned_share=args.pinned_share,
                            question_every_s=args.question_every, answer_tokens=args.answer_tokens,
                            max_busy=args.max_busy, answer_aware=not args.ingest_only, fail_engine=args.fail, fail_at_s=args.fail_at, seed=args.seed,
                            **rates)  # type: ignore[arg-type]
    except PlacementError as exc:
        parser.error(str(exc))
    summary = simulate(workload)
    if args.json:
        print(json.dumps({**asdict(summary), "workload": asdict(workload),
                          "measured": None if measured is None else asdict(measured)}))
    else:
        if measured is not None:
            print(measured.line())
        print(f"engine: {workload.prefill_tps:.0f} prefill tokens/s, {workload.slots} slots; streams: "
              f"{workload.tokens_per_frame} tokens/frame, fps drawn from {', '.join(f'{f:g}' for f in workload.fps)}, "
              f"a question every {workload.question_every_s:.0f} s, {workload.answer_tokens} answer tokens at "
              f"{workload.tpot_s * 1000:.0f} ms")
        print("\n".join(summary.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
