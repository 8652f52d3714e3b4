"""Clients of the engine: what every mode of the program uses to drive a stream.

``StreamClient`` is one stream on an in-process ``core.Engine``; ``StreamAPI`` is the interface
it implements, which an HTTP client (``hermes chat --server``) or a Ray client implements too.
Everything here is safe from any thread; nothing here touches a session.
"""

from __future__ import annotations

import queue
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .core import END, AnswerJob, Engine, EngineStopped, Event, StreamCounts, StreamFailed
from .position_tracker import PositionLimitError
from .readouts import MemoryMap
from .records import Answer, ChunkReport, SessionStats

if TYPE_CHECKING:
    from policies import Policy

    from .config import SessionConfig
    from .snapshot import SaveReport, Snapshot

__all__ = ["AnswerHandle", "EngineStopped", "PositionLimitError", "StreamAPI", "StreamClient", "StreamFailed",
           "open_stream"]


class AnswerHandle:
    """An answer being decoded: iterate for its text pieces as they come.

    ``answer`` waits for the end and returns the record; ``close()`` cancels it (between two
    tokens) and returns once the memory is restored; dropping the handle cancels it too.
    """

    def __init__(self, job: AnswerJob) -> None:
        self._job = job
        self._ended = False
        weakref.finalize(self, job.cancel.set)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self._ended:
            raise StopIteration
        item = self._job.pieces.get()
        if item is END:
            self._ended = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        return item

    @property
    def answer(self) -> Answer:
        self._job.done.wait()
        if self._job.error is not None:
            raise self._job.error
        if self._job.answer is None:  # cancelled before it started
            raise StreamFailed(f"the question {self._job.question!r} was cancelled")
        return self._job.answer

    @property
    def finished(self) -> bool:
        """Whether the engine is done with it (the memory no longer holds its tokens)."""
        return self._job.done.is_set()

    def close(self) -> None:
        self._job.cancel.set()
        self._job.done.wait()
        self._ended = True


class StreamAPI(Protocol):
    """One stream of an engine, wherever the engine runs."""

    id: str

    def submit(self, image: np.ndarray, timestamp: float, *, block: bool = True) -> bool: ...
    def end(self, error: str | None = None) -> None: ...
    def flush(self) -> ChunkReport | None: ...
    def ask(self, question: str, *, max_new_tokens: int | None = None, flush: bool = False,
            history: Sequence[tuple[str, str]] | None = None) -> AnswerHandle: ...
    def stats(self) -> SessionStats: ...
    def fresh_stats(self) -> SessionStats: ...
    def counts(self) -> StreamCounts: ...
    def memory_map(self) -> MemoryMap: ...
    def save(self, path, *, source: str | None = None) -> SaveReport: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def close(self) -> None: ...


