"""Frame sampling across containers, frame rates and sampling rates (docs/sources.md).

Every case decodes the whole clip with PyAV here, applies the documented nearest-frame rule to
that list independently (tests.media.nearest_rule, computed directly, not streamed), and checks
that open_source delivers exactly those frames: same exact timestamps, same pictures, and the
count the rule's arithmetic predicts.
"""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_cli.sources import FrameSampler, StreamClock, open_source, video
from tests.media import make_video, nearest_rule, read_index

NTSC = Fraction(30000, 1001)
SOURCE_RATES = [10, 24, 25, NTSC, 30, 60]
SAMPLING_RATES = [0.5, 1, 2, 5]  # plus the source's own rate and 1.7 × it, per case
CLIP_S = 3
SIZE = (64, 48)

# name: (suffix, make_video keywords, per-frame time base = 1/fps)
CONTAINERS = {
    "mp4": (".mp4", {}, False),
    "mkv": (".mkv", {}, False),
    "webm": (".webm", {"codec": "libvpx"}, False),
    "mpegts": (".ts", {}, False),
    "avi-mpeg4": (".avi", {"codec": "mpeg4"}, True),
    "avi-mjpeg": (".avi", {"codec": "mjpeg"}, True),
    "vfr-mp4": (".mp4", {"vfr": True}, False),
}


def decode_all(path) -> tuple[list[Fraction], list[np.ndarray], Fraction]:
    """Every frame of the video stream: exact times from the first pts, RGB pictures, time base."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        time_base = stream.time_base
    first = frames[0].pts
    times = [(f.pts - first) * time_base for f in frames]
    return times, [f.to_ndarray(format="rgb24") for f in frames], time_base


def make_clip(tmp_path, container: str, rate: Fraction | int):
    suffix, options, per_frame_time_base = CONTAINERS[container]
    if per_frame_time_base:
        options = {**options, "time_base": 1 / Fraction(rate)}
    path = tmp_path / f"clip{suffix}"
    return path, make_video(path, CLIP_S, rate, SIZE, keyframe_every=12, **options)


@pytest.mark.slow  # 42 clips × 6 sampling rates: ~20-30 s on two shared cores
@pytest.mark.parametrize("rate", SOURCE_RATES, ids=lambda r: f"{float(r):g}fps")
@pytest.mark.parametrize("container", list(CONTAINERS))
def test_sampled_frames_follow_the_nearest_frame_rule(tmp_path, container, rate):
    path, written = make_clip(tmp_path, container, rate)
    times, pictures, time_base = decode_all(path)
    if container.startswith("avi"):
        assert time_base == 1 / Fraction(rate)  # the case the old tolerance got wrong
    vfr = container.startswith("vfr")
    assert len(times) == len(written)
    assert [read_index(p) for p in pictures] == list(range(len(times)))
    for fps in [*SAMPLING_RATES, float(rate), float(rate) * 1.7]:
        with open_source(str(path), fps) as source:
            frames = list(source)
            effective = source.effective_fps
        expected = nearest_rule(times, fps)
        label = f"{container} {float(rate):g} fps sampled at {fps:g}"
        assert [f.timestamp for f in frames] == [float(times[i]) for i in expected], label
        assert [read_index(f.image) for f in frames] == expected, label
        assert all(np.array_equal(f.image, pictures[i]) for f, i in zip(frames, expected)), label
        assert [f.index for f in frames] == list(range(len(expected)))
        if not vfr:
            # constant rate: below the source rate one frame per target up to the last frame
            # plus half an interval; at or above it every frame once
            interval = times[-1] - times[-2]
            rate_q = Fraction(fps).limit_denominator(1_000_000)
            if fps < float(rate) - 1e-9:
                assert len(frames) == math.floor((times[-1] + interval / 2) * rate_q) + 1, label
            else:
                assert len(frames) == len(times), label
            assert effective == pytest.approx(min(fps, float(rate)), rel=1e-3), label


def test_avi_at_one_tick_per_frame_gives_exact_times(tmp_path):
    """The issue's case: 10 fps, time base 1/10. --fps 1 used to give 0.0, 0.9, 1.9 …"""
    path = tmp_path / "ten.avi"
    make_video(path, 8, 10, SIZE, codec="mpeg4", time_base=Fraction(1, 10))
    for fps, step, count in [(1, 1.0, 8), (5, 0.2, 40), (10, 0.1, 80)]:
        with open_source(str(path), fps) as source:
            frames = list(source)
        assert len(frames) == count
        assert [f.timestamp for f in frames] == [float(Fraction(k) * Fraction(step).limit_denominator(10)) for k in range(count)]
        assert [read_index(f.image) for f in frames] == [round(k * step * 10) for k in range(count)]


