"""``hermes serve`` as a real process (issue 22, must-show 5): SIGTERM drains — with
``--save-on-exit`` each stream's memory is saved — and ``--restore`` reopens the streams, which
give the same answers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from tests.media import make_video

pytest.importorskip("uvicorn")

ASK = {"messages": [{"role": "user", "content": "What is happening?"}], "max_tokens": 8}


class ServeProcess:
    """``hermes serve --port 0 …`` in a subprocess; ``url`` once it listens."""

    def __init__(self, *args: str, cwd: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
        env.pop("HERMES_API_KEY", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "hermes_cli", "serve", "--model", "tiny", "--port", "0",
                                      *args], cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        deadline = time.monotonic() + 120
        assert self.proc.stderr is not None
        while True:
            line = self.proc.stderr.readline()
            assert line or self.proc.poll() is None, f"the server exited: {''.join(self.lines)}"
            self.lines.append(line)
            if m := re.search(r"listening on (http://\S+)", line):
                self.url = m.group(1)
                break
            assert time.monotonic() < deadline, "the server did not start"

    def terminate(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        _, rest = self.proc.communicate(timeout=60)
        return self.proc.returncode, "".join(self.lines) + rest


def wait_ended(http, sid) -> dict:
    deadline = time.monotonic() + 60
    while (view := http.get(f"/v1/streams/{sid}").json())["state"] == "live":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return view


@pytest.mark.slow
def test_sigterm_saves_every_stream_and_restore_resumes_them_with_the_same_answers(tmp_path):
    media, saved = tmp_path / "media", tmp_path / "saved"
    media.mkdir()
    saved.mkdir()
    make_video(media / "a.mp4", seconds=4, fps=4, size=(96, 64))
    make_video(media / "b.mp4", seconds=3, fps=4, size=(96, 64), colors=("green", "blue"))
    first = ServeProcess("--media-root", str(media), "--save-on-exit", str(saved), cwd=tmp_path)
    answers, views = {}, {}
    try:
        with httpx.Client(base_url=first.url, timeout=60) as http:
            for name in ("a.mp4", "b.mp4"):
                sid = http.post("/v1/streams", json={"source": name, "fps": 2, "chunk": 2, "budget": 8}).json()["id"]
                views[sid] = wait_ended(http, sid)
                answers[sid] = http.post("/v1/chat/completions", json={**ASK, "model": f"hermes:stream/{sid}"}).json()
    finally:
        code, log = first.terminate()
    assert code == 0, log
    assert sorted(p.name for p in saved.iterdir()) == sorted(f"{sid}.safetensors" for sid in views)
    assert f"saved {len(views)} stream memories" in log

    second = ServeProcess("--media-root", str(media), "--restore", str(saved), cwd=tmp_path)
    try:
        with httpx.Client(base_url=second.url, timeout=60) as http:
            listed = {v["id"]: v for v in http.get("/v1/streams").json()["data"]}
            assert sorted(listed) == sorted(views)
            for sid, before in views.items():
                view = wait_ended(http, sid)
                assert (view["frames_seen"], view["stream_time_s"], view["cache"]) == \
                    (before["frames_seen"], before["stream_time_s"], before["cache"])
                again = http.post("/v1/chat/completions", json={**ASK, "model": f"hermes:stream/{sid}"}).json()
                assert again["choices"][0]["message"]["content"] == answers[sid]["choices"][0]["message"]["content"]
                assert again["usage"] == answers[sid]["usage"]
    finally:
        code, log = second.terminate()
    assert code == 0, log


@pytest.mark.slow
def test_the_load_script_runs_clean_at_a_small_size():
    """scripts/serve_load.py (docs/benchmarks.md) keeps working: every answer arrives, none lost."""
    import json

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "scripts/serve_load.py", "--clients", "4", "--questions", "2",
                           "--video-seconds", "8", "--json"], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["asked"], result["answered"], result["errors"], result["lost"]) == (8, 8, 0, 0)
    assert result["ttft_ms"]["p50"] > 0 and result["server_rss_mib"]["max"] > 0
