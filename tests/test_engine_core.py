"""The engine core: many streams on one model, each exactly as if it ran alone (issue 20).

Equivalence (streams interleaved on one engine end bit-identical to each run alone), isolation
(a fault in one stream's source, policy or answer leaves the others exact), and the request
semantics (bounded queues, dropping on a live stream, flush before a question, cancel).
"""

from __future__ import annotations

import threading

import pytest
import torch

from hermes_cli.engine.client import StreamFailed, open_stream
from hermes_cli.engine.core import Engine
from hermes_cli.engine.session import Session, SessionConfig
from policies import make_policy
from tests.conftest import moving_square_frames

POLICIES = ["hermes", "infinipot", "full"]
PLAN = {  # per stream: frames, and the frame index before which each question is asked
    0: (12, {5: "What is moving?", 12: "And now?"}),
    1: (10, {4: "Describe the colours.", 10: "What changed?"}),
    2: (8, {8: "Where is the square?"}),
}


def config(policy: str) -> SessionConfig:
    return SessionConfig(chunk_frames=2, budget=None if policy == "full" else 40, max_new_tokens=8)


def memory(session_or_layers):
    layers = session_or_layers.cache.stream_layers
    return [(l.stored_keys().clone(), l.stored_values().clone(), l.meta.token_id.clone(),
             l.meta.positions.clone()) for l in layers]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for la, lb in zip(a, b) for x, y in zip(la, lb))


def run_alone(adapter, i, policy, fault=None):
    n, questions = PLAN[i]
    session = Session(adapter, make_policy(policy), config(policy))
    frames = moving_square_frames(n, seed=10 + i)
    answers = []
    for k in range(n + 1):
        if k in questions:
            session.flush()
            answers.append(session.answer(questions[k]).tokens)
        if k < n:
            session.ingest([frames[k]], [float(k)])
    session.flush()
    return memory(session), answers


def feed(stream, i, answers, errors, source_fault_at=None):
    """A client thread: submit one stream's frames, asking each question at its time."""
    n, questions = PLAN[i]
    frames = moving_square_frames(n, seed=10 + i)
    try:
        for k in range(n + 1):
            if k in questions:
                answers.append(stream.answer(questions[k], flush=True).tokens)
            if k == source_fault_at:
                raise OSError("the camera was unplugged")
            if k < n:
                stream.submit(frames[k], float(k))
        stream.end()
        stream.flush()
    except OSError as exc:  # a source that breaks: the stream ends with the error
        stream.end(str(exc))
        errors.append(str(exc))
    except StreamFailed as exc:
        errors.append(str(exc))


