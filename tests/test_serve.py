"""``hermes serve`` over a real uvicorn server on loopback, driven by the real ``openai`` SDK and
plain HTTP (issue 22, must-show 1, 2 and the mid-answer disconnect of 5).

One server (tiny model, one engine) serves the whole module; each test opens its own streams on
generated videos under the server's media root.
"""

from __future__ import annotations

import json
import threading
import time

import httpx2 as httpx
import pytest
import torch

from tests.media import make_video
from tests.serving import LiveServer

openai = pytest.importorskip("openai")

QUESTION = [{"role": "user", "content": "What is happening in the video?"}]


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    make_video(root / "short.mp4", seconds=4, fps=4, size=(96, 64))
    for i, colors in enumerate((("red", "blue"), ("green", "yellow"), ("magenta", "cyan"), ("blue", "red"))):
        make_video(root / f"cam{i}.mp4", seconds=6, fps=4, size=(96, 64), colors=colors, scene_change_at=3)
    return root


@pytest.fixture(scope="module")
def server(tiny_qwen, media, tmp_path_factory):
    from hermes_cli.engine.core import Engine
    from hermes_cli.serve.app import create_app
    from hermes_cli.serve.settings import ServeSettings

    engine = Engine(tiny_qwen).start()
    app = create_app(engine, ServeSettings(media_root=media, memory_root=tmp_path_factory.mktemp("memories"),
                                           max_streams=8, keepalive_s=0.5))
    with LiveServer(app) as live:
        live.hub = app.state.hub
        yield live
    engine.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed-on-loopback", max_retries=0)


@pytest.fixture(autouse=True)
def close_streams(http):
    """Each test's streams are deleted after it (the server holds at most eight)."""
    yield
    for view in http.get("/v1/streams").json()["data"]:
        http.delete(f"/v1/streams/{view['id']}")


def open_stream(http, **body) -> str:
    reply = http.post("/v1/streams", json={"fps": 2, "chunk": 4, "budget": 24, **body})
    assert reply.status_code == 201, reply.text
    return reply.json()["id"]


def wait_state(http, sid, state="ended", timeout_s=60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (view := http.get(f"/v1/streams/{sid}").json())["state"] != state:
        assert time.monotonic() < deadline, f"stream {sid} stayed {view['state']}"
        time.sleep(0.05)
    return view


def memory(hub, sid):
    """The stream's memory as tensors (read on the engine thread)."""
    entry = hub.get(sid)
    return entry.client.engine.call(sid, lambda s: [(l.stored_keys().clone(), l.stored_values().clone(),
                                                     l.meta.token_id.clone(), l.meta.positions.clone())
                                                    for l in s.cache.stream_layers])


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for la, lb in zip(a, b) for x, y in zip(la, lb))


def sse_events(response):
    """(event, data) pairs of an SSE response, comments included as ('comment', text)."""
    kind, data = "message", []
    for line in response.iter_lines():
        if line.startswith(":"):
            yield "comment", line[1:].strip()
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            yield kind, json.loads("\n".join(data))
            kind, data = "message", []


# -- must-show 1 -----------------------------------------------------------------------------------
def test_openai_sdk_streams_the_answer_and_the_plain_reply_has_the_same_text(http, sdk):
    sid = open_stream(http, source="short.mp4")
    wait_state(http, sid)
    model = f"hermes:stream/{sid}"
    chunks = list(sdk.chat.completions.create(model=model, messages=QUESTION, max_tokens=12, stream=True))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1  # the answer arrives in pieces, not at once
    last = chunks[-1]
    assert last.object == "chat.completion.chunk" and last.choices[0].finish_reason in ("stop", "length")
    assert last.usage is not None and last.usage.completion_tokens >= len(pieces)

    reply = sdk.chat.completions.create(model=model, messages=QUESTION, max_tokens=12)
    assert reply.choices[0].message.content == "".join(pieces)
    assert reply.usage.completion_tokens == last.usage.completion_tokens
    assert reply.usage.prompt_tokens == last.usage.prompt_tokens > 0
    assert reply.model == model

    ids = [m.id for m in sdk.models.list()]
    assert "tiny" in ids and model in ids


