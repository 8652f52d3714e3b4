"""Opening a target with PyAV: `av.open` with every failure turned into one `SourceError`
line that says what to do, the video stream to decode, and the stream's duration and rate."""

from __future__ import annotations

from pathlib import Path

import av
import av.error

from .cameras import LIST_DEVICES_COMMAND, devices_hint
from .targets import SourceError, Target, scheme

__all__ = ["duration_s", "open_container", "stream_rate", "video_stream"]


def open_container(target: Target, timeout_s: float) -> av.container.InputContainer:
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


def _open_error_message(error: av.error.FFmpegError, target: Target, timeout_s: float) -> str:
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
                f"cannot open {name}: protocol '{scheme(target.url)}' is not supported — "
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


def video_stream(container: av.container.InputContainer, target: Target) -> av.VideoStream:
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


def duration_s(container: av.container.InputContainer, stream: av.VideoStream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def stream_rate(stream: av.VideoStream) -> float | None:
    rate = stream.average_rate or stream.guessed_rate
    return float(rate) if rate else None
