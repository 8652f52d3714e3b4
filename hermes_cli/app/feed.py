"""Feeding a stream from a frame source: the one owner of real-time pacing and read-ahead.

``feed`` reads a source in the calling thread and submits each frame to a stream of the engine;
the engine prefills on its own thread, so reading (decoding) the next frames overlaps the
model's work on this chunk — read-ahead, bounded by the stream's queue (a file waits for room,
a live stream drops its oldest frames). ``Pacer`` delivers a file at real time (``--realtime``)
on a clock that stands still while paused.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["Pacer", "feed"]


class Pacer:
    """Real time for a file: a frame is due at its stream time on a clock that stops while paused."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._origin: float | None = None  # wall time of stream time 0
        self._paused_total = 0.0
        self._pause_started: float | None = None

    @property
    def paused(self) -> bool:
        return self._pause_started is not None

    def pause(self) -> None:
        if self._pause_started is None:
            self._pause_started = self.clock()

    def resume(self) -> None:
        if self._pause_started is not None:
            self._paused_total += self.clock() - self._pause_started
            self._pause_started = None

    def paused_for(self) -> float:
        ongoing = 0.0 if self._pause_started is None else self.clock() - self._pause_started
        return self._paused_total + ongoing

    def wait_until_due(self, timestamp: float, stopping: threading.Event | None = None) -> None:
        """Return when ``timestamp`` is due (at once for the first frame: it starts the clock)."""
        if self._origin is None:
            self._origin = self.clock() - timestamp - self.paused_for()
            return
        stopping = stopping or threading.Event()
        while not stopping.is_set():
            delay = self._origin + self.paused_for() + timestamp - self.clock()
            if delay <= 0 and not self.paused:
                return
            stopping.wait(min(max(delay, 0.05), 0.1))


def feed(stream, frames: Iterable, *, pacer: Pacer | None = None, stopping: threading.Event | None = None,
         before: Callable[[object], None] | None = None, on_frame: Callable[[object], None] | None = None,
         end: bool = True) -> BaseException | None:
    """Submit ``frames`` (objects with ``image`` and ``timestamp``) to ``stream`` in order.

    ``before(frame)`` runs before each frame is submitted (timed questions due before it);
    ``on_frame(frame)`` after. Stops early when ``stopping`` is set (the stream is then left
    open). At the end of the source the stream is ended (``end``); a source that fails
    (``SourceError``: a live stream down past its reconnect window, a damaged file) ends it with
    its error, and that error is returned — the memory so far still answers.
    """
    from ..sources import SourceError

    lost: BaseException | None = None
    try:
        for frame in frames:
            if pacer is not None:
                pacer.wait_until_due(frame.timestamp, stopping)
            if stopping is not None and stopping.is_set():
                return None
            if before is not None:
                before(frame)
            stream.submit(frame.image, frame.timestamp)
            if on_frame is not None:
                on_frame(frame)
            if stopping is not None and stopping.is_set():
                return None
    except SourceError as error:
        lost = error
    if end:
        stream.end(None if lost is None else str(lost))
    return lost
