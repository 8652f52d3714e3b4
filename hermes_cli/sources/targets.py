"""What a source spec names: a file, a URL or a camera, as the arguments for PyAV's `av.open`.

`SourceError` is the one error every source raises for what a user can cause; its message is
one line. No PyAV here: a missing file is refused before a decoder is loaded.
"""

from __future__ import annotations

import stat
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HermesError

__all__ = ["LIVE_SCHEMES", "SourceError", "Target", "display_url", "scheme", "spec_target"]

# Protocols whose streams run in real time and have no end.
LIVE_SCHEMES = frozenset({"rtsp", "rtsps", "rtmp", "rtmps", "rtmpt", "tcp", "udp", "srt", "rtp"})


class SourceError(HermesError):
    """A source that cannot be opened or read. str() is one line: what went wrong, what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


@dataclass(frozen=True)
class Target:
    """What to hand to av.open, and how to talk about it."""

    url: str
    name: str
    kind: str  # "file", "url" or "camera"
    format: str | None = None
    options: dict[str, str] = field(default_factory=dict)


def scheme(url: str) -> str:
    """The URL's scheme in lower case ("" for a path)."""
    return url.split("://", 1)[0].lower() if "://" in url else ""


def display_url(url: str) -> str:
    """The URL without credentials or query, for messages."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host += f":{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def spec_target(spec: str, input_format: str | None) -> Target:
    """A URL, or a file checked to exist, be a regular file (not a folder, device or pipe) and not be
    empty (SourceError otherwise)."""
    url_scheme = scheme(spec)
    if url_scheme:
        options = {"rtsp_transport": "tcp"} if url_scheme in ("rtsp", "rtsps") else {}
        return Target(spec, display_url(spec), "url", input_format, options)
    path = Path(spec).expanduser()
    if not path.exists():
        raise SourceError(f"no such file: {spec} — check the path")
    if path.is_dir():
        raise SourceError(f"{spec} is a folder, not a video file — name a file inside it")
    info = path.stat()
    mode = info.st_mode
    if not stat.S_ISREG(mode):
        camera = stat.S_ISCHR(mode) and path.name.startswith("video")
        raise SourceError(f"{spec} is {_special_kind(mode)}, not a regular file — "
                          + (f"for a camera, run `hermes chat --webcam {spec}`" if camera else
                             "name a video file or a URL"))
    if info.st_size == 0:
        raise SourceError(f"{spec} is empty (0 bytes) — is the download or recording complete?")
    return Target(str(path), path.name, "file", input_format)


def _special_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words (its size means nothing: /dev/zero has 0)."""
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device (a disk)"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"
