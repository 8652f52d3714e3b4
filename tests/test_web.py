"""The web view (issue 24): its routes over a real server on loopback, and the page itself in the
machine's Chromium driven by Playwright (must-show 1 and 3; the screenshots of must-show 2 come
from scripts/web_screenshots.py).

The browser tests need Debian's ``chromium`` (``/usr/bin/chromium``, or ``HERMES_CHROMIUM``):
``.ci/run`` installs it; without it they skip, saying so.
"""

from __future__ import annotations

import io
import os
import re
import time
from pathlib import Path

import httpx2 as httpx
import numpy as np
import pytest

from tests.media import make_video, read_index
from tests.serving import LiveServer

CHROMIUM = os.environ.get("HERMES_CHROMIUM", "/usr/bin/chromium")
KEY = "test-key-3f9a"


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    make_video(root / "clip.mp4", seconds=10, fps=4, size=(96, 64))
    make_video(root / "short.mp4", seconds=4, fps=4, size=(96, 64), scene_change_at=2)
    return root


def start(tiny_qwen, media, memories, **settings):
    from hermes_cli.engine.core import Engine
    from hermes_cli.serve.app import create_app
    from hermes_cli.serve.settings import ServeSettings

    engine = Engine(tiny_qwen).start()
    app = create_app(engine, ServeSettings(media_root=media, memory_root=memories, keepalive_s=0.5, **settings))
    live = LiveServer(app)
    live.hub, live.engine = app.state.hub, engine
    return live


@pytest.fixture(scope="module")
def server(tiny_qwen, media, tmp_path_factory):
    live = start(tiny_qwen, media, tmp_path_factory.mktemp("memories"))
    yield live
    live.stop()
    live.engine.stop()


@pytest.fixture(scope="module")
def keyed(tiny_qwen, media, tmp_path_factory):
    live = start(tiny_qwen, media, tmp_path_factory.mktemp("memories-keyed"), api_key=KEY)
    yield live
    live.stop()
    live.engine.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client
        for view in client.get("/v1/streams").json()["data"]:
            client.delete(f"/v1/streams/{view['id']}")


def open_stream(http, **body) -> str:
    reply = http.post("/v1/streams", json={"fps": 2, "chunk": 4, "budget": 24, **body})
    assert reply.status_code == 201, reply.text
    return reply.json()["id"]


