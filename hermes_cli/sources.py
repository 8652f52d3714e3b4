"""Frame sources: a video file, a network stream or a camera, decoded by PyAV into RGB frames
sampled at a target rate.

    with open_source("clip.mp4", fps=2) as source:
        for frame in source:          # Frame(image=HxWx3 uint8 RGB, timestamp=s, index=n)
            ...

Files are decoded in the caller's thread (optionally paced at real time). Live sources
(network streams, cameras) are decoded by a background thread into a small buffer; when the
consumer falls behind, the oldest frames are dropped and counted, so what it gets is recent;
when a live source drops, it reconnects with backoff for `reconnect_s` seconds and its clock
runs on across the gap. Frames are picked by the nearest-frame rule on exact rational
timestamps (`FrameSampler`, docs/sources.md). Every failure a user can cause surfaces as
`SourceError`, whose message is one line.
"""

from __future__ import annotations

import collections
import math
import sys
import threading
import time
import urllib.parse
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import cast

import av
import av.error
import numpy as np

from .frames import Frame, SourceStats

__all__ = [
    "Frame",
    "FrameSampler",
    "FrameSource",
    "SourceError",
    "SourceStats",
    "StreamClock",
    "TimestampSampler",
    "default_camera",
    "devices_hint",
    "list_devices",
    "open_source",
]

# Protocols whose streams run in real time and have no end.
LIVE_SCHEMES = frozenset({"rtsp", "rtsps", "rtmp", "rtmps", "rtmpt", "tcp", "udp", "srt", "rtp"})

SEEK_FROM_S = 10.0  # a file window starting this late is reached by seeking, not by decoding up to it
PLATFORM = sys.platform  # read at call time, so tests can pose as another platform
CAMERA_FORMATS = {"linux": "v4l2", "darwin": "avfoundation", "win32": "dshow"}
LIST_DEVICES_COMMAND = "hermes chat --list-devices"

# A file whose last frame comes this much before its announced duration is reported as cut short.
TRUNCATION_SLACK_S = 0.5
TRUNCATION_SLACK_FRACTION = 0.1

# Live sources: how long to keep trying to reconnect after a drop, and the backoff between tries.
DEFAULT_RECONNECT_S = 30.0
RECONNECT_FIRST_DELAY_S = 0.25
RECONNECT_MAX_DELAY_S = 2.0
MPEGTS_PTS_BITS = 33  # MPEG-TS timestamps: 33 bits at 90 kHz, wrapping after ~26.5 h
RATE_DENOMINATOR = 1_000_000  # a float fps is read as the nearest fraction with this denominator


