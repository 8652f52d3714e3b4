"""Bounded conversation context: a question's prompt carries earlier turns, newest first, only
up to ``history_tokens`` — so its length (and TTFT) does not grow with the number of questions."""

from __future__ import annotations

import pytest

from hermes_cli.engine.session import Session, SessionConfig
from policies import make_policy
from tests.conftest import moving_square_frames

HISTORY = [(f"question {i}?", f"answer {i} " * (i + 1)) for i in range(6)]


def prompt_length(adapter, question, history, system="sys"):
    return len(adapter.tokens(adapter.question_text(question, history, system)))


@pytest.mark.parametrize("budget", [0, 1, 15, 40, 90, 10_000])
def test_recent_history_keeps_the_newest_whole_turns_that_fit(tiny_llava, budget):
    kept = tiny_llava.recent_history("Now?", HISTORY, "sys", budget)
    assert kept == HISTORY[len(HISTORY) - len(kept):]  # a suffix: the newest turns, in order
    bare = prompt_length(tiny_llava, "Now?", [])
    assert prompt_length(tiny_llava, "Now?", kept) - bare <= budget
    if len(kept) < len(HISTORY):  # one more turn would not fit
        longer = HISTORY[len(HISTORY) - len(kept) - 1:]
        assert prompt_length(tiny_llava, "Now?", longer) - bare > budget
    if budget >= 10_000:
        assert kept == HISTORY
    if budget == 0:
        assert kept == []


@pytest.mark.parametrize("kv", [False, True])
def test_the_context_stops_growing_once_the_history_budget_is_full(tiny_qwen, kv):
    config = SessionConfig(chunk_frames=4, budget=1000, max_new_tokens=6, history_tokens=60, history_kv=kv,
                           repetition_penalty=1.0)
    session = Session(tiny_qwen, make_policy("hermes"), config)
    session.ingest(moving_square_frames(4), [0.0, 1.0, 2.0, 3.0])
    answers = [session.answer("What now?") for _ in range(12)]
    assert answers[0].prompt_tokens == prompt_length(tiny_qwen, "What now?", [], config.system_prompt)
    assert answers[0].context_tokens == 0
    assert len(session.history) == 12  # every turn is remembered; only the context is bounded
    assert all(0 < a.context_tokens <= 60 for a in answers[1:])  # recent turns are carried
    if kv:  # only the new turn is prefilled
        assert max(a.prompt_tokens for a in answers) <= answers[0].prompt_tokens + 12
    else:
        assert max(a.prompt_tokens for a in answers) <= answers[0].prompt_tokens + 60


def test_history_tokens_zero_is_no_history(tiny_qwen):
    config = SessionConfig(chunk_frames=4, budget=1000, max_new_tokens=4, history_tokens=0, repetition_penalty=1.0)
    session = Session(tiny_qwen, make_policy("fifo"), config)
    session.ingest(moving_square_frames(4), [0.0, 1.0, 2.0, 3.0])
    assert len({session.answer("What now?").prompt_tokens for _ in range(3)}) == 1


def test_negative_history_tokens_is_refused():
    with pytest.raises(ValueError, match="--history-tokens"):
        SessionConfig(history_tokens=-1)
