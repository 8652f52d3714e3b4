"""``hermes serve --cluster`` on a real one-node Ray cluster (issue 25, must-show 1–5).

One cluster for the module — ``ray.init(num_cpus=2, object_store_memory≈200 MB)``, two engine
actors with the tiny model (CPU, fp32), the detached registry, a snapshot store in a temporary
folder — and the gateway (the FastAPI app of ``hermes serve``) on a loopback port. A
single-process ``hermes serve`` on the same model answers the same inputs for comparison.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.media import make_video, serve_mpegts_tcp
from tests.serving import LiveServer

ray = pytest.importorskip("ray", reason="the cluster tests need Ray: pip install 'hermes-video[cluster]'")
httpx = pytest.importorskip("httpx2")

pytestmark = pytest.mark.ray

COLORS = (("red", "blue"), ("green", "yellow"), ("magenta", "cyan"), ("blue", "red"), ("yellow", "green"),
          ("cyan", "magenta"))
STREAM = {"fps": 2, "chunk": 4, "budget": 24}
QUESTION = [{"role": "user", "content": "What is happening in the video?"}]


def session_settings():
    from hermes_cli.cli.factory import SessionSettings

    return SessionSettings.of({"model": "tiny", "device": "cpu", "dtype": "fp32"})


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    for i, colors in enumerate(COLORS):
        make_video(root / f"cam{i}.mp4", seconds=4, fps=4, size=(96, 64), colors=colors, scene_change_at=2)
    make_video(root / "long.mp4", seconds=12, fps=4, size=(96, 64), scene_change_at=6)
    return root


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def cluster(media, store):
    from hermes_cli.cluster.launch import start_cluster
    from hermes_cli.serve.settings import ServeSettings

    settings = ServeSettings(session=session_settings(), media_root=media, max_streams=16, keepalive_s=0.5)
    started = start_cluster(settings, str(store), engines=2, autosave_every_s=0.0, heartbeat_s=0.25,
                            ray_init={"num_cpus": 2, "object_store_memory": 200 * 1024 * 1024})
    yield started
    started.stop()


@pytest.fixture(scope="module")
def gateway(cluster):
    with LiveServer(cluster.app()) as live, httpx.Client(base_url=live.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def single(media, tmp_path_factory):
    """One process, one engine: ``hermes serve`` on the same model and inputs."""
    from hermes_cli.cli.factory import build_engine
    from hermes_cli.serve.app import create_app
    from hermes_cli.serve.settings import ServeSettings

    engine = build_engine(session_settings(), quiet=True)
    app = create_app(engine, ServeSettings(session=session_settings(), media_root=media,
                                           memory_root=tmp_path_factory.mktemp("single"), max_streams=16))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=120) as client:
        yield client
    engine.stop()


@pytest.fixture(autouse=True)
def close_streams(request):
    yield
    if "gateway" in request.fixturenames:
        gateway = request.getfixturevalue("gateway")
        for view in gateway.get("/v1/streams").json()["data"]:
            gateway.delete(f"/v1/streams/{view['id']}")


def open_stream(http, **body) -> str:
    reply = http.post("/v1/streams", json={**STREAM, **body})
    assert reply.status_code == 201, reply.text
    return reply.json()["id"]


def wait_state(http, sid, state="ended", timeout_s=60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        reply = http.get(f"/v1/streams/{sid}")
        if reply.status_code == 200 and reply.json()["state"] == state:
            return reply.json()
        assert time.monotonic() < deadline, f"stream {sid} is not {state}: {reply.text[:300]}"
        time.sleep(0.05)


def ask(http, sid, max_tokens=6):
    reply = http.post("/v1/chat/completions", json={"model": f"hermes:stream/{sid}", "messages": QUESTION,
                                                    "max_tokens": max_tokens})
    return reply


def memory_of(path):
    from safetensors.torch import load_file

    return load_file(str(path))


# -- must-show 1: six streams three and three, answers as in one process ---------------------------
def test_six_streams_three_and_three_answers_equal_single_process(gateway, single):
    sids = [open_stream(gateway, source=f"cam{i}.mp4") for i in range(6)]
    engines = gateway.get("/v1/engines").json()
    assert set(engines) == {"engines"}
    rows = engines["engines"]
    assert [sorted(row) for row in rows] == [sorted(["id", "pid", "node", "streams", "load", "lag_s",
                                                     "memory_bytes"])] * 2
    assert sorted(len(row["streams"]) for row in rows) == [3, 3]
    assert sorted(s for row in rows for s in row["streams"]) == sorted(sids)
    assert len({row["pid"] for row in rows}) == 2 and os.getpid() not in {row["pid"] for row in rows}
    for sid in sids:
        wait_state(gateway, sid)
    refs = [open_stream(single, source=f"cam{i}.mp4") for i in range(6)]
    for ref in refs:
        wait_state(single, ref)
    for sid, ref in zip(sids, refs, strict=True):
        mine, theirs = ask(gateway, sid), ask(single, ref)
        assert mine.status_code == 200, mine.text
        assert mine.json()["choices"][0]["message"]["content"] == theirs.json()["choices"][0]["message"]["content"]
        assert mine.json()["hermes"]["token_ids"] == theirs.json()["hermes"]["token_ids"]
        assert mine.json()["hermes"]["as_of"] == theirs.json()["hermes"]["as_of"] > 0
        assert mine.json()["hermes"]["epoch"] == 1
    rows = gateway.get("/v1/engines").json()["engines"]
    assert all(row["memory_bytes"] > 0 for row in rows)
    # the rest of hermes serve's routes answer through the cluster too
    assert gateway.get("/healthz").json() == {"status": "ok"}
    models = {m["id"] for m in gateway.get("/v1/models").json()["data"]}
    assert {"tiny", *(f"hermes:stream/{sid}" for sid in sids)} <= models
    metrics = gateway.get("/metrics").text
    assert 'hermes_streams{state="ended"} 6' in metrics and f'hermes_stream_frames_ingested_total{{stream="{sids[0]}"}}' in metrics
    listed = gateway.get("/v1/streams").json()["data"]
    assert sorted(v["id"] for v in listed) == sorted(sids) and all(v["epoch"] == 1 for v in listed)
    oneoff = gateway.post("/v1/chat/completions", json={"model": "tiny", "messages": [
        {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "cam0.mp4"}},
                                     {"type": "text", "text": "What?"}]}]})
    assert oneoff.status_code == 422 and "hermes:stream/ID" in oneoff.json()["error"]["message"]


def reference_run(single, tmp_name):
    """The uninterrupted run of long.mp4 on one process: its final memory and final answer."""
    ref = open_stream(single, source="long.mp4")
    wait_state(single, ref)
    saved = single.post(f"/v1/streams/{ref}/snapshot", json={"name": tmp_name}).json()
    answer = ask(single, ref).json()
    single.delete(f"/v1/streams/{ref}")
    return memory_of(saved["path"]), answer


def assert_same_memory(mine: dict, theirs: dict) -> None:
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert mine[key].dtype == theirs[key].dtype and mine[key].equal(theirs[key]), key


def wait_frames(http, sid, frames, timeout_s=60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (view := http.get(f"/v1/streams/{sid}").json())["frames_seen"] < frames:
        assert view["state"] == "live", view
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return view


# -- must-show 3: a move mid-stream -------------------------------------------------------------
def test_move_mid_stream_keeps_memory_bit_identical_and_bumps_epoch(gateway, single, store):
    import threading

    reference, final_answer = reference_run(single, "ref-move")
    sid = open_stream(gateway, source="long.mp4", realtime=True)
    view = wait_frames(gateway, sid, 8)
    before_engine, before_epoch = view["engine"], view["epoch"]
    assert before_epoch == 1
    assert gateway.post(f"/v1/streams/{sid}/pause").status_code == 200
    before = memory_of(gateway.post(f"/v1/streams/{sid}/snapshot", json={"name": "before-move"}).json()["path"])
    events: list = []
    watcher = threading.Thread(target=read_events, args=(gateway, sid, events), daemon=True)
    watcher.start()
    time.sleep(0.5)

    # a question in flight when the move starts completes first (from the old placement) or gets 409
    asked: dict = {}

    def question() -> None:
        asked["reply"] = ask(gateway, sid, max_tokens=48)
        asked["done_s"] = time.monotonic()

    thread = threading.Thread(target=question)
    thread.start()
    time.sleep(0.05)
    moved = gateway.post(f"/v1/streams/{sid}/move", json={})
    moved_s = time.monotonic()
    thread.join(60)
    assert moved.status_code == 200, moved.text
    assert moved.json()["epoch"] == before_epoch + 1 and moved.json()["engine"] != before_engine
    reply = asked["reply"]
    assert reply.status_code in (200, 409), reply.text
    if reply.status_code == 200:
        assert reply.json()["hermes"]["epoch"] == before_epoch and asked["done_s"] <= moved_s
    else:
        assert "moving" in reply.json()["error"]["message"]

    view = gateway.get(f"/v1/streams/{sid}").json()
    assert (view["engine"], view["epoch"], view["paused"]) == (moved.json()["engine"], before_epoch + 1, True)
    after = memory_of(gateway.post(f"/v1/streams/{sid}/snapshot", json={"name": "after-move"}).json()["path"])
    assert_same_memory(after, before)
    rows = {row["id"]: row for row in gateway.get("/v1/engines").json()["engines"]}
    assert sid in rows[moved.json()["engine"]]["streams"] and sid not in rows[before_engine]["streams"]

    assert gateway.post(f"/v1/streams/{sid}/resume").status_code == 200
    wait_state(gateway, sid)
    final = memory_of(gateway.post(f"/v1/streams/{sid}/snapshot", json={"name": "final-move"}).json()["path"])
    assert_same_memory(final, reference)
    answer = ask(gateway, sid).json()
    assert answer["hermes"]["token_ids"] == final_answer["hermes"]["token_ids"]
    assert answer["hermes"]["epoch"] == before_epoch + 1
    # the SSE subscription followed the stream: "moved" (the new engine, epoch), its chunks, "ended"
    watcher.join(30)
    kinds = [e["event"] for e in events]
    assert "closed" not in kinds and kinds[-1] == "ended", kinds
    moved_event = events[kinds.index("moved")]
    assert (moved_event["engine"], moved_event["epoch"]) == (moved.json()["engine"], before_epoch + 1)
    assert "chunk" in kinds[kinds.index("moved"):], kinds


def read_events(http, sid, into: list) -> None:
    """The stream's SSE events (their JSON data) until it ends."""
    import json

    with http.stream("GET", f"/v1/streams/{sid}/events", timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                into.append(json.loads(line[6:]))
                if into[-1]["event"] in ("ended", "failed", "closed"):
                    return


def test_move_refusals_and_drain(gateway):
    sid = open_stream(gateway, source="cam0.mp4")
    wait_state(gateway, sid)
    engine = gateway.get(f"/v1/streams/{sid}").json()["engine"]
    same = gateway.post(f"/v1/streams/{sid}/move", json={"engine": engine})
    assert same.status_code == 409 and "already on engine" in same.json()["error"]["message"]
    assert gateway.post(f"/v1/streams/{sid}/move", json={"engine": "e9"}).status_code == 404
    assert gateway.post("/v1/streams/nope/move", json={}).status_code == 404
    drained = gateway.post(f"/v1/engines/{engine}/drain")
    assert drained.status_code == 200, drained.text
    assert [m["id"] for m in drained.json()["moved"]] == [sid]
    rows = {row["id"]: row for row in gateway.get("/v1/engines").json()["engines"]}
    assert rows[engine]["streams"] == []
    view = gateway.get(f"/v1/streams/{sid}").json()
    assert view["engine"] != engine and view["epoch"] == 2 and view["state"] == "ended"
    assert ask(gateway, sid).status_code == 200
    # a drained engine takes no new stream until it is back: the next ones go elsewhere
    other = open_stream(gateway, source="cam1.mp4")
    assert gateway.get(f"/v1/streams/{other}").json()["engine"] != engine
    undrain = ray.get(gateway_registry().undrain.remote(engine))
    assert undrain == {"id": engine, "draining": False}


def gateway_registry():
    from hermes_cli.cluster.actors import NAMESPACE, REGISTRY_NAME

    return ray.get_actor(REGISTRY_NAME, namespace=NAMESPACE)


# -- must-show 4: the registry killed and restarted rebuilds the same table ----------------------
def test_registry_restart_rebuilds_the_same_table(gateway):
    sids = [open_stream(gateway, source=f"cam{i}.mp4") for i in range(4)]
    for sid in sids:
        wait_state(gateway, sid)
    moved = gateway.post(f"/v1/streams/{sids[0]}/move", json={})  # one stream at epoch 2
    assert moved.status_code == 200, moved.text
    registry = gateway_registry()
    before = ray.get(registry.table_state.remote())
    assert {sid: before[sid][1] for sid in sids} == {sids[0]: 2, sids[1]: 1, sids[2]: 1, sids[3]: 1}
    ray.kill(registry, no_restart=False)  # Ray restarts the detached actor: its constructor rebuilds
    deadline = time.monotonic() + 60
    while True:
        try:
            after = ray.get(gateway_registry().table_state.remote(), timeout=10)
            break
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            assert time.monotonic() < deadline, "the registry did not come back"
            time.sleep(0.2)
    assert after == before
    for sid in sids:  # the gateway goes on through the rebuilt registry
        view = gateway.get(f"/v1/streams/{sid}").json()
        assert [view["engine"], view["epoch"]] == before[sid]
    assert ask(gateway, sids[1]).status_code == 200
    print("failovers so far:", ray.get(gateway_registry().failover_log.remote()))


def test_live_source_failover_resumes_at_now_with_a_gap(gateway):
    """A live source's stream on a dead engine: restored elsewhere, its source reopened, a gap event."""
    import threading

    from hermes_cli.cluster.actors import NAMESPACE, engine_actor_name

    url, _ = serve_mpegts_tcp(30, 4, (96, 64))
    port = int(url.rsplit(":", 1)[1])
    sid = open_stream(gateway, source=url)
    view = wait_frames(gateway, sid, 4)
    assert view["live"] is True
    serve_mpegts_tcp(30, 4, (96, 64), port=port, first_index=1000)  # the camera, for the next connection
    victim = view["engine"]
    ray.kill(ray.get_actor(engine_actor_name(victim), namespace=NAMESPACE), no_restart=False)
    deadline = time.monotonic() + 10
    while True:
        current = gateway.get(f"/v1/streams/{sid}")
        if current.status_code == 200 and current.json()["epoch"] == 2:
            break
        assert time.monotonic() < deadline, current.text[:200]
        time.sleep(0.05)
    assert current.json()["engine"] != victim and current.json()["live"] is True
    events: list = []
    watcher = threading.Thread(target=read_events, args=(gateway, sid, events), daemon=True)
    watcher.start()
    deadline = time.monotonic() + 20
    while not any(e["event"] == "chunk" for e in events):
        assert time.monotonic() < deadline, events
        time.sleep(0.1)
    gap = events[0]
    assert gap["event"] == "gap" and gap["epoch"] == 2 and "resumes at now" in gap["reason"]
    later = wait_frames(gateway, sid, view["frames_seen"] + 4)
    assert later["stream_time_s"] > gap["as_of"] >= view["stream_time_s"] - 1e-6
    gateway.delete(f"/v1/streams/{sid}")
    deadline = time.monotonic() + 60  # Ray restarted the engine: it rejoins before the next test
    while victim not in {r["id"] for r in gateway.get("/v1/engines").json()["engines"]}:
        assert time.monotonic() < deadline
        time.sleep(0.2)


# -- must-show 2: failover ------------------------------------------------------------------------
@pytest.mark.parametrize("kill", ["SIGKILL", "ray.kill"])  # in this order: ray.kill is for good (last)
def test_failover_resumes_on_the_other_engine_within_10s(gateway, single, kill):
    import threading

    reference, final_answer = reference_run(single, f"ref-failover-{kill}")
    sid = open_stream(gateway, source="long.mp4", realtime=True)
    view = wait_frames(gateway, sid, 8)
    victim = view["engine"]
    events: list = []
    watcher = threading.Thread(target=read_events, args=(gateway, sid, events), daemon=True)
    watcher.start()
    time.sleep(0.3)
    row = next(r for r in gateway.get("/v1/engines").json()["engines"] if r["id"] == victim)
    from hermes_cli.cluster.actors import NAMESPACE, engine_actor_name

    t0 = time.monotonic()
    if kill == "ray.kill":  # an operator's kill or a lost node: Ray does not bring it back
        ray.kill(ray.get_actor(engine_actor_name(victim), namespace=NAMESPACE))
    else:  # as the OOM killer would: Ray restarts the actor's process, empty
        os.kill(row["pid"], signal.SIGKILL)
    statuses = []
    while True:  # questions during the failover: answered after it, or 503 + Retry-After
        reply = ask(gateway, sid, max_tokens=2)
        statuses.append(reply.status_code)
        assert reply.status_code in (200, 503), reply.text
        if reply.status_code == 503:
            assert reply.headers["Retry-After"] == "1"
        else:
            assert reply.json()["hermes"]["epoch"] in (1, 2)
        current = gateway.get(f"/v1/streams/{sid}")
        if current.status_code == 200 and current.json()["epoch"] == 2:
            break
        assert current.status_code in (200, 503), current.text
        assert time.monotonic() - t0 < 10, f"not resumed within 10 s: {current.text[:200]}"
        time.sleep(0.05)
    resumed_s = time.monotonic() - t0
    assert resumed_s < 10
    assert current.json()["engine"] != victim
    print(f"failover ({kill}): resumed on {current.json()['engine']} after {resumed_s:.2f}s; "
          f"answers during it: {statuses}; registry: {ray.get(gateway_registry().failover_log.remote())}")
    wait_state(gateway, sid)
    final = memory_of(gateway.post(f"/v1/streams/{sid}/snapshot", json={"name": f"final-{kill}"}).json()["path"])
    assert_same_memory(final, reference)
    answer = ask(gateway, sid).json()
    assert answer["hermes"]["token_ids"] == final_answer["hermes"]["token_ids"]
    assert answer["hermes"]["epoch"] == 2 and answer["hermes"]["as_of"] == final_answer["hermes"]["as_of"]
    watcher.join(30)  # the SSE subscription followed the failover: "moved", the new engine's chunks, "ended"
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "ended" and "moved" in kinds, kinds
    moved_event = events[kinds.index("moved")]
    assert moved_event["epoch"] == 2 and moved_event["reason"] == f"engine {victim} died"
    if kill == "ray.kill":
        assert victim not in {r["id"] for r in gateway.get("/v1/engines").json()["engines"]}
        return
    # the engine Ray restarted rejoins, empty
    deadline = time.monotonic() + 60
    while victim not in {r["id"] for r in gateway.get("/v1/engines").json()["engines"]}:
        assert time.monotonic() < deadline, "the restarted engine did not rejoin"
        time.sleep(0.2)



