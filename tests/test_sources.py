"""Frame sources on generated media: sampling, broken inputs, HTTP, live MPEG-TS, cameras.

Generated frames carry their own index (tests.media.read_index), so each test checks *which*
frames arrived, not only how many.
"""

from __future__ import annotations

import math
import socket
import threading
import time
import urllib.request
from fractions import Fraction
from pathlib import Path

import av.error
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_cli import sources
from hermes_cli.sources import Frame, SourceError, TimestampSampler, cameras, list_devices, open_source
from hermes_cli.sources.live import BackgroundReader
from tests.media import (
    color_name,
    corrupt_middle,
    exact_times,
    make_audio_only,
    make_empty,
    make_video,
    make_zero_frames,
    nearest_rule,
    random_bytes,
    read_index,
    serve_http,
    serve_mpegts_tcp,
    truncate,
)

CLIP_SECONDS, CLIP_FPS = 4, 10


def first_in_each_slot(times: list[float], fps: float) -> list[int]:
    """Reference for TimestampSampler's slot rule: the first frame in each 1/fps slot."""
    taken, last_slot = [], None
    for index, t in enumerate(times):
        slot = math.floor(Fraction(t).limit_denominator(1000) * Fraction(fps))
        if slot != last_slot:
            taken.append(index)
            last_slot = slot
    return taken


def nearest(times: list[float], fps: float, **kwargs) -> list[int]:
    """Reference for sources' nearest-frame rule, on make_video's times (1 ms time base)."""
    return nearest_rule(exact_times(times), fps, **kwargs)


def read_all(spec: str, fps: float, **kwargs) -> tuple[list[Frame], sources.SourceStats]:
    with open_source(spec, fps, **kwargs) as source:
        return list(source), source.stats


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert message and "\n" not in message
    return message


def reader_threads(source) -> list[threading.Thread]:
    """The live background reader threads of `source` still running."""
    return [t for t in threading.enumerate() if t.name == f"hermes-source:{source.name}" and t.is_alive()]


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> tuple[Path, list[float]]:
    """A 4 s, 10 fps, 64x48 H.264 mp4 (with AAC audio) and its frame times."""
    path = tmp_path_factory.mktemp("media") / "clip.mp4"
    return path, make_video(path, CLIP_SECONDS, CLIP_FPS, audio=True)


# -- sampling ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fps", [0.5, 1, 2, CLIP_FPS, 30])
def test_constant_rate_sampling(clip, fps):
    path, times = clip
    frames, stats = read_all(str(path), fps)
    expected = nearest(times, fps)
    assert [read_index(f.image) for f in frames] == expected
    assert [f.index for f in frames] == list(range(len(expected)))
    assert [f.timestamp for f in frames] == pytest.approx([times[i] for i in expected], abs=1e-3)
    assert (stats.frames_decoded, stats.frames_sampled) == (len(times), len(expected))
    assert stats.warnings == [] and stats.packets_skipped == 0


@pytest.mark.parametrize("fps", [1, 3, 10])
def test_variable_rate_sampling(tmp_path, fps):
    path = tmp_path / "vfr.mkv"
    times = make_video(path, 3, 10, vfr=True)
    frames, _ = read_all(str(path), fps)
    expected = nearest(times, fps)
    assert [read_index(f.image) for f in frames] == expected
    assert [f.timestamp for f in frames] == pytest.approx([times[i] for i in expected], abs=1e-3)


def test_sparse_frames_are_never_duplicated(tmp_path):
    path = tmp_path / "slow.mp4"
    times = make_video(path, 3, 2)  # 2 fps, sampled at 5
    frames, _ = read_all(str(path), 5)
    assert [read_index(f.image) for f in frames] == list(range(len(times)))


@settings(max_examples=200, deadline=None)
@given(
    gaps_ms=st.lists(st.integers(1, 900), min_size=1, max_size=60),
    fps=st.sampled_from([0.5, 1, 2, 3, 7.5, 10, 24, 30, 60]),
)
def test_sampler_takes_the_first_frame_of_each_slot(gaps_ms, fps):
    times = list(np.cumsum([0] + gaps_ms) / 1000)
    sampler = TimestampSampler(fps)
    taken = [i for i, t in enumerate(times) if sampler.take(t)]
    assert taken == first_in_each_slot(times, fps)


