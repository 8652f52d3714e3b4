"""The --notify probe: p(yes) from the two reply tokens' logits, over the memory, which it leaves exactly as it was."""

from __future__ import annotations

import pytest
import torch

from hermes_cli.engine.probe import (
    PROBE_TEMPLATE,
    describe,
    p_yes_from_logits,
    prepare_probe,
    probe_question,
    reply_token,
    yes_probabilities,
    yes_probability,
)
from hermes_cli.engine.session import Session, SessionConfig
from policies import make_policy
from tests.conftest import moving_square_frames


def test_p_yes_from_a_hand_built_logit_vector():
    logits = torch.zeros(50)
    logits[7], logits[11] = 2.0, -1.0  # "Yes" at 7, "No" at 11
    logits[0] = 100.0  # the most likely token overall: no part of p(yes)
    expected = 1 / (1 + torch.exp(torch.tensor(-3.0, dtype=torch.float64)))
    assert p_yes_from_logits(logits, 7, 11) == pytest.approx(float(expected), abs=1e-12)
    assert p_yes_from_logits(logits, 11, 7) == pytest.approx(1 - float(expected), abs=1e-12)
    logits[11] = 2.0
    assert p_yes_from_logits(logits, 7, 11) == 0.5
    logits[7], logits[11] = 1e4, -1e4  # no overflow, no NaN
    assert p_yes_from_logits(logits, 7, 11) == 1.0 and p_yes_from_logits(logits, 11, 7) == 0.0


def test_question_text():
    assert probe_question("a person enters?") == PROBE_TEMPLATE.format(condition="a person enters")
    with pytest.raises(ValueError, match="needs a condition"):
        probe_question(" ? ")


def test_reply_tokens_of_each_tiny_family(adapter):
    probe = prepare_probe(adapter, "a person enters", "You are a helpful assistant.")
    # the tiny vocabularies split "Yes" and "No": the reply's first token stands for each
    assert "Yes".startswith(adapter.decode([probe.yes_id])) and "No".startswith(adapter.decode([probe.no_id]))
    assert probe.yes_id != probe.no_id
    text = adapter.decode(probe.ids.tolist())
    assert "Answer Yes or No." in text and text.endswith("assistant\n")  # the assistant header closes it
    assert prepare_probe(adapter, "a person enters", "You are a helpful assistant.") is probe  # prepared once


def test_reply_token_is_the_whole_word_in_a_vocabulary_that_has_it():
    from types import SimpleNamespace

    from hermes_cli.models.tiny import QWEN_SPECIALS, make_tokenizer

    tok = make_tokenizer(QWEN_SPECIALS, vocab_size=2048)  # the corpus's "yes" is a token
    fake = SimpleNamespace(name="t", tokens=lambda s: torch.tensor(tok(s, add_special_tokens=False)["input_ids"]))
    prompt = "<|im_start|>assistant\n"
    assert tok.decode([reply_token(fake, prompt, "yes")]) == "yes"  # one token in this vocabulary
    assert tok.decode([reply_token(fake, prompt, "no")]) == "n"  # two ("n", "o"): the first stands for it
    # a leading-space word is another token: the context decides which one a reply starts with
    assert reply_token(fake, prompt, "yes") != reply_token(fake, "x", " yes")


def snapshot(session: Session) -> dict:
    cache = session.cache
    layers = []
    for l in range(cache.num_layers):
        layer = cache.stream_layers[l]
        meta = cache.meta(l)
        layers.append([layer.stored_keys().clone(), layer.stored_values().clone(),
                       *(t.clone() for t in (meta.kind, meta.token_id, meta.frame, meta.patch, meta.positions))])
    p = session.positions
    return {"layers": layers, "length": cache.length, "next_id": cache.next_id, "next": p.next_per_axis(),
            "clock": p.clock, "reindex_count": p.reindex_count, "history": list(session.history),
            "frames_seen": session.frames_seen, "stream_time_s": session.stream_time_s}


