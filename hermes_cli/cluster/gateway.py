"""The cluster's HTTP gateway: the very FastAPI app of ``hermes serve`` over a ``ClusterHub``.

``ClusterHub`` has ``serve.streams.Hub``'s methods, but each stream lives on an engine actor:
every call looks the stream up in the registry (engine, epoch, state) and forwards; ``RayStream``
is the stream's client (the ``StreamAPI`` methods the routes use). A stream being failed over is
refused with 503 and ``Retry-After``; one being moved gets 409. Beside the routes of one server
it adds ``GET /v1/engines``, ``POST /v1/streams/{id}/move`` and ``POST /v1/engines/{id}/drain``.

Why the FastAPI app and not Ray Serve: the app exists and is tested, answers stream from the
engines through Ray generators, and the gateway holds no state of its own (the registry does), so
Serve's replicas, proxy and controller would be extra moving parts for no function we use yet.
Running the gateway as a Serve deployment later only wraps ``create_cluster_app``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from ..serve.guard import Refused
from ..serve.metrics import Metrics
from ..serve.settings import ServeSettings
from .actors import NAMESPACE, REGISTRY_NAME, engine_actor_name

__all__ = ["ClusterHub", "RayStream", "create_cluster_app"]

RETRY_AFTER_S = 1
_RAY_RETRY_S = 15.0  # how long a call waits for a restarting registry


def _raise(reply):
    """``reply``, or the ``Refused`` its ``"error"`` names."""
    if isinstance(reply, dict) and "error" in reply:
        status, message, kind = reply["error"]
        raise Refused(status, message, kind)
    return reply


def _unavailable(sid: str, why: str) -> Refused:
    return Refused(503, f"stream {sid} is {why}: retry in {RETRY_AFTER_S}s", "server_error",
                   headers={"Retry-After": str(RETRY_AFTER_S)})


class ClusterHub:
    """The streams of a cluster, as the app's routes see them (thread-safe)."""

    def __init__(self, settings: ServeSettings) -> None:
        import ray

        self.settings = settings
        self.metrics = Metrics()
        self.pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="hermes-gateway")
        self.draining = threading.Event()
        self.saved: list[str] = []
        self._entries: dict[str, RemoteEntry] = {}
        self._lock = threading.Lock()
        self._engines: dict[str, Any] = {}
        self._ray = ray
        self.model = "?"
        engines = self.call_registry("engines")
        if engines:
            self.model = self._ray.get(self.engine(engines[0]["id"]).report.remote())["model"]
        for sid in self.call_registry("streams"):  # a restarted gateway finds the cluster's streams
            self._entries[sid] = RemoteEntry(sid, RayStream(self, sid))

    # -- Ray plumbing --------------------------------------------------------------------------
    def registry(self):
        return self._ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)

    def call_registry(self, method: str, *args):
        """A registry call, retried while a restarted registry comes back."""
        deadline = time.monotonic() + _RAY_RETRY_S
        while True:
            try:
                return self._ray.get(getattr(self.registry(), method).remote(*args))
            except (self._ray.exceptions.RayActorError, ValueError):
                if time.monotonic() > deadline:
                    raise Refused(503, "the cluster's registry does not answer: retry later", "server_error",
                                  headers={"Retry-After": str(RETRY_AFTER_S)}) from None
                time.sleep(0.2)

    def engine(self, engine_id: str):
        handle = self._engines.get(engine_id)
        if handle is None:
            handle = self._ray.get_actor(engine_actor_name(engine_id), namespace=NAMESPACE)
            self._engines[engine_id] = handle
        return handle

    def locate(self, sid: str) -> tuple[Any, str, int]:
        """``(engine handle, engine id, epoch)`` of a stream, or ``Refused`` (404, or 503 while it fails over)."""
        found = self.call_registry("lookup", sid)
        if found is None:
            raise Refused(404, f"no stream {sid!r} (GET /v1/streams lists the open ones)", "not_found_error")
        if found["state"] != "ok":
            raise _unavailable(sid, "being restored on another engine")
        return self.engine(found["engine"]), found["engine"], found["epoch"]

    def forward(self, sid: str, method: str, *args):
        """Call ``method`` of the stream's engine; an engine that died is reported (failover) and
        the call refused with 503 + Retry-After."""
        handle, eid, _ = self.locate(sid)
        try:
            return _raise(self._ray.get(getattr(handle, method).remote(sid, *args)))
        except self._ray.exceptions.RayActorError:
            self._engines.pop(eid, None)
            with contextlib.suppress(Exception):
                self.registry().report_dead.remote(eid)
            raise _unavailable(sid, f"on engine {eid}, which died") from None

    # -- what the routes call ------------------------------------------------------------------
    @property
    def running(self) -> bool:
        try:
            self.call_registry("streams")
            return True
        except Refused:
            return False

    def get(self, sid: str) -> RemoteEntry:
        with self._lock:
            entry = self._entries.get(sid)
        if entry is None:
            raise Refused(404, f"no stream {sid!r} (GET /v1/streams lists the open ones)", "not_found_error")
        return entry

    def entries(self) -> list[RemoteEntry]:
        with self._lock:
            return list(self._entries.values())

    def view(self, entry: RemoteEntry, *, memory_map: bool = False) -> dict:
        return self.forward(entry.id, "view", memory_map)

    def open(self, body: dict, *, oneoff: bool = False, **_) -> RemoteEntry:
        if oneoff:
            raise Refused(422, "a cluster answers about its streams: open one with POST /v1/streams and ask with "
                          "model hermes:stream/ID (video_url is for one server)")
        opened = _raise(self.call_registry("open", body))
        entry = RemoteEntry(opened["id"], RayStream(self, opened["id"]))
        with self._lock:
            self._entries[entry.id] = entry
        return entry

    def close(self, sid: str) -> None:
        with self._lock:
            self._entries.pop(sid, None)
        _raise(self.call_registry("close", sid))

    def snapshot(self, entry: RemoteEntry, name: object = None) -> dict:
        return self.forward(entry.id, "snapshot", name)

    def take_answer(self, entry: RemoteEntry) -> None:
        with entry.lock:
            if entry.answers_in_flight >= self.settings.max_answers_per_stream:
                raise Refused(429, f"stream {entry.id} is answering {entry.answers_in_flight} questions already "
                              "(--max-answers-per-stream): retry when one is done", "rate_limit_error")
            entry.answers_in_flight += 1

    def release_answer(self, entry: RemoteEntry) -> None:
        with entry.lock:
            entry.answers_in_flight -= 1

    def drain_events(self, entry: RemoteEntry) -> None:
        """The engines count their chunks themselves."""

    def drain(self, save_dir) -> list[str]:
        """Gateway shutdown: the streams stay on their engines (the cluster's, not the gateway's)."""
        self.draining.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        return []

    def restore_dir(self, folder) -> list[str]:
        raise Refused(422, "--restore is for one server; a cluster restores from its --snapshot-store")

    # -- cluster routes ------------------------------------------------------------------------
    def engines(self) -> dict:
        return {"engines": self.call_registry("engines")}

    def move(self, sid: str, to: str | None) -> dict:
        self.get(sid)
        return _raise(self.call_registry("move", sid, to))

    def drain_engine(self, engine_id: str) -> dict:
        return _raise(self.call_registry("drain", engine_id))


