"""The interactive assistant driven through prompt-toolkit's pipe input while ingestion runs."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from hermes_cli.app.live import Assistant, memory_timeline, toolbar_text
from hermes_cli.engine.session import Session, SessionConfig
from policies import make_policy
from tests.conftest import moving_square_frames


@dataclass
class Frame:
    image: np.ndarray
    timestamp: float


def frames(n: int, fail_after: int | None = None):
    images = moving_square_frames(n)
    for i in range(n):
        if fail_after is not None and i == fail_after:
            raise RuntimeError("camera unplugged")
        yield Frame(images[i], float(i))


def drive(session, source, lines: list[str], *, after_first_chunk: bool = False):
    """Run the assistant on ``lines`` of input (then Ctrl-D); optionally type only once the
    worker has ingested its first chunk, while it goes on ingesting."""
    written: list[str] = []
    with create_pipe_input() as pipe:
        assistant = Assistant(session, source, input=pipe, output=DummyOutput(), write=written.append)
        if after_first_chunk:
            assistant.ingestor.start()
            deadline = time.monotonic() + 60
            while session.units_seen == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
        for line in lines:
            pipe.send_text(line + "\r")
        pipe.close()
        assistant.run()
    return assistant, "".join(written)


def test_prompt_answers_in_order_and_shows_readouts(tiny_qwen):
    session = Session(tiny_qwen, make_policy("fifo"), SessionConfig(chunk_frames=2, budget=40, max_new_tokens=3))
    assistant, text = drive(session, frames(40), ["first question?", "second question?", "/stats", "/memory", "/policy", "/help"],
                            after_first_chunk=True)
    assert [q for q, _ in session.history] == ["first question?", "second question?"]
    assert "cache" in text and "positions" in text  # /stats
    assert "all (layers 0–" in text  # /memory: fifo keeps alike in every layer
    assert "fifo" in text and "/resume" in text  # /policy, /help
    assert not assistant.ingestor.thread.is_alive()  # Ctrl-D joined the worker
    bar = toolbar_text(assistant.ingestor)
    for readout in ("frames", "cache", "/40 tok", "MiB", "RSS", "chunk"):
        assert readout in bar


def test_worker_exception_is_a_message_and_questions_still_work(tiny_llava):
    session = Session(tiny_llava, config=SessionConfig(chunk_frames=2, budget=None, max_new_tokens=2))
    source = frames(10, fail_after=5)
    written: list[str] = []
    with create_pipe_input() as pipe:
        assistant = Assistant(session, source, input=pipe, output=DummyOutput(), write=written.append)
        assistant.ingestor.start()
        assert assistant.ingestor.finished.wait(60)  # the worker died before the first question
        pipe.send_text("still there?\r/quit\r")
        assistant.run()
    text = "".join(written)
    assert "ingestion stopped: camera unplugged" in text
    assert session.history and session.history[0][0] == "still there?"
    assert session.frames_seen == 4 and not session.last_answer.no_frames
    assert "error" in toolbar_text(assistant.ingestor)


def test_pause_and_clear(tiny_llava):
    session = Session(tiny_llava, config=SessionConfig(chunk_frames=2, budget=None, max_new_tokens=1))
    session.history.append(("old", "answer"))
    assistant, text = drive(session, frames(2), ["/pause", "/resume", "/clear", "/nonsense"])
    assert "paused" in text and "resumed" in text and "unknown command /nonsense" in text
    assert session.history == []


def test_memory_timeline_marks_what_is_held(tiny_qwen):
    session = Session(tiny_qwen, make_policy("fifo"), SessionConfig(chunk_frames=2, budget=24))
    session.ingest(moving_square_frames(20), [float(i) for i in range(20)])
    timeline = memory_timeline(session, width=10)
    rows = timeline.splitlines()[1:]
    assert rows and all(row.startswith("·") and "█" in row for row in rows)  # the start is forgotten


def test_webcam_without_camera_is_one_line():
    result = subprocess.run([sys.executable, "-m", "hermes_cli", "chat", "--webcam", "/dev/video99", "--model", "tiny"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "camera" in lines[0] and "Traceback" not in result.stderr


def test_toolbar_shows_the_lag_of_a_live_source(tiny_llava):
    class LiveFrames(list):
        is_live = True

    session = Session(tiny_llava, config=SessionConfig(chunk_frames=2, budget=None))
    session.ingest(moving_square_frames(2), [0.0, 1.0])
    from hermes_cli.app.live import Ingestor

    ingestor = Ingestor(session, LiveFrames(), lambda message: None)
    ingestor.started -= 10  # the source started 10 s ago; 1 s of it is in memory
    assert 8.5 < ingestor.lag_s < 10 and "lag 9." in toolbar_text(ingestor)
