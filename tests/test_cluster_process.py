"""``hermes serve --cluster --engines 2`` as a person runs it (issue 25, must-show 1): a local Ray
cluster from the command alone; six streams placed three and three, each autosaved into
``--snapshot-store``; SIGTERM stops it cleanly."""

from __future__ import annotations

import pytest

from tests.media import make_video
from tests.test_serve_process import ServeProcess, wait_ended

pytest.importorskip("ray", reason="the cluster tests need Ray: pip install 'hermes-video[cluster]'")
httpx = pytest.importorskip("httpx2")


@pytest.mark.slow
@pytest.mark.ray
def test_the_command_alone_runs_a_two_engine_cluster(tmp_path):
    media, store = tmp_path / "media", tmp_path / "store"
    media.mkdir()
    store.mkdir()
    for i, colors in enumerate((("red", "blue"), ("green", "yellow"), ("blue", "red"))):
        make_video(media / f"cam{i}.mp4", seconds=2, fps=4, size=(96, 64), colors=colors)
    server = ServeProcess("--cluster", "--engines", "2", "--device", "cpu", "--dtype", "fp32", "--media-root",
                          str(media), "--snapshot-store", str(store), "--autosave-every", "0s", cwd=tmp_path)
    try:
        assert any("cluster" in line for line in server.lines)
        with httpx.Client(base_url=server.url, timeout=60) as http:
            sids = [http.post("/v1/streams", json={"source": f"cam{i % 3}.mp4", "fps": 2, "chunk": 2,
                                                   "budget": 8}).json()["id"] for i in range(6)]
            rows = http.get("/v1/engines").json()["engines"]
            assert sorted(len(r["streams"]) for r in rows) == [3, 3]
            for sid in sids:
                wait_ended(http, sid)
            answer = http.post("/v1/chat/completions", json={"model": f"hermes:stream/{sids[0]}", "max_tokens": 4,
                                                             "messages": [{"role": "user", "content": "What?"}]})
            assert answer.status_code == 200 and answer.json()["hermes"]["epoch"] == 1
        assert sorted(p.name for p in store.glob("s*.json")) == sorted(f"{sid}.json" for sid in sids)
        assert all((store / f"{sid}.safetensors").is_file() for sid in sids)  # every stream autosaved
    finally:
        code, log = server.terminate()
    assert code == 0, log
    assert "Traceback" not in log, log
