"""The frames a server stream keeps for the web view: the latest one, and one per notification.

The reader thread hands every submitted frame to ``FrameKeeper.keep`` (a view of it, shrunk to
at most ``MAX_SIDE`` pixels by striding: no resampling, no copy of a full-size frame); the last
``ring`` of them are kept, because the reader runs ahead of the memory (the engine's queue plus
the partial chunk). A ``notification`` event fires after the chunk that ends at its
``stream_time_s``: ``notified`` picks the newest kept frame at or before that time and encodes it
once, so the page shows the frame of the moment it fired, even when opened later. A stream without
``notify`` keeps only the latest frame. JPEG with Pillow.
"""

from __future__ import annotations

import io
import threading
from collections import deque

import numpy as np

__all__ = ["MAX_NOTIFICATIONS", "MAX_SIDE", "FrameKeeper", "encode_jpeg"]

MAX_SIDE = 640  # the web view's frames: at most this many pixels wide or high
MAX_NOTIFICATIONS = 200  # notifications (with their frame) kept per stream; older ones are let go


def encode_jpeg(image: np.ndarray, quality: int = 82) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).convert("RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def shrink(image: np.ndarray) -> np.ndarray:
    """``image`` (H, W, 3 uint8) strided down to at most ``MAX_SIDE`` on its longer side."""
    step = -(-max(image.shape[:2]) // MAX_SIDE)
    return np.ascontiguousarray(image[::step, ::step] if step > 1 else image)


class FrameKeeper:
    """Thread-safe: the reader keeps frames, the event drain records notifications, routes read."""

    def __init__(self, ring: int = 64) -> None:
        self._lock = threading.Lock()
        self._ring: deque[tuple[float, np.ndarray]] = deque(maxlen=max(1, ring))
        self._latest_jpeg: tuple[float, bytes] | None = None
        self._notes: deque[tuple[int, dict, bytes | None]] = deque(maxlen=MAX_NOTIFICATIONS)
        self._count = 0

    def keep(self, image: np.ndarray, timestamp: float) -> None:
        small = shrink(np.asarray(image))
        with self._lock:
            self._ring.append((float(timestamp), small))

    @property
    def latest_s(self) -> float | None:
        """Stream time of the latest frame (None: none yet)."""
        with self._lock:
            return self._ring[-1][0] if self._ring else None

    def latest_jpeg(self) -> tuple[float, bytes] | None:
        """(stream time, JPEG) of the latest frame, encoded once per frame; None before any."""
        with self._lock:
            if not self._ring:
                return None
            t, image = self._ring[-1]
            cached = self._latest_jpeg
        if cached is not None and cached[0] == t:
            return cached
        made = (t, encode_jpeg(image))
        with self._lock:
            self._latest_jpeg = made
        return made

    def notified(self, data: dict) -> int:
        """Record a ``notification`` event's data with the frame of its moment; its index."""
        at = float(data.get("stream_time_s", 0.0))
        with self._lock:
            before = [img for t, img in self._ring if t <= at + 1e-6]
            image = before[-1] if before else (self._ring[0][1] if self._ring else None)
            index = self._count
            self._count += 1
        jpeg = None if image is None else encode_jpeg(image)
        with self._lock:
            self._notes.append((index, dict(data), jpeg))
        return index

    def notifications(self) -> list[tuple[int, dict, bool]]:
        """(index, event data, has a frame) of the kept notifications, oldest first."""
        with self._lock:
            return [(i, d, j is not None) for i, d, j in self._notes]

    def notification_jpeg(self, index: int) -> bytes | None:
        with self._lock:
            for i, _, jpeg in self._notes:
                if i == index:
                    return jpeg
        return None
