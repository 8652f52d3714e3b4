"""What the server lets in: the bind address, the API key, sources and memory names.

Every refusal is a ``Refused`` with an HTTP status and one line saying what to do. Nothing here
opens a file: a source or a memory name is checked on its text and its resolved path before
anything reads it.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import urllib.parse
from pathlib import Path

from ..errors import HermesError

__all__ = ["ALLOWED_SCHEMES", "Refused", "check_bind", "check_key", "check_name", "check_source", "is_loopback"]

# Network sources a request may name; everything else (file:, concat:, pipe:, data: …) is refused.
ALLOWED_SCHEMES = ("http", "https", "rtsp", "rtmp", "srt", "tcp", "udp")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Refused(HermesError):
    """A request the server will not serve: ``status`` and a one-line ``message``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(" ".join(message.split()))
        self.status, self.kind, self.headers = status, kind, headers  # headers: e.g. Retry-After on a 503

    @property
    def message(self) -> str:
        return str(self)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse (ValueError, one line) to listen beyond this machine without an API key."""
    if not is_loopback(host) and not api_key:
        raise ValueError(f"--host {host} would let anyone who can reach this machine use the model and read "
                         "what it streams: pass --api-key KEY (or set HERMES_API_KEY), or bind 127.0.0.1")


def check_key(header: str | None, api_key: str) -> bool:
    """Whether an ``Authorization`` header carries the bearer ``api_key`` (constant-time compare)."""
    scheme, _, token = (header or "").partition(" ")
    given = token.strip().encode() if scheme.lower() == "bearer" else b""
    return hmac.compare_digest(given, api_key.encode())


def check_name(name: object, what: str = "memory") -> str:
    """A stream or memory name: letters, digits, ``_ . -`` (no path, no ``..``)."""
    if not isinstance(name, str) or not NAME.match(name) or ".." in name:
        raise Refused(422, f"{what} must be a plain name (letters, digits, _ . -; up to 64), got {name!r}")
    return name


def check_source(spec: object, media_root: Path | None) -> tuple[str, bool]:
    """(what to open, is a URL) for a request's ``source``, or ``Refused`` (nothing is opened).

    URLs: only the allow-listed schemes. Local files: only under ``media_root`` — the path is
    resolved (symlinks followed) and must stay inside; ``..`` is refused outright; a relative
    path is taken from ``media_root``; no ``media_root``, no local files.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise Refused(422, "source must be a video file under --media-root or a URL "
                      f"({', '.join(ALLOWED_SCHEMES)}), got {spec!r}")
    if "\x00" in spec:
        raise Refused(422, "source contains a NUL byte")
    scheme = urllib.parse.urlsplit(spec).scheme.lower()
    if len(scheme) > 1 or "://" in spec:  # one letter: a Windows drive, i.e. a path
        if scheme not in ALLOWED_SCHEMES:
            raise Refused(422, f"source scheme {scheme or spec.split(':', 1)[0]!r} is not allowed: use one of "
                          f"{', '.join(ALLOWED_SCHEMES)}, or a file under --media-root by its path")
        return spec, True
    if media_root is None:
        raise Refused(403, "this server opens no local files: start it with --media-root DIR to serve the videos "
                      "in DIR, or give a URL", "permission_error")
    path = Path(spec)
    if ".." in path.parts:
        raise Refused(403, f"source {spec!r} climbs out with '..': name a file under the media root",
                      "permission_error")
    root = media_root.resolve()
    resolved = (path if path.is_absolute() else root / path).resolve()
    if not resolved.is_relative_to(root):
        raise Refused(403, f"source {spec!r} is outside the media root (a path or symlink leading out of it)",
                      "permission_error")
    if not resolved.is_file():
        raise Refused(404, f"no video {spec!r} under the media root", "not_found_error")
    return str(resolved), False