def run_together(adapter, policies, *, max_batch=1, **faults):
    """The streams interleaved on one engine. ``max_batch=1``: open answers take their decode
    steps in turn, each alone — bit-identical to decoding it alone; a batched step computes the
    same greedy tokens in another floating-point order, so a near-tie could pick another token
    (tests/test_batched_decode.py pins that the tokens agree)."""
    with Engine(adapter, max_batch=max_batch) as engine:
        streams = [open_stream(engine, make_policy(p), config(p)) for p in policies]
        for fault in faults.get("setup", []):
            fault(engine, streams)
        answers = [[] for _ in streams]
        errors = [[] for _ in streams]
        threads = [threading.Thread(target=feed, args=(s, i, answers[i], errors[i], faults.get("source", {}).get(i)))
                   for i, s in enumerate(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        mems = [engine.call(s.id, memory) if s.state != "failed" or s.error.startswith("the camera") else None
                for s in streams]
        states = [(s.state, s.error) for s in streams]
    return mems, answers, errors, states


def test_streams_interleaved_on_one_engine_equal_each_alone(adapter):
    alone = [run_alone(adapter, i, p) for i, p in enumerate(POLICIES)]
    mems, answers, errors, states = run_together(adapter, POLICIES)
    assert errors == [[], [], []]
    for i, (mem, ans) in enumerate(alone):
        assert same(mems[i], mem), f"stream {i} ({POLICIES[i]}): memory differs from the stream run alone"
        assert answers[i] == ans, f"stream {i} ({POLICIES[i]}): answers differ"
    assert [s for s, _ in states] == ["ended"] * 3


class FailingPolicy:
    """Wraps a policy; its selection raises on the first compression."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def select(self, state):
        self.calls += 1
        if self.calls == 1:
            raise ValueError("policy bug")
        return self.inner.select(state)


def break_answers(engine, streams):
    """Stream 2's answers raise at their second token (the first decode step: the first token
    comes from the question's own prefill, computed alone, so it is always reached)."""
    def patch(session):
        opener = session.open_answer

        def open_answer(*args, **kwargs):
            opened = opener(*args, **kwargs)
            take, count = opened.decode.take, [0]

            def failing_take(logits):
                count[0] += 1
                if count[0] == 2:
                    raise RuntimeError("decoding bug")
                return take(logits)

            opened.decode.take = failing_take
            return opened

        session.open_answer = open_answer

    engine.call(streams[2].id, patch)


def break_policy(engine, streams):
    engine.call(streams[1].id, lambda session: setattr(session, "policy", FailingPolicy(session.policy)))


def test_a_fault_in_one_stream_leaves_the_others_exact(tiny_qwen):
    policies = ["hermes", "infinipot", "hermes"]
    alone = [run_alone(tiny_qwen, i, p) for i, p in enumerate(policies)]
    # the source of stream 0 breaks after frame 7; stream 1's policy raises; stream 2's answer raises
    mems, answers, errors, states = run_together(tiny_qwen, policies, source={0: 7},
                                                 setup=[break_policy, break_answers])
    assert errors[0] == ["the camera was unplugged"]
    assert states[0] == ("failed", "the camera was unplugged")  # its memory so far still answers
    assert states[1][0] == "failed" and "ValueError: policy bug" in states[1][1]
    assert states[2][0] == "failed" and "RuntimeError: decoding bug" in states[2][1]
    assert len(errors[1]) == 1 and "policy bug" in errors[1][0]
    assert len(errors[2]) == 1 and "decoding bug" in errors[2][0]
    # stream 0 stopped early but what it holds equals the same frames alone
    assert answers[0] == alone[0][1][:1]


def test_the_others_finish_exact_when_one_stream_faults(tiny_llava):
    """The clean streams of a faulty engine equal themselves alone."""
    policies = ["hermes", "infinipot", "full"]
    alone = [run_alone(tiny_llava, i, p) for i, p in enumerate(policies)]
    mems, answers, errors, states = run_together(tiny_llava, policies, setup=[break_policy])
    assert states[1][0] == "failed"
    for i in (0, 2):
        assert same(mems[i], alone[i][0]) and answers[i] == alone[i][1]
        assert states[i] == ("ended", None)


def test_a_live_stream_drops_its_oldest_frames_when_the_engine_is_behind(tiny_qwen):
    with Engine(tiny_qwen) as engine:
        stream = open_stream(engine, make_policy("fifo"), config("fifo"), live=True, queue_frames=3)
        stream.pause()  # the engine takes nothing: the queue fills
        frames = moving_square_frames(8)
        for k in range(8):
            assert stream.submit(frames[k], float(k))
        counts = stream.counts()
        assert counts.frames_dropped == 5 and counts.frames_queued == 3
        stream.resume()
        stream.end()
        stream.flush()
        s = stream.fresh_stats()
        assert s.frames_seen == 3 and s.stream_time_s == 7.0  # the newest three


def test_a_file_stream_waits_for_room_instead_of_dropping(tiny_qwen):
    with Engine(tiny_qwen) as engine:
        stream = open_stream(engine, make_policy("fifo"), config("fifo"), queue_frames=2)
        stream.pause()
        frames = moving_square_frames(4)
        assert stream.submit(frames[0], 0.0) and stream.submit(frames[1], 1.0)
        assert not stream.submit(frames[2], 2.0, block=False)  # full: refused, not dropped
        stream.resume()
        assert stream.submit(frames[2], 2.0)  # waits for room
        stream.flush()
        assert stream.counts().frames_dropped == 0 and stream.fresh_stats().frames_seen == 3


def test_a_question_before_any_frame_gets_the_no_frames_reply(tiny_qwen):
    with Engine(tiny_qwen) as engine:
        stream = open_stream(engine, make_policy("hermes"), config("hermes"))
        answer = stream.answer("What do you see?")
        assert answer.no_frames and "not seen any frames" in answer.text


def test_cancel_mid_answer_restores_the_memory_and_other_streams_go_on(tiny_qwen):
    with Engine(tiny_qwen) as engine:
        a = open_stream(engine, make_policy("hermes"), config("hermes"))
        b = open_stream(engine, make_policy("fifo"), config("fifo"))
        frames = moving_square_frames(6)
        a.ingest(list(frames), [float(t) for t in range(6)])
        b.ingest(list(frames[:4]), [float(t) for t in range(4)])
        before = engine.call(a.id, memory)
        handle = a.ask("Tell me everything.", max_new_tokens=30)
        next(iter(handle))
        handle.close()
        assert same(engine.call(a.id, memory), before)
        assert engine.call(a.id, lambda s: s.history) == []
        assert b.answer("And b?").tokens  # the other stream is unaffected
        assert a.counts().answers_cancelled == 1


def test_closing_a_stream_mid_answer_reports_it_and_spares_the_rest(tiny_qwen):
    with Engine(tiny_qwen) as engine:
        a = open_stream(engine, make_policy("hermes"), config("hermes"))
        b = open_stream(engine, make_policy("hermes"), config("hermes"))
        frames = moving_square_frames(4)
        for s in (a, b):
            s.ingest(list(frames), [float(t) for t in range(4)])
        handle = a.ask("Tell me everything.", max_new_tokens=40)
        next(iter(handle))
        a.close()
        with pytest.raises(StreamFailed, match="closed"):
            _ = handle.answer
        assert b.answer("Still there?").tokens
        assert engine.streams() == [b.id]


def test_a_stopped_engine_refuses_requests(tiny_qwen):
    engine = Engine(tiny_qwen).start()
    stream = open_stream(engine, make_policy("fifo"), config("fifo"))
    engine.stop()
    from hermes_cli.engine.client import EngineStopped

    with pytest.raises(EngineStopped):
        stream.submit(moving_square_frames(1)[0], 0.0)