def test_earlier_messages_are_the_answers_history_and_leave_the_streams_own_alone(http, sdk, server):
    sid = open_stream(http, source="short.mp4")
    wait_state(http, sid)
    model = f"hermes:stream/{sid}"
    alone = sdk.chat.completions.create(model=model, messages=QUESTION, max_tokens=4)
    turns = [{"role": "system", "content": "ignored: the memory has its own"},
             {"role": "user", "content": "What colour is the first frame?"},
             {"role": "assistant", "content": "Red, with a band of blue."}, *QUESTION]
    with_history = sdk.chat.completions.create(model=model, messages=turns, max_tokens=4)
    assert with_history.usage.prompt_tokens > alone.usage.prompt_tokens  # the earlier turn is in the prompt
    assert server.hub.get(sid).client.history() == []  # a request's conversation is its own


def test_a_video_url_part_answers_about_that_video_in_one_request(sdk, server):
    before = len(server.hub.entries())
    reply = sdk.chat.completions.create(model="tiny", max_tokens=6, messages=[{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "short.mp4"}}, {"type": "text", "text": "What happens?"}]}])
    assert reply.choices[0].message.content and reply.model_extra["hermes"]["frames_seen"] == 4  # 4 s at the default 1 fps
    deadline = time.monotonic() + 10
    while len(server.hub.entries()) != before:  # the one-off stream is gone
        assert time.monotonic() < deadline
        time.sleep(0.05)


