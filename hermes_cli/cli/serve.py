"""``hermes serve``: one engine behind an HTTP server (docs/serve.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .console import UserError, err, set_debug, set_verbosity
from .groups import (
    AnswerOptions,
    ChatOutputOptions,
    MemoryOptions,
    ModelOptions,
    SourceOptions,
    session_settings,
    with_option_groups,
)


def _folder(option: str, value: str | None) -> Path | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(f"{option} {value}: no such folder")
    return path.resolve()


def cluster_argv(argv: list[str]) -> list[str]:
    """``hermes serve --cluster`` with no ADDRESS (last, or before another option) means a local
    Ray cluster: the option's value becomes ``local`` (the CLI parser has no optional values)."""
    if not argv or argv[0] != "serve":
        return argv
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--cluster" and (i + 1 == len(out) or out[i + 1].startswith("-")):
            out[i] = "--cluster=local"
    return out


@with_option_groups
def serve(
    host: Annotated[str, typer.Option("--host", metavar="ADDRESS", help="Address to listen on (another than loopback needs --api-key).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", metavar="PORT", help="Port to listen on (0: any free one, printed at start).")] = 8000,
    api_key: Annotated[str | None, typer.Option("--api-key", metavar="KEY", envvar="HERMES_API_KEY", show_envvar=True, help="Bearer key every request but /healthz must carry.")] = None,
    media_root: Annotated[str | None, typer.Option("--media-root", metavar="DIR", help="Local videos a request may open: files under DIR only (default: none, URLs only).")] = None,
    memory_root: Annotated[str | None, typer.Option("--memory-root", metavar="DIR", help="Folder of the snapshots requests write and restore by name.")] = None,
    max_streams: Annotated[int, typer.Option("--max-streams", metavar="N", help="Streams open at once (more: 429).")] = 8,
    max_answers_per_stream: Annotated[int, typer.Option("--max-answers-per-stream", metavar="N", help="Answers in flight on one stream (more: 429).")] = 32,
    max_body_bytes: Annotated[int, typer.Option("--max-body-bytes", metavar="BYTES", help="Largest request body (more: 413).")] = 1 << 20,
    max_question_chars: Annotated[int, typer.Option("--max-question-chars", metavar="N", help="Longest question (more: 413).")] = 8000,
    cors: Annotated[list[str] | None, typer.Option("--cors", metavar="ORIGIN", help="Let a browser page from ORIGIN call the server (repeatable; default: no CORS).")] = None,
    save_on_exit: Annotated[str | None, typer.Option("--save-on-exit", metavar="DIR", help="On SIGTERM or Ctrl-C, save each stream's memory to DIR/ID.safetensors.")] = None,
    restore: Annotated[str | None, typer.Option("--restore", metavar="DIR", help="At start, reopen every stream saved in DIR (by --save-on-exit).")] = None,
    autosave_every: Annotated[str, typer.Option("--autosave-every", metavar="TIME", help='How often streams opened with "autosave": true save.')] = "60s",
    keepalive: Annotated[str, typer.Option("--keepalive", metavar="TIME", help="SSE keep-alive comment interval.")] = "15s",
    cluster: Annotated[str | None, typer.Option("--cluster", metavar="[ADDRESS]", help="Serve on a Ray cluster: engines as Ray actors (pip install 'hermes-video[cluster]'); no ADDRESS: start a local one (docs/cluster.md).")] = None,
    engines: Annotated[int, typer.Option("--engines", metavar="N", help="With --cluster: engine actors to start (one per GPU; N on a CPU for testing).")] = 2,
    snapshot_store: Annotated[str | None, typer.Option("--snapshot-store", metavar="DIR", help="With --cluster: the folder every stream autosaves into (failover and moves restore from it; default: a new temporary folder).")] = None,
    model_options: ModelOptions = ModelOptions(),
    memory_options: MemoryOptions = MemoryOptions(),
    answer_options: AnswerOptions = AnswerOptions(),
    source_options: SourceOptions = SourceOptions(),
    output: ChatOutputOptions = ChatOutputOptions(),
) -> None:
    """Serve the model over HTTP: open streams, ask about them with any OpenAI client.

    The model is fixed when the server starts. The memory options are the defaults of every
    stream (a request may set policy, budget, fps, chunk and policy_opt).

    \b
    Examples:
      hermes serve --model tiny --media-root ~/videos
      hermes serve --host 0.0.0.0 --api-key "$(openssl rand -hex 16)" --memory-root ~/memories
      curl -s localhost:8000/v1/streams -d '{"source": "talk.mp4"}'
      hermes serve --cluster --engines 2 --model tiny --media-root ~/videos
    """
    set_debug(output.debug)
    set_verbosity(output.quiet_, output.verbose_)
    from ..app.streaming import parse_time
    from ..serve.guard import check_bind

    api_key = api_key or None
    try:
        check_bind(host, api_key)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    try:
        autosave_s, keepalive_s = parse_time(autosave_every), parse_time(keepalive)
        reconnect = source_options.reconnect
        reconnect_s = None if reconnect is None else parse_time(reconnect)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    settings = session_settings(model_options, memory_options, answer_options)
    settings.check()
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise UserError("hermes serve needs FastAPI and uvicorn: pip install 'hermes-video[serve]'") from None
    from ..serve.settings import ServeSettings

    try:
        serve_settings = ServeSettings(
            session=settings, api_key=api_key, media_root=_folder("--media-root", media_root),
            memory_root=_folder("--memory-root", memory_root), max_streams=max_streams,
            max_answers_per_stream=max_answers_per_stream, max_body_bytes=max_body_bytes,
            max_question_chars=max_question_chars, max_tokens=max(answer_options.max_new_tokens, 1024),
            keepalive_s=keepalive_s, autosave_every_s=autosave_s, reconnect_s=reconnect_s, cors=tuple(cors or ()),
            save_on_exit=_folder("--save-on-exit", save_on_exit), restore=_folder("--restore", restore))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if cluster is not None:
        running, app = _start_cluster(serve_settings, cluster, engines, snapshot_store, autosave_s)
        stop = running.stop
    else:
        from ..serve.app import create_app
        from .factory import build_engine

        engine = build_engine(settings)
        app = create_app(engine, serve_settings)
        stop = engine.stop
    hub = app.state.hub

    class Server(uvicorn.Server):
        """uvicorn, telling the streams to drain as soon as a signal comes (SSE clients let go)."""

        def handle_exit(self, sig, frame) -> None:
            hub.draining.set()
            super().handle_exit(sig, frame)
            # uvicorn raises the signal again once it has shut down; drained, this is a clean exit
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            for server in self.servers:
                for sock in server.sockets:
                    address = sock.getsockname()
                    shown = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
                    err.print(f"hermes serve · {hub.model}{' · cluster' if cluster else ''} · listening on "
                              f"http://{shown}:{address[1]}"
                              f"{'' if api_key else ' (no API key: loopback only)'}", soft_wrap=True, highlight=False)
                    return

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=10, access_log=False)
    try:
        Server(config).run()
    finally:
        stop()
    if serve_settings.save_on_exit is not None:
        err.print(f"saved {len(hub.saved)} stream memories to {serve_settings.save_on_exit}", soft_wrap=True,
                  highlight=False)


def _start_cluster(serve_settings, address: str, engines: int, store: str | None, autosave_s: float):
    """``--cluster``: Ray (started here, or joined at ``address``), the engines, the registry, the gateway app."""
    import tempfile

    if engines < 1:
        raise UserError(f"--engines must be at least 1, got {engines}")
    if serve_settings.save_on_exit is not None or serve_settings.restore is not None:
        raise UserError("--save-on-exit and --restore are for one server; a cluster keeps its memories in "
                        "--snapshot-store")
    folder = _folder("--snapshot-store", store)
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError("hermes serve --cluster needs Ray: pip install 'hermes-video[cluster]'") from None
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="hermes-store-"))
        err.print(f"snapshot store: {folder} (pass --snapshot-store DIR to keep it)", soft_wrap=True, highlight=False)
    from ..cluster.launch import start_cluster

    device = serve_settings.session.model.device or "cpu"
    err.print(f"starting {engines} engine(s) on {'a local Ray cluster' if address == 'local' else address} …",
              soft_wrap=True, highlight=False)
    running = start_cluster(serve_settings, str(folder), engines=engines,
                            address=None if address == "local" else address, autosave_every_s=autosave_s,
                            num_gpus=1 if device.startswith("cuda") else 0)
    return running, running.app()
