"""The engine core: one thread owns the model and hosts many streams.

``Engine`` holds one model adapter and runs every forward of it on its own thread. Each stream
is a ``Session`` (its whole state, no lock) plus what waits for it: a bounded queue of frames,
questions, flushes. Everything else talks to the engine by requests (``client.StreamClient`` is
the in-process client; an HTTP or Ray client implements the same methods). The scheduler, on
each turn, in this order:

1. serves control requests (open, close, save, restore, readouts, pause, resume; one that reads
   or changes a stream's session waits until that stream's open answer has ended);
2. starts a question whose stream has taken every frame submitted before it (flushing the
   partial chunk first when asked: a live stream's answer covers everything seen);
3. decodes one token of every open answer — several streams' answers together in one batch
   (``decoding.BatchDecoder``), so a question waits at most for the chunk in flight;
4. otherwise feeds one stream (round robin, fair) the frames of its next chunk; the chunk's
   prefill and compression run; autosave ticks (its one owner).

Ingest is never starved by a steady flow of questions: once answers have had as much engine
time as the last chunk took (``MIN_ANSWER_TURN_S`` at least), the next chunk goes first, so
with both waiting, ingest gets at least half of the engine.

A stream's failure (its policy raises, its answer raises, it is closed mid-answer) is caught,
reported on that stream (state ``failed``, an event, the error raised to its waiting callers),
and leaves every other stream untouched; the engine thread never dies silently: if it does stop,
every waiting request gets ``EngineStopped``.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policies import Policy

from ..errors import EXIT_BUG, HermesError
from ..models.base import ModelAdapter
from .config import SessionConfig
from .decoding import BatchDecoder
from .notify import Notifier
from .readouts import MemoryMap, memory_map
from .records import Answer, ChunkReport, SessionStats
from .session import OpenAnswer, Session

__all__ = ["END", "Engine", "EngineStopped", "Event", "StreamCounts", "StreamFailed"]

END = object()  # ends an answer's piece queue
# While questions keep coming, answers and ingest share the engine: once answers have taken as
# long as the last chunk did (and at least this long), the next chunk goes before them.
MIN_ANSWER_TURN_S = 0.05


class EngineStopped(HermesError, RuntimeError):
    """The engine stopped before serving the request."""

    exit_code = EXIT_BUG

    def __init__(self, message: str = "the engine has stopped") -> None:
        super().__init__(message)


class StreamFailed(HermesError, RuntimeError):
    """The stream failed (or was closed); the message says why. Other streams go on."""

    exit_code = EXIT_BUG


@dataclass(frozen=True)
class StreamCounts:
    """Where every frame submitted to a stream went (written by the engine thread)."""

    frames_submitted: int  # accepted by submit
    frames_dropped: int  # a live stream's oldest frames, dropped while the engine was behind
    frames_queued: int  # waiting in the engine's queue
    frames_taken: int  # handed to the session
    frames_seen: int  # the session's: prefilled into the memory
    frames_pending: int  # the session's: waiting for their chunk
    answers: int  # answers completed
    answers_cancelled: int  # closed or abandoned before their end
    lag_s: float  # stream time submitted but not yet in the memory


@dataclass(frozen=True)
class Event:
    """Something that happened on a stream: ``chunk``, ``compress``, ``reindex``, ``warning``,
    ``gap``, ``ended``, ``failed``, ``closed``, ``notification`` (``data`` is JSON-ready)."""

    kind: str
    stream: str
    data: dict = field(default_factory=dict)
    wall_s: float = field(default_factory=time.time)


class _Request:
    """A control request; ``done`` is set once it is served or refused."""

    def __init__(self, kind: str, stream: str | None, payload: Any = None) -> None:
        self.kind, self.stream, self.payload = kind, stream, payload
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()

    def wait(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class AnswerJob:
    """A question on its way: its pieces arrive on ``pieces`` (str …, then ``END`` or an exception)."""

    question: str
    max_new_tokens: int | None
    record_logits: bool
    history: list[tuple[str, str]] | None
    flush: bool
    after_seq: int  # frames submitted before it: all are taken first
    pieces: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    answer: Answer | None = None
    error: BaseException | None = None
    opened: OpenAnswer | None = None


@dataclass
class _Barrier:
    """``flush``/``sync``: served once every frame submitted before it is taken."""

    after_seq: int
    flush: bool
    request: _Request | None  # None: the stream's own end-of-stream flush
    first_chunk: int = 0  # chunk log length when it was made (sync: the chunks since)
    end_error: str | None = None  # the end of stream's: its source's error, if it failed


class _Stream:
    """The engine's record of one stream; fields are guarded by the engine's condition, and
    ``session`` is touched by the engine thread alone."""

    def __init__(self, sid: str, session: Session, *, live: bool, queue_frames: int) -> None:
        self.id, self.session, self.live, self.queue_frames = sid, session, live, queue_frames
        self.frames: deque[tuple[int, np.ndarray, float]] = deque()
        self.next_seq = 0
        self.dropped = self.taken = 0
        self.last_submitted_s = 0.0
        self.jobs: deque[AnswerJob] = deque()
        self.active: AnswerJob | None = None
        self.barriers: deque[_Barrier] = deque()
        self.paused = False
        self.ended = False
        self.error: str | None = None  # set: the stream failed (its memory is not to be trusted)
        self.source_error: str | None = None  # its source failed: the memory so far still answers
        self.closed = False
        self.chunks: list[ChunkReport] = []
        self.answers = self.cancelled = 0
        self.subscribers: list[queue.SimpleQueue] = []
        self.autosaver: Any = None
        self.notifier: Notifier | None = None
        self.warned = 0
        self.stats: SessionStats = session.stats()
        self.warnings: tuple[str, ...] = ()
        self.last_answer: Answer | None = None
        self.counts = self.make_counts()

    def first_barrier(self) -> int:
        """Frames with a smaller sequence number may be taken now."""
        bounds = [b.after_seq for b in itertools.islice(self.barriers, 1)]
        if self.jobs:
            bounds.append(self.jobs[0].after_seq)
        return min(bounds, default=self.next_seq)

    def ready(self, after_seq: int) -> bool:
        """Every frame submitted before ``after_seq`` has been taken (or dropped)."""
        return not self.frames or self.frames[0][0] >= after_seq

    def make_counts(self) -> StreamCounts:
        s = self.session
        return StreamCounts(self.next_seq, self.dropped, len(self.frames), self.taken, s.frames_seen,
                            s.pending_frames, self.answers, self.cancelled,
                            max(0.0, self.last_submitted_s - s.stream_time_s) if self.taken else 0.0)

    @property
    def state(self) -> str:
        return "failed" if self.error or self.source_error else "ended" if self.ended else "live"


class Engine:
    """One model, many streams, one thread (see the module docstring).

    Thread-safe: every public method may be called from any thread but the engine's own.
    ``max_batch``: most answers decoded together in one step.
    """

    def __init__(self, adapter: ModelAdapter, *, max_batch: int = 8, name: str = "hermes-engine") -> None:
        self.adapter = adapter
        self.max_batch = max_batch
        self._cv = threading.Condition()
        self._controls: deque[_Request] = deque()
        self._streams: dict[str, _Stream] = {}
        self._order: list[str] = []  # round-robin order of ingest
        self._turn = 0
        self._ids = itertools.count(1)
        self._stop = False
        self._closed = False
        self._batch = BatchDecoder(adapter)
        self._answer_s = 0.0  # time spent on answers since the last chunk was fed
        self._last_feed_s = 0.0  # how long that chunk took
        self.failure: BaseException | None = None  # what stopped the thread, if it died
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> Engine:
        with self._cv:
            if self._thread.ident is None and not self._closed:
                self._thread.start()
        return self

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float | None = 30.0) -> None:
        """Finish the chunk or token in flight, cancel open answers, refuse what waits, join."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            never_started = self._thread.ident is None
            if never_started:
                self._closed = True
        if never_started:
            self._refuse_all()
        elif threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    # -- requests -----------------------------------------------------------------------------------
    def open_stream(self, policy: Policy, config: SessionConfig, *, live: bool = False,
                    queue_frames: int | None = None, name: str | None = None, notifier: Notifier | None = None) -> str:
        """A new stream (its system prompt prefilled); returns its id. ``live``: a full queue drops
        its oldest frame instead of making ``submit`` wait. ``queue_frames``: the queue's bound
        (default two chunks: one read ahead while one is prefilled). ``notifier``: conditions
        probed after each chunk (``--notify``); each that fires is a ``notification`` event."""
        sid = name or f"s{next(self._ids)}"
        bound = queue_frames or 2 * config.chunk_frames
        return self._control("open", sid, (policy, config, live, bound, notifier))

    def submit(self, sid: str, image: np.ndarray, timestamp: float, *, block: bool = True) -> bool:
        """Queue one frame. A live stream never waits: when its queue is full the oldest frame
        is dropped (and counted). Another waits for room when ``block`` (read-ahead is bounded),
        else returns False without queuing. Raises ``StreamFailed`` on a failed or closed stream."""
        with self._cv:
            st = self._get(sid)
            while True:
                self._check_open(st)
                if len(st.frames) < st.queue_frames:
                    break
                if st.live:
                    st.frames.popleft()
                    st.dropped += 1
                    break
                if not block:
                    return False
                self._cv.wait(0.5)
            st.frames.append((st.next_seq, np.asarray(image), float(timestamp)))
            st.next_seq += 1
            st.last_submitted_s = max(st.last_submitted_s, float(timestamp))
            self._cv.notify_all()
            return True

    def end(self, sid: str, error: str | None = None) -> None:
        """No more frames: the queue is prefilled, then the partial chunk (the stream ``ended``;
        ``error``: its source failed — the memory so far still answers)."""
        with self._cv:
            st = self._get(sid)
            if st.ended or st.closed:
                return
            st.barriers.append(_Barrier(st.next_seq, True, None, end_error=error))
            st.ended = True
            st.source_error = error
            self._cv.notify_all()

    def sync(self, sid: str, *, flush: bool, since: int | None = None) -> list[ChunkReport]:
        """Wait until every frame submitted so far is taken (``flush``: and the partial chunk
        prefilled); returns the chunks prefilled since chunk number ``since`` (default: now)."""
        request = _Request("sync", sid)
        with self._cv:
            st = self._get(sid)
            self._check_open(st)
            st.barriers.append(_Barrier(st.next_seq, flush, request, len(st.chunks) if since is None else since))
            self._cv.notify_all()
        return request.wait()

    def ask(self, sid: str, question: str, *, max_new_tokens: int | None = None, record_logits: bool = False,
            flush: bool = False, history: Sequence[tuple[str, str]] | None = None) -> AnswerJob:
        """Queue a question, answered from the memory as it is at the next step — or, with
        ``flush``, once every frame submitted before it is prefilled (the partial chunk too). Read its pieces from ``job.pieces``; set ``job.cancel`` to
        stop it between two tokens (the memory is restored exactly)."""
        with self._cv:
            st = self._get(sid)
            self._check_open(st)
            job = AnswerJob(question, max_new_tokens, record_logits,
                            None if history is None else [(q, a) for q, a in history], flush,
                            st.next_seq if flush else 0)
            st.jobs.append(job)
            self._cv.notify_all()
            return job

    def call(self, sid: str, fn: Callable[[Session], Any]) -> Any:
        """Run ``fn(session)`` on the engine thread between two steps (for the engine's own
        modules: snapshots, readouts); returns its result."""
        return self._control("call", sid, fn)

    def memory_map(self, sid: str) -> MemoryMap:
        return self.call(sid, memory_map)

    def fresh_stats(self, sid: str) -> SessionStats:
        return self.call(sid, Session.stats)

    def set_autosaver(self, sid: str, autosaver: Any) -> None:
        """Save the stream with ``autosaver.tick()`` after each of its chunks (None: stop)."""
        self._control("autosave", sid, autosaver)

    def pause(self, sid: str) -> None:
        """Stop feeding the stream; returns once no chunk of it is in flight."""
        self._control("pause", sid, True)

    def resume(self, sid: str) -> None:
        self._control("pause", sid, False)

    def close(self, sid: str) -> None:
        """Close the stream: an open answer is cancelled, waiting requests get ``StreamFailed``."""
        self._control("close", sid)

    def note(self, sid: str, kind: str, data: dict) -> None:
        """An event from outside the engine (a source's ``gap``, a ``warning``) for subscribers."""
        self._emit_now(sid, kind, data)

    # -- readouts (no waiting: published by the engine thread) ------------------------------------
    def streams(self) -> list[str]:
        with self._cv:
            return [sid for sid in self._order if not self._streams[sid].closed]

    def stats(self, sid: str) -> SessionStats:
        return self._get(sid).stats

    def counts(self, sid: str) -> StreamCounts:
        """Frame accounting now (the queue's side live; the session's as last published)."""
        with self._cv:
            st = self._get(sid)
            c = st.counts
            return StreamCounts(st.next_seq, st.dropped, len(st.frames), st.taken, c.frames_seen, c.frames_pending,
                                st.answers, st.cancelled, c.lag_s)

    def warnings(self, sid: str) -> tuple[str, ...]:
        return self._get(sid).warnings

    def chunks_done(self, sid: str) -> int:
        """Chunks the stream has prefilled so far."""
        with self._cv:
            return len(self._get(sid).chunks)

    def state(self, sid: str) -> str:
        return self._get(sid).state

    def error(self, sid: str) -> str | None:
        st = self._get(sid)
        return st.error or st.source_error

    def paused(self, sid: str) -> bool:
        return self._get(sid).paused

    def last_answer(self, sid: str) -> Answer | None:
        return self._get(sid).last_answer

    def session_facts(self, sid: str) -> tuple[Policy, SessionConfig]:
        """The stream's policy and settings (fixed when it opened)."""
        st = self._get(sid)
        return st.session.policy, st.session.config

    def subscribe(self, sid: str) -> queue.SimpleQueue:
        """A queue that receives the stream's ``Event``s from now on."""
        q: queue.SimpleQueue = queue.SimpleQueue()
        with self._cv:
            self._get(sid).subscribers.append(q)
        return q

    def unsubscribe(self, sid: str, q: queue.SimpleQueue) -> None:
        with self._cv:
            st = self._streams.get(sid)
            if st is not None and q in st.subscribers:
                st.subscribers.remove(q)

    # -- the caller side ----------------------------------------------------------------------------
    def _get(self, sid: str) -> _Stream:
        try:
            return self._streams[sid]
        except KeyError:
            raise KeyError(f"no stream {sid!r}") from None

    def _check_open(self, st: _Stream) -> None:
        if self._stop or self._closed:
            raise EngineStopped()
        if st.closed:
            raise StreamFailed(f"stream {st.id} is closed")
        if st.error:
            raise StreamFailed(f"stream {st.id} failed: {st.error}")

    def _control(self, kind: str, sid: str | None, payload: Any = None) -> Any:
        if threading.current_thread() is self._thread:
            raise RuntimeError("the engine cannot wait for itself")
        request = _Request(kind, sid, payload)
        with self._cv:
            if self._stop or self._closed:
                raise EngineStopped()
            self._controls.append(request)
            self._cv.notify_all()
        return request.wait()

    def _emit_now(self, sid: str, kind: str, data: dict) -> None:
        with self._cv:
            st = self._streams.get(sid)
            subscribers = list(st.subscribers) if st else []
        event = Event(kind, sid, data)
        for q in subscribers:
            q.put(event)

    # -- the engine thread --------------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while (work := self._next_work()) is not None:
                kind, st, arg = work
                t0 = time.perf_counter()
                self._serve_one(kind, st, arg)
                spent = time.perf_counter() - t0
                if kind in ("start", "decode"):
                    self._answer_s += spent
                elif kind == "feed":
                    self._answer_s, self._last_feed_s = 0.0, spent
        except BaseException as exc:  # the thread itself failed: say so to everyone waiting
            self.failure = exc
            raise
        finally:
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            self._refuse_all()

    def _serve_one(self, kind: str, st: _Stream | None, arg: Any) -> None:
        if kind == "control":
            self._serve_control(arg)
        elif kind == "decode":
            self._decode_step(arg)
        elif st is None:
            raise RuntimeError(f"{kind} work without a stream")
        elif kind == "start":
            self._start_answer(st, arg)
        elif kind == "barrier":
            self._serve_barrier(st, arg)
        else:
            self._feed(st, arg)

    def _next_work(self) -> tuple[str, _Stream | None, Any] | None:
        """The next thing to do (see the module docstring's order), taken under the condition."""
        with self._cv:
            while True:
                if self._stop:
                    return None
                for request in self._controls:  # a call on a stream waits for its open answer
                    busy = self._streams.get(request.stream or "")
                    if request.kind != "call" or busy is None or busy.active is None:
                        self._controls.remove(request)
                        return "control", None, request
                live = [self._streams[sid] for sid in self._order]
                owed = self._answer_s >= max(self._last_feed_s, MIN_ANSWER_TURN_S)
                if owed and (feed := self._take_feed()) is not None:
                    return "feed", *feed  # answers have had their share: one chunk goes first
                for st in live:
                    # a paused stream takes no frames: a question answers from what it holds
                    if st.active is None and st.jobs and not st.error and (st.paused or st.ready(st.jobs[0].after_seq)):
                        job = st.jobs[0]
                        if not st.barriers or st.barriers[0].after_seq > job.after_seq:
                            st.jobs.popleft()
                            return "start", st, job
                active = [st for st in live if st.active is not None]
                if active:
                    return "decode", None, active[: self.max_batch]
                for st in live:
                    if st.barriers and st.active is None and st.ready(st.barriers[0].after_seq):
                        first_job = st.jobs[0].after_seq if st.jobs else None
                        if first_job is None or st.barriers[0].after_seq <= first_job:
                            return "barrier", st, st.barriers.popleft()
                if (feed := self._take_feed()) is not None:
                    return "feed", *feed
                self._cv.wait()

    def _take_feed(self) -> tuple[_Stream, list[tuple[int, np.ndarray, float]]] | None:
        """The next stream in turn that can take frames, and the frames of its next chunk (under
        the condition)."""
        n = len(self._order)
        for k in range(n):
            st = self._streams[self._order[(self._turn + k) % n]]
            if st.paused or st.error or st.active is not None or not st.frames:
                continue
            bound = st.first_barrier()
            need = max(1, st.session.config.chunk_frames - st.session.pending_frames)
            take: list[tuple[int, np.ndarray, float]] = []
            while st.frames and st.frames[0][0] < bound and len(take) < need:
                take.append(st.frames.popleft())
            if take:
                self._turn = (self._turn + k + 1) % n
                st.taken += len(take)
                self._cv.notify_all()  # room in the queue
                return st, take
        return None

    # -- serving ---------------------------------------------------------------------------------
    def _serve_control(self, request: _Request) -> None:
        kind = request.kind
        try:
            if kind == "open":
                policy, config, live, bound, notifier = request.payload
                if request.stream in self._streams and not self._streams[request.stream].closed:
                    raise ValueError(f"a stream named {request.stream!r} is already open")
                st = _Stream(request.stream or "", Session(self.adapter, policy, config), live=live, queue_frames=bound)
                st.notifier = notifier
                self._publish(st)
                with self._cv:
                    self._streams[st.id] = st
                    if st.id in self._order:
                        self._order.remove(st.id)
                    self._order.append(st.id)
                request.finish(st.id)
                return
            st = self._get(request.stream or "")
            if kind == "close":
                self._close(st)
                request.finish()
                return
            if st.closed:
                raise StreamFailed(f"stream {st.id} is closed")
            if kind == "pause":
                st.paused = bool(request.payload)
                result = None
            elif kind == "autosave":
                st.autosaver = request.payload
                result = None
            else:
                result = request.payload(st.session)
                self._publish(st)
            request.finish(result)
        except Exception as exc:
            request.finish(error=exc)

    def _feed(self, st: _Stream, items: list[tuple[int, np.ndarray, float]]) -> None:
        """Hand frames to the stream's session: a full chunk is prefilled (and compressed)."""
        try:
            reports = st.session.ingest([f for _, f, _ in items], [t for _, _, t in items])
        except Exception as exc:
            self._fail(st, exc)
            return
        self._after_chunks(st, reports)

    def _serve_barrier(self, st: _Stream, barrier: _Barrier) -> None:
        report = None
        if barrier.flush:
            try:
                report = st.session.flush()
            except Exception as exc:
                self._fail(st, exc)
                if barrier.request is not None:
                    barrier.request.finish(error=StreamFailed(f"stream {st.id} failed: {st.error}"))
                return
            self._after_chunks(st, [report] if report is not None else [])
        if barrier.request is not None:
            barrier.request.finish(st.chunks[barrier.first_chunk:] if not barrier.flush else report)
        else:  # the end of the stream: every chunk event is out before ``ended``
            self._emit(st, "ended", {"error": barrier.end_error} if barrier.end_error else {})

    def _after_chunks(self, st: _Stream, reports: list[ChunkReport]) -> None:
        polled: dict[str, float] = {}
        if reports and st.notifier is not None:
            reports[-1], polled = self._notify(st, reports[-1])
        for k, report in enumerate(reports):
            st.chunks.append(report)
            probed = {"p_yes": {c: round(p, 6) for c, p in polled.items()}} if polled and k == len(reports) - 1 else {}
            self._emit(st, "chunk", {**probed, "frames": report.frames, "tokens": report.tokens,
                                     "prefill_ms": round(report.prefill_ms, 3),
                                     "stream_time_s": round(st.session.stream_time_s, 3),
                                     "frames_seen": st.session.frames_seen,
                                     # the rest of the report (benchmarks split a chunk's time)
                                     "encode_ms": round(report.encode_ms, 3),
                                     "compress_ms": round(report.compress_ms, 3),
                                     "pseudo_query_ms": round(report.pseudo_query_ms, 3),
                                     "compressed": report.compressed, "folded": report.folded,
                                     "notify_ms": round(report.notify_ms, 3)})
            if report.compressed:
                self._emit(st, "compress", {"compress_ms": round(report.compress_ms, 3),
                                            "tokens_per_layer": st.session.cache.length})
            if report.reindexed:
                self._emit(st, "reindex", {"count": st.session.positions.reindex_count})
        if reports and st.autosaver is not None:
            st.autosaver.tick()
        self._publish(st)

    def _notify(self, st: _Stream, report: ChunkReport) -> tuple[ChunkReport, dict[str, float]]:
        """The ``--notify`` probes after a chunk: a ``notification`` event for each condition that
        fires; returns the report and the p(yes) of each condition polled (the chunk event's
        ``p_yes``). A probe that fails is one warning, and the stream goes on without notifications."""
        from .probe import notify_step

        assert st.notifier is not None
        try:
            step = notify_step(st.session, st.notifier, since=time.perf_counter())
        except Exception as exc:
            st.notifier = None
            st.session.warnings.append(f"--notify stopped: {type(exc).__name__}: {exc}")
            return report, {}
        for event in step.events:
            self._emit(st, "notification", event.to_json())
        return dataclasses.replace(report, notify_ms=step.probe_ms), step.p_yes

    def _start_answer(self, st: _Stream, job: AnswerJob) -> None:
        if job.cancel.is_set():
            st.cancelled += 1
            self._end_job(job)
            return
        session = st.session
        try:
            if job.flush and session.pending_frames:
                report = session.flush()
                self._after_chunks(st, [report] if report is not None else [])
            job.opened = session.open_answer(job.question, max_new_tokens=job.max_new_tokens,
                                             record_logits=job.record_logits, history=job.history)
            job.answer = st.last_answer = job.opened.answer
            piece = job.opened.start()
        except Exception as exc:
            if job.opened is not None:
                job.opened.close()
            self._fail(st, exc, job)
            return
        if piece:
            job.pieces.put(piece)
        if job.opened.done:
            self._complete(st, job)
        else:
            st.active = job

    def _decode_step(self, active: list[_Stream]) -> None:
        rows = []
        for st in active:
            job = st.active
            assert job is not None and job.opened is not None
            if job.cancel.is_set() or self._stop:
                job.opened.close()  # the rollback: the memory is as before the question
                st.active = None
                st.cancelled += 1
                self._end_job(job)
                self._publish(st)
            else:
                rows.append(st)
        if not rows:
            return
        decodes = [st.active.opened.decode for st in rows]  # type: ignore[union-attr]
        try:
            results: list[str | BaseException] = list(self._batch.step(decodes))  # type: ignore[arg-type]
        except Exception as exc:  # one stream's fault must not end the others' answers
            if len(rows) == 1:
                results = [exc]
            else:
                results = []
                for st in rows:
                    try:
                        results.append(st.active.opened.step())  # type: ignore[union-attr]
                    except Exception as alone:
                        results.append(alone)
        for st, result in zip(rows, results, strict=True):
            job = st.active
            assert job is not None and job.opened is not None
            if isinstance(result, BaseException):
                job.opened.close()
                st.active = None
                self._fail(st, result, job)
                continue
            if result:
                job.pieces.put(result)
            if job.opened.done:
                st.active = None
                self._complete(st, job)

    def _complete(self, st: _Stream, job: AnswerJob) -> None:
        assert job.opened is not None
        try:
            job.opened.close()
        except Exception as exc:
            self._fail(st, exc, job)
            return
        st.answers += 1
        self._end_job(job)
        self._publish(st)

    @staticmethod
    def _end_job(job: AnswerJob, error: BaseException | None = None) -> None:
        job.error = error
        job.pieces.put(END if error is None else error)
        job.done.set()

    def _fail(self, st: _Stream, exc: BaseException, job: AnswerJob | None = None) -> None:
        """The stream failed: say so once, refuse what waits for it; other streams go on."""
        st.error = f"{type(exc).__name__}: {exc}"
        error = StreamFailed(f"stream {st.id} failed: {st.error}")
        error.__cause__ = exc
        if job is not None:
            self._end_job(job, error)
        self._refuse_stream(st, error)
        self._emit(st, "failed", {"error": st.error})
        self._publish(st)

    def _close(self, st: _Stream) -> None:
        if st.closed:
            return
        if st.active is not None and st.active.opened is not None:
            st.active.opened.close()
            st.cancelled += 1
            self._end_job(st.active, StreamFailed(f"stream {st.id} was closed mid-answer"))
            st.active = None
        with self._cv:
            st.closed = True
            self._cv.notify_all()
        self._refuse_stream(st, StreamFailed(f"stream {st.id} is closed"))
        self._emit(st, "closed", {})
        with self._cv:
            self._streams.pop(st.id, None)
            if st.id in self._order:
                self._order.remove(st.id)

    def _refuse_stream(self, st: _Stream, error: BaseException, *, drop_frames: bool = True) -> None:
        """Fail what waits for the stream; ``drop_frames``: its queued frames go too (counted
        as dropped) — an engine that stops leaves them queued, so the counts still add up."""
        with self._cv:
            jobs, barriers = list(st.jobs), list(st.barriers)
            st.jobs.clear()
            st.barriers.clear()
            if drop_frames:
                st.dropped += len(st.frames)
                st.frames.clear()
            self._cv.notify_all()
        for job in jobs:
            self._end_job(job, error)
        for barrier in barriers:
            if barrier.request is not None:
                barrier.request.finish(error=error)

    def _refuse_all(self) -> None:
        with self._cv:
            controls = list(self._controls)
            self._controls.clear()
            streams = list(self._streams.values())
        for request in controls:
            request.finish(error=EngineStopped())
        for st in streams:
            if st.active is not None:
                if st.active.opened is not None and threading.current_thread() is self._thread:
                    st.active.opened.close()
                self._end_job(st.active, EngineStopped("the answer was cut short: the engine stopped"))
                st.active = None
            self._refuse_stream(st, EngineStopped(), drop_frames=False)

    def _emit(self, st: _Stream, kind: str, data: dict) -> None:
        event = Event(kind, st.id, data)
        with self._cv:
            subscribers = list(st.subscribers)
        for q in subscribers:
            q.put(event)

    def _publish(self, st: _Stream) -> None:
        """Readouts for other threads, and the session's new warnings as events."""
        session = st.session
        st.stats = session.stats()
        warnings = tuple(session.warnings)
        for warning in warnings[st.warned:]:
            self._emit(st, "warning", {"message": warning})
        st.warned = len(warnings)
        st.warnings = warnings
        st.counts = st.make_counts()