# -- must-show 2 -----------------------------------------------------------------------------------
def test_four_streams_at_once_answer_every_question_within_budget_with_their_events(http, sdk, server):
    budget = 24
    ids: list[str] = [""] * 4

    def opener(i):  # four POSTs at the same time
        ids[i] = open_stream(http, source=f"cam{i}.mp4", realtime=True, budget=budget)

    threads = [threading.Thread(target=opener, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(set(ids)) == 4

    events: dict[str, list] = {sid: [] for sid in ids}

    def listen(sid):
        with httpx.stream("GET", f"{server.url}/v1/streams/{sid}/events", timeout=60) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            for kind, data in sse_events(response):
                events[sid].append((kind, data))
                if kind in ("ended", "failed"):
                    return

    listeners = [threading.Thread(target=listen, args=(sid,)) for sid in ids]
    for t in listeners:
        t.start()

    answers: list[tuple[str, str, str | None]] = []
    lock = threading.Lock()

    def ask(sid, k):
        reply = sdk.chat.completions.create(model=f"hermes:stream/{sid}", max_tokens=6, stream=k % 2 == 0,
                                            messages=[{"role": "user", "content": f"Question {k}: what now?"}])
        if k % 2 == 0:
            text, finish = "", None
            for c in reply:
                if c.choices:
                    text += c.choices[0].delta.content or ""
                    finish = c.choices[0].finish_reason or finish
        else:
            text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
        with lock:
            answers.append((sid, text, finish))

    time.sleep(1.0)  # mid-stream: the videos play at real time for 6 s
    askers = [threading.Thread(target=ask, args=(sid, k)) for sid in ids for k in range(3)]
    for t in askers:
        t.start()
    for t in askers:
        t.join(120)
    assert len(answers) == 12 and all(text and finish in ("stop", "length") for _, text, finish in answers)
    assert sorted(sid for sid, _, _ in answers) == sorted(ids * 3)

    for t in listeners:
        t.join(60)
    for sid in ids:
        view = wait_state(http, sid)
        assert view["frames_seen"] == 12  # 6 s at 2 fps
        assert max(view["cache"]["stream_tokens_per_layer"]) <= budget
        assert view["cache"]["compressions"] >= 1
        kinds = [k for k, _ in events[sid] if k != "comment"]
        assert kinds.count("chunk") == 3 and "compress" in kinds and kinds[-1] == "ended"
        chunk_times = [d["stream_time_s"] for k, d in events[sid] if k == "chunk"]
        assert chunk_times == sorted(chunk_times) and all(d["stream"] == sid for k, d in events[sid] if k != "comment")


def test_the_events_of_a_quiet_stream_carry_keep_alive_comments(http, server):
    sid = open_stream(http, source="short.mp4", realtime=True)
    http.post(f"/v1/streams/{sid}/pause")
    seen = []
    with httpx.stream("GET", f"{server.url}/v1/streams/{sid}/events", timeout=30) as response:
        for kind, data in sse_events(response):
            seen.append((kind, data))
            if sum(k == "comment" for k, _ in seen) >= 3:
                break
    assert [d for k, d in seen if k == "comment"][1:] == ["keep-alive", "keep-alive"]
    http.delete(f"/v1/streams/{sid}")


def test_a_stream_that_ended_before_its_events_were_asked_for_says_so_at_once(http, server):
    sid = open_stream(http, source="short.mp4")
    wait_state(http, sid)
    with httpx.stream("GET", f"{server.url}/v1/streams/{sid}/events", timeout=10) as response:
        kinds = [k for k, _ in sse_events(response) if k != "comment"]
    assert kinds == ["ended"]


# -- must-show 5: a client that goes away mid-answer -----------------------------------------------
def test_a_client_that_disconnects_mid_answer_cancels_it_and_the_memory_is_as_before(http, server):
    sid = open_stream(http, source="short.mp4")
    wait_state(http, sid)
    hub = server.hub
    before = memory(hub, sid)
    body = {"model": f"hermes:stream/{sid}", "messages": QUESTION, "max_tokens": 1000, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        got = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
        assert len(got) >= 2
    # the connection is closed: the server cancels the answer between two tokens
    client = hub.get(sid).client
    deadline = time.monotonic() + 10
    while client.counts().answers_cancelled < 1:
        assert time.monotonic() < deadline, "the answer was not cancelled"
        time.sleep(0.02)
    assert len(client.last_answer.tokens) < 1000
    assert same(memory(hub, sid), before)
    assert hub.get(sid).answers_in_flight == 0
    assert http.post("/v1/chat/completions", json={**body, "stream": False, "max_tokens": 3}).status_code == 200


# -- the rest of the API ------------------------------------------------------------------------------
def test_streams_are_listed_read_snapshotted_restored_and_deleted(http, server):
    sid = open_stream(http, source="short.mp4")
    view = wait_state(http, sid)
    assert {"id", "source", "state", "frames_seen", "stream_time_s", "cache"} <= set(view)
    assert view["source"] == "short.mp4" and view["frames_seen"] == 8
    assert sid in [v["id"] for v in http.get("/v1/streams").json()["data"]]
    mapped = http.get(f"/v1/streams/{sid}", params={"memory_map": "true"}).json()["memory_map"]
    assert len(mapped["layers"]) == len(view["cache"]["tokens_per_layer"])

    saved = http.post(f"/v1/streams/{sid}/snapshot", json={"name": "kept"}).json()
    assert saved["path"].endswith("kept.safetensors") and saved["bytes"] > 0
    ask = {"messages": QUESTION, "max_tokens": 5}
    first = http.post("/v1/chat/completions", json={**ask, "model": f"hermes:stream/{sid}"}).json()
    restored = http.post("/v1/streams", json={"memory": "kept"})
    assert restored.status_code == 201, restored.text
    rid = restored.json()["id"]
    again = http.post("/v1/chat/completions", json={**ask, "model": f"hermes:stream/{rid}"}).json()
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    assert http.get(f"/v1/streams/{rid}").json()["frames_seen"] == 8

    for gone in (sid, rid):
        assert http.delete(f"/v1/streams/{gone}").json()["deleted"] is True
        assert http.get(f"/v1/streams/{gone}").status_code == 404
    assert f"hermes:stream/{sid}" not in [m["id"] for m in http.get("/v1/models").json()["data"]]


def test_metrics_are_prometheus_text_with_streams_latencies_and_memory(http, sdk):
    sid = open_stream(http, source="short.mp4")
    wait_state(http, sid)
    sdk.chat.completions.create(model=f"hermes:stream/{sid}", messages=QUESTION, max_tokens=3)
    reply = http.get("/metrics")
    assert reply.headers["content-type"].startswith("text/plain")
    text = reply.text
    for name in ("hermes_streams", "hermes_stream_frames_ingested_total", "hermes_stream_lag_seconds",
                 "hermes_stream_queue_frames", "hermes_stream_kv_bytes", "hermes_process_resident_memory_bytes"):
        assert f"# TYPE {name} " in text
    assert f'hermes_stream_frames_ingested_total{{stream="{sid}"}} 8.0' in text
    count = next(line for line in text.splitlines() if line.startswith("hermes_answer_ttft_seconds_count"))
    assert int(count.split()[1]) >= 1
    chunks = next(line for line in text.splitlines() if line.startswith("hermes_chunk_prefill_seconds_count"))
    assert int(chunks.split()[1]) >= 2


# -- hermes chat --server -------------------------------------------------------------------------------
@pytest.mark.slow
def test_hermes_chat_talks_to_a_servers_stream_like_a_local_one(http, sdk, server):
    import subprocess
    import sys

    sid = open_stream(http, source="short.mp4")
    wait_state(http, sid)
    first = sdk.chat.completions.create(model=f"hermes:stream/{sid}", messages=QUESTION, max_tokens=6)
    text = first.choices[0].message.content
    follow_up = [*QUESTION, {"role": "assistant", "content": text}, {"role": "user", "content": "And then?"}]
    second = sdk.chat.completions.create(model=f"hermes:stream/{sid}", messages=follow_up, max_tokens=6)
    lines = f"{QUESTION[0]['content']}\nAnd then?\n/clear\nAnd then?\n/stats\n/memory\n/pause\n"
    done = subprocess.run([sys.executable, "-m", "hermes_cli", "chat", "--server", server.url, "--stream", sid,
                           "--max-new-tokens", "6", "--json"], input=lines, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["answer"] for r in records[:2]] == [text, second.choices[0].message.content]  # the client keeps the turns
    assert records[2]["answer"] == sdk.chat.completions.create(
        model=f"hermes:stream/{sid}", messages=[{"role": "user", "content": "And then?"}], max_tokens=6
    ).choices[0].message.content  # /clear forgot them
    assert records[0]["frames_seen"] == 8 and records[0]["answer_tokens"] == 6
    shown = done.stdout + done.stderr  # with --json the commands' output goes to stderr (stdout: JSON only)
    assert "8 frames" in shown and "shallow" in shown  # /stats and /memory from the server
    assert http.get(f"/v1/streams/{sid}").json()["paused"] is True


@pytest.mark.slow
def test_hermes_chat_without_a_reachable_stream_says_so_in_one_line(server):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "hermes_cli", "chat", "--server", server.url, "--stream", "nope"],
                          input="", capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no stream 'nope'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


# -- must-show 5: a live source that drops ----------------------------------------------------------
@pytest.mark.slow  # real time: 2 s of stream, 1 s down, 2 s more, then the 3 s reconnect window
def test_a_live_source_that_drops_reconnects_and_its_events_report_the_gap(server):
    from hermes_cli.serve.app import create_app
    from hermes_cli.serve.settings import ServeSettings
    from tests.test_reconnect import restarting_server

    url, servers = restarting_server("tcp")
    app = create_app(server.hub.engine, ServeSettings(reconnect_s=3.0, keepalive_s=1.0))
    with LiveServer(app) as other, httpx.Client(base_url=other.url, timeout=60) as client:
        reply = client.post("/v1/streams", json={"source": url, "fps": 5, "chunk": 4, "budget": 32})
        assert reply.status_code == 201, reply.text
        sid = reply.json()["id"]
        assert reply.json()["live"] is True
        events = []
        with httpx.stream("GET", f"{other.url}/v1/streams/{sid}/events", timeout=60) as response:
            for kind, data in sse_events(response):
                if kind != "comment":
                    events.append((kind, data))
                if kind in ("ended", "failed"):
                    break
        kinds = [k for k, _ in events]
        gap = next(d for k, d in events if k == "gap")
        assert gap["gaps"] == 1 and gap["gap_s"] > 0.5
        # chunks of both runs reach the memory (a busy engine may prefill the first run's after the drop)
        assert kinds.count("chunk") >= 2
        assert kinds[-1] == "ended" and "error" in events[-1][1]  # gone for good after the window
        view = client.get(f"/v1/streams/{sid}").json()
        assert view["state"] == "failed" and view["frames_seen"] > 10  # both runs are in the memory
        answer = client.post("/v1/chat/completions", json={"model": f"hermes:stream/{sid}", "max_tokens": 3,
                                                           "messages": [{"role": "user", "content": "And?"}]})
        assert answer.status_code == 200  # the memory so far still answers
    servers.join(30)


def test_a_plain_reply_whose_client_gives_up_is_cancelled_too(http, server):
    sid = open_stream(http, source="short.mp4")
    wait_state(http, sid)
    body = {"model": f"hermes:stream/{sid}", "messages": QUESTION, "max_tokens": 1000}
    with pytest.raises(httpx.ReadTimeout):  # the client stops waiting and closes the connection
        httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.3))
    client = server.hub.get(sid).client
    deadline = time.monotonic() + 10
    while client.counts().answers_cancelled < 1:
        assert time.monotonic() < deadline, "the answer was not cancelled"
        time.sleep(0.02)
    assert len(client.last_answer.tokens) < 1000 and client.counts().answers == 0


