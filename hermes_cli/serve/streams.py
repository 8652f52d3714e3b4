"""The server's streams: each an engine stream, its source and the reader thread that feeds it.

``Hub`` opens streams from request bodies (checked by ``guard``), restores snapshots, bounds how
many streams and answers run at once, and drains at shutdown (sources stopped, each memory
saved with ``save_on_exit``). Blocking calls (the engine's requests, sources) happen here; the
HTTP layer runs them on ``Hub.pool``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..engine.client import EngineStopped, StreamClient, StreamFailed, open_stream
from ..engine.core import Engine
from ..errors import HermesError
from .frames import FrameKeeper
from .guard import Refused, check_name, check_source
from .metrics import Metrics
from .settings import ServeSettings

__all__ = ["STREAM_FIELDS", "Hub", "StreamEntry"]

log = logging.getLogger("hermes.serve")

STREAM_FIELDS = ("source", "policy", "budget", "fps", "chunk", "realtime", "policy_opt", "autosave", "memory", "notify")
MAX_NOTIFY = 8  # conditions one stream may probe after each chunk (each probe is a forward)
SNAPSHOT_SUFFIX = ".safetensors"
_FLAG = re.compile(r"--(policy-opt|policy|budget|chunk|fps)\b")


def _field_text(message: str) -> str:
    """A settings message as a request's: ``--budget`` → ``budget``."""
    return _FLAG.sub(lambda m: m.group(1).replace("-", "_"), message)


@dataclass
class StreamEntry:
    """One open stream of the server."""

    id: str
    client: StreamClient
    source: str | None  # as the request gave it
    source_id: str | None  # what snapshots record: a file's resolved path, else the URL
    live: bool
    realtime: bool
    oneoff: bool = False  # opened by a chat request's video_url: closed after its answer
    frames: Any = None  # the FrameSource (None: a memory alone)
    thread: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    reader_done: threading.Event = field(default_factory=threading.Event)
    answers_in_flight: int = 0
    created_s: float = field(default_factory=time.time)
    events: Any = None  # the metrics' subscription to the stream's events
    lock: threading.Lock = field(default_factory=threading.Lock)
    kept: FrameKeeper = field(default_factory=FrameKeeper)  # the web view's latest and notification frames


