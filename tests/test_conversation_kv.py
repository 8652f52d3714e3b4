"""Earlier turns kept as keys and values: the same as prefilling the same tokens again, moved to
follow the stream as it grows, trimmed to whole turns, and dropped when the history changes."""

from __future__ import annotations

import pytest
import torch

from hermes_cli.engine.decoding import greedy_answer
from hermes_cli.engine.records import Answer
from hermes_cli.engine.session import Session, SessionConfig
from policies import make_policy
from tests.conftest import moving_square_frames


def session_for(adapter, **config):
    config = {"chunk_frames": 4, "budget": 1000, "max_new_tokens": 5, "history_tokens": 200,
              "repetition_penalty": 1.0, **config}
    session = Session(adapter, make_policy("fifo"), SessionConfig(**config))
    session.ingest(moving_square_frames(4), [0.0, 1.0, 2.0, 3.0])
    return session


def test_kept_turns_equal_prefilling_the_same_tokens(adapter):
    session = session_for(adapter)
    first = session.answer("What is it?")
    system = session.config.system_prompt
    unfed = session.conversation.kept.unfed  # answer tokens the decoder never fed back
    rest = session.conversation.prompt(adapter, "And now?", session.history, system)
    second = session.answer("And now?", record_logits=True)
    assert second.context_tokens > 0 and second.prompt_tokens == rest.shape[0]
    # the reference: the very same token sequence prefilled at once, on the same memory
    reference = Answer(question="And now?")
    prompt = adapter.tokens(adapter.question_text("What is it?", [], system))
    fed = torch.tensor(first.tokens[: len(first.tokens) - len(unfed)], dtype=torch.long)
    tokens = torch.cat([prompt, fed, rest])
    list(greedy_answer(adapter, session.cache, session.positions, tokens, reference, max_new_tokens=5,
                       repetition_penalty=1.0, record_logits=True))
    assert reference.tokens == second.tokens
    for a, b in zip(reference.step_logits, second.step_logits, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=0)


def test_kept_turns_move_after_the_stream_as_it_grows(tiny_qwen):
    session = session_for(tiny_qwen)
    session.answer("What is it?")
    kept = session.conversation.kept
    old_keys = [k.clone() for k in kept.keys]
    session.ingest(moving_square_frames(4, seed=3), [4.0, 5.0, 6.0, 7.0])
    start = session.positions.next()
    seen = {}

    def spy(mark):
        n = kept.length
        seen["positions"] = session.cache.meta(0).positions[mark.length : mark.length + n].clone()
        seen["keys"] = [l.keys[:, :, mark.length : mark.length + n].clone() for l in session.cache.stream_layers]

    original = session.conversation.capture

    def capture(cache, mark, **kwargs):
        spy(mark)
        original(cache, mark, **kwargs)

    session.conversation.capture = capture
    session.answer("And now?")
    n = kept.length
    expected = torch.arange(start, start + n).unsqueeze(1).expand(n, tiny_qwen.position_axes)
    assert torch.equal(seen["positions"], expected)
    delta = torch.full((n, tiny_qwen.position_axes), start - int(kept.positions[0, 0]))
    assert int(delta[0, 0]) > 0
    for got, old in zip(seen["keys"], old_keys, strict=True):
        assert torch.allclose(got, tiny_qwen.rotary.rotate(old, delta), atol=1e-5)


def test_kept_turns_are_whole_turns_within_the_budget(tiny_llava):
    session = session_for(tiny_llava, history_tokens=80)
    for i in range(10):
        answer = session.answer(f"Question {i}?")
        kept = session.conversation.kept
        assert kept is not None and kept.length <= 80 and kept.length == kept.keys[0].shape[2]
        assert kept.turns == len(session.history) and kept.last_turn == session.history[-1]
        assert answer.context_tokens <= 80
        # trimmed turns are moved back to the stream's next position: no rotation at the next question
        n = kept.length
        assert torch.equal(kept.positions[:, 0], torch.arange(session.positions.next(), session.positions.next() + n))
    assert len(kept.sizes) >= 2  # several whole turns fit


def test_a_cleared_history_is_not_carried(tiny_llava):
    session = session_for(tiny_llava)
    session.answer("What is it?")
    session.answer("And now?")
    session.history.clear()
    answer = session.answer("Anything else?")
    assert answer.context_tokens == 0
    assert session.conversation.kept.turns == 1


@pytest.mark.parametrize("config", [{"history_tokens": 0}, {"history": False}, {"history_kv": False}])
def test_no_kept_turns_when_history_is_off_or_text(tiny_llava, config):
    session = session_for(tiny_llava, **config)
    session.answer("What is it?")
    assert session.conversation is None