def test_sampler_tolerance_absorbs_rounded_timestamps():
    times = [round(i / 30, 3) for i in range(90)]  # 30 fps in a 1 ms time base: 0.033, 0.067...
    exact, tolerant = TimestampSampler(30), TimestampSampler(30, tolerance_s=1e-3)
    assert sum(map(exact.take, times)) < 90
    assert sum(map(tolerant.take, times)) == 90


def test_timestamps_start_at_zero_when_the_stream_does_not(tmp_path):
    # MPEG-TS starts at pts 1.4 s; tests.media's live server starts at 10 s (below).
    path = tmp_path / "clip.ts"
    make_video(path, 2, 10)
    frames, _ = read_all(str(path), 10)
    assert frames[0].timestamp == 0.0 and read_index(frames[0].image) == 0
    assert frames[-1].timestamp == pytest.approx(1.9, abs=1e-3)


def test_odd_size_frames(tmp_path):
    path = tmp_path / "odd.mp4"
    make_video(path, 2, 5, size=(177, 99))
    frames, _ = read_all(str(path), 1)
    assert [f.image.shape for f in frames] == [(99, 177, 3)] * 2
    assert all(f.image.dtype == np.uint8 for f in frames)
    assert [read_index(f.image) for f in frames] == [0, 5]
    assert [color_name(f.image) for f in frames] == ["red", "green"]


def test_rotation_metadata_is_applied(tmp_path):
    path = tmp_path / "portrait.mp4"
    make_video(path, 1, 5, size=(64, 48), rotation=90)
    frames, _ = read_all(str(path), 5)
    assert frames[2].image.shape == (64, 48, 3)  # turned a quarter counter-clockwise
    assert read_index(np.rot90(frames[2].image, -1)) == 2


def test_scene_change_is_one_cut(tmp_path):
    path = tmp_path / "cut.mp4"
    make_video(path, 3, 5, scene_change_at=1.4, colors=("blue", "yellow"))
    frames, _ = read_all(str(path), 5)
    assert [color_name(f.image) for f in frames] == ["blue"] * 7 + ["yellow"] * 8


def test_max_frames_and_time_window(clip):
    path, _ = clip
    frames, _ = read_all(str(path), 2, start_s=1.0, end_s=2.5)
    assert [f.timestamp for f in frames] == pytest.approx([1.0, 1.5, 2.0, 2.5])
    assert [f.index for f in frames] == [0, 1, 2, 3]
    frames, stats = read_all(str(path), 10, max_frames=3)
    assert [read_index(f.image) for f in frames] == [0, 1, 2] and stats.warnings == []


def test_realtime_paces_by_timestamps(tmp_path):
    path = tmp_path / "short.mp4"
    make_video(path, 1, 10)
    started = time.monotonic()
    frames, _ = read_all(str(path), 5, realtime=True)
    assert len(frames) == 5
    assert 0.75 <= time.monotonic() - started < 2.0  # last sample at 0.8 s


def test_file_properties(clip):
    path, _ = clip
    with open_source(str(path), 1) as source:
        assert source.name == "clip.mp4"
        assert source.is_live is False
        assert source.duration_s == pytest.approx(CLIP_SECONDS, abs=0.15)
    with open_source(str(path), 1, live=True) as source:
        assert source.is_live is True and source.duration_s is None


# -- bad inputs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fps", [0, -1.0, float("nan"), float("inf")])
def test_fps_must_be_positive(clip, fps):
    with pytest.raises(ValueError, match="fps"):
        open_source(str(clip[0]), fps)
    with pytest.raises(ValueError):
        TimestampSampler(fps)


def test_missing_file(tmp_path):
    with pytest.raises(SourceError) as error:
        open_source(str(tmp_path / "nope.mp4"))
    assert one_line(error).startswith("no such file:") and "check the path" in str(error.value)


def test_folder_is_not_a_video(tmp_path):
    with pytest.raises(SourceError, match="folder"):
        open_source(str(tmp_path))


def test_empty_file(tmp_path):
    make_empty(tmp_path / "empty.mp4")
    with pytest.raises(SourceError) as error:
        open_source(str(tmp_path / "empty.mp4"))
    assert "empty" in one_line(error)


def test_random_bytes(tmp_path):
    random_bytes(tmp_path / "noise.mp4")
    with pytest.raises(SourceError) as error:
        open_source(str(tmp_path / "noise.mp4"))
    assert "not a video file" in one_line(error)


