"""Position re-indexing in a live session: lazy, eager and off, on both model families."""

from __future__ import annotations

import pytest
import torch

from hermes_cli.engine.session import PositionLimitError, Session, SessionConfig
from hermes_cli.models.loading import load_model
from policies import make_policy
from tests.conftest import moving_square_frames
from tests.test_engine import one_shot_logits, stream

LIMIT = 256


@pytest.fixture(scope="module", params=["tiny", "tiny-llava-onevision"])
def short_model(request):
    """A tiny model whose rotary positions end at LIMIT."""
    return load_model(request.param, device="cpu", dtype="fp32", max_positions=LIMIT)


def long_stream(adapter, reindex, frames=96, budget=48):
    session = Session(adapter, make_policy("fifo"),
                      SessionConfig(chunk_frames=4, budget=budget, reindex=reindex, max_new_tokens=3))
    answers = []
    for start in range(0, frames, 8):
        session.ingest(moving_square_frames(8, seed=start), [float(start + i) for i in range(8)])
        answers.append(session.answer("what now?", record_logits=True))
    return session, answers


@pytest.mark.parametrize("mode", ["lazy", "eager"])
def test_long_stream_keeps_answering_below_the_limit(short_model, mode):
    session, answers = long_stream(short_model, mode)
    stats = session.stats().positions
    video_positions = 96 // short_model.frames_per_unit * 12  # far more positions than LIMIT
    assert video_positions > 2 * LIMIT or short_model.position_axes == 1
    nxt = stats.next if isinstance(stats.next, int) else max(stats.next)
    assert nxt < LIMIT and stats.limit == LIMIT
    for answer in answers:
        assert all(torch.isfinite(logits).all() for logits in answer.step_logits)
    if mode == "lazy":
        assert stats.reindex_count >= 1
    else:
        assert stats.reindex_count == session.compressions > 0
    for layer in range(session.cache.num_layers):  # the prefix never moves
        prefix = session.cache.meta(layer).positions[: session.cache.prefix_length()]
        assert torch.equal(prefix[:, 0], torch.arange(prefix.shape[0]))


def test_off_stops_at_the_limit_with_a_clear_message(short_model):
    with pytest.raises(PositionLimitError, match=r"position limit \(256\).*--reindex lazy"):
        long_stream(short_model, "off", frames=400)


def test_eager_without_eviction_keeps_the_one_shot_equivalence(adapter):
    """Nothing evicted, positions compacted (1-D: unchanged; M-RoPE: the temporal step collapses):
    streamed logits equal one uncached forward at the compacted positions."""
    frames = moving_square_frames(8)
    session = stream(adapter, frames, 4, reindex="eager", reindex_spacing="interval")
    session.positions.reindex(session.units_seen)
    assert session.positions.reindex_count == 1
    answer = session.answer("What is happening?", max_new_tokens=4, record_logits=True)
    prompt = adapter.tokens(adapter.question_text(answer.question, [], session.config.system_prompt))
    logits, ids = one_shot_logits(adapter, session, frames, 4, prompt, answer.tokens)
    first = ids.shape[0] - len(answer.tokens) - 1
    for step, streamed in enumerate(answer.step_logits):
        assert torch.max(torch.abs(streamed - logits[first + step])) <= 1e-4


def test_reindex_rotates_keys_like_a_forward_at_the_new_positions(tiny_qwen):
    """Layer-0 keys after moving every stream token equal a fresh prefill at the new positions."""
    from hermes_cli.positions.layout import compact_positions

    session = stream(tiny_qwen, moving_square_frames(8), 4)
    p = session.cache.prefix_length()
    old = session.cache.meta(0).positions[p:].clone()
    new = compact_positions(old, p)  # step 1: the temporal spacing (4 per unit at 1 fps) collapses
    assert not torch.equal(old, new)
    for layer in range(session.cache.num_layers):
        session.cache.reposition(layer, new, tiny_qwen.rotary)
    fresh = Session(tiny_qwen, config=SessionConfig(chunk_frames=4, budget=None))
    chunks = [tiny_qwen.encode(moving_square_frames(8)[i : i + 4], i // 2) for i in (0, 4)]
    for chunk, (a, b) in zip(chunks, ((0, 24), (24, 48))):
        fresh.adapter.forward(chunk.embeds, new[a:b], fresh.cache)
    moved = session.cache.stream_layers[0].stored_keys()[0, :, p:]
    expected = fresh.cache.stream_layers[0].stored_keys()[0, :, p:]
    scale = expected.abs().max()
    assert torch.max(torch.abs(moved - expected)) <= 1e-4 * scale


def test_compaction_keeps_the_temporal_spacing_and_the_clock_continues(tiny_qwen):
    """After fifo evicts the oldest units, eager compaction closes the gap in steps of the
    temporal interval, and the next chunk continues one interval after the last unit."""
    session = Session(tiny_qwen, make_policy("fifo"),
                      SessionConfig(chunk_frames=4, budget=48, reindex="eager", reindex_spacing="interval"))
    session.ingest(moving_square_frames(16), [float(i) for i in range(16)])
    assert session.positions.reindex_count == session.compressions >= 1
    p = session.cache.prefix_length()
    t = torch.unique(session.cache.meta(0).positions[p:, 0])
    interval = session.positions.clock.interval
    assert interval == 4.0 and torch.equal(t, p + (torch.arange(len(t)) * interval).long())
    chunk = tiny_qwen.encode(moving_square_frames(4), session.units_seen)
    nxt = tiny_qwen.chunk_positions(chunk, session.positions.clock, session.positions.next())
    assert int(nxt[0, 0]) == int(t[-1]) + 4


def test_full_policy_past_the_limit_says_to_use_a_budget(short_model):
    session = Session(short_model, make_policy("full"), SessionConfig(chunk_frames=4, budget=None, reindex_spacing="interval"))
    with pytest.raises(PositionLimitError, match="keeps every token: use one with a budget"):
        for start in range(0, 400, 8):
            session.ingest(moving_square_frames(8, seed=start), [float(start + i) for i in range(8)])
