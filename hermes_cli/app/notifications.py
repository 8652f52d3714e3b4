"""``--notify``: the notifications of a stream, handed to the places that show them.

The engine probes each condition after every chunk and emits a ``notification`` event when one
fires (``engine.notify``, ``engine.probe``); ``NotificationWatcher`` follows a stream's events on
its own thread and gives each notification to ``show`` (a JSON line, a line at the prompt) and to
``--on-notify``'s command (never through a shell unless asked), and counts them for the toolbar.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["NotificationWatcher", "notification_line"]


def notification_line(record: dict) -> str:
    """``notification at 12.3s: a person enters (p 0.91) — A man walks in.``"""
    text = f" — {record['text']}" if record.get("text") else ""
    return f"notification at {record['stream_time_s']:.1f}s: {record['notification']} (p {record['p_yes']:.2f}){text}"


class NotificationWatcher:
    """Follows ``stream``'s events; each ``notification`` goes to ``show(record)`` and ``command``."""

    def __init__(self, stream, show: Callable[[dict], None], command=None) -> None:
        self.stream, self.show, self.command = stream, show, command
        self.count = 0
        self.last: dict | None = None
        self._events = stream.subscribe()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hermes-notify", daemon=True)

    def start(self) -> NotificationWatcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._handle(self._events.get(timeout=0.1))
            except queue.Empty:
                continue

    def _handle(self, event) -> None:
        from ..engine.notify import NotifyEvent

        if event.kind != "notification":
            return
        self.count += 1
        self.last = event.data
        self.show(event.data)
        if self.command is not None:
            try:
                self.command(NotifyEvent(**event.data))
            except OSError as exc:
                self.show({"error": f"--on-notify could not start: {exc}"})

    def stop(self) -> None:
        """Hand on what is still queued, then stop following; waits for --on-notify's commands."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(5)
        while True:
            try:
                self._handle(self._events.get_nowait())
            except queue.Empty:
                break
        self.stream.unsubscribe(self._events)
        if self.command is not None:
            self.command.close()