def test_audio_only(tmp_path):
    make_audio_only(tmp_path / "sound.m4a")
    with pytest.raises(SourceError) as error:
        open_source(str(tmp_path / "sound.m4a"))
    assert "no video stream (audio only?)" in one_line(error)


def test_zero_frames_fail_when_iteration_ends(tmp_path):
    make_zero_frames(tmp_path / "blank.avi")
    with open_source(str(tmp_path / "blank.avi")) as source, pytest.raises(SourceError) as error:
        list(source)
    assert "no video frame" in one_line(error)


def test_window_past_the_end_names_the_times(clip):
    with open_source(str(clip[0]), start_s=100.0) as source, pytest.raises(SourceError) as error:
        list(source)
    assert "between 100 s and the end" in one_line(error)


@pytest.mark.parametrize("suffix", [".mkv", ".mp4"])
def test_truncated_file_yields_the_frames_before_the_cut(tmp_path, suffix):
    # Truncation policy: whatever decodes is delivered, with one warning; a file that cannot
    # be opened at all (next test) is a SourceError.
    path = tmp_path / f"cut{suffix}"
    times = make_video(path, 4, 10, faststart=True)
    truncate(path, 0.5)
    frames, stats = read_all(str(path), 10)
    assert 5 < len(frames) < len(times)
    assert [read_index(f.image) for f in frames] == list(range(len(frames)))
    assert len(stats.warnings) == 1 and "truncated" in stats.warnings[0]


def test_truncated_mp4_without_index_fails_at_open(tmp_path):
    path = tmp_path / "cut.mp4"
    make_video(path, 4, 10)  # index (moov) written last, so the cut loses it
    truncate(path, 0.5)
    with pytest.raises(SourceError) as error:
        open_source(str(path))
    assert "not a video file, or corrupt" in one_line(error) and "index" in str(error.value)


def test_damaged_middle_is_skipped_with_one_warning(tmp_path):
    path = tmp_path / "damaged.mp4"
    times = make_video(path, 4, 10, codec="mpeg4")
    corrupt_middle(path, 0.4, 0.6)
    frames, stats = read_all(str(path), 10)
    indices = [read_index(f.image) for f in frames]
    assert stats.packets_skipped > 0 and len(stats.warnings) == 1
    assert "damaged" in stats.warnings[0]
    assert indices[:5] == [0, 1, 2, 3, 4] and indices[-1] == len(times) - 1  # recovered after it
    assert stats.frames_decoded < len(times)