class SourceError(Exception):
    """A source that cannot be opened or read. str() is one line: what went wrong, what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class TimestampSampler:
    """Picks frames at `fps` from presentation timestamps (variable frame rate safe).

    Time from start_s is cut into slots of 1/fps; the first frame inside each slot is taken,
    later ones in the same slot are not. So the first frame at t >= start_s is taken, frames
    sparser than `fps` are each taken once (never duplicated), and empty slots after a gap
    are not made up for. `tolerance_s` absorbs timestamp rounding.

    Float-time slot rule for frames with exact nominal times (evaluation's .npy frame arrays).
    Decoded media uses `FrameSampler` (exact, independent of the container's time base).
    """

    def __init__(self, fps: float, start_s: float = 0.0, tolerance_s: float = 1e-6) -> None:
        _check_fps(fps)
        self.period_s = 1.0 / fps
        self.start_s = start_s
        self.tolerance_s = tolerance_s
        self.next_s = start_s

    def take(self, timestamp: float) -> bool:
        """Whether the frame at `timestamp` (seconds) is a sample; call in presentation order."""
        if timestamp + self.tolerance_s < self.next_s:
            return False
        slot = math.floor((timestamp - self.start_s + self.tolerance_s) / self.period_s)
        self.next_s = self.start_s + (slot + 1) * self.period_s
        return True


def exact_rate(fps: float | Fraction) -> Fraction:
    """`fps` as an exact fraction: a float is read as the nearest fraction with a denominator of
    at most 10^6 (so 29.97 is 2997/100, 0.1 is 1/10), a Fraction is kept as it is."""
    if isinstance(fps, Fraction):
        return fps
    return Fraction(fps).limit_denominator(RATE_DENOMINATOR)


class FrameSampler:
    """The nearest-frame rule on exact times (docs/sources.md, "Frame sampling").

    Targets are T_k = start + k/fps for k = 0, 1, ... while T_k <= end. Each target takes the
    frame whose presentation time is nearest to it, the earlier one on a tie; a frame taken by
    several targets is delivered once. Targets after the last frame count as long as that frame
    is still the nearest: up to half the last frame interval past it (a lone frame: none).

    Feed frames in presentation order with `push(time, item)`; it returns the items decided so
    far, in order (a frame is decided when the next one arrives, or at once when it is itself the
    nearest to a target at or before it). `finish()` returns the rest at the end of the stream.
    Times are `Fraction` seconds; a frame not later than the one before it is ignored.
    """

    def __init__(self, fps: float | Fraction, start: float | Fraction = 0, end: float | Fraction | None = None) -> None:
        _check_fps(float(fps))
        self.fps = exact_rate(fps)
        self.start = _exact_time(start)
        self.end = None if end is None else _exact_time(end)
        self.done = False  # no target is left (the next one is past `end`)
        self._k = 0
        self._prev: tuple[Fraction, object] | None = None  # the latest frame before the next target
        self._prev_taken = False
        self._last_interval = Fraction(0)

    def target(self, k: int) -> Fraction:
        """The time of target k."""
        return self.start + k / self.fps

    def push(self, time: Fraction, item: object) -> list[tuple[Fraction, object]]:
        """Offer the next frame; returns [(time, item)] chosen now (at most two). Constant time
        however many targets lie between this frame and the one before (a long gap)."""
        chosen: list[tuple[Fraction, object]] = []
        if self.done or (self._prev is not None and time <= self._prev[0]):
            return chosen
        new_taken = False
        first = self._k  # the first target after the previous frame
        last = math.floor((time - self.start) * self.fps) if time >= self.start else -1  # last target <= time
        if self.end is not None:
            last = min(last, math.floor((self.end - self.start) * self.fps))
        if last >= first:
            # prev_time < target <= time: the nearer frame wins, the earlier on a tie. Targets
            # up to the midpoint take the previous frame, later ones this frame.
            if self._prev is not None and not self._prev_taken:
                target = self.target(first)
                if target - self._prev[0] <= time - target:
                    chosen.append(self._prev)
                    self._prev_taken = True
            target = self.target(last)
            if self._prev is None or time - target < target - self._prev[0]:
                chosen.append((time, item))
                new_taken = True
            self._k = last + 1
        if self.end is not None and self.target(self._k) > self.end:
            self.done = True
        if self._prev is not None:
            self._last_interval = time - self._prev[0]
        self._prev, self._prev_taken = (time, item), new_taken
        return chosen

    def finish(self) -> list[tuple[Fraction, object]]:
        """End of stream: the last frame, when a target up to half an interval after it is left.

        May also be called at a break in a live stream (the stream then goes on: frames pushed
        later are sampled as usual, the last one is not delivered twice)."""
        if self.done or self._prev is None or self._prev_taken:
            return []
        target = self.target(self._k)
        if target <= self._prev[0] + self._last_interval / 2 and (self.end is None or target <= self.end):
            self._prev_taken = True
            return [self._prev]
        return []


class StreamClock:
    """Exact stream time in seconds from frame pts: 0 at the first frame (or at `origin_pts`),
    increasing across timestamp wraps and continuous across reconnects.

    wrap_bits: the width of the container's timestamps (33 for MPEG-TS); a jump backwards by
    more than half that range is read as a wrap (and forwards by as much as a wrap undone).
    After `resume()` (a reconnect), the next frame is placed `gap` after the last one, whatever
    its pts, and later frames follow the new stream's pts from there. With `jump_back_step`
    (live streams), a frame whose time would not be after the last one (the sender restarted
    its timestamps) is placed that step after it instead, and counted in `jumps_back`.
    """

    def __init__(
        self,
        wrap_bits: int | None = None,
        origin_pts: int | None = None,
        jump_back_step: Fraction | None = None,
    ) -> None:
        self._wrap = None if wrap_bits is None else 1 << wrap_bits
        self._jump_back_step = jump_back_step
        self.jumps_back = 0
        self._origin_pts = origin_pts
        self._base = Fraction(0)  # time of origin_pts
        self._unwrap = 0  # added to raw pts
        self._last_raw: int | None = None
        self._resume_gap: Fraction | None = None
        self.last: Fraction | None = None  # time of the latest frame

    def time(self, pts: int, time_base: Fraction) -> Fraction:
        """Seconds of the frame with this pts (frames in presentation order)."""
        if self._resume_gap is not None:
            self._base = (self.last or Fraction(0)) + self._resume_gap
            self._origin_pts, self._last_raw, self._unwrap = pts, None, 0
            self._resume_gap = None
        if self._wrap is not None and self._last_raw is not None:
            jump = pts - self._last_raw
            if jump < -self._wrap // 2:
                self._unwrap += self._wrap
            elif jump > self._wrap // 2:
                self._unwrap -= self._wrap
        self._last_raw = pts
        if self._origin_pts is None:
            self._origin_pts = pts
        time = self._base + (pts + self._unwrap - self._origin_pts) * Fraction(time_base)
        if self._jump_back_step is not None and self.last is not None and time <= self.last:
            self.jumps_back += 1
            self._base, self._origin_pts, self._unwrap = self.last + self._jump_back_step, pts, 0
            time = self._base
        self.last = time
        return time

    def advance(self, seconds: Fraction) -> Fraction:
        """The time of a frame without pts: `seconds` after the latest one."""
        self.last = (self.last if self.last is not None else -seconds) + seconds
        return self.last

    def resume(self, gap: Fraction) -> None:
        """A new connection: its first frame comes `gap` after the latest frame so far."""
        self._resume_gap = gap


def _exact_time(seconds: float | Fraction) -> Fraction:
    if isinstance(seconds, Fraction):
        return seconds
    return Fraction(seconds).limit_denominator(RATE_DENOMINATOR)


@dataclass(frozen=True)
class _Target:
    """What to hand to av.open, and how to talk about it."""

    url: str
    name: str
    kind: str  # "file", "url" or "camera"
    format: str | None = None
    options: dict[str, str] = field(default_factory=dict)


class FrameSource:
    """Iterable of sampled `Frame`s from one opened stream; iterate once, then `close()`.

    Use `open_source` to make one. Iteration raises `SourceError` when the stream fails, or
    when it ends without a single frame.
    """

    def __init__(
        self,
        container: av.container.InputContainer,
        stream: av.VideoStream,
        target: _Target,
        *,
        fps: float,
        live: bool,
        realtime: bool,
        timeout_s: float,
        max_frames: int | None,
        start_s: float,
        end_s: float | None,
        buffer_frames: int,
        reconnect_s: float = 0.0,
    ) -> None:
        self._container = container
        self._stream = stream
        self._target = target
        self._fps = fps
        self._live = live
        self._realtime = realtime
        self._timeout_s = timeout_s
        self._max_frames = max_frames
        self._start_s = start_s
        self._end_s = end_s
        self._buffer_frames = buffer_frames
        self._reconnect_s = reconnect_s
        self._last_frame_at: float | None = None  # monotonic time the latest frame was decoded
        self._gap: tuple[float, str] | None = None  # (last frame's time, why) after a reconnect
        self._said_jump_back = False
        self._stats = SourceStats()
        self._stop = threading.Event()
        self._closed = False
        self._iterated = False
        self._damaged = False  # a warning already says the data is damaged
        self._reader: _BackgroundReader | None = None  # live sources
        self._frames: _StoppableIterator | None = None  # files
        self._duration_s = None if live else _duration_s(container, stream)
        self._source_fps = _stream_rate(stream)  # read now: a closed stream must not be touched

    @property
    def name(self) -> str:
        """Short display name: a file's name, a URL without credentials, or the camera."""
        return self._target.name

    @property
    def is_live(self) -> bool:
        """True for real-time sources (streams, cameras): read in the background, may drop frames."""
        return self._live

    @property
    def duration_s(self) -> float | None:
        """Length in seconds, or None when unknown (always None for live sources)."""
        return self._duration_s

    @property
    def fps(self) -> float:
        """The target sampling rate in frames per second."""
        return self._fps

    @property
    def source_fps(self) -> float | None:
        """The stream's own frame rate (average, or FFmpeg's guess), or None when unknown."""
        return self._source_fps

    @property
    def effective_fps(self) -> float:
        """The rate frames can actually come at: `fps`, or the source's own rate when that is
        lower (--fps 100 on a 25 fps file gives 25 fps; each frame is delivered once)."""
        source_fps = self.source_fps
        return min(self._fps, source_fps) if source_fps else self._fps

    @property
    def rate_note(self) -> str | None:
        """One line for the user when `fps` exceeds the source's rate, else None."""
        if self.effective_fps >= self._fps:
            return None
        return (
            f"{self.name}: --fps {self._fps:g} exceeds the video's {self.effective_fps:.4g} fps; "
            f"every frame is used once, so it gives {self.effective_fps:.4g} fps"
        )

    @property
    def reconnect_s(self) -> float:
        """How long a live source keeps trying to reconnect after a drop (0: it does not)."""
        return self._reconnect_s

    @property
    def stats(self) -> SourceStats:
        """Counters and warnings, updated while the source is read."""
        return self._stats

    def __iter__(self) -> Iterator[Frame]:
        if self._iterated:
            raise RuntimeError(f"{self.name}: a FrameSource can be iterated only once")
        if self._closed:
            raise RuntimeError(f"{self.name}: source is closed")
        self._iterated = True
        if self._live:
            self._reader = _BackgroundReader(
                self._sampled_frames(), self._buffer_frames, self._stats, self.name
            )
            return iter(self._reader)
        self._frames = _StoppableIterator(self._sampled_frames())
        return self._frames

    def close(self) -> None:
        """Stop reading and release the stream; safe to call more than once, from any thread.

        A live source's thread is joined; it notices the request between frames, or at the
        latest when a stalled read times out (`timeout_s`). A file being iterated in another
        thread stops at its next packet and releases the stream itself."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._reader is not None:
            self._reader.close(self._timeout_s + 1.0)
        elif self._frames is not None:
            self._frames.close()
        else:
            self._container.close()

    def __enter__(self) -> FrameSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _sampled_frames(self) -> Generator[Frame, None, None]:
        """Decode, sample and convert frames, paced at real time when asked; closes the
        container when done (in the thread that reads it)."""
        try:
            yield from self._sample()
        finally:
            self._container.close()

    def _sample(self) -> Iterator[Frame]:
        origin_pts = self._seek_to_start()
        wraps = {"mpegts", "hls"} & set(self._container.format.name.split(","))
        self._clock = StreamClock(
            MPEGTS_PTS_BITS if wraps else None,
            origin_pts,
            jump_back_step=1 / exact_rate(self._source_fps or self._fps) if self._live else None,
        )
        sampler = FrameSampler(self._fps, self._start_s, self._end_s)
        last_timestamp = Fraction(0)
        clock_origin: float | None = None
        for av_frame in self._decoded_frames():
            if av_frame is None:  # a live source dropped: settle its last frame as at an end
                for frame_time, chosen_frame in sampler.finish():
                    self._stats.frames_sampled += 1
                    yield Frame(_upright_rgb(cast(av.VideoFrame, chosen_frame)), float(frame_time), self._stats.frames_sampled - 1)
                    if self._max_frames is not None and self._stats.frames_sampled >= self._max_frames:
                        return
                continue
            self._stats.frames_decoded += 1
            if self._gap is not None:
                self._resume_clock()
            if av_frame.pts is None:  # rare (raw streams): continue the clock at the nominal rate
                timestamp = self._clock.advance(1 / exact_rate(self._stream.guessed_rate or 25))
            else:
                time_base = av_frame.time_base or self._stream.time_base
                if time_base is None:
                    raise SourceError(f"{self.name}: the video stream has no time base — cannot place its frames in time")
                timestamp = self._clock.time(av_frame.pts, time_base)
            last_timestamp = timestamp
            if self._clock.jumps_back == 1 and not self._said_jump_back:
                self._said_jump_back = True
                self._stats.warnings.append(
                    f"{self.name}: the stream's timestamps jumped back; its clock runs on from where it was"
                )
            chosen = sampler.push(timestamp, av_frame)
            if sampler.done and not chosen:
                return
            for frame_time, chosen_frame in chosen:
                if self._realtime:
                    if clock_origin is None:
                        clock_origin = time.monotonic() - float(frame_time)
                    elif self._stop.wait(max(0.0, clock_origin + float(frame_time) - time.monotonic())):
                        return
                self._stats.frames_sampled += 1
                yield Frame(_upright_rgb(cast(av.VideoFrame, chosen_frame)), float(frame_time), self._stats.frames_sampled - 1)
                if self._max_frames is not None and self._stats.frames_sampled >= self._max_frames:
                    return
            if sampler.done:
                return
        if self._stop.is_set():
            return
        for frame_time, chosen_frame in sampler.finish():
            self._stats.frames_sampled += 1
            yield Frame(_upright_rgb(cast(av.VideoFrame, chosen_frame)), float(frame_time), self._stats.frames_sampled - 1)
        if self._stats.frames_sampled == 0:
            raise SourceError(self._no_frames_message())
        self._check_complete(float(last_timestamp))

    def _resume_clock(self) -> None:
        """First frame after a reconnect: the clock jumps by the wall time since the last frame
        (at least one frame interval), and the gap is counted."""
        assert self._gap is not None, "resuming the clock without a gap"
        last_frame_at, drop = self._gap
        self._gap = None
        now = time.monotonic()
        rate = exact_rate(self.effective_fps)
        gap = max(Fraction(now - last_frame_at).limit_denominator(RATE_DENOMINATOR), 1 / rate)
        lost = max(0, round(gap * rate) - 1)
        self._clock.resume(gap)
        self._stats.gaps += 1
        self._stats.gap_s += float(gap)
        self._stats.frames_lost += lost
        self._stats.warnings.append(
            f"{self.name}: {drop}; reconnected, a gap of {float(gap):.1f} s ({lost} frames lost)"
        )

    def _seek_to_start(self) -> int | None:
        """Jump to the keyframe before ``start_s`` in a file; returns the pts that timestamps
        count from (the stream's start), or None when not seeking (timestamps then count from
        the first decoded frame, which is the same instant for a file read from its start)."""
        stream = self._stream
        if self._live or self._start_s < SEEK_FROM_S or stream.start_time is None or stream.time_base is None:
            return None
        target = stream.start_time + int(self._start_s / stream.time_base)
        try:
            self._container.seek(target, stream=stream, backward=True)
        except av.error.FFmpegError:
            return None  # not seekable: decode from the start and skip, as for short offsets
        return stream.start_time

    def _decoded_frames(self) -> Iterator[av.VideoFrame | None]:
        """Frames in presentation order; undecodable packets are skipped with one warning.
        None marks where a live source dropped (before it reconnects or gives up)."""
        for packet in self._packets():
            if packet is None:
                yield None
                continue
            try:
                frames = packet.decode()
            except av.error.FFmpegError as error:
                self._stats.packets_skipped += 1
                if self._stats.packets_skipped == 1:
                    self._warn_damaged(
                        f"{self.name}: skipped damaged data ({error.strerror}); "
                        "some frames may be missing"
                    )
                continue
            for frame in frames:
                self._last_frame_at = time.monotonic()
                yield frame

    def _packets(self) -> Iterator[av.Packet | None]:
        """Video packets until the end. A read failure ends a file (with a warning); a live
        source that drops yields None, then reconnects for `reconnect_s` (then raises
        SourceError), or without reconnection raises SourceError at a failure and ends at the
        end of its stream."""
        while not self._stop.is_set():
            demuxer = self._container.demux(self._stream)
            drop: str | None = None  # why a live source stopped
            error: av.error.FFmpegError | None = None
            while not self._stop.is_set():
                try:
                    packet = next(demuxer)
                except StopIteration:
                    drop = "the stream ended"
                    break
                except av.error.FFmpegError as read_error:
                    if self._stop.is_set():
                        return
                    error = read_error
                    if isinstance(error, (av.error.ExitError, av.error.TimeoutError)):
                        drop = f"no data for {self._timeout_s:g} s"
                    elif self._live:
                        drop = f"stream failed ({error.strerror})"
                    else:
                        self._warn_damaged(
                            f"{self.name}: reading stopped early ({error.strerror}); "
                            "the file is damaged or the connection dropped"
                        )
                        return
                    break
                yield packet
            if self._stop.is_set() or (error is None and not self._live):
                return
            drop = drop or "the stream ended"
            yield None
            if self._reconnect_s <= 0:
                if error is None:
                    return  # a live stream that ends, without reconnection: the end
                if drop.startswith("no data"):
                    raise SourceError(f"{self.name}: {drop} — is the stream still running?") from error
                raise SourceError(f"{self.name}: {drop} — check the source and open it again") from error
            self._reconnect(drop)

    def _reconnect(self, drop: str) -> None:
        """Reopen a dropped live source, retrying with backoff until `reconnect_s` have passed
        since the drop; the clock then resumes after the gap (see `_resume_clock`). Returns when
        reconnected or asked to stop; raises SourceError when the time runs out."""
        dropped_at = time.monotonic()
        deadline = dropped_at + self._reconnect_s
        last_frame_at = self._last_frame_at if self._last_frame_at is not None else dropped_at
        self._container.close()
        self._stats.reconnecting = True
        delay = RECONNECT_FIRST_DELAY_S
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SourceError(
                        f"{self.name}: {drop} and did not come back within {self._reconnect_s:g} s "
                        "— check the source and open it again"
                    )
                try:
                    # the full timeout: PyAV's clock for the first reads after the open may still
                    # be the open's, and a short one drops the probed connection at once
                    container = _open_container(self._target, self._timeout_s)
                except SourceError:
                    pass
                else:
                    try:
                        stream = _video_stream(container, self._target)
                    except SourceError:
                        container.close()
                    else:
                        self._container, self._stream = container, stream
                        self._source_fps = _stream_rate(stream) or self._source_fps
                        self._gap = (last_frame_at, drop)
                        return
                if self._stop.wait(min(delay, max(0.0, deadline - time.monotonic()))):
                    return
                delay = min(2 * delay, RECONNECT_MAX_DELAY_S)
        finally:
            self._stats.reconnecting = False

    def _check_complete(self, last_timestamp: float) -> None:
        """Warn when a file read to its end stops well before its announced duration."""
        if self._live or self._duration_s is None or self._damaged or self._end_s is not None:
            return
        slack = max(TRUNCATION_SLACK_S, TRUNCATION_SLACK_FRACTION * self._duration_s)
        frame_s = 1.0 / float(self._stream.guessed_rate or self._fps)
        if last_timestamp + frame_s < self._duration_s - slack:
            self._warn_damaged(
                f"{self.name}: frames end at {last_timestamp:.1f} s of "
                f"{self._duration_s:.1f} s; the file looks truncated or damaged"
            )

    def _no_frames_message(self) -> str:
        if self._start_s > 0 or self._end_s is not None:
            end = "the end" if self._end_s is None else f"{self._end_s:g} s"
            return (
                f"{self.name}: no video frames between {self._start_s:g} s and {end} — "
                "check the times"
            )
        return f"{self.name}: no video frame could be decoded — the file is empty or damaged"

    def _warn_damaged(self, message: str) -> None:
        """Record a warning about damaged or missing data (one is enough per cause)."""
        self._damaged = True
        self._stats.warnings.append(message)


class _StoppableIterator:
    """Wraps a generator so that `close()` may come from any thread: when another thread is
    inside next() at that moment, the generator is left to stop by itself (it watches the
    source's stop flag) and run its own cleanup."""

    def __init__(self, frames: Generator[Frame, None, None]) -> None:
        self._frames = frames
        self._running = threading.Lock()

    def __iter__(self) -> _StoppableIterator:
        return self

    def __next__(self) -> Frame:
        with self._running:
            return next(self._frames)

    def close(self) -> None:
        if self._running.acquire(blocking=False):
            try:
                self._frames.close()
            finally:
                self._running.release()


class _BackgroundReader:
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


def open_source(
    spec: str,
    fps: float = 1.0,
    *,
    realtime: bool = False,
    live: bool | None = None,
    timeout_s: float = 10.0,
    webcam: bool = False,
    input_format: str | None = None,
    max_frames: int | None = None,
    start_s: float = 0.0,
    end_s: float | None = None,
    buffer_frames: int = 64,
    reconnect_s: float | None = None,
) -> FrameSource:
    """Open a video file, URL or (with `webcam`) camera, sampled at `fps` frames per second.

    spec: a path; an http(s) (mp4, HLS...), rtsp (sent over TCP), rtmp, tcp://, udp://, srt
    URL; or with `webcam` a device ("" for this platform's default camera; on Linux "0"
    means /dev/video0). `input_format` forces an FFmpeg input format (e.g. "mpegts").
    realtime: pace delivery so frame timestamps follow the wall clock (files).
    live: treat as live (background reader, frames dropped when the consumer lags); default:
    network protocols, cameras and http streams of unknown length are live, files are not.
    timeout_s: limit for opening and for each read of a network stream or camera.
    max_frames / start_s / end_s: stop after that many samples / sample only that span
    (a file window starting at 10 s or later is reached by seeking to the keyframe before it;
    earlier frames are decoded and skipped).
    buffer_frames: frames a live source holds for a lagging consumer.
    reconnect_s: how long a live source keeps trying to reconnect after it drops or ends
    (backoff 0.25 s doubling to 2 s between tries; a try under way when the time runs out may
    add up to timeout_s); its clock runs on across the gap, which `stats` counts; then
    iteration raises one SourceError line. Default:
    30 s for network streams and cameras, 0 (no reconnection) for files; 0 disables.

    Raises ValueError for invalid arguments and SourceError when the source cannot be opened
    (missing file, not a video, no video stream, no decoder, unreachable within timeout_s).
    """
    _check_fps(fps)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if max_frames is not None and max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames}")
    if start_s < 0 or (end_s is not None and end_s < start_s):
        raise ValueError(f"need 0 <= start_s <= end_s, got start_s={start_s}, end_s={end_s}")
    if buffer_frames < 1:
        raise ValueError(f"buffer_frames must be >= 1, got {buffer_frames}")
    if reconnect_s is not None and not (reconnect_s >= 0 and math.isfinite(reconnect_s)):
        raise ValueError(f"reconnect_s must be a finite number >= 0, got {reconnect_s}")

    target = _camera_target(spec, input_format) if webcam else _target(spec, input_format)
    container = _open_container(target, timeout_s)
    try:
        stream = _video_stream(container, target)
    except SourceError:
        container.close()
        raise
    if live is None:
        live = target.kind == "camera" or _scheme(target.url) in LIVE_SCHEMES or (
            target.kind == "url" and _duration_s(container, stream) is None
        )
    if not live:
        stream.codec_context.thread_type = "AUTO"  # frame threads: faster, a few frames of delay
    if reconnect_s is None:
        reconnect_s = DEFAULT_RECONNECT_S if live and target.kind != "file" else 0.0
    return FrameSource(
        container,
        stream,
        target,
        fps=fps,
        live=live,
        realtime=realtime,
        timeout_s=timeout_s,
        max_frames=max_frames,
        start_s=start_s,
        end_s=end_s,
        buffer_frames=buffer_frames,
        reconnect_s=reconnect_s,
    )


def _check_fps(fps: float) -> None:
    if not (fps > 0 and math.isfinite(fps)):
        raise ValueError(f"fps must be a finite number > 0, got {fps}")


def default_camera() -> str:
    """This platform's default camera spec ("" when there is no sensible default)."""
    if PLATFORM.startswith("linux"):
        return "/dev/video0"
    if PLATFORM == "darwin":
        return "0"
    if PLATFORM == "win32":
        cameras = list_devices()
        return cameras[0] if cameras else ""
    return ""


def list_devices() -> list[str]:
    """Camera specs usable with `open_source(spec, webcam=True)`, where they can be listed.

    Linux: the /dev/video* nodes (a camera often has two; the first one carries video).
    Elsewhere FFmpeg offers no reliable listing through PyAV: [] (see `devices_hint`).
    """
    if PLATFORM.startswith("linux"):
        nodes = Path("/dev").glob("video*")
        return [str(node) for node in sorted(nodes, key=lambda node: _trailing_number(node.name))]
    if PLATFORM == "win32":
        try:
            return [f"video={device.name}" for device in av.device.enumerate_input_devices("dshow")]
        except (av.error.FFmpegError, ValueError):  # ValueError: no dshow in this build
            return []
    return []


def devices_hint() -> str:
    """One line telling the user how to find camera names on this platform."""
    if PLATFORM.startswith("linux"):
        return "cameras are /dev/video* (try `v4l2-ctl --list-devices`); pass one as `hermes chat --webcam /dev/videoN`"
    if PLATFORM == "darwin":
        return 'list cameras with `ffmpeg -f avfoundation -list_devices true -i ""`; pass the number'
    if PLATFORM == "win32":
        return 'list cameras with `ffmpeg -list_devices true -f dshow -i dummy`; pass "video=NAME"'
    return "camera capture is supported on Linux, macOS and Windows"


def _trailing_number(text: str) -> tuple[int, str]:
    digits = text[len(text.rstrip("0123456789")) :]
    return (int(digits) if digits else -1, text)


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def _display_url(url: str) -> str:
    """The URL without credentials or query, for messages."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def _target(spec: str, input_format: str | None) -> _Target:
    scheme = _scheme(spec)
    if scheme:
        options = {"rtsp_transport": "tcp"} if scheme in ("rtsp", "rtsps") else {}
        return _Target(spec, _display_url(spec), "url", input_format, options)
    path = Path(spec).expanduser()
    if not path.exists():
        raise SourceError(f"no such file: {spec} — check the path")
    if path.is_dir():
        raise SourceError(f"{spec} is a folder, not a video file — name a file inside it")
    if path.stat().st_size == 0:
        raise SourceError(f"{spec} is empty (0 bytes) — is the download or recording complete?")
    return _Target(str(path), path.name, "file", input_format)


def _camera_target(spec: str, input_format: str | None) -> _Target:
    """Camera device and input format for this platform (v4l2 / avfoundation / dshow)."""
    device = spec or default_camera()
    camera_format = input_format or CAMERA_FORMATS.get(PLATFORM)
    if camera_format is None or not device:
        raise SourceError(f"no default camera on this platform — {devices_hint()}")
    options: dict[str, str] = {}
    if camera_format == "v4l2":
        if device.isdigit():
            device = f"/dev/video{device}"
        if not Path(device).exists():
            raise SourceError(f"no camera at {device} — list cameras with `{LIST_DEVICES_COMMAND}`")
    elif camera_format == "avfoundation":
        options["framerate"] = "30"  # the default 29.97 is refused by many Mac cameras
    elif camera_format == "dshow" and not device.startswith("video="):
        device = f"video={device}"
    return _Target(device, f"camera {device}", "camera", camera_format, options)


def _open_container(target: _Target, timeout_s: float) -> av.container.InputContainer:
    """av.open with errors turned into one-line SourceErrors. For URLs and cameras, PyAV's
    `timeout` bounds the open and each later read (FFmpeg's interrupt callback)."""
    timeout = None if target.kind == "file" else timeout_s
    try:
        return av.open(target.url, format=target.format, options=target.options, timeout=timeout)
    except av.error.FFmpegError as error:  # before ValueError: InvalidDataError is one
        raise SourceError(_open_error_message(error, target, timeout_s)) from error
    except ValueError as error:  # PyAV: "no container format 'NAME'"
        raise SourceError(
            f"cannot open {target.name}: this FFmpeg build has no input format "
            f"'{target.format}' — check the format name"
        ) from error


def _open_error_message(error: av.error.FFmpegError, target: _Target, timeout_s: float) -> str:
    name, kind = target.name, target.kind
    reason = error.strerror or type(error).__name__
    if isinstance(error, (av.error.ExitError, av.error.TimeoutError)):
        return f"cannot open {name}: timed out after {timeout_s:g} s — is the address reachable?"
    if kind == "camera":
        if isinstance(error, (av.error.FileNotFoundError, av.error.NotADirectoryError)):
            return f"no camera at {target.url} — list cameras with `{LIST_DEVICES_COMMAND}`"
        if isinstance(error, av.error.PermissionError):
            return f"cannot open {name}: permission denied — is your user allowed to use cameras?"
        return f"cannot open {name}: {reason} — is another program using it? ({devices_hint()})"
    if kind == "url":
        if isinstance(error, av.error.ConnectionRefusedError):
            return f"cannot open {name}: connection refused — is the server running?"
        if isinstance(error, av.error.HTTPNotFoundError):
            return f"cannot open {name}: HTTP 404 not found — check the address"
        if isinstance(error, (av.error.HTTPUnauthorizedError, av.error.HTTPForbiddenError)):
            return f"cannot open {name}: access denied ({reason}) — check credentials in the URL"
        if isinstance(error, av.error.ProtocolNotFoundError):
            return (
                f"cannot open {name}: protocol '{_scheme(target.url)}' is not supported — "
                "use http(s), rtsp, rtmp, tcp, udp or srt"
            )
        if isinstance(error, av.error.InvalidDataError):
            return f"cannot open {name}: the server sent no readable video — check the address"
        return f"cannot open {name}: {reason} — check the address and the network"
    if isinstance(error, av.error.PermissionError):
        return f"cannot read {name}: permission denied — check the file's permissions"
    if isinstance(error, (av.error.InvalidDataError, av.error.EOFError)):
        cut_mp4 = Path(name).suffix.lower() in (".mp4", ".mov", ".m4v")
        hint = " (an .mp4/.mov cut short loses its index)" if cut_mp4 else ""
        return f"{name}: not a video file, or corrupt{hint} — check that it plays in a video player"
    return f"cannot open {name}: {reason} — check the file"


def _video_stream(container: av.container.InputContainer, target: _Target) -> av.VideoStream:
    """The first real video stream (cover art is not video) that this build can decode."""
    streams = [
        stream
        for stream in container.streams.video
        if not stream.disposition & av.stream.Disposition.attached_pic
    ]
    if not streams:
        audio_only = " (audio only?)" if container.streams.audio else ""
        raise SourceError(
            f"{target.name} has no video stream{audio_only} — pass a file or stream with video"
        )
    for stream in streams:
        if stream.codec_context is not None:
            return stream
    codec = getattr(streams[0], "name", None) or "unknown"  # no codec context to ask
    raise SourceError(
        f"{target.name}: video codec '{codec}' cannot be decoded by this PyAV build — "
        "convert it to H.264 (e.g. `ffmpeg -i IN -c:v libx264 OUT.mp4`)"
    )


def _duration_s(container: av.container.InputContainer, stream: av.VideoStream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _stream_rate(stream: av.VideoStream) -> float | None:
    rate = stream.average_rate or stream.guessed_rate
    return float(rate) if rate else None


def _upright_rgb(av_frame: av.VideoFrame) -> np.ndarray:
    """RGB pixels turned as the display matrix says (frame.rotation: degrees counter-clockwise)."""
    image = av_frame.to_ndarray(format="rgb24")
    quarter_turns = round(av_frame.rotation / 90) % 4
    return np.ascontiguousarray(np.rot90(image, quarter_turns)) if quarter_turns else image