class StreamClient:
    """One stream on an in-process engine (see ``StreamAPI``)."""

    def __init__(self, engine: Engine, sid: str) -> None:
        self.engine, self.id = engine, sid
        self.policy, self.config = engine.session_facts(sid)

    # -- facts fixed at opening -------------------------------------------------------------------
    @property
    def model(self) -> str:
        return self.engine.adapter.name

    @property
    def frames_per_unit(self) -> int:
        return self.engine.adapter.frames_per_unit

    # -- frames ---------------------------------------------------------------------------------
    def submit(self, image: np.ndarray, timestamp: float, *, block: bool = True) -> bool:
        return self.engine.submit(self.id, image, timestamp, block=block)

    def ingest(self, frames: Sequence[np.ndarray], timestamps: Sequence[float]) -> list[ChunkReport]:
        """Submit frames and wait until they are taken; the chunks they completed."""
        if len(frames) != len(timestamps):
            raise ValueError(f"{len(frames)} frames but {len(timestamps)} timestamps")
        before = self.engine.chunks_done(self.id)
        for frame, ts in zip(frames, timestamps, strict=True):
            self.submit(frame, ts)
        return self.engine.sync(self.id, flush=False, since=before)

    def flush(self) -> ChunkReport | None:
        """Prefill every frame submitted so far, the partial chunk too (padded to whole units)."""
        result = self.engine.sync(self.id, flush=True)
        return result if isinstance(result, ChunkReport) else None

    def end(self, error: str | None = None) -> None:
        self.engine.end(self.id, error)

    def note(self, kind: str, **data) -> None:
        """An event of the source's (``gap``, ``warning``) for the stream's subscribers."""
        self.engine.note(self.id, kind, data)

    # -- questions ------------------------------------------------------------------------------
    def ask(self, question: str, *, max_new_tokens: int | None = None, record_logits: bool = False,
            flush: bool = False, history: Sequence[tuple[str, str]] | None = None) -> AnswerHandle:
        return AnswerHandle(self.engine.ask(self.id, question, max_new_tokens=max_new_tokens,
                                            record_logits=record_logits, flush=flush, history=history))

    def answer(self, question: str, **kwargs) -> Answer:
        handle = self.ask(question, **kwargs)
        for _ in handle:
            pass
        return handle.answer

    # -- readouts -------------------------------------------------------------------------------
    def stats(self) -> SessionStats:
        """As of the stream's last chunk or answer (no waiting)."""
        return self.engine.stats(self.id)

    def fresh_stats(self) -> SessionStats:
        """Now (waits for the step in flight)."""
        return self.engine.fresh_stats(self.id)

    def counts(self) -> StreamCounts:
        return self.engine.counts(self.id)

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.engine.warnings(self.id)

    @property
    def state(self) -> str:
        return self.engine.state(self.id)

    @property
    def error(self) -> str | None:
        return self.engine.error(self.id)

    @property
    def paused(self) -> bool:
        return self.engine.paused(self.id)

    @property
    def last_answer(self) -> Answer | None:
        return self.engine.last_answer(self.id)

    def memory_map(self) -> MemoryMap:
        return self.engine.memory_map(self.id)

    def history(self) -> list[tuple[str, str]]:
        return self.engine.call(self.id, lambda session: list(session.history))

    def subscribe(self) -> queue.SimpleQueue[Event]:
        return self.engine.subscribe(self.id)

    def unsubscribe(self, q: queue.SimpleQueue) -> None:
        self.engine.unsubscribe(self.id, q)

    # -- control --------------------------------------------------------------------------------
    def clear_history(self) -> None:
        self.engine.call(self.id, lambda session: session.history.clear())

    def pause(self) -> None:
        self.engine.pause(self.id)

    def resume(self) -> None:
        self.engine.resume(self.id)

    def save(self, path, *, source: str | None = None) -> SaveReport:
        """Write the memory to ``path`` atomically: the copy is taken between two engine steps,
        the file is written on this thread (the engine goes on meanwhile)."""
        import time

        from .snapshot import capture_timed, check_destination, write_captured

        check_destination(path)
        t0 = time.perf_counter()
        tensors, metadata, held_s = self.engine.call(self.id, lambda session: capture_timed(session, source=source))
        return write_captured(path, tensors, metadata, held_s, time.perf_counter() - t0)

    def restore(self, snap: Snapshot, *, accept_policy: bool = False, convert_dtype: bool = False) -> None:
        """Take ``snap``'s memory (checked first: a mismatch raises ``SnapshotError``)."""
        from .snapshot import check_fits, restore

        def run(session) -> None:
            check_fits(snap, session, accept_policy=accept_policy, convert_dtype=convert_dtype)
            restore(snap, session, convert_dtype=convert_dtype)

        self.engine.call(self.id, run)

    def autosave(self, path, every_s: float, *, source: str | None = None):
        """Save atomically to ``path`` at most every ``every_s`` seconds, after a chunk (the
        engine ticks it: the one owner of autosave); returns the ``Autosaver``."""
        from .snapshot import Autosaver

        made = self.engine.call(self.id, lambda session: Autosaver(session, path, every_s, source=source))
        self.engine.set_autosaver(self.id, made)
        return made

    def close(self) -> None:
        self.engine.close(self.id)


def open_stream(engine: Engine, policy: Policy, config: SessionConfig, *, live: bool = False,
                queue_frames: int | None = None, name: str | None = None, notifier=None) -> StreamClient:
    """Open a stream on ``engine`` and return its client (see ``Engine.open_stream``)."""
    sid = engine.open_stream(policy, config, live=live, queue_frames=queue_frames, name=name, notifier=notifier)
    return StreamClient(engine, sid)
