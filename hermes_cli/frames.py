"""What every frame source gives: ``Frame``s, their counters, and the ``FrameSource`` protocol.

Files and network streams (``sources``), stored frame arrays (``evaluation``), a restored
memory's continuation (``cli.memory``) and plain lists in tests all meet here, so the app reads
a source's name, liveness, duration and counters as attributes instead of probing for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, eq=False)  # compared by identity: images are arrays
class Frame:
    """One sampled frame: `image` is (H, W, 3) uint8 RGB, upright (rotation metadata applied);
    `timestamp` is seconds since the stream's first frame; `index` counts sampled frames from 0
    (a live source's dropped frames leave gaps)."""

    image: np.ndarray
    timestamp: float
    index: int


@dataclass
class SourceStats:
    """Counters of a source, updated while it is read."""

    frames_decoded: int = 0  # every frame the decoder produced
    frames_sampled: int = 0  # frames picked at the target fps (delivered or dropped)
    frames_dropped: int = 0  # sampled frames a live source discarded because the consumer lagged
    packets_skipped: int = 0  # packets whose data could not be decoded
    gaps: int = 0  # times a live source dropped and came back (reconnected)
    gap_s: float = 0.0  # stream seconds those gaps lasted, in total
    frames_lost: int = 0  # samples the gaps cost: round(gap × effective fps) − 1 per gap
    reconnecting: bool = False  # a live source is trying to reconnect right now
    warnings: list[str] = field(default_factory=list)


@runtime_checkable
class FrameSource(Protocol):
    """Timed frames from somewhere; iterate once. ``close`` may come from another thread."""

    @property
    def name(self) -> str: ...

    @property
    def is_live(self) -> bool:
        """Frames arrive at real time (a stream or a camera), not as fast as they are read."""
        ...

    @property
    def duration_s(self) -> float | None:
        """How long the source is (None: unknown or unbounded)."""
        ...

    @property
    def stats(self) -> SourceStats: ...

    def __iter__(self) -> Iterator[Frame]: ...

    def close(self) -> None: ...

    def __enter__(self) -> FrameSource: ...

    def __exit__(self, *exc_info: object) -> None: ...


class IterableSource:
    """Any iterable of frames as a ``FrameSource`` (finite and not live unless told otherwise)."""

    def __init__(self, frames: Iterable[Frame], *, name: str = "frames", is_live: bool = False,
                 duration_s: float | None = None) -> None:
        self._frames = frames
        self.name = name
        self.is_live = is_live
        self.duration_s = duration_s
        self.stats = SourceStats()

    def __iter__(self) -> Iterator[Frame]:
        return iter(self._frames)

    def close(self) -> None:
        close = getattr(self._frames, "close", None)  # a generator stops; a list has nothing to release
        if close is not None:
            close()

    def __enter__(self) -> IterableSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def as_source(frames: FrameSource | Iterable[Frame]) -> FrameSource:
    """``frames`` itself when it is a ``FrameSource``, else wrapped as one (an ``is_live``
    attribute of the iterable is kept)."""
    if isinstance(frames, FrameSource):
        return frames
    return IterableSource(frames, is_live=bool(getattr(frames, "is_live", False)))
