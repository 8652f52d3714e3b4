"""Which decoded frames are samples, and at what time: pure arithmetic on exact timestamps.

No PyAV and no numpy here, so evaluation (stored frame arrays) and tests pick frames by the
same rule as decoded media without loading a decoder. The rule is docs/sources.md's
"Frame sampling".
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["FrameSampler", "StreamClock", "TimestampSampler", "check_fps", "exact_rate", "exact_time"]

MPEGTS_PTS_BITS = 33  # MPEG-TS timestamps: 33 bits at 90 kHz, wrapping after ~26.5 h
RATE_DENOMINATOR = 1_000_000  # a float fps is read as the nearest fraction with this denominator


def check_fps(fps: float) -> None:
    """Raise ValueError unless `fps` is a finite number > 0."""
    if not (fps > 0 and math.isfinite(fps)):
        raise ValueError(f"fps must be a finite number > 0, got {fps}")


def exact_rate(fps: float | Fraction) -> Fraction:
    """`fps` as an exact fraction: a float is read as the nearest fraction with a denominator of
    at most 10^6 (so 29.97 is 2997/100, 0.1 is 1/10), a Fraction is kept as it is."""
    if isinstance(fps, Fraction):
        return fps
    return Fraction(fps).limit_denominator(RATE_DENOMINATOR)


def exact_time(seconds: float | Fraction) -> Fraction:
    """Seconds as an exact fraction (a float to the nearest microsecond-denominator fraction)."""
    if isinstance(seconds, Fraction):
        return seconds
    return Fraction(seconds).limit_denominator(RATE_DENOMINATOR)


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
        check_fps(fps)
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
        check_fps(float(fps))
        self.fps = exact_rate(fps)
        self.start = exact_time(start)
        self.end = None if end is None else exact_time(end)
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
