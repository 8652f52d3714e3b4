"""The web view (docs/web.md): one page at ``/`` and the routes it shares with scripts.

``GET /`` and ``GET /web/{asset}``: the page — HTML, CSS and plain JavaScript shipped in the
package (``serve/web/``), served with a ``Content-Security-Policy`` that allows nothing but this
origin; they hold no data, so they are the only routes besides ``/healthz`` that need no key
(the page asks for the key and sends it on every call). ``GET /v1/streams/{id}/memory``: the
stream's ``MemoryMap`` (per layer: moments and held shares) plus the per-group rows the page
draws — the numbers ``/memory`` shades. ``GET /v1/streams/{id}/frame.jpg``: the latest frame the
reader submitted (404 before any). ``GET /v1/streams/{id}/notifications`` and
``…/notifications/{n}/frame.jpg``: the notifications the stream fired, with the frame of the
moment each fired (kept by the server: a page opened later sees them too).
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

from ..engine.client import EngineStopped, StreamFailed
from .guard import Refused
from .streams import Hub, StreamEntry

__all__ = ["ASSETS", "CSP", "PUBLIC_PATHS", "add_web_routes", "memory_json"]

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-cache"}
ASSETS = {"index.html": "text/html; charset=utf-8", "web.css": "text/css; charset=utf-8",
          "web.js": "text/javascript; charset=utf-8", "icon.svg": "image/svg+xml"}
PUBLIC_PATHS = ("/", *(f"/web/{name}" for name in ASSETS if name != "index.html"))
NO_STORE = {"Cache-Control": "no-store"}


def _asset(name: str) -> bytes:
    return (resources.files("hermes_cli.serve") / "web" / name).read_bytes()


def memory_json(entry: StreamEntry) -> dict:
    """The body of ``GET /v1/streams/{id}/memory`` (``Refused`` 404 once the stream is closed)."""
    try:
        memory = entry.client.memory_map()
    except (KeyError, StreamFailed, EngineStopped) as exc:
        raise Refused(404, f"stream {entry.id} is closed ({exc})", "not_found_error") from None
    return {"object": "stream.memory", "stream": entry.id, **memory.to_json(),
            "end_s": round(memory.units[-1][1], 3) if memory.units else 0.0, "group_rows": memory.group_rows()}


def add_web_routes(api: FastAPI, hub: Hub, run) -> None:
    """Register the page and its routes on ``api`` (``run``: a blocking call on the hub's pool)."""

    @api.get("/")
    async def page():
        return Response(_asset("index.html"), media_type=ASSETS["index.html"], headers=PAGE_HEADERS)

    @api.get("/web/{name}")
    async def asset(name: str):
        if name not in ASSETS or name == "index.html":
            raise Refused(404, f"no page asset {name!r}", "not_found_error")
        return Response(_asset(name), media_type=ASSETS[name], headers=PAGE_HEADERS)

    @api.get("/v1/streams/{sid}/memory")
    async def memory(sid: str):
        return await run(memory_json, hub.get(sid))

    @api.get("/v1/streams/{sid}/frame.jpg")
    async def frame(sid: str):
        entry = hub.get(sid)
        latest = await run(entry.kept.latest_jpeg)
        if latest is None:
            raise Refused(404, f"stream {sid} has no frame yet (its source has not delivered one)", "not_found_error")
        return Response(latest[1], media_type="image/jpeg",
                        headers={**NO_STORE, "X-Hermes-Stream-Time": f"{latest[0]:.3f}"})

    @api.get("/v1/streams/{sid}/notifications")
    async def notifications(sid: str):
        entry = hub.get(sid)
        await run(hub.drain_events, entry)
        data = [{"index": i, **d, "frame": f"/v1/streams/{sid}/notifications/{i}/frame.jpg" if has else None}
                for i, d, has in entry.kept.notifications()]
        return {"object": "list", "data": data}

    @api.get("/v1/streams/{sid}/notifications/{index}/frame.jpg")
    async def notification_frame(sid: str, index: int):
        jpeg = hub.get(sid).kept.notification_jpeg(index)
        if jpeg is None:
            raise Refused(404, f"stream {sid} keeps no frame for notification {index}", "not_found_error")
        return Response(jpeg, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=3600"})
