"""The interactive assistant driven through prompt-toolkit's pipe input while ingestion runs."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from hermes_cli.app.live import Assistant, memory_timeline, toolbar_text
from hermes_cli.engine.readouts import memory_map
from hermes_cli.engine.session import Session, SessionConfig
from policies import make_policy
from tests.conftest import moving_square_frames, on_engine


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


def drive(stream, source, lines: list[str], *, after_first_chunk: bool = False):
    """Run the assistant on ``lines`` of input (then Ctrl-D); optionally type only once the
    engine has ingested its first chunk, while it goes on ingesting."""
    written: list[str] = []
    with create_pipe_input() as pipe:
        assistant = Assistant(stream, source, input=pipe, output=DummyOutput(), write=written.append)
        if after_first_chunk:
            assistant.ingestor.start()
            deadline = time.monotonic() + 60
            while stream.stats().units_seen == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
        for line in lines:
            pipe.send_text(line + "\r")
        pipe.close()
        assistant.run()
    return assistant, "".join(written)


def test_prompt_answers_in_order_and_shows_readouts(tiny_qwen):
    with on_engine(tiny_qwen, "fifo", SessionConfig(chunk_frames=2, budget=40, max_new_tokens=3)) as stream:
        assistant, text = drive(stream, frames(40), ["first question?", "second question?", "/stats", "/memory",
                                                     "/policy", "/help"], after_first_chunk=True)
        assert [q for q, _ in stream.history()] == ["first question?", "second question?"]
        bar = toolbar_text(assistant.ingestor)
    assert "cache" in text and "positions" in text  # /stats
    assert "all (layers 0–" in text  # /memory: fifo keeps alike in every layer
    assert "fifo" in text and "/resume" in text  # /policy, /help
    assert not assistant.ingestor.thread.is_alive()  # Ctrl-D joined the ingest thread
    for readout in ("frames", "cache", "/40 tok", "MiB", "RSS", "chunk"):
        assert readout in bar


def test_worker_exception_is_a_message_and_questions_still_work(tiny_llava):
    source = frames(10, fail_after=5)
    written: list[str] = []
    with on_engine(tiny_llava, "full", SessionConfig(chunk_frames=2, budget=None, max_new_tokens=2)) as stream, \
            create_pipe_input() as pipe:
        assistant = Assistant(stream, source, input=pipe, output=DummyOutput(), write=written.append)
        assistant.ingestor.start()
        assert assistant.ingestor.finished.wait(60)  # the source died before the first question
        pipe.send_text("still there?\r/quit\r")
        assistant.run()
        history = stream.history()
        assert history and history[0][0] == "still there?"
        assert stream.fresh_stats().frames_seen == 4 and not stream.last_answer.no_frames
        assert "error" in toolbar_text(assistant.ingestor)
    text = "".join(written)
    assert "ingestion stopped: camera unplugged" in text


def test_pause_and_clear(tiny_llava):
    with on_engine(tiny_llava, "full", SessionConfig(chunk_frames=2, budget=None, max_new_tokens=1)) as stream:
        stream.engine.call(stream.id, lambda s: s.history.append(("old", "answer")))
        _, text = drive(stream, frames(2), ["/pause", "/resume", "/clear", "/nonsense"])
        assert "paused" in text and "resumed" in text and "unknown command /nonsense" in text
        assert stream.history() == []


def test_memory_timeline_marks_what_is_held(tiny_qwen):
    session = Session(tiny_qwen, make_policy("fifo"), SessionConfig(chunk_frames=2, budget=24))
    session.ingest(moving_square_frames(20), [float(i) for i in range(20)])
    rows = memory_timeline(memory_map(session), width=20).splitlines()
    assert rows[0] == "0s " + "─" * 18 + " 20s"
    # 10 Qwen units of 2 frames (2 s each, 2 cells each): fifo keeps the newest 2 units whole
    assert rows[1] == "·" * 16 + "█" * 4 + "  all (layers 0–9, 2 of 10 units)"
    assert rows[-1].startswith("█ held") and "a unit is 2 frames" in rows[-1]


def test_memory_timeline_with_nothing_evicted_is_solid(tiny_qwen):
    """Every cell a 2-frame unit covers is marked: `full` shows no gap (it used to mark one cell per unit)."""
    session = Session(tiny_qwen, make_policy("full"), SessionConfig(chunk_frames=4, budget=None))
    session.ingest(moving_square_frames(12), [float(i) for i in range(12)])
    for width in (12, 48, 50):
        row = memory_timeline(memory_map(session), width=width).splitlines()[1]
        assert row.startswith("█" * width + "  all")


def video_meta(units: list[int]):
    """Metadata of video tokens of ``units`` (one entry per token)."""
    from hermes_cli.engine.cache import KIND_VIDEO, TokenMeta

    return TokenMeta.new(KIND_VIDEO, 0, torch.arange(len(units))[:, None], frame=torch.tensor(units))


def test_memory_timeline_shades_partly_held_units():
    """4 tokens per unit; layer 0 holds all of unit 0 and half of unit 1, layer 1 all of unit 0 only."""
    from types import SimpleNamespace

    metas = [video_meta([0, 0, 0, 0, 1, 1]), video_meta([0, 0, 0, 0])]
    session = SimpleNamespace(
        units_seen=3, unit_times=[0.0, 2.0, 4.0], tokens_per_unit=4,
        adapter=SimpleNamespace(frames_per_unit=2), config=SimpleNamespace(fps=1.0, chunk_frames=2),
        cache=SimpleNamespace(num_layers=2, meta=lambda layer: metas[layer],
                              stream_layers=[SimpleNamespace(meta=m) for m in metas]),
        policy=SimpleNamespace(layer_groups=lambda n: {"shallow": [0], "deep": [1], "all": [0, 1]}),
    )
    rows = memory_timeline(memory_map(session), width=6).splitlines()
    assert rows[1] == "██▒▒··  shallow (layers 0–0, 2 of 3 units)"  # half of unit 1
    assert rows[2] == "██····  deep (layers 1–1, 1 of 3 units)"
    assert rows[3] == "██░░··  all (layers 0–1, 2 of 3 units)"  # a quarter of unit 1 over both layers


def test_webcam_without_camera_is_one_line():
    result = subprocess.run([sys.executable, "-m", "hermes_cli", "chat", "--webcam", "/dev/video99", "--model", "tiny"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "camera" in lines[0] and "Traceback" not in result.stderr


def test_toolbar_shows_the_lag_of_a_live_source(tiny_llava):
    class LiveFrames(list):
        is_live = True

    from hermes_cli.app.live import Ingestor

    with on_engine(tiny_llava, "full", SessionConfig(chunk_frames=2, budget=None)) as stream:
        stream.ingest(moving_square_frames(2), [0.0, 1.0])
        ingestor = Ingestor(stream, LiveFrames(), lambda message: None)
        ingestor.started -= 10  # the source started 10 s ago; 1 s of it is in memory
        assert 8.5 < ingestor.lag_s < 10 and "lag 9." in toolbar_text(ingestor)


class FakeStream:
    """What an Ingestor needs of a stream's client, recording when each frame was submitted."""

    def __init__(self):
        self.warnings: tuple[str, ...] = ()
        self.times: list[float] = []
        self.frames_seen = 0
        self.paused = False

    def submit(self, image, timestamp, block=True):
        self.times.append(time.monotonic())
        self.frames_seen += 1
        return True

    def end(self, error=None):
        pass

    def flush(self):
        return None

    def pause(self):
        self.paused = True

    def resume(self):
        self.paused = False

    def stats(self):
        from types import SimpleNamespace

        return SimpleNamespace(frames_seen=self.frames_seen, stream_time_s=0.0)