def test_fps_above_the_source_rate_is_reported(tmp_path):
    path = tmp_path / "slow.mkv"
    make_video(path, 2, 25, SIZE)
    with open_source(str(path), 100) as source:
        assert source.source_fps == pytest.approx(25)
        assert source.effective_fps == pytest.approx(25)
        assert source.rate_note == "slow.mkv: --fps 100 exceeds the video's 25 fps; every frame is used once, so it gives 25 fps"
        assert len(list(source)) == 50
    with open_source(str(path), 10) as source:
        assert source.effective_fps == 10 and source.rate_note is None


@pytest.mark.parametrize("container", ["mpegts", "avi-mpeg4", "webm"])
def test_a_late_window_gives_the_frames_decoding_through_gives(tmp_path, monkeypatch, container):
    suffix, options, per_frame_time_base = CONTAINERS[container]
    if per_frame_time_base:
        options = {**options, "time_base": Fraction(1, 10)}
    path = tmp_path / f"long{suffix}"
    make_video(path, 14, 10, SIZE, keyframe_every=10, **options)
    times, _, _ = decode_all(path)
    seeked = list(open_source(str(path), 3, start_s=11.05, end_s=12.5))
    monkeypatch.setattr(video, "SEEK_FROM_S", 1e9)
    decoded = list(open_source(str(path), 3, start_s=11.05, end_s=12.5))
    expected = nearest_rule(times, 3, start=Fraction(1105, 100), end=Fraction(25, 2))
    assert [f.timestamp for f in seeked] == [f.timestamp for f in decoded] == [float(times[i]) for i in expected]
    assert [read_index(f.image) for f in seeked] == [read_index(f.image) for f in decoded] == expected


# -- the rule and the clock on synthetic times ------------------------------------------------------
def streamed(times, fps, start=0, end=None) -> list[int]:
    sampler = FrameSampler(fps, start, end)
    chosen = []
    for index, t in enumerate(times):
        chosen += [item for _, item in sampler.push(t, index)]
        if sampler.done:
            break
    return chosen + [item for _, item in sampler.finish()]


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.integers(1, 900), min_size=0, max_size=60),
    unit=st.sampled_from([Fraction(1, 1000), Fraction(1, 90000), Fraction(1001, 30000), Fraction(1, 10)]),
    fps=st.sampled_from([0.5, 1, 2, 3, 5, 7.5, 10, 24, 25, 29.97, 30, 60, 100]),
    start=st.integers(0, 200),
    span=st.none() | st.integers(0, 2000),
)
def test_streamed_sampler_equals_the_rule_computed_directly(gaps, unit, fps, start, span):
    times = [Fraction(0)]
    for gap in gaps:
        times.append(times[-1] + gap * unit)
    start_s = Fraction(start, 100)
    end_s = None if span is None else start_s + Fraction(span, 100)
    assert streamed(times, fps, start_s, end_s) == nearest_rule(times, fps, start_s, end_s)


def test_rule_examples():
    t = [Fraction(k, 10) for k in range(10)]  # 10 fps, 0.0 … 0.9
    assert streamed(t, 4) == [0, 2, 5, 7]  # targets 0, .25, .5, .75: ties go to the earlier frame
    assert streamed(t, 10) == list(range(10))
    assert streamed(t, 1000) == list(range(10))  # every frame once
    assert streamed(t, 1, start=Fraction(1, 2)) == [5]  # the target 1.5 is past 0.9 + 0.05
    assert streamed(t, 20, end=Fraction(1, 4)) == [0, 1, 2]  # 0.25: a tie → 0.2; nothing after
    rounded = [Fraction(round(k * 1000 / 30), 1000) for k in range(30)]  # 30 fps in milliseconds
    assert streamed(rounded, 30) == list(range(30))  # rounding neither drops nor repeats frames
    assert streamed([Fraction(0), Fraction(1, 10), Fraction(2)], 1) == [0, 1, 2]  # a gap: no repeats
    assert streamed([Fraction(3)], 1) == [0]  # a lone frame, after the first target