@dataclass
class RemoteEntry:
    """One stream of the cluster, as the gateway holds it."""

    id: str
    client: RayStream
    oneoff: bool = False
    answers_in_flight: int = 0
    created_s: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock)


class RayStream:
    """A stream on an engine actor, behind the ``StreamAPI`` methods the routes use."""

    def __init__(self, hub: ClusterHub, sid: str) -> None:
        self.hub, self.id = hub, sid

    def _get(self, name: str):
        return self.hub.forward(self.id, "call", name)["value"]

    @property
    def state(self) -> str:
        return self._get("state")

    @property
    def error(self) -> str | None:
        return self._get("error")

    @property
    def paused(self) -> bool:
        return self._get("paused")

    @property
    def config(self):
        return self._get("config")

    @property
    def warnings(self) -> tuple[str, ...]:
        return self._get("warnings")

    def stats(self):
        return self._get("stats")

    def fresh_stats(self):
        return self._get("fresh_stats")

    def counts(self):
        return self._get("counts")

    def pause(self) -> None:
        self._get("pause")

    def resume(self) -> None:
        self._get("resume")

    def subscribe(self) -> RemoteEvents:
        number = self.hub.forward(self.id, "subscribe")["value"]
        return RemoteEvents(self, number)

    def unsubscribe(self, q: RemoteEvents) -> None:
        q.close()

    def ask(self, question: str, *, max_new_tokens: int | None = None, history=None, **_) -> RemoteAnswer:
        """Start the answer on the stream's engine (``Refused`` 503 while it fails over)."""
        handle, eid, epoch = self.hub.locate(self.id)
        qid = uuid.uuid4().hex
        generator = handle.ask.remote(self.id, qid, question, max_new_tokens, history)
        return RemoteAnswer(self, handle, eid, qid, generator, epoch)