def test_the_interactive_prompt_runs_on_a_servers_stream(http, server):
    from hermes_cli.app.live import toolbar_text
    from hermes_cli.serve.client import RemoteStream, ServerFrames
    from tests.test_live import drive

    sid = open_stream(http, source="short.mp4", realtime=True)  # still streaming when the prompt opens
    stream = RemoteStream(server.url, sid, max_new_tokens=4)
    try:
        assistant, text = drive(stream, ServerFrames(stream, poll_s=0.05),
                                ["What is it?", "And then?", "/stats", "/memory", "/policy", "/pause", "/clear"],
                                after_first_chunk=True)
        assert [q for q, _ in stream.history()] == []  # /clear came last
        assert stream.last_answer is not None and len(stream.last_answer.tokens) == 4
        assert "shallow" in text and "hermes (budget 24)" in text
        assert http.get(f"/v1/streams/{sid}").json()["paused"] is True  # /pause reached the server
        http.post(f"/v1/streams/{sid}/resume")
        wait_state(http, sid)
        bar = toolbar_text(assistant.ingestor)
        for readout in ("8 frames", "cache 24/24 tok", "chunk", "TTFT", "RSS"):  # the readouts of the stream now
            assert readout in bar
    finally:
        stream.close()


def test_notify_conditions_become_notification_events(http, server):
    sid = open_stream(http, source="cam0.mp4", realtime=True, notify={"conditions": ["a person enters"],
                                                                       "threshold": 0})
    events = []
    with httpx.stream("GET", f"{server.url}/v1/streams/{sid}/events", timeout=60) as response:
        for kind, data in sse_events(response):
            events.append((kind, data))
            if kind in ("ended", "failed"):
                break
    notes = [d for k, d in events if k == "notification"]
    assert len(notes) == 1 and notes[0]["notification"] == "a person enters"  # threshold 0: the first probe fires
    for bad in (["x"] * 9, [""], {"conditions": ["x"], "threshold": 2}, {"conditions": ["x"], "loud": 1}, "x"):
        reply = http.post("/v1/streams", json={"source": "short.mp4", "notify": bad})
        assert reply.status_code == 422 and "notify" in reply.json()["error"]["message"], bad


def test_the_memory_map_of_a_stream_shorter_than_one_chunk(http):
    sid = open_stream(http, source="short.mp4", chunk=16, budget=64)  # 8 frames: one partial chunk, flushed
    wait_state(http, sid)
    reply = http.get(f"/v1/streams/{sid}", params={"memory_map": "true"})
    assert reply.status_code == 200, reply.text
    mapped = reply.json()["memory_map"]
    assert len(mapped["units"]) == 4 and mapped["recent_from_s"] == mapped["units"][0][0]
