"""``hermes serve``: the engine over HTTP — many streams, OpenAI-compatible answers (docs/serve.md).

``create_app(engine, settings)`` is the FastAPI application of one in-process engine; ``guard``
decides what a request may open; ``streams.Hub`` owns the server's streams and their source
readers; ``chat`` reads and writes OpenAI chat completions; ``client`` is the HTTP client the
interactive prompt uses (``hermes chat --server``).
"""

from __future__ import annotations

__all__ = ["ServeSettings", "create_app"]


def __getattr__(name: str):  # FastAPI is imported only when the server is built
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "ServeSettings":
        from .settings import ServeSettings

        return ServeSettings
    raise AttributeError(name)