def wait_ended(http, sid, timeout_s=90.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (view := http.get(f"/v1/streams/{sid}").json())["state"] == "live":
        assert time.monotonic() < deadline, f"stream {sid} did not end"
        time.sleep(0.05)
    return view


def cells_of(memory: dict, held: dict[str, float], width: int) -> str:
    """A row of ``/memory`` from the route's data: each cell the time-weighted held share of the
    units it covers (the page draws the same shares, one rectangle per unit)."""
    from hermes_cli.app.live import _shade

    spans = memory["units"]
    end = max(memory["end_s"], 1e-6)
    cells = []
    for c in range(width):
        lo, hi = c * end / width, (c + 1) * end / width
        weight = part = 0.0
        for u, (a, b) in enumerate(spans):
            overlap = min(b, hi) - max(a, lo)
            if overlap > 0:
                weight += overlap
                part += overlap * held.get(str(u), 0.0)
        cells.append(_shade(part / weight if weight else None))
    return "".join(cells)


# -- the routes -------------------------------------------------------------------------------------
def test_memory_route_draws_what_memory_text_draws(http, server):
    from hermes_cli.app.live import memory_timeline

    sid = open_stream(http, source="clip.mp4")
    wait_ended(http, sid)
    memory = http.get(f"/v1/streams/{sid}/memory").json()
    engine_map = server.hub.get(sid).client.memory_map()  # the same memory: the stream has ended
    text = memory_timeline(engine_map, width=40).splitlines()
    assert memory["object"] == "stream.memory" and memory["stream"] == sid
    assert len(memory["units"]) == len(engine_map.units) > 0
    rows = memory["group_rows"]
    groups = [g for g, layers in engine_map.groups.items() if layers]
    assert [r["group"] for r in rows] == groups and len(text) == len(rows) + 2  # axis, one per group, legend
    for row, line in zip(rows, text[1:-1], strict=True):
        cells, label = line[:40], line[40:]
        assert cells == cells_of(memory, row["held"], 40), row["group"]
        assert f"{row['group']} (layers {row['layers'][0]}–{row['layers'][-1]}, " \
               f"{row['units_kept']} of {len(memory['units'])} units)" in label
    budget_shows = any(0 < s < 1 for r in rows for s in r["held"].values()) or \
        any(r["units_kept"] < len(memory["units"]) for r in rows)
    assert budget_shows, "a budget of 24 tokens must have forgotten something"
    for layer, shares in zip(memory["layers"], engine_map.shares, strict=True):  # per layer: the map's own shares
        assert {int(u): s for u, s in layer["held"].items()} == pytest.approx(shares, abs=1e-4)
    assert memory["recent_from_s"] == pytest.approx(engine_map.recent_from_s)
    assert http.get("/v1/streams/nope/memory").status_code == 404


def test_frame_route_is_the_latest_frame_and_404_before_any(http, server):
    from PIL import Image

    sid = open_stream(http, source="clip.mp4")
    view = wait_ended(http, sid)
    reply = http.get(f"/v1/streams/{sid}/frame.jpg")
    assert reply.status_code == 200 and reply.headers["content-type"] == "image/jpeg"
    image = np.asarray(Image.open(io.BytesIO(reply.content)).convert("RGB"))
    assert image.shape == (64, 96, 3)
    t = float(reply.headers["x-hermes-stream-time"])
    assert t == pytest.approx(view["frame_s"]) and t == pytest.approx(9.5)  # fps 2 over a 10 s clip: the last at 9.5 s
    assert read_index(image) == 38  # the source's frame 38 (of 40 at 4 fps) is at 9.5 s
    saved = http.post(f"/v1/streams/{sid}/snapshot", json={"name": "webframe"})
    assert saved.status_code == 200, saved.text
    alone = open_stream(http, memory="webframe")  # a memory alone: no source, no frame
    missing = http.get(f"/v1/streams/{alone}/frame.jpg")
    assert missing.status_code == 404 and "no frame yet" in missing.json()["error"]["message"]


def test_notifications_keep_the_frame_of_their_moment(http, server):
    from PIL import Image

    sid = open_stream(http, source="short.mp4", notify={"conditions": ["the screen turns green"], "threshold": 0})
    wait_ended(http, sid)
    notes = http.get(f"/v1/streams/{sid}/notifications").json()["data"]
    assert len(notes) == 1 and notes[0]["notification"] == "the screen turns green"  # threshold 0: the first probe
    note = notes[0]
    reply = http.get(note["frame"])
    assert reply.status_code == 200
    image = np.asarray(Image.open(io.BytesIO(reply.content)).convert("RGB"))
    # the probe ran after the first chunk (4 frames at 2 fps: 0–1.5 s): its last frame, source frame 6,
    # not the latest one the reader had read by then
    assert note["stream_time_s"] == pytest.approx(1.5) and read_index(image) == 6
    assert http.get(f"/v1/streams/{sid}/notifications/7/frame.jpg").status_code == 404


def test_page_is_self_contained_and_locked_to_its_origin(http):
    page = http.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    sources = [w for part in csp.split(";") for w in part.split()[1:]]
    assert set(sources) <= {"'self'", "'none'"}, csp  # nothing but this origin: no inline, no data:, no blob:
    html = page.text
    linked = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert linked and all(link.startswith("/web/") for link in linked), linked
    for link in linked:
        asset = http.get(link)
        assert asset.status_code == 200 and asset.headers["content-security-policy"] == csp, link
        for url in re.findall(r"\b(?:https?:)?//[\w.-]+", asset.text):
            assert url == "http://www.w3.org", f"{link} names another origin: {url}"  # the SVG namespace, not fetched
    assert "<script>" not in html and not re.search(r"<[^>]*\s(?:style|on[a-z]+)=", html)  # no inline code or style
    assert http.get("/web/../app.py").status_code == 404 and http.get("/web/nothing.js").status_code == 404


def test_with_a_key_the_data_routes_refuse_and_the_page_does_not(keyed):
    with httpx.Client(base_url=keyed.url, timeout=30) as client:
        assert client.get("/").status_code == 200 and client.get("/web/web.js").status_code == 200
        for path in ("/v1/streams", "/v1/streams/s1/memory", "/v1/streams/s1/frame.jpg",
                     "/v1/streams/s1/notifications", "/v1/streams/s1/notifications/0/frame.jpg",
                     "/v1/streams/s1/events"):
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                reply = client.get(path, headers=headers)
                assert reply.status_code == 401, (path, headers)
        assert client.get("/v1/streams", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


# -- the page in a browser ---------------------------------------------------------------------------
def browser_or_skip():
    """Playwright's sync API, or a skip saying what is missing (a failure under .ci/run, which
    sets HERMES_REQUIRE_BROWSER=1 after installing Chromium: CI must not skip these)."""
    missing = None
    if not Path(CHROMIUM).is_file():
        missing = (f"no Chromium at {CHROMIUM}: `apt-get install chromium` (.ci/run installs it) "
                   "or point HERMES_CHROMIUM at one")
    else:
        try:
            from playwright import sync_api
        except ImportError:
            missing = "no Playwright: pip install playwright (the dev extra has it)"
    if missing is not None:
        if os.environ.get("HERMES_REQUIRE_BROWSER"):
            pytest.fail(missing)
        pytest.skip(missing)
    return sync_api


@pytest.fixture(scope="module")
def browser():
    sync_api = browser_or_skip()
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield chromium
        chromium.close()


class Watched:
    """A page with its console errors and every request it made recorded."""

    def __init__(self, browser, origin: str) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        self.page = self.context.new_page()
        self.origin = origin
        self.errors: list[str] = []
        self.requests: list = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r))
        self.failed: list[str] = []
        self.page.on("response", lambda r: self.failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)

    def foreign(self) -> list[str]:
        return [r.url for r in self.requests if not r.url.startswith(self.origin + "/")]

    def close(self) -> None:
        self.context.close()


