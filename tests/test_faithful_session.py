"""Session-side behaviours of the papers / official code: plain-rank compaction (Eq. 11),
repetition penalty over generated tokens only, pseudo-queries that follow earlier answers while
the prompt carries no history (the official evaluation protocol)."""

from __future__ import annotations

import torch

import hermes_cli.engine.decoding as decoding_module
from hermes_cli.engine.session import Session, SessionConfig
from policies import make_policy
from tests.conftest import moving_square_frames


def test_eager_compaction_uses_the_plain_rank_on_every_axis_and_the_clock_continues(tiny_qwen):
    session = Session(tiny_qwen, make_policy("fifo"), SessionConfig(chunk_frames=4, budget=48, reindex="eager"))
    session.ingest(moving_square_frames(16), [float(i) for i in range(16)])
    assert session.positions.reindex_count == session.compressions >= 1
    p = session.cache.prefix_length()
    positions = session.cache.meta(0).positions[p:]
    for axis in range(3):
        distinct = torch.unique(positions[:, axis])
        assert torch.equal(distinct, p + torch.arange(len(distinct)))  # offset + dense rank, step 1
    t = torch.unique(positions[:, 0])
    chunk = tiny_qwen.encode(moving_square_frames(4), session.units_seen)
    nxt = tiny_qwen.chunk_positions(chunk, session.positions.clock, session.positions.next())
    assert int(nxt[0, 0]) == int(t[-1]) + 1  # the next unit right after the compacted ones


def test_repetition_penalty_covers_generated_tokens_only_unless_asked(tiny_qwen, monkeypatch):
    seen_at_first_step = {}
    real = decoding_module.penalised

    def spy(logits, seen, penalty):
        seen_at_first_step.setdefault(len(seen_at_first_step), list(seen))
        return real(logits, seen, penalty)

    monkeypatch.setattr(decoding_module, "penalised", spy)
    for penalise_prompt in (False, True):
        seen_at_first_step.clear()
        session = Session(tiny_qwen, make_policy("full"), SessionConfig(chunk_frames=2, penalise_prompt=penalise_prompt))
        session.ingest(moving_square_frames(2), [0.0, 1.0])
        answer = session.answer("What is there?", max_new_tokens=3)
        prompt = tiny_qwen.tokens(tiny_qwen.question_text("What is there?", [], session.config.system_prompt)).tolist()
        assert seen_at_first_step[0] == (prompt if penalise_prompt else [])
        if len(answer.tokens) >= 1 and 1 in seen_at_first_step:
            assert seen_at_first_step[1][-1] == answer.tokens[0]


def test_pseudo_queries_follow_earlier_answers_while_the_prompt_has_no_history(tiny_qwen, monkeypatch):
    prompts = []
    real = tiny_qwen.question_text

    def spy(question, history, system_prompt=None):
        prompts.append(list(history))
        return real(question, history, system_prompt)

    monkeypatch.setattr(tiny_qwen, "question_text", spy)
    session = Session(tiny_qwen, make_policy("hermes"), SessionConfig(chunk_frames=2, budget=400, history=False))
    session.ingest(moving_square_frames(2), [0.0, 1.0])
    first = session.answer("What moves?", max_new_tokens=2)
    session.answer("Where is it?", max_new_tokens=2)
    assert len(prompts) >= 2 and all(h == [] for h in prompts)  # each question answered on its own
    assert session.history[0] == ("What moves?", first.text)  # ... but remembered for the pseudo-queries
    assert "Question: Where is it? Answer:" in session.policy.pseudo_queries(tuple(session.history))["global"]
    off = Session(tiny_qwen, make_policy("hermes"),
                  SessionConfig(chunk_frames=2, budget=400, history=False, pseudo_query_history=False))
    off.ingest(moving_square_frames(2), [0.0, 1.0])
    off.answer("What moves?", max_new_tokens=2)
    assert off.history == []
