"""The HTTP front of one engine: ``create_app(engine, settings)`` (FastAPI; run it on uvicorn).

Routes (docs/serve.md): ``GET /healthz``; ``POST``/``GET /v1/streams``; ``GET``/``DELETE
/v1/streams/{id}``; ``GET /v1/streams/{id}/events`` (SSE); ``POST /v1/streams/{id}/snapshot``;
``POST /v1/streams/{id}/pause`` and ``/resume``; ``POST /v1/chat/completions`` (OpenAI);
``GET /v1/models``; ``GET /metrics`` (Prometheus); the web view's (``web``: ``GET /``,
``/v1/streams/{id}/memory``, ``/frame.jpg``, ``/notifications``). With an API key every route
but ``/healthz`` and the page's own files wants ``Authorization: Bearer KEY``. Errors are ``{"error": {"message", "type", "code"}}``
with a one-line message. A streamed answer whose client goes away is cancelled (the memory
restored); blocking engine calls run on the hub's thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import queue
import threading
import time
from contextlib import asynccontextmanager, suppress
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from ..engine.client import EngineStopped, StreamFailed
from ..engine.core import Engine
from ..engine.readouts import rss_bytes
from . import chat
from .guard import Refused, check_key
from .metrics import Metrics, render
from .settings import ServeSettings
from .streams import Hub, StreamEntry
from .web import PUBLIC_PATHS, add_web_routes

__all__ = ["create_app"]

log = logging.getLogger("hermes.serve")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
END_KINDS = ("ended", "failed", "closed")


def error_body(status: int, message: str, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "code": status}}


class KeyGuard:
    """ASGI middleware: every request but ``/healthz`` and the web page's own files (no data:
    ``web.PUBLIC_PATHS``) carries the bearer key, else 401."""

    def __init__(self, app, api_key: str, metrics: Metrics) -> None:
        self.app, self.api_key, self.metrics = app, api_key, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in ("/healthz", *PUBLIC_PATHS):
            header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            if not check_key(header, self.api_key):
                self.metrics.refused(401)
                response = JSONResponse(error_body(401, "missing or wrong API key: send Authorization: Bearer KEY",
                                                   "authentication_error"),
                                        status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Streamed(StreamingResponse):
    """An SSE response that runs ``on_close`` however it ends (done, client gone, shutdown)."""

    def __init__(self, content, on_close) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def create_app(engine: Engine | None, settings: ServeSettings, hub: Any = None) -> FastAPI:
    """The server of ``engine``'s streams under ``settings`` (``app.state.hub`` holds them); or of
    ``hub``, any object with ``Hub``'s methods (``cluster.gateway``: streams on Ray engines)."""
    if hub is None:
        assert engine is not None
        hub = Hub(engine, settings)
    metrics = hub.metrics
    started = int(time.time())

    async def run(fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(hub.pool, functools.partial(fn, *args, **kwargs))

    @asynccontextmanager
    async def lifespan(app):
        if settings.restore is not None:
            await run(hub.restore_dir, settings.restore)
        yield
        await asyncio.to_thread(hub.drain, settings.save_on_exit)

    api = FastAPI(title="hermes-video", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    api.state.hub = hub

    @api.exception_handler(Refused)
    async def refused(request: Request, exc: Refused):
        metrics.refused(exc.status)
        return JSONResponse(error_body(exc.status, exc.message, exc.kind), status_code=exc.status, headers=exc.headers)

    @api.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        metrics.refused(exc.status_code)
        text = {404: f"no route {request.method} {request.url.path} (docs/serve.md lists them)",
                405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return JSONResponse(error_body(exc.status_code, text), status_code=exc.status_code)

    @api.exception_handler(EngineStopped)
    async def stopped(request: Request, exc: EngineStopped):
        metrics.refused(503)
        return JSONResponse(error_body(503, f"{exc}: the server is shutting down or its model failed",
                                       "server_error"), status_code=503)

    @api.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):  # a bug: still one line, never a traceback to the client
        metrics.refused(500)
        log.exception("internal error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(500, f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())}",
                                       "server_error"), status_code=500)

    async def read_json(request: Request) -> dict:
        limit = settings.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise Refused(413, f"the body is {int(length)} bytes; this server takes at most {limit} (--max-body-bytes)")
        data = bytearray()
        async for piece in request.stream():
            data += piece
            if len(data) > limit:
                raise Refused(413, f"the body is over {limit} bytes (--max-body-bytes)")
        if not data.strip():
            return {}
        try:
            body = json.loads(data)
        except UnicodeDecodeError:
            raise Refused(422, "the body is not UTF-8 JSON") from None
        except json.JSONDecodeError as exc:
            raise Refused(422, f"the body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        if not isinstance(body, dict):
            raise Refused(422, f"the body must be a JSON object, got a {type(body).__name__}")
        return body

    add_web_routes(api, hub, run)

    # -- health, models, metrics -----------------------------------------------------------------
    @api.get("/healthz")
    async def healthz():
        return {"status": "ok" if hub.running else "stopped"}

    @api.get("/v1/models")
    async def models():
        data = [{"id": hub.model, "object": "model", "created": started, "owned_by": "hermes-video"}]
        data += [{"id": f"{chat.STREAM_MODEL_PREFIX}{e.id}", "object": "model", "created": int(e.created_s),
                  "owned_by": "hermes-video"} for e in hub.entries() if not e.oneoff]
        return {"object": "list", "data": data}

    @api.get("/metrics")
    async def prometheus():
        return Response(await run(metrics_text), media_type="text/plain; version=0.0.4")

    def metrics_text() -> str:
        states: dict[str, int] = {"live": 0, "ended": 0, "failed": 0}
        rows: dict[str, list[tuple[dict[str, str], float]]] = {k: [] for k in (
            "frames", "dropped", "lag", "queue", "inflight", "answers", "cancelled", "tokens", "kv")}
        for entry in hub.entries():
            try:
                c, counts, stats = entry.client, entry.client.counts(), entry.client.stats()
                state = c.state
            except (KeyError, StreamFailed, EngineStopped):
                continue
            hub.drain_events(entry)
            states[state] = states.get(state, 0) + 1
            label = {"stream": entry.id}
            for key, value in (("frames", counts.frames_seen), ("dropped", counts.frames_dropped),
                               ("lag", counts.lag_s), ("queue", counts.frames_queued),
                               ("inflight", entry.answers_in_flight), ("answers", counts.answers),
                               ("cancelled", counts.answers_cancelled), ("tokens", stats.cache.tokens),
                               ("kv", stats.cache.kv_bytes)):
                rows[key].append((label, float(value)))
        families: list[tuple[str, str, str, list[tuple[dict[str, str], float]]]] = [
            ("hermes_streams", "gauge", "Open streams by state.", [({"state": k}, float(v)) for k, v in states.items()]),
            ("hermes_stream_frames_ingested_total", "counter", "Frames prefilled into the stream's memory.", rows["frames"]),
            ("hermes_stream_frames_dropped_total", "counter", "Frames a live stream dropped while the engine was behind.", rows["dropped"]),
            ("hermes_stream_lag_seconds", "gauge", "Stream time submitted but not yet in the memory.", rows["lag"]),
            ("hermes_stream_queue_frames", "gauge", "Frames waiting in the engine's queue.", rows["queue"]),
            ("hermes_stream_answers_in_flight", "gauge", "Answers being decoded or waiting.", rows["inflight"]),
            ("hermes_stream_answers_total", "counter", "Answers completed.", rows["answers"]),
            ("hermes_stream_answers_cancelled_total", "counter", "Answers cancelled (client gone, closed).", rows["cancelled"]),
            ("hermes_stream_memory_tokens", "gauge", "Tokens per layer held by the stream's memory.", rows["tokens"]),
            ("hermes_stream_kv_bytes", "gauge", "Bytes of keys and values the stream's memory holds.", rows["kv"]),
            ("hermes_process_resident_memory_bytes", "gauge", "Resident set size of the server process.",
             [({}, float(rss_bytes() or 0))]),
            ("hermes_requests_refused_total", "counter", "Requests answered with an error, by status.",
             [({"code": str(k)}, float(v)) for k, v in sorted(dict(metrics.requests_refused).items())]),
        ]
        return render(families, [
            ("hermes_chunk_prefill_seconds", "Prefill (and compression) time of one chunk.", metrics.chunk_prefill_s),
            ("hermes_answer_ttft_seconds", "Time to an answer's first token.", metrics.answer_ttft_s),
            ("hermes_answer_seconds", "Time from a question to its answer's end.", metrics.answer_s),
        ])

    # -- streams --------------------------------------------------------------------------------
    @api.post("/v1/streams", status_code=201)
    async def open_stream(request: Request):
        body = await read_json(request)
        entry = await run(hub.open, body)
        return JSONResponse(await run(hub.view, entry), status_code=201)

    @api.get("/v1/streams")
    async def list_streams():
        def views() -> list[dict]:
            found = []
            for entry in hub.entries():
                if not entry.oneoff:
                    with contextlib.suppress(Refused):  # closed meanwhile
                        found.append(hub.view(entry))
            return found

        return {"object": "list", "data": await run(views)}

    @api.get("/v1/streams/{sid}")
    async def get_stream(sid: str, memory_map: bool = False):
        return await run(hub.view, hub.get(sid), memory_map=memory_map)

    @api.delete("/v1/streams/{sid}")
    async def delete_stream(sid: str):
        hub.get(sid)
        await run(hub.close, sid)
        return {"id": sid, "object": "stream", "deleted": True}

    @api.post("/v1/streams/{sid}/snapshot")
    async def snapshot(sid: str, request: Request):
        body = await read_json(request)
        return await run(hub.snapshot, hub.get(sid), body.get("name"))

    @api.post("/v1/streams/{sid}/pause")
    async def pause(sid: str):
        entry = hub.get(sid)
        await run(entry.client.pause)
        return await run(hub.view, entry)

    @api.post("/v1/streams/{sid}/resume")
    async def resume(sid: str):
        entry = hub.get(sid)
        await run(entry.client.resume)
        return await run(hub.view, entry)

    @api.get("/v1/streams/{sid}/events")
    async def events(sid: str):
        entry = hub.get(sid)
        q = entry.client.subscribe()
        state, error = entry.client.state, entry.client.error

        def next_event(timeout: float):
            try:
                return q.get(timeout=timeout)
            except queue.Empty:
                return None

        async def stream():
            yield ": hermes events\n\n"
            if state != "live":  # it ended before this client came: say so, and close
                yield sse_event(0, "ended" if state == "ended" else "failed", entry.id,
                                {"error": error} if error else {})
                return
            last, count = time.monotonic(), 0
            while not hub.draining.is_set():
                event = await run(next_event, min(1.0, settings.keepalive_s))
                if event is None:
                    if time.monotonic() - last >= settings.keepalive_s:
                        yield ": keep-alive\n\n"
                        last = time.monotonic()
                    continue
                count += 1
                yield sse_event(count, event.kind, event.stream, event.data, event.wall_s)
                last = time.monotonic()
                if event.kind in END_KINDS:
                    return

        def unsubscribe() -> None:
            with suppress(KeyError):
                entry.client.unsubscribe(q)

        return _Streamed(stream(), unsubscribe)

    # -- answers --------------------------------------------------------------------------------
    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read_json(request)
        req = chat.parse_chat(body, served_model=hub.model, max_tokens=settings.max_tokens,
                              max_question_chars=settings.max_question_chars)
        if req.stream_id is not None:
            entry = hub.get(req.stream_id)
        else:
            entry = await run(open_oneoff, req.video_url)
        try:
            hub.take_answer(entry)
        except Refused:
            if entry.oneoff:
                await run(hub.close, entry.id)
            raise
        try:
            handle = entry.client.ask(req.question, max_new_tokens=req.max_tokens, history=req.history)
        except (StreamFailed, EngineStopped, KeyError) as exc:
            finish_entry(entry)
            raise Refused(409, f"stream {entry.id} cannot answer: {exc}", "conflict_error") from None
        except Refused:  # a cluster's stream that is moving (409) or failing over (503)
            finish_entry(entry)
            raise
        max_new = req.max_tokens or entry.client.config.max_new_tokens
        asked = time.perf_counter()
        closed = threading.Event()

        def finish() -> None:
            """Once, however the reply ends: cancel an unfinished answer (off the event loop)."""
            if closed.is_set():
                return
            closed.set()

            def cleanup() -> None:
                if not handle.finished:
                    handle.close()  # between two tokens; the memory is restored
                finish_entry(entry)

            threading.Thread(target=cleanup, name="hermes-answer-close", daemon=True).start()

        def observe(answer) -> None:
            metrics.answer_s.observe(time.perf_counter() - asked)
            if answer.ttft_ms is not None:
                metrics.answer_ttft_s.observe(answer.ttft_ms / 1000)

        if req.stream:
            async def pieces():
                yield chat.chunk(req, {"role": "assistant", "content": ""})
                while True:
                    try:
                        piece = await run(next, handle, None)
                    except (StreamFailed, EngineStopped) as exc:
                        yield f"data: {json.dumps(error_body(500, str(exc), 'server_error'))}\n\n"
                        return
                    if piece is None:
                        break
                    yield chat.chunk(req, {"content": piece})
                answer = handle.answer
                observe(answer)
                yield chat.chunk(req, {}, chat.finish_reason(answer, max_new), usage=chat.usage(answer),
                                 hermes=chat.extras(answer, getattr(handle, "epoch", 1)))
                yield "data: [DONE]\n\n"

            return _Streamed(pieces(), finish)

        def collect():
            for _ in handle:
                pass
            return handle.answer

        try:
            future = asyncio.get_running_loop().run_in_executor(hub.pool, collect)
            while True:
                done, _ = await asyncio.wait({future}, timeout=0.25)
                if done:
                    break
                if await request.is_disconnected():
                    return Response(status_code=499)  # nobody to answer: finish() cancels it
            try:
                answer = future.result()
            except (StreamFailed, EngineStopped) as exc:
                raise Refused(500, str(exc), "server_error") from None
            observe(answer)
            return chat.completion(req, answer, max_new, getattr(handle, "epoch", 1))
        finally:
            finish()

    def open_oneoff(url: str | None) -> StreamEntry:
        entry = hub.open({"source": url}, oneoff=True)
        entry.reader_done.wait()
        if entry.client.state == "failed":
            why = entry.client.error
            hub.close(entry.id)
            raise Refused(422, f"cannot read the video_url: {why}")
        return entry

    def finish_entry(entry: StreamEntry) -> None:
        hub.release_answer(entry)
        if entry.oneoff:
            with suppress(Refused):
                hub.close(entry.id)

    if settings.api_key:
        api.add_middleware(KeyGuard, api_key=settings.api_key, metrics=metrics)
    if settings.cors:  # outermost: a browser's preflight is answered before the key is asked for
        api.add_middleware(CORSMiddleware, allow_origins=list(settings.cors), allow_methods=["*"],
                           allow_headers=["*"])
    return api


def sse_event(number: int, kind: str, stream: str, data: dict, wall_s: float | None = None) -> str:
    payload: dict[str, Any] = {"event": kind, "stream": stream, **data}  # the kind again: readers that drop event names
    if wall_s is not None:
        payload["wall_s"] = round(wall_s, 3)
    return f"id: {number}\nevent: {kind}\ndata: {json.dumps(payload)}\n\n"
