"""The server's settings: limits, roots and the defaults every stream starts from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..cli.factory import SessionSettings

__all__ = ["ServeSettings"]


@dataclass(frozen=True)
class ServeSettings:
    """Everything ``create_app`` needs besides the engine (the model is the engine's, fixed)."""

    session: SessionSettings = field(default_factory=SessionSettings)  # a stream's defaults
    api_key: str | None = None  # None: no key (loopback only; ``check_bind``)
    media_root: Path | None = None  # local videos a request may open (None: none)
    memory_root: Path | None = None  # where snapshots are written and read (None: no snapshots)
    max_streams: int = 8  # open streams at once (429 past it)
    max_answers_per_stream: int = 32  # answers in flight on one stream (429 past it)
    max_body_bytes: int = 1 << 20  # request bodies (413 past it)
    max_question_chars: int = 8000  # the question's text (413 past it)
    max_tokens: int = 1024  # most tokens a request may ask for
    keepalive_s: float = 15.0  # SSE comment lines while nothing happens
    autosave_every_s: float = 60.0  # "autosave": true streams save this often
    reconnect_s: float | None = None  # live sources: retry window after a drop (None: the sources' default)
    cors: tuple[str, ...] = ()  # allowed origins (none: no CORS headers at all)
    save_on_exit: Path | None = None  # SIGTERM/shutdown: each stream's memory saved here
    restore: Path | None = None  # at start: reopen every snapshot saved here

    def __post_init__(self) -> None:
        for name in ("max_streams", "max_answers_per_stream", "max_body_bytes", "max_question_chars", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("media_root", "memory_root", "save_on_exit", "restore"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_dir():
                raise ValueError(f"--{name.replace('_', '-')} {path}: not a folder")
