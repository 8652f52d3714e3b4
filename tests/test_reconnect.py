"""Live sources that drop: reconnection on 127.0.0.1 over TCP and HTTP (docs/sources.md).

A live MPEG-TS server streams frames 0…19 (2 s at 10 fps), then goes away (closes the
connection and stops listening); a second server on the same port comes up a moment later
with frames 100…119 whose pts start again at 10 s, as a restarted server's would. The source
must deliver both runs in order, with a clock that runs on across the gap, count the gap,
and, when the second server is gone for good, end with one SourceError line once
`reconnect_s` has passed.
"""

from __future__ import annotations

import threading
import time

import pytest

from hermes_cli.sources import SourceError, open_source
from tests.media import read_index, serve_live_mpegts

FPS = 10
RUN_S = 2.0
DOWN_S = 1.0  # the server is away this long between the runs
RECONNECT_S = 3.0


DONE_AT: dict[int, float] = {}  # restarting server thread id → when its second run ended


def servers_done_at(thread: threading.Thread) -> float:
    return DONE_AT[thread.ident]


def restarting_server(protocol: str) -> tuple[str, threading.Thread]:
    """Serve frames 0…19, go down for DOWN_S, then serve frames 100…119 on the same port."""
    url, first = serve_live_mpegts(RUN_S, FPS, protocol=protocol)
    port = int(url.split(":")[2].split("/")[0])

    def restart() -> None:
        first.join(30)
        time.sleep(DOWN_S)
        _, second = serve_live_mpegts(RUN_S, FPS, protocol=protocol, port=port, first_index=100)
        second.join(30)
        DONE_AT[threading.get_ident()] = time.monotonic()

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    return url, thread


@pytest.mark.slow  # real time: 2 s + gap + 2 s + the 3 s window
@pytest.mark.parametrize("protocol", ["tcp", "http"])
def test_a_restarted_server_continues_the_stream_with_the_gap_counted(protocol):
    url, servers = restarting_server(protocol)
    frames = []
    with open_source(url, FPS, timeout_s=2, reconnect_s=RECONNECT_S) as source:
        assert source.is_live and source.reconnect_s == RECONNECT_S
        with pytest.raises(SourceError) as error:
            for frame in source:
                frames.append(frame)
                if read_index(frame.image) == 100:  # the first frame after the gap
                    stats_during = (source.stats.gaps, source.stats.reconnecting)
        ended_at = time.monotonic()
        stats = source.stats
    servers.join(10)

    indices = [read_index(f.image) for f in frames]
    assert indices == list(range(20)) + list(range(100, 120)), (error.value, stats)  # both sides, in order
    assert [f.index for f in frames] == list(range(40))
    times = [f.timestamp for f in frames]
    assert times[:20] == pytest.approx([k / 10 for k in range(20)], abs=1e-3)
    gap = times[20] - times[19]
    assert DOWN_S <= gap < DOWN_S + RECONNECT_S + 2  # the clock jumps by the wall-clock gap…
    assert [t - times[20] for t in times[20:]] == pytest.approx([k / 10 for k in range(20)], abs=1e-3)  # …then runs on
    assert stats_during == (1, False)
    assert stats.gaps == 1
    assert stats.gap_s == pytest.approx(gap, abs=1e-6)
    assert stats.frames_lost == round(gap * FPS) - 1
    assert stats.frames_sampled == 40 and stats.frames_dropped == 0
    assert len(stats.warnings) == 1 and "reconnected, a gap of" in stats.warnings[0]
    # one line: why it dropped (a TCP peer closes: the end; FFmpeg's HTTP reports an I/O
    # error when a body of unknown length stops), then that it did not come back
    message = str(error.value)
    assert "\n" not in message
    why = "the stream ended" if protocol == "tcp" else "stream failed (Input/output error)"
    assert message == f"{source.name}: {why} and did not come back within 3 s — check the source and open it again"
    assert ended_at - servers_done_at(servers) < RECONNECT_S + 2.5


def test_a_server_that_stays_down_ends_with_one_line_within_the_window():
    url, server = serve_live_mpegts(1.0, FPS, speed=2)
    frames = []
    with open_source(url, FPS, timeout_s=1, reconnect_s=1.5) as source:
        with pytest.raises(SourceError) as error:
            for frame in source:
                frames.append(frame)
                last_frame_at = time.monotonic()
        failed_after = time.monotonic() - last_frame_at
        assert source.stats.gaps == 0 and not source.stats.reconnecting
    server.join(5)
    assert len(frames) == 10
    assert 1.5 <= failed_after < 1.5 + 1.5  # the window, plus at most one bounded connection try
    assert str(error.value) == f"{url}: the stream ended and did not come back within 1.5 s — check the source and open it again"