class RemoteEvents:
    """A subscription to a stream's events on its engine (``get(timeout)`` like a queue) that
    follows the stream: on a ``moved`` event (a move) or its engine's death (a failover, once the
    stream is restored) it subscribes on the new engine and hands on one ``moved`` event."""

    def __init__(self, stream: RayStream, number: int) -> None:
        self.stream, self.number = stream, number
        self.handle, self.engine_id, self.epoch = stream.hub.locate(stream.id)
        self.buffer: list = []
        self.following = False  # a "moved" came: subscribe on the new engine (retried until the move is done)
        self.lost: str | None = None  # the engine that died under the subscription

    def _follow(self) -> bool:
        """Subscribe where the stream is now (False while it is still being restored)."""
        try:
            self.handle, self.engine_id, self.epoch = self.stream.hub.locate(self.stream.id)
            self.number = self.stream.hub.forward(self.stream.id, "subscribe")["value"]
        except Refused:
            return False
        self.buffer, self.following = [], False
        return True

    def get(self, timeout: float | None = None):
        import queue

        from ..engine.core import Event

        ray = self.stream.hub._ray
        if self.lost is not None or self.following:  # resubscribe where the stream lives now
            if not self._follow():
                time.sleep(min(timeout or 0.0, 0.2))
                raise queue.Empty
            if self.lost is not None:
                lost, self.lost = self.lost, None
                return Event("moved", self.stream.id, {"engine": self.engine_id, "epoch": self.epoch,
                                                       "reason": f"engine {lost} died"})
        if not self.buffer:
            try:
                found = ray.get(self.handle.poll.remote(self.number, timeout or 0.0))
            except ray.exceptions.RayActorError:
                found = None
            if found is None:  # the engine died (or came back empty): follow the failover
                self.lost = self.engine_id
                raise queue.Empty
            self.buffer = found
        if not self.buffer:
            raise queue.Empty
        event = self.buffer.pop(0)
        if event.kind == "moved":
            with contextlib.suppress(Exception):
                self.handle.unsubscribe.remote(self.number)
            self.buffer, self.following = [], True
            self._follow()
        return event

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.handle.unsubscribe.remote(self.number)


class RemoteAnswer:
    """An answer being decoded on an engine (the ``AnswerHandle`` the routes use): iterate for the
    pieces; ``answer`` the record; ``epoch`` the placement that answered; ``close()`` cancels."""

    def __init__(self, stream: RayStream, handle, engine_id: str, qid: str, generator, epoch: int) -> None:
        self.stream, self.handle, self.engine_id, self.qid = stream, handle, engine_id, qid
        self.generator, self.epoch = generator, epoch
        self._answer = None
        self._ended = False

    def __iter__(self):
        return self

    def __next__(self) -> str:
        ray = self.stream.hub._ray
        if self._ended:
            raise StopIteration
        try:
            item = ray.get(next(self.generator))
        except StopIteration:
            self._ended = True
            raise
        except ray.exceptions.RayActorError:
            self._ended = True
            with contextlib.suppress(Exception):
                self.stream.hub.registry().report_dead.remote(self.engine_id)
            raise _unavailable(self.stream.id, f"on engine {self.engine_id}, which died while answering") from None
        if isinstance(item, str):
            return item
        self._ended = True
        _raise(item)
        self._answer, self.epoch = item["answer"], item["epoch"]
        raise StopIteration

    @property
    def answer(self):
        for _ in self:
            pass
        if self._answer is None:
            raise _unavailable(self.stream.id, "not answering")
        return self._answer

    @property
    def finished(self) -> bool:
        return self._ended

    def close(self) -> None:
        if not self._ended:
            with contextlib.suppress(Exception):
                self.stream.hub._ray.get(self.handle.cancel.remote(self.qid), timeout=10)
            self._ended = True


def create_cluster_app(settings: ServeSettings):
    """The app of ``hermes serve`` over the cluster's streams, with the cluster's routes added."""
    from ..serve.app import create_app

    hub = ClusterHub(settings)
    api = create_app(None, settings, hub=hub)

    async def run(fn, *args):
        import asyncio
        import functools

        return await asyncio.get_running_loop().run_in_executor(hub.pool, functools.partial(fn, *args))

    async def body_of(request: Request) -> dict:
        import json

        data = await request.body()
        if not data.strip():
            return {}
        try:
            body = json.loads(data)
        except ValueError:
            raise Refused(422, "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise Refused(422, f"the body must be a JSON object, got a {type(body).__name__}")
        return body

    @api.get("/v1/engines")
    async def engines():
        return await run(hub.engines)

    @api.post("/v1/streams/{sid}/move")
    async def move(sid: str, request: Request):
        body = await body_of(request)
        target = body.get("engine")
        if target is not None and not isinstance(target, str):
            raise Refused(422, f"engine must be an engine id (GET /v1/engines), got {target!r}")
        return await run(hub.move, sid, target)

    @api.post("/v1/engines/{eid}/drain")
    async def drain(eid: str):
        return await run(hub.drain_engine, eid)

    return api
