"""Frame sources: a video file, a network stream or a camera, decoded by PyAV into RGB frames
sampled at a target rate (docs/sources.md).

    with open_source("clip.mp4", fps=2) as source:
        for frame in source:          # Frame(image=HxWx3 uint8 RGB, timestamp=s, index=n)
            ...

The modules, lowest first:

- `sampling`: which frames are samples (`FrameSampler`, `TimestampSampler`) and exact stream
  time (`StreamClock`): pure arithmetic, no PyAV.
- `targets`: what a spec names (file, URL) and `SourceError`; `cameras`: this platform's cameras.
- `container`: `av.open` with one-line errors, the video stream; `live`: the background reader
  and reconnection of live sources; `video`: `VideoSource`, the PyAV source itself.
- `opening`: `open_source`.

Importing this package, `sampling`, `targets` or `cameras` does not import PyAV: the names
that need it (`open_source`, `VideoSource`) are loaded when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..frames import Frame, SourceStats
from .cameras import default_camera, devices_hint, list_devices
from .sampling import FrameSampler, StreamClock, TimestampSampler
from .targets import SourceError

if TYPE_CHECKING:
    from .opening import open_source
    from .video import VideoSource

__all__ = [
    "Frame",
    "FrameSampler",
    "SourceError",
    "SourceStats",
    "StreamClock",
    "TimestampSampler",
    "VideoSource",
    "default_camera",
    "devices_hint",
    "list_devices",
    "open_source",
]


def __getattr__(name: str) -> Any:
    """`open_source` and `VideoSource`, imported (with PyAV) on first use."""
    if name == "open_source":
        from .opening import open_source

        return open_source
    if name == "VideoSource":
        from .video import VideoSource

        return VideoSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