def test_without_reconnection_a_live_stream_ends_when_it_ends():
    url, server = serve_live_mpegts(1.0, FPS, speed=2)
    with open_source(url, FPS, timeout_s=2, reconnect_s=0) as source:
        frames = list(source)
        assert source.stats.gaps == 0
    server.join(5)
    assert [read_index(f.image) for f in frames] == list(range(10))


def test_close_during_reconnection_returns_promptly():
    url, server = serve_live_mpegts(0.5, FPS, speed=2)
    source = open_source(url, FPS, timeout_s=1, reconnect_s=30)
    frames = iter(source)
    for _ in range(5):
        next(frames)
    deadline = time.monotonic() + 5
    while not source.stats.reconnecting and time.monotonic() < deadline:
        time.sleep(0.02)
    assert source.stats.reconnecting
    started = time.monotonic()
    source.close()
    assert time.monotonic() - started < 2.5  # one connection try (timeout 1 s) at most
    assert list(frames) == []
    server.join(5)


def test_reconnect_defaults_and_validation(tmp_path):
    from tests.media import make_video

    path = tmp_path / "clip.mp4"
    make_video(path, 1, 10)
    with open_source(str(path), 1) as source:
        assert source.reconnect_s == 0  # files do not reconnect
    with open_source(str(path), 1, live=True) as source:
        assert source.reconnect_s == 0  # nor files played live
    url, server = serve_live_mpegts(0.3, FPS, speed=2)
    with open_source(url, FPS, timeout_s=2) as source:
        assert source.reconnect_s == 30  # network streams do, by default
    server.join(5)
    with pytest.raises(ValueError, match="reconnect_s"):
        open_source(str(path), 1, reconnect_s=-1)


def test_cli_reads_reconnect_and_notes_a_rate_above_the_source(tmp_path, capsys):
    from hermes_cli.cli.console import UserError
    from hermes_cli.cli.factory import open_frames as _open_source
    from tests.media import make_video

    path = tmp_path / "clip.mkv"
    make_video(path, 1, 10)
    source = _open_source(str(path), 40, reconnect="2.5s")
    assert source.reconnect_s == 2.5 and source.effective_fps == 10
    source.close()
    assert "--fps 40 exceeds the video's 10 fps; every frame is used once, so it gives 10 fps" in capsys.readouterr().err
    with pytest.raises(UserError, match="cannot read 'soon'"):
        _open_source(str(path), 1, reconnect="soon")


def test_a_source_that_gives_up_still_gets_its_questions_answered(tiny_llava):
    """The stream ends early with one error, after the questions owed are answered from the memory so far."""
    from hermes_cli.app.streaming import TimedQuestion, run_stream
    from hermes_cli.engine.session import SessionConfig
    from hermes_cli.frames import Frame
    from tests.conftest import moving_square_frames, on_engine

    def frames():
        for i, image in enumerate(moving_square_frames(6)):
            yield Frame(image, float(i), i)
        raise SourceError("tcp://127.0.0.1:1: the stream ended and did not come back within 3 s")

    answered = []
    with on_engine(tiny_llava, "full", SessionConfig(chunk_frames=4, budget=None, max_new_tokens=2)) as stream, \
            pytest.raises(SourceError, match="did not come back"):
        run_stream(stream, frames(), [TimedQuestion("late?", 100.0), TimedQuestion("at the end?")],
                   on_answer=answered.append)
    assert [a.answer.question for a in answered] == ["late?", "at the end?"]
    assert all(not a.answer.no_frames and a.answer.frames_seen == 6 for a in answered)


def test_json_answers_and_the_toolbar_carry_the_gaps():
    from types import SimpleNamespace

    from hermes_cli.cli.watch import answer_record
    from hermes_cli.frames import IterableSource

    source = IterableSource([], name="tcp://x", is_live=True)
    source.stats.gaps, source.stats.gap_s, source.stats.frames_lost, source.stats.frames_dropped = 2, 3.5, 6, 1
    stats = SimpleNamespace(to_json=lambda: {"frames_seen": 3})
    answer = SimpleNamespace(question="q", text="a", no_frames=False, record=lambda: {})
    record = answer_record(SimpleNamespace(answer=answer, stats=stats, asked_at_s=None), source)
    assert record["source"] == {"frames_dropped": 1, "gaps": 2, "gap_s": 3.5, "frames_lost": 6}


def test_the_toolbar_shows_a_live_sources_gaps(tiny_llava):
    from hermes_cli.app.live import Ingestor, toolbar_text
    from hermes_cli.engine.session import SessionConfig
    from hermes_cli.frames import IterableSource
    from tests.conftest import on_engine

    source = IterableSource([], name="tcp://x", is_live=True)
    source.stats.gaps, source.stats.gap_s, source.stats.reconnecting = 1, 4.2, True
    with on_engine(tiny_llava, "full", SessionConfig(chunk_frames=2, budget=None)) as stream:
        ingestor = Ingestor(stream, source, lambda m: None)
        assert "1 gaps (4s) · reconnecting" in toolbar_text(ingestor)