def test_speed_is_a_rate_over_a_recent_window_and_states_say_done_or_paused():
    from hermes_cli.app.live import RATE_WINDOW_S, Ingestor

    ingestor = Ingestor(FakeStream(), [], lambda message: None)
    now = time.monotonic()
    # long ago the stream crawled (1 stream second per 10 wall seconds); recently it runs at 4×
    ingestor._rate.extend([(now - 100, 0.0), (now - 90, 1.0)])
    ingestor._rate.extend((now - 4 + i, 1.0 + 4 * (i + 1)) for i in range(4))
    # 12 stream seconds (5 → 17) in the 4 wall seconds from the oldest sample in the window to now
    assert ingestor.speed == pytest.approx(12 / 4, rel=0.05)
    assert all(now - t <= RATE_WINDOW_S for t, _ in ingestor._rate)
    assert ingestor.state == "live"
    ingestor.stream.paused = True  # what the engine reports once a pause is served
    assert ingestor.state == "paused"
    ingestor.finished.set()
    assert ingestor.state == "done"


def test_pause_stops_the_realtime_clock():
    """--realtime in the prompt: a pause shifts every later frame; /resume does not ingest a backlog."""
    from hermes_cli.app.live import Ingestor

    session = FakeStream()
    source = [Frame(np.zeros((4, 4, 3), np.uint8), t) for t in (0.0, 0.4, 0.8)]
    ingestor = Ingestor(session, source, lambda message: None, pace=True).start()
    deadline = time.monotonic() + 10
    while not session.times and time.monotonic() < deadline:
        time.sleep(0.005)
    ingestor.pause()
    time.sleep(0.6)
    ingestor.resume()
    assert ingestor.finished.wait(10)
    start = session.times[0]
    assert session.times[1] - start >= 0.4 + 0.45  # not at 0.6 s, right after the pause: it was shifted
    assert session.times[2] - start >= 0.8 + 0.45


