"""One thread owns a session; every other thread talks to it through requests.

``SessionWorker`` runs a ``Session`` on its own thread. Ingesting, flushing, answering, pausing
and arbitrary reads (``call``) are requests to that thread, so the model, the cache, the
positions and every session field have exactly one writer, and no lock is ever held while a
caller reads an answer.

Scheduling (one queue of *urgent* requests — answers, calls, pause, resume — and one FIFO
*feed* of ingest and flush requests):

- Urgent requests go first. An ingest request is fed to the session one frame at a time and
  yields back to the queue after every chunk it completes, so a question waits for at most the
  chunk in flight (plus answers asked before it).
- An answer is decoded by the worker into a per-answer queue of text pieces, as fast as the
  model goes; the caller iterates that queue. A caller that reads slowly, or keeps a half-read
  answer alive, does not hold the model: the answer finishes and the memory is restored without
  waiting for the reader. ``close()`` (or dropping the stream) cancels it between two tokens; the
  memory is restored exactly before ``close()`` returns.
- While paused, the feed is not served (callers of ``ingest`` wait on an event, not a poll);
  answers and calls still are. ``pause()`` returns once no chunk is in flight.
- ``stop()`` lets the chunk or token in flight finish, cancels the answer in progress, refuses
  everything still queued and every later request (``WorkerStopped``, which says how many frames
  of the request were taken) and joins the thread. Frames of a partial chunk stay pending in the
  session, not in the memory.

Every frame handed over is accounted for: a caller knows what it submitted and what was refused
(``WorkerStopped.frames_taken``); ``counts()`` says ``frames_taken == frames_seen +
frames_pending``, so the frames submitted are those in the memory, those pending (dropped if the
stream ends without ``flush``) and those refused.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ..errors import EXIT_BUG, HermesError
from .records import Answer, ChunkReport, SessionStats
from .session import Session

T = TypeVar("T")

__all__ = ["SessionWorker", "WorkerAnswer", "WorkerCounts", "WorkerStopped"]


class WorkerStopped(HermesError, RuntimeError):
    """The worker stopped before serving the request; ``frames_taken`` of its frames were ingested."""

    exit_code = EXIT_BUG

    def __init__(self, message: str = "the session worker has stopped", frames_taken: int = 0) -> None:
        super().__init__(message)
        self.frames_taken = frames_taken


@dataclass(frozen=True)
class WorkerCounts:
    """Where every frame handed to the worker went (all written by the worker thread)."""

    frames_taken: int  # frames handed to the session
    frames_seen: int  # the session's: frames prefilled into the memory
    frames_pending: int  # the session's: frames waiting for their chunk (not in the memory)
    answers: int  # answers completed
    answers_cancelled: int  # answers closed, abandoned or cut by stop() before their end


_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Request:
    """One request; ``done`` is set once it is served or refused."""

    def __init__(self, kind: str, payload: Any = None) -> None:
        self.kind = kind
        self.payload = payload
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.offset = 0  # ingest: frames already handed to the session

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()

    def wait(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class _AnswerJob:
    question: str
    max_new_tokens: int | None
    record_logits: bool
    pieces: Any  # queue.SimpleQueue of str | _END | _Failure
    cancel: threading.Event
    answer: Answer | None = None


class WorkerAnswer:
    """An answer decoded by the worker: iterate for its text pieces (as they are decoded).

    ``answer`` waits for the answer to end and returns its record. ``close()`` cancels it and
    returns once the memory is restored; dropping the object cancels it too.
    """

    def __init__(self, request: _Request, job: _AnswerJob) -> None:
        self._request = request
        self._job = job
        self._ended = False
        weakref.finalize(self, job.cancel.set)  # abandoned: tell the worker to stop decoding

    def __iter__(self) -> WorkerAnswer:
        return self

    def __next__(self) -> str:
        if self._ended:
            raise StopIteration
        item = self._job.pieces.get()
        if item is _END:
            self._ended = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._ended = True
            raise item.error
        return item

    @property
    def answer(self) -> Answer:
        self._request.done.wait()
        if self._job.answer is None:
            raise self._request.error or WorkerStopped()
        return self._job.answer

    @property
    def finished(self) -> bool:
        """Whether the worker is done with it (the memory no longer holds its tokens)."""
        return self._request.done.is_set()

    def close(self) -> None:
        """Cancel (between two tokens) and wait until the question's tokens have left the memory."""
        self._job.cancel.set()
        self._request.done.wait()
        self._ended = True


