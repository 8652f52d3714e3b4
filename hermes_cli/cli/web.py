"""``hermes watch SOURCE --web [PORT]``: the stream in the browser (docs/web.md).

The serve app on loopback with one stream open on SOURCE: a local file's folder is the media
root (the page may open the other videos in it), memories are saved in the current folder, no
API key (loopback only). ``--web`` alone takes any free port; the address is printed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .console import UserError, err

__all__ = ["optional_port", "run_web"]


def optional_port(argv: list[str]) -> list[str]:
    """``--web`` with no number after it means ``--web=0`` (any free port): typer has no options
    with an optional value, so ``main`` rewrites the command line first."""
    if not argv or argv[0] != "watch":
        return argv
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--":
            break
        if arg == "--web" and (i + 1 == len(out) or not out[i + 1].isdigit()):
            out[i] = "--web=0"
    return out


def run_web(source: str, settings, notify_options, *, port: int, realtime: bool, reconnect_s: float | None) -> None:
    """Serve the page and one stream on ``source`` at http://127.0.0.1:PORT until Ctrl-C."""
    if not 0 <= port <= 65535:
        raise UserError(f"--web {port}: a port is a number from 0 to 65535 (0 or no number: any free port)")
    try:
        import uvicorn

        from ..serve.app import create_app
    except ImportError:
        raise UserError("hermes watch --web needs FastAPI and uvicorn: pip install 'hermes-video[serve]'") from None
    from ..serve.guard import Refused
    from ..serve.settings import ServeSettings
    from .factory import build_engine

    media_root, target = None, source
    if "://" not in source:
        path = Path(source).expanduser()
        if not path.is_file():
            raise UserError(f"no video file {source} (give a file, or a URL such as rtsp://…)")
        media_root, target = path.resolve().parent, path.name  # the page lists it by its name
    body: dict = {"source": target, "realtime": realtime}
    conditions = notify_options.conditions()
    if conditions:
        knobs = {k: v for k, v in dataclasses.asdict(notify_options.settings()).items() if v is not None}
        body["notify"] = {"conditions": conditions, **knobs}
    engine = build_engine(settings)
    try:
        app = create_app(engine, ServeSettings(session=settings, media_root=media_root, memory_root=Path.cwd(),
                                               reconnect_s=reconnect_s))
        hub = app.state.hub
        try:
            sid = hub.open(body).id
        except Refused as exc:
            raise UserError(str(exc)) from None

        class Server(uvicorn.Server):
            """uvicorn, printing the page's address; Ctrl-C is how this view stops: a clean exit."""

            def handle_exit(self, sig, frame) -> None:
                hub.draining.set()  # event streams let go at once
                super().handle_exit(sig, frame)
                captured = getattr(self, "_captured_signals", None)  # uvicorn would raise it again
                if isinstance(captured, list):
                    captured.clear()

            async def startup(self, sockets=None) -> None:
                await super().startup(sockets)
                for server in self.servers:
                    for sock in server.sockets:
                        err.print(f"hermes watch · {engine.adapter.name} · the web view of {source} is at "
                                  f"http://127.0.0.1:{sock.getsockname()[1]}/?stream={sid} (Ctrl-C stops)",
                                  soft_wrap=True, highlight=False)
                        return

        Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
                              timeout_graceful_shutdown=5, access_log=False)).run()
    finally:
        engine.stop()
