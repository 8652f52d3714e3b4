"""Better words for errors on video URLs, where the cause is the server rather than the file."""

from __future__ import annotations

import urllib.error
import urllib.request

DAMAGED = "empty or damaged"


def supports_ranges(url: str, timeout_s: float = 3.0) -> bool | None:
    """Whether an http(s) server answers a byte-range request with 206 (None: no answer)."""
    request = urllib.request.Request(url, headers={"Range": "bytes=0-0"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status == 206
    except urllib.error.HTTPError as exc:
        return exc.code == 206
    except (urllib.error.URLError, OSError, ValueError):
        return None


def explain_source_error(spec: str | None, message: str) -> str:
    """``message``, or, for a URL said to be empty or damaged while its server cannot seek, the real cause."""
    if not spec or not spec.lower().startswith(("http://", "https://")) or DAMAGED not in message:
        return message
    if supports_ranges(spec) is not False:
        return message
    return (f"cannot read {spec.split('?')[0]}: the server does not support HTTP range requests, and this "
            "file keeps its index at the end (an .mp4/.mov without 'faststart'), which needs seeking — download "
            "it first and watch the file, or serve it from a server that supports ranges")