class SessionWorker:
    """The one thread that drives ``session`` (see the module docstring for the rules).

    The session must not be used directly by anyone else while the worker runs.
    """

    def __init__(self, session: Session, name: str = "hermes-model") -> None:
        self.session = session
        self._cv = threading.Condition()
        self._urgent: deque[_Request] = deque()  # guarded by _cv
        self._feed: deque[_Request] = deque()  # guarded by _cv
        self._stop_requested = threading.Event()
        self._closed = False  # guarded by _cv; set by the worker thread as it exits
        self.paused = threading.Event()  # set/cleared only by the worker thread
        # Fields below are written only by the worker thread (before start: by the constructor).
        self._paused = False
        self._stats: SessionStats = session.stats()
        self._warnings: tuple[str, ...] = tuple(session.warnings)
        self._taken = 0
        self._answers = self._cancelled = 0
        self._counts = self._make_counts()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> SessionWorker:
        """Start the thread (once; later calls do nothing)."""
        with self._cv:
            if self._thread.ident is None and not self._closed:
                self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float | None = 30.0) -> None:
        """Finish the chunk or token in flight, cancel the answer, refuse what is queued, join.

        Called on the worker thread itself (inside ``call``), it only asks the thread to stop.
        """
        self._stop_requested.set()
        with self._cv:
            self._cv.notify_all()
            never_started = self._thread.ident is None
            if never_started:
                self._closed = True
        if never_started:
            self._refuse_queued()
        elif threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    # -- requests -------------------------------------------------------------------------------
    def ingest(self, frames: Sequence[np.ndarray], timestamps: Sequence[float]) -> list[ChunkReport]:
        """Ingest frames (waits while paused); returns the chunks they completed."""
        if len(frames) != len(timestamps):
            raise ValueError(f"{len(frames)} frames but {len(timestamps)} timestamps")
        return self._submit(_Request("ingest", (list(frames), [float(t) for t in timestamps])), urgent=False)

    def flush(self) -> ChunkReport | None:
        """Prefill the partial chunk (end of stream); served in order with ``ingest``."""
        return self._submit(_Request("flush"), urgent=False)

    def ask(self, question: str, *, max_new_tokens: int | None = None, record_logits: bool = False) -> WorkerAnswer:
        """Queue a question; iterate the result for its pieces."""
        job = _AnswerJob(question, max_new_tokens, record_logits, queue.SimpleQueue(), threading.Event())
        request = _Request("answer", job)
        handle = WorkerAnswer(request, job)
        self._enqueue(request, urgent=True)
        return handle

    def answer(self, question: str, **kwargs) -> Answer:
        """Ask and read the whole answer."""
        stream = self.ask(question, **kwargs)
        for _ in stream:
            pass
        return stream.answer

    def call(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn(session)`` on the worker thread (between chunks) and return its result."""
        return self._submit(_Request("call", fn), urgent=True)

    def pause(self) -> None:
        """Stop serving ingest requests; returns once no chunk is in flight."""
        self._submit(_Request("pause"), urgent=True)

    def resume(self) -> None:
        """Serve ingest requests again."""
        self._submit(_Request("resume"), urgent=True)

    # -- readouts (no waiting: published by the worker) -------------------------------------------
    def stats(self) -> SessionStats:
        """The session's stats as of the last chunk, answer or call the worker served."""
        return self._stats

    def counts(self) -> WorkerCounts:
        """Frame accounting as of the last request the worker served."""
        return self._counts

    @property
    def warnings(self) -> tuple[str, ...]:
        return self._warnings

    # -- the caller side of the queue ---------------------------------------------------------------
    def _enqueue(self, request: _Request, *, urgent: bool) -> None:
        with self._cv:
            if self._closed or self._stop_requested.is_set():
                raise WorkerStopped()
            (self._urgent if urgent else self._feed).append(request)
            self._cv.notify_all()

    def _submit(self, request: _Request, *, urgent: bool) -> Any:
        if threading.current_thread() is self._thread:
            raise RuntimeError("the worker cannot wait for itself: use the session directly inside call()")
        self._enqueue(request, urgent=urgent)
        return request.wait()

    # -- the worker thread --------------------------------------------------------------------------
    def _next(self) -> _Request | None:
        with self._cv:
            while True:
                if self._stop_requested.is_set():
                    return None
                if self._urgent:
                    return self._urgent.popleft()
                if self._feed and not self._paused:
                    return self._feed[0]  # stays at the head until fully fed
                self._cv.wait()

    def _serve(self) -> None:
        request = None
        try:
            while (request := self._next()) is not None:
                outcome = self._handle(request)
                if outcome is None:  # an ingest request served in part; its frames queued, no chunk
                    self._counts = self._make_counts()
                    continue
                # Publish first, so a caller that sees its request done also sees its effect.
                self._publish()
                result, error = outcome
                if request.kind == "answer":
                    request.payload.pieces.put(_END if error is None else _Failure(error))
                    error = None
                request.finish(result, error)
        finally:
            with self._cv:
                self._closed = True
            if request is not None and not request.done.is_set():  # the worker itself failed
                with self._cv:
                    if request in self._feed:
                        self._feed.remove(request)
                self._refuse(request)
            self._refuse_queued()
            self._publish()

    def _handle(self, request: _Request) -> tuple[Any, BaseException | None] | None:
        """Serve (part of) one request; ``(result, error)`` once it is done, None if not yet."""
        kind = request.kind
        if kind == "ingest":
            return self._feed_some(request)
        if kind == "answer":
            return None, self._answer(request.payload)
        if kind == "pause" or kind == "resume":
            self._paused = kind == "pause"
            if self._paused:
                self.paused.set()
            else:
                self.paused.clear()
            return None, None
        if kind == "flush":
            self._pop_feed()
        fn = self.session.flush if kind == "flush" else (lambda: request.payload(self.session))
        try:
            return fn(), None
        except Exception as exc:
            return None, exc

    def _pop_feed(self) -> None:
        with self._cv:
            self._feed.popleft()

    def _feed_some(self, request: _Request) -> tuple[Any, BaseException | None] | None:
        """Hand frames of ``request`` to the session until one chunk completes; None if frames
        remain or nothing changed but a frame queued for its chunk (the stats are as they were)."""
        frames, times = request.payload
        if request.result is None:
            request.result = []
        chunked = False
        try:
            while request.offset < len(frames) and not chunked:
                i = request.offset
                made = self.session.ingest([frames[i]], [times[i]])
                request.offset += 1
                self._taken += 1
                request.result.extend(made)
                chunked = bool(made)
        except Exception as exc:
            request.offset += 1  # the frame stays in the session's partial chunk
            self._taken += 1
            self._pop_feed()
            exc.frames_taken = request.offset  # type: ignore[attr-defined]
            return None, exc
        if request.offset < len(frames):
            if chunked:
                self._publish()
            return None
        self._pop_feed()
        return request.result, None

    def _answer(self, job: _AnswerJob) -> BaseException | None:
        """Decode ``job`` into its piece queue; returns the error that ended it, if any."""
        if job.cancel.is_set():  # abandoned before it started
            self._cancelled += 1
            return None
        stream = self.session.ask(job.question, max_new_tokens=job.max_new_tokens, record_logits=job.record_logits)
        job.answer = stream.answer
        pieces: Iterator[str] = iter(stream)
        try:
            while True:
                if job.cancel.is_set() or self._stop_requested.is_set():
                    stream.close()  # the rollback: the cache is as before the question
                    self._cancelled += 1
                    if job.cancel.is_set():
                        return None
                    return WorkerStopped("the answer was cut short: the worker stopped")
                piece = next(pieces, None)
                if piece is None:
                    self._answers += 1
                    return None
                job.pieces.put(piece)
        except Exception as exc:
            stream.close()
            return exc

    def _refuse_queued(self) -> None:
        with self._cv:
            queued = [*self._urgent, *self._feed]
            self._urgent.clear()
            self._feed.clear()
        for request in queued:
            self._refuse(request)
        self._counts = self._make_counts()

    @staticmethod
    def _refuse(request: _Request) -> None:
        if request.kind == "answer":
            request.payload.pieces.put(_Failure(WorkerStopped()))
        request.finish(error=WorkerStopped(frames_taken=request.offset))

    def _publish(self) -> None:
        session = self.session
        self._stats = session.stats()
        self._warnings = tuple(session.warnings)
        self._counts = self._make_counts()

    def _make_counts(self) -> WorkerCounts:
        session = self.session
        return WorkerCounts(self._taken, session.frames_seen,
                            session.pending_frames, self._answers, self._cancelled)