def test_ctrl_c_at_an_empty_prompt_does_not_say_end_of_stream(tiny_llava):
    import threading

    release = threading.Event()

    class Live:
        is_live = True

        def __iter__(self):
            images = moving_square_frames(3)
            for i in range(3):
                yield Frame(images[i], float(i))
            release.wait(30)  # a live stream that has not ended

        def close(self):
            release.set()

    written: list[str] = []
    config = SessionConfig(chunk_frames=8, budget=None, max_new_tokens=2)
    with on_engine(tiny_llava, "full", config, live=True) as stream, create_pipe_input() as pipe:
        assistant = Assistant(stream, Live(), input=pipe, output=DummyOutput(), write=written.append)
        assistant.ingestor.start()
        deadline = time.monotonic() + 30
        while assistant.ingestor.frames_read < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stream.fresh_stats().frames_seen == 0  # all 3 frames wait in a partial chunk of 8
        assert "3 frames, 0 kept" in toolbar_text(assistant.ingestor)  # counted as they arrive
        pipe.send_text("what now?\r")
        pipe.send_text("\x03")  # Ctrl-C at the empty prompt
        assistant.run()
        # the question flushed the partial chunk: answered from the 3 frames seen, not "no frames yet"
        assert stream.last_answer.frames_seen == 3 and not stream.last_answer.no_frames
    text = "".join(written)
    assert "end of stream" not in text


def test_stats_text_names_no_internals(tiny_llava):
    from hermes_cli.app.live import stats_text

    session = Session(tiny_llava, config=SessionConfig(chunk_frames=2, budget=None))
    session.ingest(moving_square_frames(2), [0.0, 1.0])
    text = stats_text(session.stats())
    assert "budget none (keeps everything)" in text and "None" not in text
    line = next(l for l in text.splitlines() if l.startswith("last chunk"))
    import re

    assert re.fullmatch(r"last chunk  prefill \d+(\.\d)? ms · compress \d+(\.\d)? ms", line), line


def test_memory_timeline_counts_a_per_head_layer_once():
    """A layer keeping a set per KV head (infinipot profile=reference): each head holds all of unit
    0 and half of unit 1, then head 1 has a token of unit 2 where head 0 has one of unit 1 — shares
    are per head (3 of 2 × 4 tokens of unit 1), not summed over the heads."""
    from types import SimpleNamespace

    shared = video_meta([0, 0, 0, 0, 1, 1])
    per_head = shared.expand(2)
    per_head = type(shared)(*(t.clone() for t in per_head._fields()))
    per_head.frame[1, 5] = 2
    session = SimpleNamespace(
        units_seen=2, unit_times=[0.0, 2.0], tokens_per_unit=4, adapter=SimpleNamespace(frames_per_unit=2),
        config=SimpleNamespace(fps=1.0, chunk_frames=2),
        cache=SimpleNamespace(num_layers=1, meta=lambda layer: per_head, stream_layers=[SimpleNamespace(meta=per_head)]),
        policy=SimpleNamespace(layer_groups=lambda n: {"all": [0]}),
    )
    assert memory_map(session).shares == [{0: 1.0, 1: 3 / 8, 2: 1 / 8}]
