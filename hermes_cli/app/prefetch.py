"""Frames decoded ahead: a bounded background iterator, so decoding overlaps the model's work.

Video decoding (PyAV releases the GIL) is independent of prefilling the chunk before it, so
``prefetched`` runs the source in a thread at most ``depth`` items ahead; the consumer then
waits for frames only when decoding is slower than the model.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterable
from typing import TypeVar

T = TypeVar("T")
_END = object()


def prefetched(items: Iterable[T], depth: int, *, join_timeout_s: float = 5.0) -> Generator[T, None, None]:
    """Yield ``items`` in order, produced by a background thread up to ``depth`` items ahead.

    An exception raised by the source is raised here, at the position it happened. Closing the
    generator (or breaking out of the loop) stops the thread before the next item it would queue
    and waits up to ``join_timeout_s`` for it. ``depth <= 0``: no thread, plain iteration.
    """
    if depth <= 0:
        yield from items
        return
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
            put((_END, None))
        except BaseException as exc:  # handed to the consumer
            put((_END, exc))

    worker = threading.Thread(target=produce, name="hermes-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item, error = slots.get()
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        worker.join(timeout=join_timeout_s)
