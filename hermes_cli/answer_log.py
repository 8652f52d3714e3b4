"""The answer log: every question and answer, with where and how it was answered, in SQLite.

The file is ``$XDG_STATE_HOME/hermes-video/logs.db`` (default ``~/.local/state/hermes-video``;
``HERMES_LOGS`` names another), as ``llm`` keeps one. ``log_answer`` is the one writer: every
place that prints an answer calls it once, after ``begin`` named the run's command and source
(or turned logging off for the run: ``--no-log``). ``hermes logs off`` leaves a ``logs-off``
file beside the log, and nothing is logged until ``hermes logs on`` removes it.

The schema is versioned with SQLite's ``user_version``; opening an older file migrates it in
place, keeping its rows (``MIGRATIONS``). A log that cannot be written never stops an answer:
it is said once on stderr and the run goes on unlogged.

Standard library only: the CLI imports this before torch.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2
COLUMNS = ("id", "datetime_utc", "command", "source", "stream_time_s", "asked_at_s", "frames_seen", "model",
           "policy", "question", "answer", "ttft_ms", "tpot_ms", "answer_tokens")

# version 1, the first layout: the answer, its source, model, policy, stream time and TTFT
_V1 = """CREATE TABLE answers (
    id INTEGER PRIMARY KEY, datetime_utc TEXT NOT NULL, source TEXT, model TEXT, policy TEXT,
    question TEXT NOT NULL, answer TEXT NOT NULL, stream_time_s REAL, ttft_ms REAL)"""
# MIGRATIONS[v] takes a file at version v to v + 1; a new layout appends one entry
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE answers ADD COLUMN command TEXT",
        "ALTER TABLE answers ADD COLUMN asked_at_s REAL",
        "ALTER TABLE answers ADD COLUMN frames_seen INTEGER",
        "ALTER TABLE answers ADD COLUMN tpot_ms REAL",
        "ALTER TABLE answers ADD COLUMN answer_tokens INTEGER",
        "CREATE INDEX answers_datetime ON answers (datetime_utc)"),
}

_RUN: dict[str, Any] = {"command": None, "source": None, "enabled": True, "failed": False}
_LOCK = threading.Lock()


def state_dir() -> Path:
    """hermes' state folder: $XDG_STATE_HOME/hermes-video (default ~/.local/state/hermes-video)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hermes-video"


def log_path() -> Path:
    """The log file: HERMES_LOGS, else logs.db in the state folder."""
    return Path(os.environ["HERMES_LOGS"]).expanduser() if os.environ.get("HERMES_LOGS") else state_dir() / "logs.db"


def _off_marker() -> Path:
    return log_path().with_name("logs-off")


def logging_on() -> bool:
    """False after ``hermes logs off`` (until ``hermes logs on``)."""
    return not _off_marker().exists()


def set_logging(on: bool) -> None:
    """``hermes logs on`` / ``off``: remove or leave the ``logs-off`` marker beside the log."""
    marker = _off_marker()
    if on:
        marker.unlink(missing_ok=True)
    else:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


def begin(command: str, source: str | None, *, enabled: bool = True) -> None:
    """Name this run's command and source for the answers it logs; ``enabled=False``: ``--no-log``."""
    if source is not None and "://" not in source and Path(source).expanduser().exists():
        source = str(Path(source).expanduser().resolve())
    _RUN.update(command=command, source=source, enabled=enabled, failed=False)


@contextmanager
def connect(path: Path | None = None) -> Iterator[sqlite3.Connection]:
    """The log, created or migrated to ``SCHEMA_VERSION``; committed and closed on leaving."""
    path = path or log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path, timeout=5)) as db:
        db.row_factory = sqlite3.Row
        with db:
            migrate(db)
        with db:
            yield db


def migrate(db: sqlite3.Connection) -> int:
    """Bring ``db`` to ``SCHEMA_VERSION`` (a new file starts at version 1); the version it had (0: new)."""
    version = start = db.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:  # a new file, or one of the first layout written without its version
        if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'answers'").fetchone():
            db.execute(_V1)
        version = 1
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"the log has schema version {version}, newer than this hermes "
                                    f"({SCHEMA_VERSION}) — upgrade hermes-video, or set HERMES_LOGS to another file")
    while version < SCHEMA_VERSION:
        for statement in MIGRATIONS[version]:
            db.execute(statement)
        version += 1
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return start


def log_answer(answer: Any, *, model: str, policy: str, asked_at_s: float | None = None) -> None:
    """Log one answer (an engine ``Answer``: ``question``, ``text``, ``record()``) unless this run
    or ``hermes logs off`` turned logging off. Never raises: a log that cannot be written is said once."""
    if not _RUN["enabled"] or _RUN["failed"] or not logging_on():
        return
    timings = answer.record()
    row = {
        "datetime_utc": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "command": _RUN["command"], "source": _RUN["source"], "stream_time_s": timings.get("stream_time_s"),
        "asked_at_s": asked_at_s, "frames_seen": timings.get("frames_seen"), "model": model, "policy": policy,
        "question": answer.question, "answer": answer.text, "ttft_ms": timings.get("ttft_ms"),
        "tpot_ms": timings.get("tpot_ms"), "answer_tokens": timings.get("answer_tokens"),
    }
    try:
        with _LOCK, connect() as db:
            db.execute(f"INSERT INTO answers ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                       tuple(row.values()))
    except (sqlite3.Error, OSError) as exc:
        _RUN["failed"] = True
        sys.stderr.write(f"warning: answers are not logged: cannot write {log_path()} ({exc}) — "
                         "hermes logs off stops trying, --no-log skips it for one run\n")


def recent(count: int = 10, search: str | None = None) -> list[dict]:
    """The newest ``count`` answers (0: all), oldest first; ``search``: only those whose question
    or answer contains it (case-insensitive)."""
    if not log_path().exists():
        return []
    where, args = "", []
    if search:
        where = "WHERE question LIKE ? ESCAPE '\\' OR answer LIKE ? ESCAPE '\\'"
        pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        args = [pattern, pattern]
    limit = f"LIMIT {int(count)}" if count > 0 else ""
    with connect() as db:
        rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM answers {where} ORDER BY id DESC {limit}", args).fetchall()
    return [dict(r) for r in reversed(rows)]


def count() -> int:
    """How many answers the log holds."""
    if not log_path().exists():
        return 0
    with connect() as db:
        return db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
