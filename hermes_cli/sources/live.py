"""Live sources (network streams, cameras): the background reader that keeps the newest frames
for a lagging consumer, reconnection with backoff after a drop, and the gap it leaves.

docs/sources.md, "Live sources", states the behaviour.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from fractions import Fraction

import av

from ..frames import Frame, SourceStats
from .container import open_container, video_stream
from .sampling import RATE_DENOMINATOR
from .targets import SourceError, Target

__all__ = ["BackgroundReader", "reconnect", "record_gap"]

# How long to keep trying to reconnect after a drop, and the backoff between tries.
DEFAULT_RECONNECT_S = 30.0
RECONNECT_FIRST_DELAY_S = 0.25
RECONNECT_MAX_DELAY_S = 2.0


def reconnect(
    target: Target, drop: str, *, timeout_s: float, reconnect_s: float, stop: threading.Event, stats: SourceStats
) -> tuple[av.container.InputContainer, av.VideoStream] | None:
    """Reopen a dropped live source, retrying with backoff (0.25 s doubling to 2 s) until
    `reconnect_s` have passed; `stats.reconnecting` is set meanwhile. Returns the new container
    and its video stream, or None when `stop` is set; raises SourceError when the time runs out."""
    deadline = time.monotonic() + reconnect_s
    stats.reconnecting = True
    delay = RECONNECT_FIRST_DELAY_S
    try:
        while True:
            if deadline - time.monotonic() <= 0:
                raise SourceError(
                    f"{target.name}: {drop} and did not come back within {reconnect_s:g} s "
                    "— check the source and open it again"
                )
            try:
                # the full timeout: PyAV's clock for the first reads after the open may still
                # be the open's, and a short one drops the probed connection at once
                container = open_container(target, timeout_s)
            except SourceError:
                pass
            else:
                try:
                    return container, video_stream(container, target)
                except SourceError:
                    container.close()
            if stop.wait(min(delay, max(0.0, deadline - time.monotonic()))):
                return None
            delay = min(2 * delay, RECONNECT_MAX_DELAY_S)
    finally:
        stats.reconnecting = False


def record_gap(stats: SourceStats, name: str, drop: str, last_frame_at: float, rate: Fraction) -> Fraction:
    """The gap a reconnect left: the wall time since the last frame (`time.monotonic()` then),
    at least one frame interval at `rate`. It is counted in `stats` (gaps, seconds, frames
    lost: round(gap × rate) − 1) with one warning, and returned for the stream clock."""
    gap = max(Fraction(time.monotonic() - last_frame_at).limit_denominator(RATE_DENOMINATOR), 1 / rate)
    lost = max(0, round(gap * rate) - 1)
    stats.gaps += 1
    stats.gap_s += float(gap)
    stats.frames_lost += lost
    stats.warnings.append(f"{name}: {drop}; reconnected, a gap of {float(gap):.1f} s ({lost} frames lost)")
    return gap


class BackgroundReader:
    """Drains a frame iterator in a daemon thread into a bounded buffer; newest frames win.

    Iterating yields buffered frames in order and then re-raises, in the consumer's thread,
    any error the reader hit (as SourceError). `frames` stops by itself once asked to.
    """

    def __init__(self, frames: Iterator[Frame], capacity: int, stats: SourceStats, name: str) -> None:
        self._frames = frames
        self._buffer: collections.deque[Frame] = collections.deque(maxlen=capacity)
        self._stats = stats
        self._name = name
        self._ready = threading.Condition()
        self._finished = False
        self._error: SourceError | None = None
        self._thread = threading.Thread(target=self._run, name=f"hermes-source:{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for frame in self._frames:
                with self._ready:
                    if len(self._buffer) == self._buffer.maxlen:
                        self._stats.frames_dropped += 1
                    self._buffer.append(frame)
                    self._ready.notify()
        except SourceError as error:
            self._error = error
        except Exception as error:
            self._error = SourceError(f"{self._name}: reading failed ({type(error).__name__}: {error})")
        finally:
            with self._ready:
                self._finished = True
                self._ready.notify_all()

    def __iter__(self) -> Iterator[Frame]:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._buffer or self._finished)
                if self._buffer:
                    frame = self._buffer.popleft()
                elif self._error is not None:
                    error, self._error = self._error, None
                    raise error
                else:
                    return
            yield frame

    def close(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the thread (its frames iterator must have been told to
        stop), then forget what is buffered: iteration ends."""
        self._thread.join(timeout_s)
        with self._ready:
            self._buffer.clear()
            self._error = None
            self._finished = True
            self._ready.notify_all()
