"""`open_source`: a spec (path, URL, or camera) to an opened, sampled `VideoSource`, with the
arguments checked and the defaults that depend on the kind of source (live or not, reconnection)."""

from __future__ import annotations

import math

from .cameras import camera_target
from .container import duration_s, open_container, video_stream
from .live import DEFAULT_RECONNECT_S
from .sampling import check_fps
from .targets import LIVE_SCHEMES, SourceError, scheme, spec_target
from .video import VideoSource

__all__ = ["open_source"]


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
) -> VideoSource:
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
    check_fps(fps)
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

    target = camera_target(spec, input_format) if webcam else spec_target(spec, input_format)
    container = open_container(target, timeout_s)
    try:
        stream = video_stream(container, target)
    except SourceError:
        container.close()
        raise
    if live is None:
        live = target.kind == "camera" or scheme(target.url) in LIVE_SCHEMES or (
            target.kind == "url" and duration_s(container, stream) is None
        )
    if not live:
        stream.codec_context.thread_type = "AUTO"  # frame threads: faster, a few frames of delay
    if reconnect_s is None:
        reconnect_s = DEFAULT_RECONNECT_S if live and target.kind != "file" else 0.0
    return VideoSource(
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


