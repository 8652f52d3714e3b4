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

from tests.media import make_video
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
