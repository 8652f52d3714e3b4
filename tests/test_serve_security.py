"""``hermes serve`` is safe by default (issue 22, must-show 4): the bind, the key, what a request
may open, and the bounds — against a real server on loopback with an API key."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time

import httpx2 as httpx
import pytest

from tests.media import make_video
from tests.serving import LiveServer

openai = pytest.importorskip("openai")

KEY = "s3cret-key-for-tests"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    """A media root with a clip and a symlink out of it; outside it, a FIFO posing as a video:
    opening it for reading would block, and a writer can tell whether anyone has it open."""
    base = tmp_path_factory.mktemp("guard")
    root, outside = base / "media", base / "outside"
    root.mkdir()
    outside.mkdir()
    make_video(root / "clip.mp4", seconds=2, fps=4, size=(96, 64))
    fifo = outside / "secret.mp4"
    os.mkfifo(fifo)
    (root / "link.mp4").symlink_to(fifo)
    (root / "dir-link").symlink_to(outside, target_is_directory=True)
    return root, fifo


@pytest.fixture(scope="module")
def server(tiny_qwen, places):
    from hermes_cli.engine.core import Engine
    from hermes_cli.serve.app import create_app
    from hermes_cli.serve.settings import ServeSettings

    engine = Engine(tiny_qwen).start()
    app = create_app(engine, ServeSettings(api_key=KEY, media_root=places[0], max_streams=2,
                                           max_answers_per_stream=1, max_body_bytes=4096, max_question_chars=200))
    with LiveServer(app) as live:
        live.engine = engine
        yield live
    engine.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30, headers=AUTH) as client:
        yield client
        for view in client.get("/v1/streams").json()["data"]:
            client.delete(f"/v1/streams/{view['id']}")


def one_line_error(reply, status: int) -> str:
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]["message"]
    assert message and "\n" not in message
    return message


ROUTES = [("GET", "/v1/streams"), ("POST", "/v1/streams"), ("GET", "/v1/streams/s1"), ("DELETE", "/v1/streams/s1"),
          ("GET", "/v1/streams/s1/events"), ("POST", "/v1/streams/s1/snapshot"), ("POST", "/v1/streams/s1/pause"),
          ("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/metrics"), ("GET", "/no/such/route")]


def test_binding_beyond_loopback_without_a_key_is_refused_at_start(tmp_path):
    from hermes_cli.serve.guard import check_bind

    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        check_bind(host, None)
    for host in ("0.0.0.0", "::", "192.168.1.10", "my-host.example"):
        with pytest.raises(ValueError, match="--api-key"):
            check_bind(host, None)
        check_bind(host, "a-key")
    env = {k: v for k, v in os.environ.items() if k != "HERMES_API_KEY"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hermes_cli", "serve", "--host", "0.0.0.0", "--model", "tiny"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--api-key" in lines[0] and "0.0.0.0" in lines[0]
    assert time.monotonic() - started < 60  # refused before any model is loaded


def test_a_missing_or_wrong_key_gets_401_on_every_route_but_healthz(server):
    with httpx.Client(base_url=server.url, timeout=10) as bare:
        assert bare.get("/healthz").status_code == 200
        for method, path in ROUTES:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                            {"Authorization": f"Basic {KEY}"}):
                reply = bare.request(method, path, headers=headers)
                assert reply.status_code == 401, (method, path, headers)
                assert reply.headers["www-authenticate"] == "Bearer"
        assert bare.get("/v1/models", headers=AUTH).status_code == 200
    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        sdk.models.list()
    assert openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0).models.list().data[0].id == "tiny"


def test_sources_outside_the_media_root_are_refused_with_no_file_opened(http, places):
    root, fifo = places
    bad = ["../outside/secret.mp4", "dir-link/../clip.mp4", str(fifo), "link.mp4", "dir-link/secret.mp4",
           f"file://{fifo}", "file:clip.mp4", "concat:clip.mp4|clip.mp4", "pipe:0", "data:video/mp4;base64,AAAA",
           "/etc/passwd", "missing.mp4"]
    for source in bad:
        reply = http.post("/v1/streams", json={"source": source})
        assert reply.status_code in (403, 404, 422), (source, reply.text)
        one_line_error(reply, reply.status_code)
    # a video_url part goes through the same guard
    reply = http.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": str(fifo)}}, {"type": "text", "text": "?"}]}]})
    assert reply.status_code == 403
    with pytest.raises(OSError) as nobody:  # no reader ever opened the FIFO
        os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    assert nobody.value.errno == errno.ENXIO
    assert http.get("/v1/streams").json()["data"] == []
    # inside the root, by a relative or an absolute path, is fine
    for source in ("clip.mp4", str(root / "clip.mp4")):
        assert http.post("/v1/streams", json={"source": source}).status_code == 201


def test_an_oversized_body_gets_413_a_long_question_too(http):
    big = {"source": "clip.mp4", "policy_opt": {"x": "y" * 5000}}
    one_line_error(http.post("/v1/streams", json=big), 413)

    def chunked():  # no Content-Length: counted as it arrives
        yield b'{"source": "'
        for _ in range(10):
            yield b"a" * 1000
        yield b'"}'

    one_line_error(http.post("/v1/streams", content=chunked()), 413)
    sid = http.post("/v1/streams", json={"source": "clip.mp4"}).json()["id"]
    long_question = {"model": f"hermes:stream/{sid}", "messages": [{"role": "user", "content": "why " * 60}]}
    assert "at most 200" in one_line_error(http.post("/v1/chat/completions", json=long_question), 413)


def test_one_stream_too_many_gets_429(http):
    for _ in range(2):
        assert http.post("/v1/streams", json={"source": "clip.mp4"}).status_code == 201
    assert "--max-streams" in one_line_error(http.post("/v1/streams", json={"source": "clip.mp4"}), 429)


def test_too_many_answers_at_once_on_one_stream_get_429(http, server):
    sid = http.post("/v1/streams", json={"source": "clip.mp4", "fps": 2, "chunk": 2}).json()["id"]
    body = {"model": f"hermes:stream/{sid}", "messages": [{"role": "user", "content": "Tell me all."}],
            "max_tokens": 1000, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=30) as first:
        assert first.status_code == 200
        next(first.iter_lines())
        second = http.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 2})
        one_line_error(second, 429)
    deadline = time.monotonic() + 10
    while http.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 2}).status_code == 429:
        assert time.monotonic() < deadline  # the first one's slot comes back once it is cancelled
        time.sleep(0.05)


def test_malformed_json_and_bad_fields_get_a_one_line_422(http):
    for content in (b"{not json", b'{"source": "clip.mp4",}', b"[1, 2]", b"\xff\xfe"):
        one_line_error(http.post("/v1/streams", content=content, headers={"Content-Type": "application/json"}), 422)
    for body, words in (({"source": "clip.mp4", "budget": "big"}, "budget"), ({"source": "clip.mp4", "fps": -1}, "fps"),
                        ({"source": "clip.mp4", "policy": "nope"}, "nope"), ({"source": "clip.mp4", "colour": 1}, "colour"),
                        ({"source": "clip.mp4", "chunk": 3}, "chunk"), ({"source": "clip.mp4", "realtime": "yes"}, "realtime"),
                        ({"source": 7}, "source"), ({}, "source")):
        assert words in one_line_error(http.post("/v1/streams", json=body), 422)
    for body in ({"model": "tiny"}, {"model": "hermes:stream/s9", "messages": "hi"},
                 {"model": "tiny", "messages": [{"role": "user", "content": "no video"}]},
                 {"model": "hermes:stream/s9", "messages": [{"role": "assistant", "content": "hi"}]},
                 {"model": "hermes:stream/s9", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}):
        one_line_error(http.post("/v1/chat/completions", json=body), 422)


def test_no_request_can_load_another_model(http):
    body = {"model": "Qwen/Qwen2.5-VL-7B-Instruct", "messages": [{"role": "user", "content": "hi"}]}
    assert "fixed" in one_line_error(http.post("/v1/chat/completions", json=body), 404)
    assert one_line_error(http.post("/v1/streams", json={"source": "clip.mp4", "model": "other"}), 422)


def test_cors_is_off_unless_an_origin_is_given(server, tiny_qwen, places):
    preflight = {"Origin": "https://page.example", "Access-Control-Request-Method": "POST"}
    reply = httpx.options(f"{server.url}/v1/streams", headers=preflight)
    assert "access-control-allow-origin" not in reply.headers
    from hermes_cli.serve.app import create_app
    from hermes_cli.serve.settings import ServeSettings

    app = create_app(server.engine, ServeSettings(api_key=KEY, cors=("https://page.example",)))
    with LiveServer(app) as other:
        reply = httpx.options(f"{other.url}/v1/streams", headers=preflight)
        assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == "https://page.example"
        assert httpx.get(f"{other.url}/v1/models", headers={"Origin": "https://page.example"}).status_code == 401
        elsewhere = httpx.options(f"{other.url}/v1/streams", headers={**preflight, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in elsewhere.headers


def test_requests_at_once_do_not_block_each_other(http, server):
    """A slow answer holds no lock the other routes need."""
    sid = http.post("/v1/streams", json={"source": "clip.mp4"}).json()["id"]
    body = {"model": f"hermes:stream/{sid}", "messages": [{"role": "user", "content": "Go on."}],
            "max_tokens": 1000, "stream": True}
    results = []

    def others():
        results.append(http.get("/v1/streams").status_code)
        results.append(http.get("/metrics").status_code)

    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=AUTH, timeout=30) as reply:
        next(reply.iter_lines())
        t = threading.Thread(target=others)
        t.start()
        t.join(10)
    assert results == [200, 200]