# -- network -------------------------------------------------------------------------------------
def test_http_server_honours_range_requests(clip):
    path, _ = clip
    data = path.read_bytes()
    url, stop = serve_http(path)
    try:
        request = urllib.request.Request(url, headers={"Range": "bytes=10-19"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 206 and response.read() == data[10:20]
            assert response.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200 and response.read() == data
    finally:
        stop()
        stop()  # idempotent


def test_http_server_stops_by_itself(clip):
    url, stop = serve_http(clip[0], lifetime_s=0.2)
    time.sleep(0.5)
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)
    stop()


def test_http_file_end_to_end(clip):
    path, times = clip
    url, stop = serve_http(path)
    try:
        with open_source(url, 2) as source:
            assert source.is_live is False
            assert source.name == url
            assert source.duration_s == pytest.approx(CLIP_SECONDS, abs=0.15)
            frames = list(source)
    finally:
        stop()
    assert [read_index(f.image) for f in frames] == first_in_each_slot(times, 2)


def test_hls_playlist_over_http(tmp_path):
    playlist = tmp_path / "index.m3u8"
    times = make_video(playlist, 3, 10)  # writes the playlist and its .ts segment
    url, stop = serve_http(playlist)
    try:
        frames, _ = read_all(url, 2)
    finally:
        stop()
    assert [read_index(f.image) for f in frames] == first_in_each_slot(times, 2)


def test_credentials_never_reach_names_or_messages(clip):
    url, stop = serve_http(clip[0])
    secret_url = url.replace("http://", "http://user:s3cret@")
    try:
        with open_source(secret_url, 1) as source:
            assert "s3cret" not in source.name and source.name == url
    finally:
        stop()
    with pytest.raises(SourceError) as error:
        open_source(secret_url, timeout_s=2)
    assert "connection refused" in one_line(error) and "s3cret" not in str(error.value)


def test_http_404(clip):
    url, stop = serve_http(clip[0])
    try:
        with pytest.raises(SourceError) as error:
            open_source(url + ".missing", timeout_s=2)
    finally:
        stop()
    assert "404" in one_line(error)


def test_unreachable_address_times_out(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never answers
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(SourceError) as error:
            open_source(f"http://127.0.0.1:{port}/video.mp4", timeout_s=0.5)
    assert time.monotonic() - started < 3
    assert "timed out after 0.5 s" in one_line(error) and "reachable" in str(error.value)


def test_unknown_protocol():
    with pytest.raises(SourceError) as error:
        open_source("nosuchproto://127.0.0.1:1/video", timeout_s=1)
    assert "not supported" in one_line(error)


def test_live_mpegts_over_tcp():
    url, server = serve_mpegts_tcp(3, 10, speed=4)
    with open_source(url, 10, timeout_s=5, reconnect_s=0) as source:
        assert source.is_live is True and source.duration_s is None
        assert source.name == url
        frames = list(source)
        assert source.stats.frames_dropped == 0
    server.join(5)
    assert not server.is_alive()
    assert len(frames) == 30
    assert [read_index(f.image) for f in frames] == [f.index for f in frames] == list(range(30))
    assert frames[0].timestamp == 0.0  # the stream's first pts is 10 s
    assert frames[-1].timestamp == pytest.approx(2.9, abs=1e-3)


def test_slow_consumer_of_a_live_stream_drops_the_oldest_frames():
    url, server = serve_mpegts_tcp(3, 10, speed=3)
    received = []
    with open_source(url, 10, timeout_s=5, buffer_frames=3, reconnect_s=0) as source:
        for frame in source:
            received.append(frame)
            time.sleep(0.05)
        stats = source.stats
    server.join(5)
    indices = [f.index for f in received]
    assert stats.frames_dropped > 0
    assert len(received) + stats.frames_dropped == stats.frames_sampled == 30
    assert indices == sorted(set(indices)) and indices[-1] == 29  # in order, newest kept
    assert [read_index(f.image) for f in received] == indices


def test_slow_consumer_of_a_file_played_live(clip):
    path, times = clip
    with open_source(str(path), 10, live=True, buffer_frames=2) as source:
        received = []
        for frame in source:
            received.append(frame.index)
            time.sleep(0.01)
        assert source.stats.frames_dropped > 0
        assert len(received) + source.stats.frames_dropped == len(times)
        assert received == sorted(received) and received[-1] == len(times) - 1


def test_stalled_live_stream_raises_in_the_consumer():
    url, server = serve_mpegts_tcp(4, 10, speed=20, stall_s=5)
    received = []
    started = time.monotonic()
    with open_source(url, 10, timeout_s=0.5, reconnect_s=0) as source, pytest.raises(SourceError) as error:
        for frame in source:
            received.append(frame)
    assert time.monotonic() - started < 4
    assert "no data for 0.5 s" in one_line(error)
    assert len(received) > 20  # what arrived before the stall was delivered first
    assert not reader_threads(source)


def test_background_reader_error_reaches_the_consumer():
    def failing_frames():
        yield Frame(np.zeros((2, 2, 3), np.uint8), 0.0, 0)
        raise RuntimeError("decoder exploded")

    reader = BackgroundReader(failing_frames(), 4, sources.SourceStats(), "test")
    frames = iter(reader)
    assert next(frames).index == 0
    with pytest.raises(SourceError, match="reading failed .*RuntimeError: decoder exploded"):
        next(frames)
    reader.close(1)


# -- cameras -------------------------------------------------------------------------------------
def test_missing_camera_is_one_clear_line():
    with pytest.raises(SourceError) as error:
        open_source("/dev/video99", webcam=True)
    assert one_line(error) == (
        "no camera at /dev/video99 — list cameras with `hermes chat --list-devices`"
    )


@pytest.mark.skipif(Path("/dev/video0").exists(), reason="this machine has a camera")
def test_default_linux_camera_and_numbers(monkeypatch):
    monkeypatch.setattr(cameras, "PLATFORM", "linux")
    with pytest.raises(SourceError, match="^no camera at /dev/video0 "):
        open_source("", webcam=True)
    with pytest.raises(SourceError, match="^no camera at /dev/video7 "):
        open_source("7", webcam=True)


@pytest.mark.parametrize(
    ("platform", "spec", "device", "input_format", "options"),
    [
        ("darwin", "", "0", "avfoundation", {"framerate": "30"}),
        ("darwin", "1", "1", "avfoundation", {"framerate": "30"}),
        ("win32", "USB Camera", "video=USB Camera", "dshow", {}),
        ("win32", "video=USB Camera", "video=USB Camera", "dshow", {}),
    ],
)
def test_camera_arguments_per_platform(monkeypatch, platform, spec, device, input_format, options):
    opened = {}

    def fake_open(url, **kwargs):
        opened.update(url=url, **kwargs)
        raise av.error.FileNotFoundError(2, "No such file or directory", url)

    monkeypatch.setattr(cameras, "PLATFORM", platform)
    monkeypatch.setattr(av, "open", fake_open)
    with pytest.raises(SourceError) as error:
        open_source(spec, webcam=True, timeout_s=3)
    assert opened == {"url": device, "format": input_format, "options": options, "timeout": 3}
    assert one_line(error).startswith(f"no camera at {device} ")


def test_camera_format_missing_from_this_build():
    with pytest.raises(SourceError) as error:
        open_source("0", webcam=True, input_format="no-such-format")
    assert "no input format 'no-such-format'" in one_line(error)


def test_no_default_camera_on_windows_without_cameras(monkeypatch):
    monkeypatch.setattr(cameras, "PLATFORM", "win32")
    monkeypatch.setattr(cameras, "list_devices", lambda: [])
    with pytest.raises(SourceError) as error:
        open_source("", webcam=True)
    assert "no default camera" in one_line(error) and "dshow" in str(error.value)


def test_list_devices_returns_video_nodes():
    devices = list_devices()
    assert all(device.startswith("/dev/video") for device in devices)
    assert "\n" not in sources.devices_hint()


# -- lifecycle -----------------------------------------------------------------------------------
def test_close_is_idempotent_and_ends_iteration(clip):
    source = open_source(str(clip[0]), 10)
    frames = iter(source)
    next(frames)
    source.close()
    source.close()
    assert list(frames) == []
    with pytest.raises(RuntimeError, match="only once"):
        iter(source)


def test_close_before_iterating(clip):
    source = open_source(str(clip[0]), 10)
    source.close()
    source.close()
    with pytest.raises(RuntimeError, match="closed"):
        iter(source)


def test_close_from_another_thread_stops_a_paced_file(clip):
    source = open_source(str(clip[0]), 10, realtime=True)
    received = []
    consumer = threading.Thread(target=lambda: received.extend(source))
    consumer.start()
    time.sleep(0.3)
    source.close()
    consumer.join(2)
    assert not consumer.is_alive()
    assert 0 < len(received) < 10


def test_close_joins_the_live_reader_thread():
    url, server = serve_mpegts_tcp(20, 10, speed=2)
    source = open_source(url, 10, timeout_s=5)
    frames = iter(source)
    next(frames)
    assert reader_threads(source)
    source.close()
    source.close()
    assert not reader_threads(source)
    assert list(frames) == []
    server.join(5)
    assert not server.is_alive()  # the server saw the client go


@pytest.mark.parametrize("suffix", [".mp4", ".mkv"])
def test_a_late_window_is_reached_by_seeking_with_the_same_frames(tmp_path, monkeypatch, suffix):
    from hermes_cli.sources import video

    path = tmp_path / f"long{suffix}"
    make_video(path, 30, 5, keyframe_every=10)
    seeked, seek_stats = read_all(str(path), 2, start_s=21.0, end_s=24.0)
    monkeypatch.setattr(video, "SEEK_FROM_S", 1e9)  # decode everything and skip instead
    decoded, decode_stats = read_all(str(path), 2, start_s=21.0, end_s=24.0)
    assert seek_stats.frames_decoded < decode_stats.frames_decoded / 2
    # 5 fps sampled at 2 fps: the nearest frame to each half second from 21 s (a tie at
    # 21.5 s between 21.4 and 21.6 goes to the earlier frame)
    assert [f.timestamp for f in seeked] == pytest.approx([21.0, 21.4, 22.0, 22.4, 23.0, 23.4, 24.0])
    assert [f.timestamp for f in seeked] == [f.timestamp for f in decoded]
    assert [read_index(f.image) for f in seeked] == [read_index(f.image) for f in decoded]
    assert [read_index(f.image) for f in seeked] == [105, 107, 110, 112, 115, 117, 120]
