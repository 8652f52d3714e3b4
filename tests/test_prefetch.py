"""Frames decoded ahead in a thread: same order, errors where they happened, bounded, stoppable, overlapped."""

from __future__ import annotations

import threading
import time

import pytest

from hermes_cli.app.prefetch import prefetched


def test_same_items_in_order():
    assert list(prefetched(iter(range(50)), 4)) == list(range(50))
    assert list(prefetched(range(5), 0)) == list(range(5))


def test_a_source_error_is_raised_after_the_items_before_it():
    def source():
        yield 1
        yield 2
        raise ValueError("broken file")

    got = []
    with pytest.raises(ValueError, match="broken file"):
        for item in prefetched(source(), 3):
            got.append(item)
    assert got == [1, 2]


def test_it_never_runs_more_than_depth_ahead_and_stops_when_closed():
    produced = []

    def source():
        for i in range(1000):
            produced.append(i)
            yield i

    stream = prefetched(source(), 3)
    assert next(stream) == 0
    time.sleep(0.2)
    assert len(produced) <= 1 + 3 + 1  # the consumed one, the queue, one waiting to be queued
    stream.close()
    time.sleep(0.1)
    count = len(produced)
    time.sleep(0.1)
    assert len(produced) == count
    assert not any(t.name == "hermes-prefetch" and t.is_alive() for t in threading.enumerate())


def test_decoding_overlaps_the_consumer():
    def slow_source():
        for i in range(8):
            time.sleep(0.04)  # "decoding"
            yield i

    t0 = time.perf_counter()
    for _ in prefetched(slow_source(), 4):
        time.sleep(0.04)  # "prefill"
    overlapped = time.perf_counter() - t0
    assert overlapped < 0.55  # sequential would take 8 × 0.08 = 0.64 s; overlapped ≈ 0.36 s


def test_run_stream_prefetch_keeps_question_timing(tiny_llava):
    """With frames decoded ahead, a question is still asked after exactly the frames up to its time."""
    from types import SimpleNamespace

    from hermes_cli.app.streaming import TimedQuestion, run_stream
    from hermes_cli.engine.session import Session, SessionConfig
    from policies import make_policy
    from tests.conftest import moving_square_frames

    images = moving_square_frames(10)
    frames = [SimpleNamespace(image=images[i], timestamp=float(i)) for i in range(10)]
    session = Session(tiny_llava, make_policy("fifo"), SessionConfig(chunk_frames=4, budget=100, max_new_tokens=2))
    answers = run_stream(session, iter(frames), [TimedQuestion("now?", 5.0), TimedQuestion("end?")], prefetch=4)
    assert [a.answer.frames_seen for a in answers] == [6, 10]