def test_clock_counts_from_the_first_frame_exactly():
    clock = StreamClock()
    assert clock.time(900, Fraction(1, 90000)) == 0
    assert clock.time(3900, Fraction(1, 90000)) == Fraction(1, 30)
    clock = StreamClock(origin_pts=0)
    assert clock.time(15, Fraction(1, 10)) == Fraction(3, 2)


def test_mpegts_timestamps_that_wrap_keep_increasing():
    wrap, tick = 1 << 33, 3003  # 29.97 fps at 90 kHz
    clock = StreamClock(wrap_bits=33)
    first = wrap - 10 * tick
    times = [clock.time((first + k * tick) % wrap, Fraction(1, 90000)) for k in range(20)]
    assert times == [Fraction(k * tick, 90000) for k in range(20)]
    # ~26.5 h in: a second wrap, the unwrapped time runs on
    clock = StreamClock(wrap_bits=33)
    pts = 0
    last = None
    for _ in range(3):
        for _ in range(4):
            pts += wrap // 4 - 7  # frames a quarter of the range apart (pts starts at that step)
            last_time = clock.time(pts % wrap, Fraction(1, 90000))
            assert last is None or last_time > last
            last = last_time
    assert last == Fraction(pts - (wrap // 4 - 7), 90000)
    # a frame slightly out of order across the wrap point goes back, not forward a day
    clock = StreamClock(wrap_bits=33)
    clock.time(wrap - 100, Fraction(1, 90000))
    clock.time(50, Fraction(1, 90000))
    assert clock.time(wrap - 20, Fraction(1, 90000)) == Fraction(80, 90000)
    # without wrap_bits nothing is unwrapped
    assert StreamClock().time(0, 1) == 0


def test_clock_resumes_after_a_gap_whatever_the_new_pts():
    clock = StreamClock()
    for k in range(5):
        clock.time(900_000 + k * 9000, Fraction(1, 90000))  # 10 fps from pts 10 s
    assert clock.last == Fraction(4, 10)
    clock.resume(Fraction(5, 2))
    assert clock.time(900_000, Fraction(1, 90000)) == Fraction(29, 10)  # server restarted at 10 s
    assert clock.time(909_000, Fraction(1, 90000)) == 3
    assert clock.advance(Fraction(1, 10)) == Fraction(31, 10)


def test_live_clock_runs_on_when_the_sender_restarts_its_timestamps():
    clock = StreamClock(jump_back_step=Fraction(1, 10))
    times = [clock.time(pts, Fraction(1, 10)) for pts in [50, 51, 52, 3, 4, 52]]
    assert times == [0, Fraction(1, 10), Fraction(2, 10), Fraction(3, 10), Fraction(4, 10), Fraction(3, 10) + Fraction(52 - 3, 10)]
    assert clock.jumps_back == 1
    assert StreamClock().time(5, 1) == 0 and StreamClock().jumps_back == 0  # files: not by default


def test_the_sampler_imports_no_pyav():
    """Evaluation samples stored frame arrays by the same rule without loading a decoder: the
    sampler, the error and the camera facts come without PyAV; `open_source` brings it."""
    code = (
        "import sys\n"
        "from hermes_cli.sources.sampling import FrameSampler\n"
        "from hermes_cli.sources import SourceError, TimestampSampler, StreamClock, devices_hint\n"
        "assert TimestampSampler(2).take(0.0) and FrameSampler(1).push(__import__('fractions').Fraction(0), 'a')\n"
        "print('AV', 'av' in sys.modules)\n"
        "from hermes_cli.sources import open_source\n"
        "print('AV', 'av' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["AV False", "AV True"]