def assert_same(a: dict, b: dict) -> None:
    for la, lb in zip(a["layers"], b["layers"], strict=True):
        for ta, tb in zip(la, lb, strict=True):
            assert ta.dtype == tb.dtype and ta.shape == tb.shape and torch.equal(ta, tb)
    assert {k: v for k, v in a.items() if k != "layers"} == {k: v for k, v in b.items() if k != "layers"}


def streamed(adapter, frames: int = 12, policy: tuple = ("fifo", {})) -> Session:
    """A session over ``frames`` frames under a budget small enough to evict (gaps in the positions)."""
    name, options = policy
    session = Session(adapter, make_policy(name, **options), SessionConfig(chunk_frames=4, budget=30, repetition_penalty=1.0))
    images = moving_square_frames(frames)
    session.ingest(list(images), [i * 0.5 for i in range(frames)])
    session.flush()
    return session


POLICIES = [("fifo", {}), ("hermes", {}), ("infinipot", {"profile": "reference"})]  # the last keeps a set per head


@pytest.mark.parametrize("policy", POLICIES, ids=[p[0] for p in POLICIES])
def test_probe_leaves_the_memory_exactly_as_it_was(adapter, policy):
    session = streamed(adapter, policy=policy)
    assert session.compressions > 0
    assert session.cache.meta(1).per_head == (policy[0] == "infinipot")
    before = snapshot(session)
    p = yes_probability(session, "a coloured square is visible")
    assert 0.0 <= p <= 1.0
    assert_same(before, snapshot(session))
    both = yes_probabilities(session, ["a coloured square is visible", "the screen is black"])
    assert_same(before, snapshot(session))
    assert yes_probability(session, "a coloured square is visible") == p  # the same memory, the same p
    # the memory still answers exactly as before the probes
    assert both["a coloured square is visible"] == pytest.approx(p, abs=1e-5)


def test_probe_is_the_reply_tokens_softmax_of_a_plain_question(adapter):
    """p(yes) is what the question's own forward gives for the two reply tokens (and the probes of
    several conditions in one forward each equal their probe alone)."""
    from hermes_cli.engine.cache import KIND_TEXT
    from hermes_cli.engine.prefill import prefill

    session = streamed(adapter)
    conditions = ["a coloured square is visible", "the screen is black", "someone waves"]
    together = yes_probabilities(session, conditions)
    for c in conditions:
        probe = prepare_probe(adapter, c, session.config.system_prompt)
        mark = session.cache.mark()
        hidden = prefill(adapter, session.cache, adapter.embed(probe.ids), session.positions.text(len(probe.ids)), KIND_TEXT)
        logits = adapter.logits(hidden[:, -1])[0]
        session.cache.rollback(mark)
        alone = p_yes_from_logits(logits, probe.yes_id, probe.no_id)
        assert yes_probability(session, c) == pytest.approx(alone, abs=1e-6)
        assert together[c] == pytest.approx(alone, abs=1e-5)


def test_verbatim_question_is_asked_as_it_is(tiny_llava):
    question = "Is the square red? Answer only with Yes or No."
    probe = prepare_probe(tiny_llava, question, verbatim=True)
    text = tiny_llava.decode(probe.ids.tolist())
    assert question in text and "Looking at the latest frames" not in text
    session = streamed(tiny_llava)
    before = snapshot(session)
    p = yes_probability(session, question, verbatim=True)
    assert 0.0 <= p <= 1.0 and p != yes_probability(session, question)  # not the templated probe
    assert_same(before, snapshot(session))


def test_probe_needs_frames_and_no_open_answer(tiny_qwen):
    from hermes_cli.engine.session import AnswerOpenError

    session = Session(tiny_qwen, config=SessionConfig(chunk_frames=2, budget=None))
    with pytest.raises(ValueError, match="after a chunk"):
        yes_probability(session, "x")
    session.ingest(list(moving_square_frames(2)), [0.0, 0.5])
    stream = session.ask("What is happening?")
    iterator = iter(stream)
    next(iterator, None)
    if session._open_answer is not None:  # an answer longer than one piece is open now
        with pytest.raises(AnswerOpenError):
            yes_probability(session, "x")
    stream.close()
    assert 0.0 <= yes_probability(session, "x") <= 1.0
    empty = Session(tiny_qwen, config=SessionConfig(chunk_frames=2, budget=None))
    assert describe(empty, "x").no_frames  # before any frame: the session's fixed reply


