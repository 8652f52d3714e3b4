"""A model hub on loopback for tests: the few routes ``huggingface_hub`` downloads through.

``serve_hub({"org/name": {"config.json": b"…", …}})`` starts a real HTTP server on 127.0.0.1 and
returns it; point ``HF_ENDPOINT`` at ``hub.url``. Routes: the repo's revision info and file tree
(``/api/models/REPO[/revision/REV]``, ``/api/models/REPO/tree/REV``), each file's metadata and
bytes (``HEAD``/``GET /REPO/resolve/REV/FILE``, with ``Range`` for resumed downloads), and any
other path a 404 (the reachability probe only needs an answer). ``drop_once`` names files whose
first download is cut off halfway (the connection closes), to test resuming; ``ranges`` records
every ``Range`` header received.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    repos: dict[str, dict[str, bytes]]
    drop_once: set[str] = field(default_factory=set)
    ranges: list[tuple[str, str]] = field(default_factory=list)
    gets: list[str] = field(default_factory=list)
    server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def serve_hub(repos: dict[str, dict[str, bytes]], drop_once: set[str] | None = None) -> FakeHub:
    hub = FakeHub(repos, set(drop_once or ()))
    revision = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$")
    tree = re.compile(r"^/api/models/(.+?)/tree/([^/]+)(/.*)?$")
    resolve = re.compile(r"^/(.+?)/resolve/([^/]+)/(.+)$")

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _json(self, data) -> None:
            body = json.dumps(data).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _missing(self) -> None:
            body = b'{"error": "Repository not found"}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _file(self, head: bool) -> bool:
            m = resolve.match(unquote(urlparse(self.path).path))
            if not m or m.group(1) not in hub.repos or m.group(3) not in hub.repos[m.group(1)]:
                return False
            name, data = m.group(3), hub.repos[m.group(1)][m.group(3)]
            start = 0
            if (wanted := self.headers.get("Range")) and not head:
                hub.ranges.append((name, wanted))
                start = int(re.match(r"bytes=(\d+)-", wanted).group(1))
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{_etag(data)}"')
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if head:
                return True
            hub.gets.append(name)
            if name in hub.drop_once:  # half the bytes, then the connection drops
                hub.drop_once.discard(name)
                self.wfile.write(data[start:start + (len(data) - start) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return True
            self.wfile.write(data[start:])
            return True

        def do_HEAD(self) -> None:
            if not self._file(head=True):
                self._missing()

        def do_GET(self) -> None:
            path = unquote(urlparse(self.path).path)
            if (m := revision.match(path)) and m.group(1) in hub.repos:
                files = hub.repos[m.group(1)]
                self._json({"id": m.group(1), "modelId": m.group(1), "sha": COMMIT, "private": False,
                            "siblings": [{"rfilename": f} for f in files]})
            elif (m := tree.match(path)) and m.group(1) in hub.repos:
                files = hub.repos[m.group(1)]
                self._json([{"type": "file", "path": f, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                            for f, d in files.items()])
            elif not self._file(head=False):
                self._missing()

    hub.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hub.server.daemon_threads = True
    threading.Thread(target=hub.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return hub