def shares(page) -> list[list[str]]:
    return page.eval_on_selector_all(
        "#map .map-row[data-kind=group]",
        "rows => rows.map(r => [...r.querySelectorAll('rect[data-share]')].map(c => c.dataset.share))")


@pytest.mark.browser
def test_page_opens_a_stream_draws_its_memory_answers_and_notifies(browser, server, http):
    watched = Watched(browser, server.url)
    page = watched.page
    try:
        page.goto(server.url + "/")
        page.wait_for_selector("#stream-select")
        page.wait_for_selector("#open-panel[open]")  # nothing open yet: the form shows
        page.fill("#source", "clip.mp4")
        page.click("#open-options > summary")
        page.fill("#opt-fps", "2")
        page.fill("#opt-chunk", "4")
        page.fill("#opt-budget", "24")
        page.check("#opt-realtime")
        page.fill("#opt-notify", "a red square appears")
        page.fill("#opt-threshold", "0")
        page.click("#open-btn")
        page.wait_for_function("() => new URL(location.href).searchParams.get('stream')")
        sid = page.evaluate("new URL(location.href).searchParams.get('stream')")
        view = http.get(f"/v1/streams/{sid}").json()
        groups = [g for g, layers in server.hub.get(sid).client.memory_map().groups.items() if layers]

        page.wait_for_selector("#map .map-row[data-kind=group] rect[data-share]")
        first = shares(page)
        assert len(first) == len(groups) > 1  # one row per layer group
        page.wait_for_function(
            "n => document.querySelectorAll('#map .map-row[data-kind=group]')[0]"
            ".querySelectorAll('rect[data-share]').length > n", arg=len(first[0]) + 2, timeout=30000)
        later = shares(page)
        assert later != first and len(later) == len(groups)  # cells change as the stream goes on
        assert page.locator("#frame-time").inner_text().startswith("at ")
        def fetched(suffix: str) -> int:
            return sum(r.url.split("?")[0].endswith(suffix) for r in watched.requests)

        page.click("#pause-btn")  # no chunk, no event: the map is not fetched again
        page.wait_for_function("() => document.getElementById('pause-btn').textContent === 'Resume'")
        assert http.get(f"/v1/streams/{sid}").json()["paused"] is True
        page.wait_for_timeout(600)  # (the page's own clock: Playwright records requests meanwhile)
        maps, views = fetched("/memory"), fetched(f"/streams/{sid}")
        page.wait_for_timeout(2500)
        assert fetched("/memory") == maps and fetched(f"/streams/{sid}") >= views + 2  # the readouts still poll
        page.click("#pause-btn")
        page.wait_for_function("() => document.getElementById('pause-btn').textContent === 'Pause'")
        page.wait_for_function("n => [...performance.getEntriesByType('resource')]"
                               ".filter(e => e.name.includes('/memory')).length > n", arg=maps, timeout=20000)
        page.check("#per-layer")  # per layer on demand
        layers = sum(len(v) for v in server.hub.get(sid).client.memory_map().groups.values())
        assert page.locator("#map .map-row[data-kind=layer]").count() == layers
        page.uncheck("#per-layer")
        assert page.locator("#map .map-row[data-kind=group]").count() == len(groups)
        unlabelled = page.evaluate("""() => [...document.querySelectorAll('input, select, textarea')]
            .filter(e => !e.labels || !e.labels.length).map(e => e.id)""")
        assert unlabelled == [], unlabelled  # every control has its label

        page.wait_for_selector("#notifications .note", timeout=30000)  # threshold 0: the first probe fires
        note = page.locator("#notifications .note").first
        assert "a red square appears" in note.inner_text()
        page.wait_for_function("() => document.querySelector('#notifications canvas').width != 160")  # its frame drawn

        page.evaluate("""() => { window.__lengths = [];
            new MutationObserver(() => { const a = document.querySelector('#conversation .turn:last-child .a');
                if (a) window.__lengths.push(a.textContent.length); })
              .observe(document.getElementById('conversation'), {subtree: true, childList: true, characterData: true}); }""")
        page.fill("#question", "What is happening?")
        page.press("#question", "Enter")
        page.wait_for_function("() => document.querySelector('#conversation .turn .meta').textContent.includes('TTFT')",
                               timeout=60000)
        answer = page.locator("#conversation .turn .a").first.inner_text()
        lengths = page.evaluate("window.__lengths")
        assert answer.strip() and len({n for n in lengths if n > 1}) > 1, lengths  # it came in pieces
        assert page.locator("#conversation .turn .q").first.inner_text() == "What is happening?"
        page.wait_for_function("() => document.getElementById('r-answer').textContent.includes('TTFT')")
        for readout in ("r-tokens", "r-kv", "r-lag", "r-rss"):
            assert page.locator(f"#{readout}").inner_text() != "—", readout

        cancelled = http.get(f"/v1/streams/{sid}").json()["counts"]["answers_cancelled"]
        page.fill("#question", "And now, in a long answer?")
        page.press("#question", "Enter")
        page.wait_for_function("() => !document.getElementById('cancel-btn').disabled")
        page.keyboard.press("Escape")
        page.wait_for_function("() => document.getElementById('cancel-btn').disabled")
        assert page.locator("#conversation .turn:last-child .meta").inner_text() == "cancelled"
        deadline = time.monotonic() + 10
        while http.get(f"/v1/streams/{sid}").json()["counts"]["answers_cancelled"] == cancelled:
            assert time.monotonic() < deadline, "the server did not cancel the answer the page let go"
            time.sleep(0.05)

        page.fill("#save-name", "from-the-page")
        page.click("#save-btn")
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('memory saved to')")
        assert (server.hub.settings.memory_root / "from-the-page.safetensors").is_file()
        page.click("#close-btn")
        page.wait_for_function("() => !new URL(location.href).searchParams.get('stream')")
        assert all(v["id"] != sid for v in http.get("/v1/streams").json()["data"])
        assert view["source"] == "clip.mp4"
        assert watched.errors == [], (watched.errors, watched.failed)
        assert watched.foreign() == [], watched.foreign()
    finally:
        watched.close()


