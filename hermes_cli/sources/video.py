"""The PyAV source: an opened container decoded into RGB frames sampled at a target rate.

    with open_source("clip.mp4", fps=2) as source:   # a VideoSource
        for frame in source:          # Frame(image=HxWx3 uint8 RGB, timestamp=s, index=n)
            ...

Files are decoded in the caller's thread (optionally paced at real time). Live sources
(network streams, cameras) are decoded by a background thread into a small buffer; when the
consumer falls behind, the oldest frames are dropped and counted, so what it gets is recent;
when a live source drops, it reconnects with backoff for `reconnect_s` seconds and its clock
runs on across the gap (`live.py`). Frames are picked by the nearest-frame rule on exact
rational timestamps (`sampling.FrameSampler`, docs/sources.md). Every failure a user can
cause surfaces as `SourceError`, whose message is one line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from fractions import Fraction
from typing import cast

import av
import av.error
import numpy as np

from ..frames import Frame, SourceStats
from .container import duration_s, stream_rate
from .live import BackgroundReader, reconnect, record_gap
from .sampling import MPEGTS_PTS_BITS, FrameSampler, StreamClock, exact_rate
from .targets import SourceError, Target

__all__ = ["VideoSource", "upright_rgb"]

SEEK_FROM_S = 10.0  # a file window starting this late is reached by seeking, not by decoding up to it

# A file whose last frame comes this much before its announced duration is reported as cut short.
TRUNCATION_SLACK_S = 0.5
TRUNCATION_SLACK_FRACTION = 0.1


class VideoSource:
    """Iterable of sampled `Frame`s from one opened stream; iterate once, then `close()`.

    Use `open_source` to make one. Iteration raises `SourceError` when the stream fails, or
    when it ends without a single frame.
    """

    def __init__(
        self,
        container: av.container.InputContainer,
        stream: av.VideoStream,
        target: Target,
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
        self._clock = StreamClock()  # replaced when sampling starts
        self._pace_origin: float | None = None  # realtime: monotonic time of stream time 0
        self._stats = SourceStats()
        self._stop = threading.Event()
        self._closed = False
        self._iterated = False
        self._damaged = False  # a warning already says the data is damaged
        self._reader: BackgroundReader | None = None  # live sources
        self._frames: _StoppableIterator | None = None  # files
        self._duration_s = None if live else duration_s(container, stream)
        self._source_fps = stream_rate(stream)  # read now: a closed stream must not be touched

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
            raise RuntimeError(f"{self.name}: a source can be iterated only once")
        if self._closed:
            raise RuntimeError(f"{self.name}: source is closed")
        self._iterated = True
        if self._live:
            self._reader = BackgroundReader(
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

    def __enter__(self) -> VideoSource:
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
        for av_frame in self._decoded_frames():
            if av_frame is None:  # a live source dropped: settle its last frame as at an end
                yield from self._deliver(sampler.finish())
                if self._enough():
                    return
                continue
            self._stats.frames_decoded += 1
            last_timestamp = self._frame_time(av_frame)
            chosen = sampler.push(last_timestamp, av_frame)
            if sampler.done and not chosen:
                return
            yield from self._deliver(chosen)
            if self._enough() or sampler.done:
                return
        if self._stop.is_set():
            return
        yield from self._deliver(sampler.finish())
        if self._stats.frames_sampled == 0:
            raise SourceError(self._no_frames_message())
        self._check_complete(float(last_timestamp))

    def _frame_time(self, av_frame: av.VideoFrame) -> Fraction:
        """The stream time of the next decoded frame (the clock resumed after a reconnect)."""
        if self._gap is not None:
            self._resume_clock()
        if av_frame.pts is None:  # rare (raw streams): continue the clock at the nominal rate
            return self._clock.advance(1 / exact_rate(self._stream.guessed_rate or 25))
        time_base = av_frame.time_base or self._stream.time_base
        if time_base is None:
            raise SourceError(f"{self.name}: the video stream has no time base — cannot place its frames in time")
        timestamp = self._clock.time(av_frame.pts, time_base)
        if self._clock.jumps_back == 1 and not self._said_jump_back:
            self._said_jump_back = True
            self._stats.warnings.append(
                f"{self.name}: the stream's timestamps jumped back; its clock runs on from where it was"
            )
        return timestamp

    def _deliver(self, chosen: list[tuple[Fraction, object]]) -> Iterator[Frame]:
        """The sampler's chosen frames as upright RGB `Frame`s, paced at real time when asked;
        stops early at `max_frames` or when the source is closed (see `_enough`)."""
        for frame_time, av_frame in chosen:
            if self._realtime:
                if self._pace_origin is None:
                    self._pace_origin = time.monotonic() - float(frame_time)
                elif self._stop.wait(max(0.0, self._pace_origin + float(frame_time) - time.monotonic())):
                    return
            self._stats.frames_sampled += 1
            yield Frame(upright_rgb(cast(av.VideoFrame, av_frame)), float(frame_time), self._stats.frames_sampled - 1)
            if self._enough():
                return

    def _enough(self) -> bool:
        """No more frames are wanted: `max_frames` are delivered or the source is closed."""
        full = self._max_frames is not None and self._stats.frames_sampled >= self._max_frames
        return full or self._stop.is_set()

    def _resume_clock(self) -> None:
        """First frame after a reconnect: the clock jumps by the wall time since the last frame
        (at least one frame interval), and the gap is counted (`live.record_gap`)."""
        assert self._gap is not None, "resuming the clock without a gap"
        last_frame_at, drop = self._gap
        self._gap = None
        self._clock.resume(record_gap(self._stats, self.name, drop, last_frame_at, exact_rate(self.effective_fps)))

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
        """Reopen a dropped live source for up to `reconnect_s` (`live.reconnect`); the clock
        then resumes after the gap (see `_resume_clock`). Returns when reconnected or asked to
        stop; raises SourceError when the time runs out."""
        last_frame_at = self._last_frame_at if self._last_frame_at is not None else time.monotonic()
        self._container.close()
        reopened = reconnect(
            self._target, drop, timeout_s=self._timeout_s, reconnect_s=self._reconnect_s,
            stop=self._stop, stats=self._stats,
        )
        if reopened is not None:
            self._container, self._stream = reopened
            self._source_fps = stream_rate(self._stream) or self._source_fps
            self._gap = (last_frame_at, drop)

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


def upright_rgb(av_frame: av.VideoFrame) -> np.ndarray:
    """RGB pixels turned as the display matrix says (frame.rotation: degrees counter-clockwise)."""
    image = av_frame.to_ndarray(format="rgb24")
    quarter_turns = round(av_frame.rotation / 90) % 4
    return np.ascontiguousarray(np.rot90(image, quarter_turns)) if quarter_turns else image