def test_describe_from_the_memory_leaves_it_and_the_conversation(adapter):
    session = streamed(adapter, frames=8)
    session.config = SessionConfig(chunk_frames=4, budget=30, repetition_penalty=1.0, history=True)
    before = snapshot(session)
    answer = describe(session, "a coloured square is visible", max_new_tokens=5)
    assert 1 <= len(answer.tokens) <= 5 and answer.text
    assert answer.frames_seen == 8 and answer.question.startswith("Looking at the latest frames: a coloured square")
    assert_same(before, snapshot(session))  # neither the memory nor the history changed
    again = describe(session, "a coloured square is visible", max_new_tokens=5)
    assert again.tokens == answer.tokens


def test_notify_step_fires_describes_and_leaves_the_memory(tiny_qwen):
    import time

    from hermes_cli.engine.notify import Notifier, NotifySettings
    from hermes_cli.engine.probe import notify_step

    session = streamed(tiny_qwen, frames=8)
    before = snapshot(session)
    notifier = Notifier(["a person enters", "the kettle boils"], NotifySettings(threshold=0.0))
    chunk_done = time.perf_counter()
    first = notify_step(session, notifier, since=chunk_done, max_new_tokens=4)
    assert [e.notification for e in first.events] == ["a person enters", "the kettle boils"]  # threshold 0: at once
    for e in first.events:
        record = e.to_json()
        assert set(record) == {"notification", "stream_time_s", "frames_seen", "p_yes", "text", "latency_ms"}
        assert e.frames_seen == 8 and e.stream_time_s == session.stream_time_s
        assert e.p_yes == first.p_yes[e.notification] and e.latency_ms > 0
    assert first.events[1].latency_ms >= first.events[0].latency_ms >= first.probe_ms > 0
    assert_same(before, snapshot(session))
    second = notify_step(session, notifier, max_new_tokens=4)
    assert second.events == [] and second.p_yes == first.p_yes  # the same memory: the same p, no new edge


def test_notify_step_polls_due_conditions_and_describes_by_their_question(tiny_qwen):
    from hermes_cli.engine.notify import Condition, Notifier, NotifySettings
    from hermes_cli.engine.probe import notify_step

    session = streamed(tiny_qwen, frames=8)
    before = snapshot(session)
    now = session.stream_time_s
    later = Condition("the screen turns blue", question="What colour is the screen?", start_s=now + 1.0)
    asked = Condition("a coloured square is visible", question="What colour is the screen?", stop_s=now)
    notifier = Notifier([later, asked], NotifySettings(threshold=0.0))
    step = notify_step(session, notifier, max_new_tokens=4)
    assert list(step.p_yes) == ["a coloured square is visible"]  # the other is not due yet: not probed
    assert [e.notification for e in step.events] == ["a coloured square is visible"]
    own = describe(session, "a coloured square is visible", max_new_tokens=4, question="What colour is the screen?")
    assert step.events[0].text == own.text.strip()  # described by its own question
    assert notifier.states["the screen turns blue"].probes == 0
    assert_same(before, snapshot(session))
    idle = Notifier([later], NotifySettings(threshold=0.0))
    assert notify_step(session, idle).p_yes == {}  # nothing due: no forward, nothing fires


def test_probe_on_qwen3_vl_leaves_the_memory():
    """Qwen3-VL (text timestamps, DeepStack: the probe's tokens are no visual cells) as well."""
    from hermes_cli.models.loading import load_model

    adapter = load_model("tiny-qwen3-vl", device="cpu", dtype="fp32")
    session = streamed(adapter, frames=8)
    before = snapshot(session)
    both = yes_probabilities(session, ["a coloured square is visible", "the screen is black"])
    assert all(0.0 <= p <= 1.0 for p in both.values())
    assert yes_probability(session, "the screen is black") == pytest.approx(both["the screen is black"], abs=1e-5)
    assert_same(before, snapshot(session))