@pytest.mark.browser
def test_page_asks_for_the_key_once_and_every_call_carries_it(browser, keyed):
    with httpx.Client(base_url=keyed.url, timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as client:
        reply = client.post("/v1/streams", json={"source": "short.mp4", "fps": 2, "chunk": 4, "budget": 24})
        sid = reply.json()["id"]
    watched = Watched(browser, keyed.url)
    page = watched.page
    try:
        page.goto(f"{keyed.url}/?stream={sid}")
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#key-input", KEY)
        page.press("#key-input", "Enter")
        page.wait_for_selector("#map .map-row[data-kind=group]", timeout=30000)
        assert page.evaluate("sessionStorage.getItem('hermes.apiKey')") == KEY
        page.reload()  # kept in the tab's session storage: not asked again
        page.wait_for_selector("#map .map-row[data-kind=group]", timeout=30000)
        assert not page.locator("#key-dialog").evaluate("d => d.open")
        page.fill("#question", "What is it?")
        page.press("#question", "Enter")
        page.wait_for_function("() => document.querySelector('#conversation .turn .meta').textContent.includes('TTFT')",
                               timeout=60000)
        calls = [r for r in watched.requests if "/v1/" in r.url]
        paths = {r.url.split(keyed.url)[1].split("?")[0] for r in calls}
        for wanted in ("/v1/streams", f"/v1/streams/{sid}", f"/v1/streams/{sid}/memory", f"/v1/streams/{sid}/events",
                       f"/v1/streams/{sid}/frame.jpg", "/v1/chat/completions"):
            assert wanted in paths, (wanted, paths)
        first_asked = next(i for i, r in enumerate(calls) if r.headers.get("authorization"))
        assert first_asked == 1  # the one call before the key: the first, refused, that made the page ask
        for r in calls[1:]:
            assert r.headers.get("authorization") == f"Bearer {KEY}", r.url
        assert watched.foreign() == []
        page.evaluate("sessionStorage.clear()")
    finally:
        watched.close()


# -- hermes watch SOURCE --web [PORT] ------------------------------------------------------------------
def test_web_without_a_port_means_any_free_port():
    from hermes_cli.cli.web import optional_port

    assert optional_port(["watch", "a.mp4", "--web"]) == ["watch", "a.mp4", "--web=0"]
    assert optional_port(["watch", "--web", "a.mp4"]) == ["watch", "--web=0", "a.mp4"]
    assert optional_port(["watch", "a.mp4", "--web", "8123"]) == ["watch", "a.mp4", "--web", "8123"]
    assert optional_port(["watch", "--", "--web"]) == ["watch", "--", "--web"]  # after --: a file named --web
    assert optional_port(["serve", "--web"]) == ["serve", "--web"]  # only watch has --web


@pytest.mark.slow
def test_watch_web_prints_the_address_of_the_page_on_its_stream(media, tmp_path):
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen([sys.executable, "-m", "hermes_cli", "watch", str(media / "short.mp4"), "--model", "tiny",
                                "--fps", "2", "--chunk", "4", "--web"], cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                               text=True)
    try:
        line = ""
        for line in process.stderr:
            if "web view" in line:
                break
        found = re.search(r"(http://127\.0\.0\.1:\d+)/\?stream=(\S+)", line)
        assert found, line
        url, sid = found.groups()
        with httpx.Client(base_url=url, timeout=30) as client:
            assert "Content-Security-Policy" in client.get("/").headers
            assert client.get(f"/v1/streams/{sid}").json()["source"] == "short.mp4"  # by its name in the page
            deadline = time.monotonic() + 60
            while client.get(f"/v1/streams/{sid}").json()["state"] == "live":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            memory = client.get(f"/v1/streams/{sid}/memory").json()
            assert memory["end_s"] == pytest.approx(4.0) and memory["group_rows"]
            assert client.get(f"/v1/streams/{sid}/frame.jpg").status_code == 200
            saved = client.post(f"/v1/streams/{sid}/snapshot", json={"name": "kept"}).json()
            assert Path(saved["path"]) == tmp_path / "kept.safetensors"  # memories go to the current folder
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_watch_web_refuses_what_the_page_does_instead(media):
    from typer.testing import CliRunner

    from hermes_cli.cli.console import UserError
    from hermes_cli.cli.main import app

    clip = str(media / "short.mp4")
    for extra, said in ((["--ask", "What?"], "--web asks in the page"),
                        (["--save-memory", str(media / "m.safetensors")], "--web does not take --save-memory"),
                        (["--notify", "a dog", "--on-notify", "true"], "--web does not take --on-notify")):
        result = CliRunner().invoke(app, ["watch", clip, "--model", "tiny", "--web=0", *extra])
        assert isinstance(result.exception, UserError) and said in str(result.exception), (extra, result.output)
    result = CliRunner().invoke(app, ["watch", str(media / "absent.mp4"), "--model", "tiny", "--web=0"])
    assert isinstance(result.exception, UserError) and "no video file" in str(result.exception)
