"""The cluster's Ray actors: ``EngineHost`` (one engine core, its streams and their source
readers) and ``Registry`` (the stream → engine table, epochs, moves, drain, failover, rebuild).

Both are plain classes; ``launch`` makes them Ray actors. Replies that cross Ray are plain data:
a refusal is ``{"error": [status, message, kind]}`` (the gateway raises it as ``Refused``), never a
pickled exception. An engine host runs the very ``serve.streams.Hub`` of ``hermes serve``: a
stream opened there is opened, restored, read and autosaved exactly as in one process; under the
cluster every stream autosaves into the ``SnapshotStore`` (``StoreAutosaver``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from .placement import Engine as EngineSpec
from .placement import EngineReport, NoFit, PlacementError, PlacementTable, SnapshotEntry, StaleMove, Stream, rebuild
from .store import IndexEntry, SnapshotStore, StoreAutosaver

__all__ = ["NAMESPACE", "REGISTRY_NAME", "ClusterSettings", "EngineHost", "Registry", "engine_actor_name"]

log = logging.getLogger("hermes.cluster")

NAMESPACE = "hermes"
REGISTRY_NAME = "hermes-registry"
LATEST = "latest"  # EngineHost.open's snapshot: the store's newest generation that reads back whole


def engine_actor_name(engine_id: str) -> str:
    return f"hermes-engine-{engine_id}"


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
    """What the registry places by (``placement.Engine`` figures) and how it watches engines."""

    store: str  # the snapshot store folder
    engines: tuple[str, ...]  # engine ids, e.g. ("e0", "e1")
    slots: int = 64  # streams an engine may hold
    prefill_tps: float = 15_000.0  # an engine's sustained prefill tokens/s (measure it: docs/cluster.md)
    tokens_per_frame: int = 196  # a stream's visual tokens per frame (LLaVA-OV: 196)
    default_fps: float = 1.0  # a stream's fps when its request names none
    heartbeat_s: float = 0.5  # how often the registry pings each engine
    move_wait_s: float = 10.0  # how long a move waits for the stream's answers in flight


def _refusal(exc) -> dict:
    return {"error": [exc.status, exc.message, exc.kind]}


class EngineHost:
    """One engine core and its streams (an actor: every method is called from Ray's threads)."""

    def __init__(self, engine_id: str, serve_settings, store: str, autosave_every_s: float) -> None:
        import torch

        from ..cli.factory import build_engine
        from ..serve.streams import Hub

        torch.set_num_threads(1)
        from ..cli import memory  # noqa: F401  (imported now: a failover's restore must not wait for it)
        from ..engine import snapshot  # noqa: F401

        self.id = engine_id
        self.engine = build_engine(serve_settings.session, quiet=True)
        self.store = SnapshotStore(store)
        self.autosave_every_s = autosave_every_s
        settings = dataclasses.replace(serve_settings, memory_root=Path(store), max_streams=1 << 16,
                                       save_on_exit=None, restore=None)
        self.hub = Hub(self.engine, settings)
        self.epochs: dict[str, int] = {}
        self.asking: dict[str, int] = {}
        self.moving: set[str] = set()
        self.lock = threading.Lock()
        self.jobs: dict[str, Any] = {}
        self.gaps: dict[str, dict] = {}  # live streams restored here: the gap every new subscriber is told first
        self.subs: dict[int, tuple[str, queue.SimpleQueue]] = {}
        self._ids = itertools.count(1)

    # -- facts -------------------------------------------------------------------------------
    def ping(self) -> int:
        return os.getpid()

    def report(self) -> dict:
        """What ``GET /v1/engines`` shows of this engine (the registry adds ``load``), and the
        ``(stream, epoch)`` pairs it holds (the registry's rebuild reads them)."""
        import ray

        lag, memory = 0.0, 0
        held = []
        for entry in self.hub.entries():
            with contextlib.suppress(Exception):
                lag = max(lag, entry.client.counts().lag_s)
                memory += entry.client.stats().cache.kv_bytes
            held.append((entry.id, self.epochs.get(entry.id, 1)))
        return {"id": self.id, "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                "model": self.engine.adapter.name, "held": held, "lag_s": round(lag, 3), "memory_bytes": memory}

    # -- streams -----------------------------------------------------------------------------
    def open(self, sid: str, body: dict, epoch: int, snapshot: str | None = None, paused: bool = False) -> dict:
        """Open ``sid`` from its request ``body`` (from ``snapshot`` when given, ``LATEST``: the
        store's newest good one: the memory restored, a file source resumed after the snapshot's
        last frame); it autosaves into the store."""
        from ..serve.guard import Refused

        request = {k: v for k, v in body.items() if k != "autosave"}
        t0 = time.perf_counter()
        if snapshot == LATEST:  # a failover: the newest good generation, else none (from the start)
            found = self.store.latest(sid)
            snapshot = None if found is None else str(found[0])
        try:
            entry = self.hub.open(request, name=sid, snapshot_path=None if snapshot is None else Path(snapshot),
                                  paused=paused)
        except Refused as exc:
            return _refusal(exc)
        saver = self.engine.call(sid, lambda session: StoreAutosaver(session, self.store, sid, self.autosave_every_s,
                                                                       source=entry.source_id))
        self.engine.set_autosaver(sid, saver)
        self.epochs[sid] = epoch
        self.gaps.pop(sid, None)
        if snapshot is not None and entry.live:  # a live source resumes at now: what came meanwhile is lost
            as_of = entry.client.stats().stream_time_s
            self.gaps[sid] = {"reason": f"restored on engine {self.id} at epoch {epoch}: a live source resumes "
                                        "at now", "as_of": round(as_of, 3), "epoch": epoch}
            entry.client.note("gap", **self.gaps[sid])
        view = self.view(sid)
        view["open_s"] = round(time.perf_counter() - t0, 4)  # restore included: what a failover or move costs here
        return view

    def view(self, sid: str, memory_map: bool = False) -> dict:
        from ..serve.guard import Refused

        try:
            view = self.hub.view(self.hub.get(sid), memory_map=memory_map)
        except Refused as exc:
            return _refusal(exc)
        view["engine"], view["epoch"] = self.id, self.epochs.get(sid, 1)
        return view

    def close(self, sid: str, moved: dict | None = None) -> dict:
        """Close ``sid``; ``moved`` (``{"engine", "epoch"}``): it lives on there now, and its
        subscribers get a ``moved`` event before this copy's ``closed`` (the gateway follows it)."""
        from ..engine.core import Event
        from ..serve.guard import Refused

        if moved is not None:
            for held, q in list(self.subs.values()):
                if held == sid:
                    q.put(Event("moved", sid, dict(moved)))
        self.epochs.pop(sid, None)
        self.gaps.pop(sid, None)
        try:
            self.hub.close(sid)
        except Refused as exc:
            return _refusal(exc)
        return {"id": sid}

    def call(self, sid: str, name: str) -> Any:
        """A readout or control of the stream's client: ``state``, ``error``, ``paused``, ``config``,
        ``stats``, ``counts``, ``pause``, ``resume``."""
        from ..serve.guard import Refused

        try:
            client = self.hub.get(sid).client
        except Refused as exc:
            return _refusal(exc)
        if name in ("pause", "resume", "stats", "counts", "fresh_stats"):
            return {"value": getattr(client, name)()}
        if name in ("state", "error", "paused", "config", "warnings"):
            return {"value": getattr(client, name)}
        raise ValueError(f"no readout {name!r}")

    def snapshot(self, sid: str, name: str | None) -> dict:
        from ..serve.guard import Refused

        try:
            return self.hub.snapshot(self.hub.get(sid), name)
        except Refused as exc:
            return _refusal(exc)

    # -- answers -----------------------------------------------------------------------------
    def ask(self, sid: str, qid: str, question: str, max_new_tokens: int | None, history):
        """A streaming generator: the answer's text pieces, then ``{"answer": Answer, "epoch"}``
        (or ``{"error": ...}``: 404 no such stream, 409 while it moves)."""
        from ..serve.guard import Refused

        with self.lock:
            if sid in self.moving:
                yield {"error": [409, f"stream {sid} is moving to another engine: ask again in a moment",
                                 "conflict_error"]}
                return
            try:
                entry = self.hub.get(sid)
            except Refused as exc:
                yield _refusal(exc)
                return
            self.asking[sid] = self.asking.get(sid, 0) + 1
            epoch = self.epochs.get(sid, 1)
        try:
            handle = entry.client.ask(question, max_new_tokens=max_new_tokens, history=history)
            self.jobs[qid] = handle
            for piece in handle:  # noqa: UP028 (Ray drives the generator with send(): plain iterators lack it)
                yield piece
            yield {"answer": handle.answer, "epoch": epoch}
        except Exception as exc:
            yield {"error": [500, f"stream {sid} cannot answer: {exc}", "server_error"]}
        finally:
            self.jobs.pop(qid, None)
            with self.lock:
                self.asking[sid] -= 1

    def cancel(self, qid: str) -> None:
        handle = self.jobs.get(qid)
        if handle is not None and not handle.finished:
            handle.close()

    # -- events ------------------------------------------------------------------------------
    def subscribe(self, sid: str) -> dict:
        from ..serve.guard import Refused

        try:
            q = self.hub.get(sid).client.subscribe()
        except Refused as exc:
            return _refusal(exc)
        if sid in self.gaps:
            from ..engine.core import Event

            q.put(Event("gap", sid, dict(self.gaps[sid])))
        number = next(self._ids)
        self.subs[number] = (sid, q)
        return {"value": number}

    def poll(self, number: int, timeout_s: float) -> list | None:
        """The subscription's events so far (waits up to ``timeout_s`` for the first); None for
        a subscription this engine does not hold (it was restarted since: the stream is elsewhere)."""
        held = self.subs.get(number)
        if held is None:
            return None
        q, found = held[1], []
        with contextlib.suppress(queue.Empty):
            found.append(q.get(timeout=timeout_s))
            while len(found) < 256:
                found.append(q.get_nowait())
        return found

    def unsubscribe(self, number: int) -> None:
        held = self.subs.pop(number, None)
        if held is not None:
            with contextlib.suppress(Exception):
                self.hub.get(held[0]).client.unsubscribe(held[1])

    # -- moves -------------------------------------------------------------------------------
    def prepare_move(self, sid: str, wait_s: float) -> dict:
        """Stop ``sid`` at a chunk boundary for a move: new questions get 409, the ones in flight
        finish first (up to ``wait_s``, else the move is refused with 409), ingest pauses, the
        memory is saved into the store. Returns the snapshot's path and whether it was paused."""
        from ..serve.guard import Refused

        try:
            entry = self.hub.get(sid)
        except Refused as exc:
            return _refusal(exc)
        with self.lock:
            self.moving.add(sid)
        deadline = time.monotonic() + wait_s
        while self.asking.get(sid, 0) > 0:
            if time.monotonic() > deadline:
                self.abort_move(sid, False)
                return {"error": [409, f"stream {sid} is still answering after {wait_s:g}s: move it later",
                                  "conflict_error"]}
            time.sleep(0.02)
        was_paused = entry.client.paused
        entry.client.pause()  # returns once no chunk of it is in flight: a chunk boundary
        saver = StoreAutosaver(None, self.store, sid, 0.0, source=entry.source_id)

        def save(session):
            saver.session = session
            return saver.save()

        report = self.engine.call(sid, save)
        return {"path": str(report.path), "bytes": report.bytes, "paused": was_paused}

    def abort_move(self, sid: str, paused: bool) -> None:
        with self.lock:
            self.moving.discard(sid)
        if not paused:
            with contextlib.suppress(Exception):
                self.hub.get(sid).client.resume()

    def stop(self) -> None:
        self.hub.drain(None)
        self.engine.stop()


class Registry:
    """The stream → engine table of a cluster (a detached actor, restarted on failure).

    Placement follows ``placement.PlacementTable``; every move bumps the stream's epoch. At start
    (the first time and after every restart) it rebuilds its table from the engines' reports and
    the store's index, restores the streams no live engine holds and closes stale copies; then a
    heartbeat thread pings each engine every ``heartbeat_s`` and fails over the dead ones.
    """

    def __init__(self, settings: ClusterSettings) -> None:
        import ray

        self.settings = settings
        self.store = SnapshotStore(settings.store)
        self.lock = threading.RLock()
        self.recovering: set[str] = set()
        self.failovers: list[dict] = []
        self.timings: list[dict] = []  # per restored stream: the store read + the open on the target
        self.handles: dict[str, Any] = {}
        self.pids: dict[str, int] = {}
        reports = []
        for eid in settings.engines:
            try:
                handle = ray.get_actor(engine_actor_name(eid), namespace=NAMESPACE)
                report = ray.get(handle.report.remote(), timeout=30)
            except Exception as exc:  # gone while the registry was down: its streams are pending
                log.warning("registry: engine %s does not answer (%s)", eid, exc)
                continue
            self.handles[eid] = handle
            self.pids[eid] = report["pid"]
            reports.append(report)
        self.model = reports[0]["model"] if reports else "?"
        self.bodies = {e.id: e.body for e in self.store.read_index() if not e.ended}
        index = [SnapshotEntry(self._stream(e.id, e.body), e.epoch, e.ended) for e in self.store.read_index()]
        engine_reports = [EngineReport(self._engine(r), tuple((self._stream(sid, self.bodies.get(sid, {})), epoch)
                                                               for sid, epoch in r["held"]))
                          for r in reports]
        rebuilt = rebuild(engine_reports, index)
        self.table: PlacementTable = rebuilt.table
        for eid, sid, _epoch in rebuilt.stale:
            with contextlib.suppress(Exception):
                ray.get(self.handles[eid].close.remote(sid), timeout=30)
        self._restore(self.table.place_pending().moved)
        self._ids = itertools.count(1 + max((int(s[1:]) for s in self.table.streams
                                             if s[:1] == "s" and s[1:].isdigit()), default=0))
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._heartbeat, name="hermes-registry-heartbeat", daemon=True)
        self._watch.start()

    def _engine(self, report: dict) -> EngineSpec:
        s = self.settings
        return EngineSpec(report["id"], report["model"], s.slots, s.prefill_tps, report["node"])

    def _stream(self, sid: str, body: dict) -> Stream:
        fps = body.get("fps", self.settings.default_fps)
        return Stream(sid, self.model, float(fps), self.settings.tokens_per_frame)

    # -- lookups -----------------------------------------------------------------------------
    def lookup(self, sid: str) -> dict | None:
        """``{"engine", "epoch", "state"}`` (state ``ok``, or ``recovering`` during a failover),
        or None for a stream the cluster does not hold."""
        with self.lock:
            if sid not in self.table.streams:
                return None
            engine = self.table.engine_of(sid)
            state = "recovering" if sid in self.recovering or engine is None else "ok"
            return {"engine": engine, "epoch": self.table.epoch(sid), "state": state}

    def streams(self) -> list[str]:
        with self.lock:
            return sorted(self.table.streams)

    def table_state(self) -> dict:
        """``{stream: [engine, epoch]}`` — what a rebuilt registry must reproduce."""
        with self.lock:
            return {sid: [self.table.engine_of(sid), self.table.epoch(sid)] for sid in sorted(self.table.streams)}

    def engines(self) -> list[dict]:
        import ray

        with self.lock:
            handles = dict(self.handles)
            load = self.table.utilisation()
            where = {sid: self.table.engine_of(sid) for sid in self.table.streams}
        found = []
        for eid, handle in handles.items():
            try:
                report = ray.get(handle.report.remote(), timeout=10)
            except Exception:
                continue
            found.append({"id": eid, "pid": report["pid"], "node": report["node"],
                          "streams": sorted(s for s, e in where.items() if e == eid),
                          "load": round(load.get(eid, 0.0), 4), "lag_s": report["lag_s"],
                          "memory_bytes": report["memory_bytes"]})
        return found

    # -- opening and closing --------------------------------------------------------------------
    def open(self, body: dict) -> dict:
        """Place a new stream and open it there: ``{"id", "engine", "epoch", "view"}``."""
        import ray

        with self.lock:
            sid = f"s{next(self._ids)}"
            while sid in self.table.streams:
                sid = f"s{next(self._ids)}"
            try:
                fps = body.get("fps", self.settings.default_fps)
                if not isinstance(fps, int | float) or isinstance(fps, bool) or not 0 < fps <= 60:
                    return {"error": [422, f"fps must be a number above 0 and at most 60, got {fps!r}",
                                      "invalid_request_error"]}
                move = self.table.add_stream(self._stream(sid, body))
            except NoFit as exc:
                return {"error": [503, f"{exc} — add an engine or close a stream", "server_error"]}
            handle = self.handles[move.target]
            self.recovering.add(sid)
        try:
            view = ray.get(handle.open.remote(sid, body, move.epoch))
        except Exception as exc:
            view = {"error": [503, f"engine {move.target} failed opening the stream: {exc}", "server_error"]}
        with self.lock:
            self.recovering.discard(sid)
            if "error" in view:
                self.table.remove_stream(sid)
                return view
            self.bodies[sid] = body
        self.store.write_index(IndexEntry(sid, body, move.epoch or 1))
        return {"id": sid, "engine": move.target, "epoch": move.epoch, "view": view}

    def close(self, sid: str) -> dict:
        import ray

        with self.lock:
            if sid not in self.table.streams:
                return {"error": [404, f"no stream {sid!r}", "not_found_error"]}
            engine = self.table.engine_of(sid)
            self.table.remove_stream(sid)
            self.bodies.pop(sid, None)
        if engine is not None:
            with contextlib.suppress(Exception):
                ray.get(self.handles[engine].close.remote(sid), timeout=30)
        self.store.forget(sid)
        return {"id": sid}

    # -- moves -------------------------------------------------------------------------------
    def move(self, sid: str, to: str | None = None) -> dict:
        """Move ``sid`` at a chunk boundary (to ``to`` or where placement says): pause, snapshot,
        restore on the target, flip the epoch, resume; the source's copy is closed."""
        import ray

        with self.lock:
            if sid not in self.table.streams:
                return {"error": [404, f"no stream {sid!r}", "not_found_error"]}
            if to is not None and to not in self.table.engines:
                return {"error": [404, f"no engine {to!r} (GET /v1/engines lists them)", "not_found_error"]}
            if sid in self.recovering:
                return {"error": [409, f"stream {sid} is being moved or restored: try again", "conflict_error"]}
            try:
                plan = self.table.plan_move(sid, to)
            except PlacementError as exc:
                return {"error": [409, str(exc), "conflict_error"]}
            if plan.source is None:
                return {"error": [503, f"stream {sid} is on no engine now (pending): try again", "server_error"]}
            source, target = self.handles[plan.source], self.handles[plan.target]
            epoch = self.table.epoch(sid) + 1
            self.recovering.add(sid)
        t0 = time.perf_counter()
        try:
            ready = ray.get(source.prepare_move.remote(sid, self.settings.move_wait_s))
            if "error" in ready:
                return ready
            opened = ray.get(target.open.remote(sid, self.bodies.get(sid, {}), epoch, ready["path"],
                                                ready["paused"]))
            if "error" in opened:
                ray.get(source.abort_move.remote(sid, ready["paused"]))
                return opened
            with self.lock:
                try:
                    done = self.table.apply(plan)
                except StaleMove as exc:
                    ray.get(target.close.remote(sid))
                    ray.get(source.abort_move.remote(sid, ready["paused"]))
                    return {"error": [409, str(exc), "conflict_error"]}
            ray.get(source.close.remote(sid, {"engine": plan.target, "epoch": done.epoch}))
            with self.lock:
                self.store.write_index(IndexEntry(sid, self.bodies.get(sid, {}), done.epoch or epoch))
            return {"id": sid, "from": plan.source, "engine": plan.target, "epoch": done.epoch,
                    "snapshot_bytes": ready["bytes"], "move_s": round(time.perf_counter() - t0, 4)}
        finally:
            with self.lock:
                self.recovering.discard(sid)

    def drain(self, engine_id: str) -> dict:
        """Stop placing on ``engine_id`` and move every stream off it."""
        with self.lock:
            if engine_id not in self.table.engines:
                return {"error": [404, f"no engine {engine_id!r} (GET /v1/engines lists them)", "not_found_error"]}
            plan = self.table.drain(engine_id)
        moved: list[dict] = []
        failed: list[dict] = []
        for move in plan.moves:
            result = self.move(move.stream, move.target)
            (failed if "error" in result else moved).append(result)
        stuck = [{"stream": d.stream, "reason": d.reason} for d in plan.stuck]
        return {"id": engine_id, "draining": True, "moved": moved, "failed": failed, "stuck": stuck}

    def undrain(self, engine_id: str) -> dict:
        with self.lock:
            self.table.undrain(engine_id)
        return {"id": engine_id, "draining": False}

    # -- failover ----------------------------------------------------------------------------
    def report_dead(self, engine_id: str) -> None:
        """A caller saw ``engine_id`` die (an actor-died error): fail it over now."""
        self._failover(engine_id)

    def failover_log(self) -> list[dict]:
        """Each failover since this registry started, and its restores' timings."""
        return [*self.failovers, *self.timings]

    def _heartbeat(self) -> None:
        """Ping every engine: one that died, stopped answering or came back as a new process (Ray
        restarted it, empty) is failed over; one that answers again rejoins the table, empty."""
        import ray

        while not self._stop.wait(self.settings.heartbeat_s):
            for eid in self.settings.engines:
                handle = self.handles.get(eid)
                try:
                    handle = handle or ray.get_actor(engine_actor_name(eid), namespace=NAMESPACE)
                except ValueError:  # killed for good
                    continue
                ref = handle.ping.remote()
                ready, _ = ray.wait([ref], timeout=max(2.0, 4 * self.settings.heartbeat_s))
                pid = None
                with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    pid = ray.get(ref, timeout=0.1) if ready else None
                if eid in self.handles:
                    if pid != self.pids.get(eid):
                        log.warning("registry: engine %s is gone (pid %s → %s): failing over its streams", eid,
                                    self.pids.get(eid), pid)
                        self._failover(eid, f"heartbeat: pid {self.pids.get(eid)} → {pid}")
                elif pid is not None:
                    self._rejoin(eid, handle, pid)

    def _rejoin(self, engine_id: str, handle, pid: int) -> None:
        import ray

        try:
            report = ray.get(handle.report.remote(), timeout=30)
        except Exception:
            return
        with self.lock:
            self.table.add_engine(self._engine(report))
            self.handles[engine_id], self.pids[engine_id] = handle, pid
            moved = self.table.place_pending().moved
        self._restore(moved)

    def _failover(self, engine_id: str, why: str = "reported dead") -> None:
        t0 = time.perf_counter()
        with self.lock:
            if engine_id not in self.handles or engine_id not in self.table.engines:
                return
            orphans = self.table.engine_state(engine_id).streams
            self.recovering.update(s.id for s in orphans)
            del self.handles[engine_id]
            self.pids.pop(engine_id, None)
            outcome = self.table.fail(engine_id)
        restored = self._restore(outcome.moved)
        self.failovers.append({"engine": engine_id, "why": why, "detected_at": time.time(), "streams": restored,
                               "pending": [d.stream for d in outcome.unplaced],
                               "failover_s": round(time.perf_counter() - t0, 4)})

    def _restore(self, moves) -> list[str]:
        """Open each moved stream on its new engine from its last good snapshot."""
        import ray

        restored = []
        for move in moves:
            sid = move.stream
            body = self.bodies.get(sid, {})
            t0 = time.perf_counter()
            with self.lock:
                self.recovering.add(sid)
            try:  # the target picks the newest snapshot that reads back whole (the registry holds no torch)
                opened = ray.get(self.handles[move.target].open.remote(sid, body, move.epoch, LATEST), timeout=120)
                self.timings.append({"stream": sid, "read_s": round(time.perf_counter() - t0, 4),
                                     "open_s": opened.get("open_s"), "as_of": opened.get("stream_time_s")})
                if "error" in opened:
                    log.error("registry: cannot restore %s on %s: %s", sid, move.target, opened["error"][1])
                else:
                    restored.append(sid)
                    self.store.write_index(IndexEntry(sid, body, move.epoch))
            except Exception as exc:
                log.error("registry: cannot restore %s on %s: %s", sid, move.target, exc)
            finally:
                with self.lock:
                    self.recovering.discard(sid)
        return restored

    def shutdown(self) -> None:
        self._stop.set()
