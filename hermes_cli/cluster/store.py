"""The snapshot store of a cluster: a folder outside the engines (``--snapshot-store DIR``).

Per stream ``ID`` it holds ``ID.safetensors`` (the newest autosave), ``ID.prev.safetensors`` (the
one before) and ``ID.json`` (the index entry: the stream's request body, its epoch, whether it
ended). A save writes ``ID.next.safetensors`` atomically first and only then rotates, so a failed
write (a full disk, a read-only store) leaves both older generations in place, and a corrupt
newest file falls back to the one before (``latest``). No Ray, no torch at import.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["IndexEntry", "SnapshotStore", "StoreAutosaver"]

log = logging.getLogger("hermes.cluster")

SUFFIX = ".safetensors"


@dataclass(frozen=True)
class IndexEntry:
    """What the store remembers of a stream besides its memory."""

    id: str
    body: dict  # the POST /v1/streams body it was opened with
    epoch: int
    ended: bool = False


class SnapshotStore:
    """A local folder of stream snapshots and their index (see the module docstring)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ValueError(f"--snapshot-store {root}: not a folder")

    def path(self, sid: str, generation: str = "") -> Path:
        return self.root / f"{sid}{'.' + generation if generation else ''}{SUFFIX}"

    # -- index ------------------------------------------------------------------------------------
    def write_index(self, entry: IndexEntry) -> None:
        """Record ``entry`` atomically (a failure is logged: placement goes on without it)."""
        target = self.root / f"{entry.id}.json"
        tmp = target.with_suffix(".json.tmp")
        try:
            tmp.write_text(json.dumps({"id": entry.id, "body": entry.body, "epoch": entry.epoch, "ended": entry.ended}))
            os.replace(tmp, target)
        except OSError as exc:
            log.warning("snapshot store: cannot write the index of %s: %s", entry.id, exc)

    def read_index(self) -> list[IndexEntry]:
        entries = []
        for path in sorted(self.root.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                entries.append(IndexEntry(data["id"], data["body"], int(data["epoch"]), bool(data.get("ended"))))
            except (OSError, ValueError, KeyError) as exc:
                log.warning("snapshot store: skipping %s: %s", path, exc)
        return entries

    def forget(self, sid: str) -> None:
        """A closed stream: its index entry is marked ended (its snapshots stay for `hermes chat --memory`)."""
        for entry in self.read_index():
            if entry.id == sid:
                self.write_index(IndexEntry(entry.id, entry.body, entry.epoch, ended=True))

    # -- snapshots ----------------------------------------------------------------------------------
    def latest(self, sid: str):
        """The newest snapshot of ``sid`` that reads back whole: ``(path, Snapshot)``, the previous
        generation when the newest is damaged, or None when neither is usable."""
        from ..engine.snapshot import SnapshotError, read

        for generation in ("", "prev"):
            path = self.path(sid, generation)
            if not path.is_file():
                continue
            try:
                return path, read(path)
            except SnapshotError as exc:
                log.warning("snapshot store: %s — falling back to the generation before", exc)
        return None


class StoreAutosaver:
    """The engine's autosaver (``tick()`` after a chunk) writing into a ``SnapshotStore``: the new
    snapshot goes to ``ID.next`` first, then ``ID`` → ``ID.prev`` and ``ID.next`` → ``ID``. A failed
    save becomes one warning of the stream (once) and both older generations stay."""

    def __init__(self, session, store: SnapshotStore, sid: str, every_s: float, *, source: str | None = None,
                 clock=None) -> None:
        import time

        self.session, self.store, self.sid, self.every_s, self.source = session, store, sid, every_s, source
        self.clock = clock or time.monotonic
        self.last = self.clock()
        self.saves = 0
        self.failures = 0

    def tick(self) -> bool:
        if self.clock() - self.last < self.every_s:
            return False
        from ..engine.snapshot import SnapshotError

        try:
            self.save()
        except SnapshotError as exc:
            self.last = self.clock()
            self.failures += 1
            warning = f"autosave failed: {exc} — the stream goes on; the last good snapshot stays"
            if warning not in self.session.warnings:
                self.session.warnings.append(warning)
            return False
        return True

    def save(self):
        from ..engine.snapshot import SnapshotError, save

        latest, prev, nxt = self.store.path(self.sid), self.store.path(self.sid, "prev"), self.store.path(self.sid, "next")
        report = save(self.session, nxt, source=self.source)
        try:
            if latest.exists():
                os.replace(latest, prev)
            os.replace(nxt, latest)
        except OSError as exc:
            raise SnapshotError(f"cannot rotate the snapshots of {self.sid}: {exc.strerror or exc}") from exc
        self.last = self.clock()
        self.saves += 1
        return dataclasses.replace(report, path=latest)
