"""Answers open on several streams at once are decoded in one batch: the same greedy tokens as
decoding each alone, and every stream's memory afterwards exactly as before (issue 20)."""

from __future__ import annotations

import pytest
import torch

from hermes_cli.engine.decoding import BatchDecoder
from hermes_cli.engine.session import Session, SessionConfig
from tests.conftest import moving_square_frames

QUESTIONS = ["What is moving?", "Describe the colours.", "Where is the square?", "What happens next?"]


def streams(adapter, b):
    """B streams of different lengths (2..2b+... frames), so the batch has padding."""
    out = []
    for i in range(b):
        s = Session(adapter, config=SessionConfig(chunk_frames=2, budget=None, repetition_penalty=1.1))
        n = 2 * (1 + i % 3)
        s.ingest(moving_square_frames(n, seed=i), [float(t) for t in range(n)])
        s.flush()
        out.append(s)
    return out


def snapshot(session):
    layers = session.cache.stream_layers
    return [(l.stored_keys().clone(), l.stored_values().clone(), l.meta.token_id.clone()) for l in layers], \
        session.cache.next_id


def same_memory(a, b):
    (la, ida), (lb, idb) = a, b
    return ida == idb and all(torch.equal(x, y) for pa, pb in zip(la, lb) for x, y in zip(pa, pb))


def decode_together(adapter, sessions, max_new_tokens):
    opened = [s.open_answer(QUESTIONS[i % len(QUESTIONS)], max_new_tokens=max_new_tokens)
              for i, s in enumerate(sessions)]
    for o in opened:
        o.start()
    batch = BatchDecoder(adapter)
    while active := [o for o in opened if not o.done]:
        batch.step([o.decode for o in active])
    for o in opened:
        o.close()
    return [o.answer for o in opened]


@pytest.mark.parametrize("b", [1, 2, 3, 5, 8])
def test_batched_decode_equals_one_at_a_time(adapter, b):
    alone = streams(adapter, b)
    solo = [s.answer(QUESTIONS[i % len(QUESTIONS)], max_new_tokens=12) for i, s in enumerate(alone)]
    together = streams(adapter, b)
    before = [snapshot(s) for s in together]
    answers = decode_together(adapter, together, 12)
    assert [a.tokens for a in answers] == [a.tokens for a in solo]
    assert all(len(a.tokens) > 0 for a in answers)
    for s, was, a in zip(together, before, answers):
        assert same_memory(snapshot(s), was)  # each memory afterwards exactly as before
        assert s.history == [(a.question, a.text)]


def test_rows_leave_the_batch_at_different_steps(tiny_qwen):
    """Answers of different lengths: rows end (eos or token limit) one by one and the rest go on."""
    sessions = streams(tiny_qwen, 4)
    limits = [3, 9, 5, 12]
    solo_sessions = streams(tiny_qwen, 4)
    solo = [s.answer(QUESTIONS[i], max_new_tokens=n) for i, (s, n) in enumerate(zip(solo_sessions, limits))]
    opened = [s.open_answer(QUESTIONS[i], max_new_tokens=n) for i, (s, n) in enumerate(zip(sessions, limits))]
    for o in opened:
        o.start()
    batch = BatchDecoder(tiny_qwen)
    while active := [o for o in opened if not o.done]:
        batch.step([o.decode for o in active])
    assert [o.answer.tokens for o in opened] == [a.tokens for a in solo]
    for o in opened:
        o.close()


def test_a_row_that_raises_in_a_batched_step_leaves_the_other_rows_exact(tiny_qwen):
    """One answer's own fault mid-batch: it gets the exception, the others' tokens are those of
    decoding each alone (no row steps twice or loses its token)."""
    solo = [s.answer(QUESTIONS[i], max_new_tokens=8) for i, s in enumerate(streams(tiny_qwen, 3))]
    sessions = streams(tiny_qwen, 3)
    opened = [s.open_answer(QUESTIONS[i], max_new_tokens=8) for i, s in enumerate(sessions)]
    for o in opened:
        o.start()
    take, calls = opened[1].decode.take, [0]

    def failing(logits):
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("row 1's bug")
        return take(logits)

    opened[1].decode.take = failing
    batch, failed = BatchDecoder(tiny_qwen), []
    while active := [o for o in opened if not o.done and o not in failed]:
        for o, result in zip(active, batch.step([o.decode for o in active])):
            if isinstance(result, Exception):
                failed.append(o)
    assert failed == [opened[1]]
    assert opened[0].answer.tokens == solo[0].tokens and opened[2].answer.tokens == solo[2].tokens
    for o in opened:
        o.close()