class Hub:
    """Every stream of one server on one engine (thread-safe)."""

    def __init__(self, engine: Engine, settings: ServeSettings, metrics: Metrics | None = None) -> None:
        self.engine, self.settings = engine, settings
        self.metrics = metrics or Metrics()
        self.pool = ThreadPoolExecutor(max_workers=64 + 4 * settings.max_streams * 8, thread_name_prefix="hermes-serve")
        self.draining = threading.Event()
        self._lock = threading.Lock()
        self._entries: dict[str, StreamEntry] = {}
        self._reserved = 0
        self._ids = itertools.count(1)
        self.saved: list[str] = []  # the streams ``drain`` saved

    @property
    def model(self) -> str:
        return self.engine.adapter.name

    @property
    def running(self) -> bool:
        return self.engine.running

    # -- looking up -----------------------------------------------------------------------------
    def get(self, sid: str) -> StreamEntry:
        with self._lock:
            entry = self._entries.get(sid)
        if entry is None:
            raise Refused(404, f"no stream {sid!r} (GET /v1/streams lists the open ones)", "not_found_error")
        return entry

    def entries(self) -> list[StreamEntry]:
        with self._lock:
            return list(self._entries.values())

    def view(self, entry: StreamEntry, *, memory_map: bool = False) -> dict:
        """The JSON of ``GET /v1/streams/{id}`` (``Refused`` 404 once the stream is closed)."""
        try:
            return self._view(entry, memory_map)
        except (KeyError, StreamFailed) as exc:
            raise Refused(404, f"stream {entry.id} is closed ({exc})", "not_found_error") from None

    def _view(self, entry: StreamEntry, memory_map: bool) -> dict:
        c = entry.client
        self.drain_events(entry)
        stats = c.stats().to_json()
        view: dict = {"id": entry.id, "object": "stream", "source": entry.source, "state": c.state,
                      "frames_seen": stats["frames_seen"], "stream_time_s": stats["stream_time_s"],
                      "cache": stats["cache"], "policy": stats["policy"], "model": stats["model"],
                      "live": entry.live, "realtime": entry.realtime, "paused": c.paused,
                      "counts": asdict(c.counts()), "answers_in_flight": entry.answers_in_flight,
                      "warnings": list(c.warnings), "stats": stats, "created": int(entry.created_s)}
        if c.error:
            view["error"] = c.error
        last = c.stats().last_chunk
        policy, config = c.policy, c.config
        view["last_chunk"] = None if last is None else asdict(last)
        view["policy_parameters"] = {f.name: getattr(policy, f.name) for f in policy.parameters()}
        view["config"] = asdict(config)
        view["frames_per_unit"] = c.frames_per_unit
        answer = c.last_answer
        view["last_answer"] = None if answer is None else {
            "ttft_ms": answer.ttft_ms, "tpot_ms": answer.tpot_ms, "tokens": len(answer.tokens),
            "stream_time_s": round(answer.stream_time_s, 3)}
        view["frame_s"] = entry.kept.latest_s
        if memory_map:
            view["memory_map"] = c.memory_map().to_json()
        return view

    # -- opening --------------------------------------------------------------------------------
    def open(self, body: dict, *, name: str | None = None, snapshot_path: Path | None = None,
             oneoff: bool = False, paused: bool = False) -> StreamEntry:
        """A stream from a ``POST /v1/streams`` body (checked first; nothing opened on a refusal);
        ``paused``: it takes no frames until resumed (a moved stream that was paused stays so)."""
        from ..cli.console import UserError

        unknown = sorted(set(body) - set(STREAM_FIELDS))
        if unknown:
            raise Refused(422, f"unknown field {unknown[0]!r} (a stream takes {', '.join(STREAM_FIELDS)})")
        settings, given = self._stream_settings(body)
        run = None
        memory = body.get("memory")
        if memory is not None or snapshot_path is not None:
            run = self._memory_run(snapshot_path or self._memory_path(memory, must_exist=True))
            made_by = run.snapshot.model_name if run.snapshot is not None else self.model
            if made_by != self.model:
                raise Refused(422, f"memory {memory or snapshot_path} was made by model {made_by!r}; this server runs "
                              f"{self.model!r} (fixed when it started)")
            try:
                settings = run.settings(settings, given)
            except HermesError as exc:  # a bad option, or a snapshot that does not fit
                raise Refused(422, _field_text(str(exc))) from None
        try:
            settings.check()
        except UserError as exc:
            raise Refused(422, _field_text(str(exc))) from None
        source = body.get("source")
        if source is None and run is None:
            raise Refused(422, "a stream needs a source (a video under --media-root or a URL) or a memory")
        realtime, autosave = _flag(body, "realtime"), _flag(body, "autosave")
        if autosave and self.settings.memory_root is None:
            raise Refused(422, "autosave needs a folder for snapshots: start the server with --memory-root DIR")
        notifier = self._notifier(body.get("notify"))
        target, is_url = check_source(source, self.settings.media_root) if source is not None else (None, False)
        sid = self._reserve(name)
        try:
            return self._open(sid, settings, source, target, is_url, realtime, autosave, run, oneoff, notifier, paused)
        finally:
            with self._lock:
                self._reserved -= 1

    def _stream_settings(self, body: dict):
        base = self.settings.session
        changes: dict = {}
        if "policy" in body:
            if not isinstance(body["policy"], str):
                raise Refused(422, f"policy must be a policy name (see `hermes policies`), got {body['policy']!r}")
            changes["policy"] = body["policy"]
        for key, target in (("budget", "budget"), ("chunk", "chunk")):
            if key in body:
                value = body[key]
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise Refused(422, f"{key} must be a whole number of at least 1, got {value!r}")
                changes[target] = value
        if "fps" in body:
            fps = body["fps"]
            if not isinstance(fps, int | float) or isinstance(fps, bool) or not 0 < fps <= 60:
                raise Refused(422, f"fps must be a number above 0 and at most 60, got {fps!r}")
            changes["fps"] = float(fps)
        if "policy_opt" in body:
            opts = body["policy_opt"]
            if not isinstance(opts, dict) or not all(isinstance(k, str) and isinstance(v, str | int | float | bool)
                                                     for k, v in opts.items()):
                raise Refused(422, 'policy_opt must be an object of parameter values, e.g. {"alpha": 0.4}')
            changes["policy_opt"] = tuple(f"{k}={_option_text(v)}" for k, v in opts.items())
        given = {k for k in ("policy", "budget", "fps", "chunk") if k in body}
        return base.replace(**changes), given

    @staticmethod
    def _notifier(spec: object):
        """``"notify": ["a person enters", …]`` (or ``{"conditions": [...], "threshold": 0.5, …}``
        with the firing rule's knobs): conditions probed after each chunk; each that fires is a
        ``notification`` event."""
        if spec is None:
            return None
        from ..engine.notify import Notifier, NotifySettings

        knobs = {f.name for f in dataclasses.fields(NotifySettings)}
        conditions, options = (spec.get("conditions"), {k: v for k, v in spec.items() if k != "conditions"}) \
            if isinstance(spec, dict) else (spec, {})
        if (not isinstance(conditions, list) or not conditions or len(conditions) > MAX_NOTIFY
                or not all(isinstance(c, str) and c.strip() and len(c) <= 200 for c in conditions)):
            raise Refused(422, f'notify must be a list of 1 to {MAX_NOTIFY} condition texts (up to 200 characters '
                          'each), e.g. ["a person enters"], or {"conditions": [...], "threshold": 0.5}')
        unknown = sorted(set(options) - knobs)
        if unknown or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in options.values()):
            raise Refused(422, f"notify takes conditions and the numbers {', '.join(sorted(knobs))}; "
                          f"got {', '.join(unknown) or 'a value that is not a number'}")
        try:
            return Notifier(conditions, NotifySettings(**options))
        except (ValueError, TypeError) as exc:
            raise Refused(422, re.sub(r"--notify-(\w[\w-]*)", lambda m: f"notify.{m.group(1).replace('-', '_')}",
                                      str(exc))) from None

    def _memory_path(self, name: object, *, must_exist: bool) -> Path:
        root = self.settings.memory_root
        if root is None:
            raise Refused(422, "this server keeps no memories: start it with --memory-root DIR")
        name = check_name(name, "memory")
        path = (root / (name if name.endswith(SNAPSHOT_SUFFIX) else name + SNAPSHOT_SUFFIX)).resolve()
        if not path.is_relative_to(root.resolve()):
            raise Refused(403, f"memory {name!r} leads out of the memory root", "permission_error")
        if must_exist and not path.is_file():
            raise Refused(404, f"no memory {name!r} under the memory root", "not_found_error")
        return path

    @staticmethod
    def _memory_run(path: Path):
        from ..cli.memory import MemoryRun

        try:
            return MemoryRun(load=str(path), quiet=True)
        except HermesError as exc:  # a file that is no snapshot, or a damaged one
            raise Refused(422, str(exc)) from None

    def _reserve(self, name: str | None) -> str:
        with self._lock:
            if len(self._entries) + self._reserved >= self.settings.max_streams:
                raise Refused(429, f"this server holds at most {self.settings.max_streams} streams "
                              "(--max-streams): DELETE one first", "rate_limit_error")
            if name is not None and name in self._entries:
                raise Refused(409, f"a stream named {name!r} is open already", "conflict_error")
            sid = name
            while sid is None or sid in self._entries:
                sid = f"s{next(self._ids)}"
            self._reserved += 1
            return sid

    def _open(self, sid, settings, source, target, is_url, realtime, autosave, run, oneoff, notifier,
              paused=False) -> StreamEntry:
        from ..cli.memory import ContinuedFrames
        from ..cli.urls import explain_source_error
        from ..engine.snapshot import SnapshotError
        from ..sources import SourceError, open_source

        frames: Any = None
        if target is not None:
            try:
                frames = open_source(target, settings.memory.fps, realtime=False, reconnect_s=self.settings.reconnect_s)
            except (SourceError, ValueError) as exc:
                raise Refused(422, explain_source_error(target if is_url else None, str(exc))) from None
        live = bool(frames is not None and frames.is_live)
        if oneoff and live:
            frames.close()
            raise Refused(422, "a video_url must be a video with an end: open a live source with POST /v1/streams "
                          "and ask with model hermes:stream/ID")
        try:
            client = open_stream(self.engine, settings.memory.make_policy(), settings.config(), live=live, name=sid,
                                 notifier=notifier)
        except BaseException as exc:
            if frames is not None:
                frames.close()
            if isinstance(exc, ValueError):  # what only the model can tell (a chunk it cannot encode)
                raise Refused(422, _field_text(str(exc))) from None
            raise
        entry = StreamEntry(sid, client, source, target, live, realtime and not live, oneoff, frames,
                            kept=FrameKeeper(4 * settings.config().chunk_frames if notifier is not None else 1))
        try:
            iterable: Any = frames
            snap = None if run is None else run.snapshot
            if snap is not None:
                client.restore(snap)
                consumed = snap.consumed_until_s
                if consumed is not None and frames is not None:
                    if target == snap.source and not live:  # the same file: resume after its last frame
                        iterable = ContinuedFrames(frames, skip_until_s=consumed)
                    else:  # another source continues the stream's time
                        client.flush()
                        iterable = ContinuedFrames(frames, offset_s=consumed + 1.0 / settings.memory.fps)
                if entry.source_id is None:
                    entry.source_id = snap.source
            if paused:
                client.pause()
            if autosave:
                client.autosave(self._memory_path(sid, must_exist=False), self.settings.autosave_every_s,
                                source=entry.source_id)
        except SnapshotError as exc:
            self._discard(entry)
            raise Refused(422, str(exc)) from None
        except BaseException:
            self._discard(entry)
            raise
        entry.events = client.subscribe()
        with self._lock:
            self._entries[sid] = entry
        if frames is None:
            client.end()  # a memory alone: it answers, nothing more comes
            entry.reader_done.set()
        else:
            entry.thread = threading.Thread(target=self._read, args=(entry, iterable), name=f"hermes-source-{sid}",
                                            daemon=True)
            entry.thread.start()
        log.info("stream %s opened on %s", sid, source or "a saved memory")
        return entry

    def _discard(self, entry: StreamEntry) -> None:
        if entry.frames is not None:
            entry.frames.close()
        with contextlib.suppress(StreamFailed, EngineStopped, KeyError):
            entry.client.close()

    def _read(self, entry: StreamEntry, frames) -> None:
        """The reader thread: submit the source's frames, then flush and end the stream (with the
        source's error if it failed); a live source's reconnections become ``gap`` events."""
        from ..app.feed import Pacer, feed

        client, source = entry.client, entry.frames
        seen = {"gaps": 0}

        def on_frame(frame) -> None:
            entry.kept.keep(frame.image, frame.timestamp)
            stats = source.stats
            if stats.gaps > seen["gaps"]:
                seen["gaps"] = stats.gaps
                client.note("gap", gaps=stats.gaps, gap_s=round(stats.gap_s, 3), frames_lost=stats.frames_lost,
                            resumed_at_s=round(frame.timestamp, 3))
            self.drain_events(entry)

        try:
            with source:
                lost = feed(client, frames, pacer=Pacer() if entry.realtime else None, stopping=entry.stopping,
                            on_frame=on_frame, end=False)
            if entry.stopping.is_set():
                return
            client.flush()  # every chunk in before "ended": subscribers see the chunks, then the end
            client.end(None if lost is None else str(lost))
        except (StreamFailed, EngineStopped, KeyError):
            pass  # closed or failed meanwhile: the stream says so itself
        except Exception as exc:  # the decoder failed in a way the source did not wrap
            with contextlib.suppress(StreamFailed, EngineStopped, KeyError):
                client.end(f"{type(exc).__name__}: {exc}")
        finally:
            entry.reader_done.set()
            self.drain_events(entry)

    def drain_events(self, entry: StreamEntry) -> None:
        """Fold the stream's events since the last call into the metrics."""
        q = entry.events
        if q is None:
            return
        while True:
            try:
                event = q.get_nowait()
            except Exception:
                return
            if event.kind == "chunk":
                self.metrics.chunk_prefill_s.observe(event.data.get("prefill_ms", 0.0) / 1000)
            elif event.kind == "notification":
                entry.kept.notified(event.data)

    # -- answers --------------------------------------------------------------------------------
    def take_answer(self, entry: StreamEntry) -> None:
        with entry.lock:
            if entry.answers_in_flight >= self.settings.max_answers_per_stream:
                raise Refused(429, f"stream {entry.id} is answering {entry.answers_in_flight} questions already "
                              "(--max-answers-per-stream): retry when one is done", "rate_limit_error")
            entry.answers_in_flight += 1

    def release_answer(self, entry: StreamEntry) -> None:
        with entry.lock:
            entry.answers_in_flight -= 1

    # -- snapshots ------------------------------------------------------------------------------
    def snapshot(self, entry: StreamEntry, name: object = None) -> dict:
        from ..engine.snapshot import SnapshotError

        path = self._memory_path(entry.id if name is None else name, must_exist=False)
        try:
            report = entry.client.save(path, source=entry.source_id)
        except SnapshotError as exc:
            raise Refused(500, str(exc), "server_error") from None
        return {"path": str(report.path), "bytes": report.bytes}

    def restore_dir(self, folder: Path) -> list[str]:
        """Reopen every snapshot in ``folder`` under its file's name (its source resumes when this
        server may still open it; else the memory alone answers)."""
        opened = []
        for path in sorted(folder.glob(f"*{SNAPSHOT_SUFFIX}")):
            run = self._memory_run(path)
            source = run.snapshot.source if run.snapshot is not None else None
            body: dict = {}
            if source is not None:
                try:
                    check_source(source, self.settings.media_root)
                    body["source"] = source
                except Refused as why:
                    log.warning("%s: its source is not served here (%s): restoring the memory alone", path, why)
            try:
                entry = self.open(body, name=check_name(path.name[: -len(SNAPSHOT_SUFFIX)], "stream"),
                                  snapshot_path=path)
            except Refused as why:
                log.warning("cannot restore %s: %s", path, why)
                continue
            opened.append(entry.id)
        return opened

    # -- closing --------------------------------------------------------------------------------
    def close(self, sid: str) -> None:
        with self._lock:
            entry = self._entries.pop(sid, None)
        if entry is None:
            raise Refused(404, f"no stream {sid!r}", "not_found_error")
        self._stop(entry)
        with contextlib.suppress(StreamFailed, EngineStopped, KeyError):
            entry.client.close()

    @staticmethod
    def _stop(entry: StreamEntry) -> None:
        entry.stopping.set()
        if entry.frames is not None:
            entry.frames.close()
        if entry.thread is not None:
            entry.thread.join(10)

    def drain(self, save_dir: Path | None) -> list[str]:
        """Shutdown: stop every source, save each stream's memory into ``save_dir``, close them."""
        self.draining.set()
        entries = self.entries()
        for entry in entries:
            self._stop(entry)
        saved = []
        for entry in entries:
            if save_dir is not None and not entry.oneoff:
                try:
                    entry.client.save(save_dir / f"{entry.id}{SNAPSHOT_SUFFIX}", source=entry.source_id)
                    saved.append(entry.id)
                except Exception as exc:  # one stream's failed save must not lose the others
                    log.error("could not save stream %s: %s", entry.id, exc)
        for entry in entries:
            with contextlib.suppress(Refused):
                self.close(entry.id)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.saved = saved
        return saved


def _flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise Refused(422, f"{key} must be true or false, got {value!r}")
    return value


def _option_text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else repr(value) if isinstance(value, float) else str(value)
