"""Position re-indexing in a live session: lazy, eager and off, on both model families."""

from __future__ import annotations

import pytest
import torch

from hermes_cli.models import load_model
from hermes_cli.session import PositionLimitError, Session, SessionConfig
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
    stats = session.stats()["positions"]
    video_positions = 96 // short_model.frames_per_unit * 12  # far more positions than LIMIT
    assert video_positions > 2 * LIMIT or short_model.position_axes == 1
    nxt = stats["next"] if isinstance(stats["next"], int) else max(stats["next"])
    assert nxt < LIMIT and stats["limit"] == LIMIT
    for answer in answers:
        assert all(torch.isfinite(logits).all() for logits in answer.step_logits)
    if mode == "lazy":
        assert stats["reindex_count"] >= 1
    else:
        assert stats["reindex_count"] == session.compressions > 0
    for layer in range(session.cache.num_layers):  # the prefix never moves
        prefix = session.cache.meta(layer).positions[: session.cache.prefix_length()]
        assert torch.equal(prefix[:, 0], torch.arange(prefix.shape[0]))


def test_off_stops_at_the_limit_with_a_clear_message(short_model):
    with pytest.raises(PositionLimitError, match=r"position limit \(256\).*--reindex lazy"):
        long_stream(short_model, "off", frames=400)


def test_eager_without_eviction_keeps_the_one_shot_equivalence(tiny_llava):
    """With nothing evicted, 1-D compaction is the identity: streamed logits still match."""
    frames = moving_square_frames(8)
    session = stream(tiny_llava, frames, 4, reindex="eager")
    session.reindex()
    answer = session.answer("What is happening?", max_new_tokens=4, record_logits=True)
    prompt = tiny_llava.tokens(tiny_llava.question_text(answer.question, [], session.config.system_prompt))
    logits, ids = one_shot_logits(tiny_llava, session, frames, 4, prompt, answer.tokens)
    first = ids.shape[0] - len(answer.tokens) - 1
    for step, streamed in enumerate(answer.step_logits):
        assert torch.max(torch.abs(streamed - logits[first + step])) <= 1e-4


def test_reindex_rotates_keys_like_a_forward_at_the_new_positions(tiny_qwen):
    """Layer-0 keys after compaction equal a fresh prefill of the same tokens at the new positions."""
    session = stream(tiny_qwen, moving_square_frames(8), 4)
    old = session.cache.meta(0).positions.clone()
    session.reindex()
    new = session.cache.meta(0).positions
    assert not torch.equal(old, new)  # the temporal step (4 per unit at 1 fps) collapses to 1
    assert int(new[:, 0].max()) < int(old[:, 0].max())
    fresh = Session(tiny_qwen, config=SessionConfig(chunk_frames=4, budget=None))
    chunks = [tiny_qwen.encode(moving_square_frames(8)[i : i + 4], i // 2) for i in (0, 4)]
    p = fresh.cache.prefix_length()
    for chunk, (a, b) in zip(chunks, ((p, p + 24), (p + 24, p + 48))):
        fresh.adapter.forward(chunk.embeds, new[a:b], fresh.cache)
    moved = session.cache.stream_layers[0].stored_keys()[0, :, p:]
    expected = fresh.cache.stream_layers[0].stored_keys()[0, :, p:]
    scale = expected.abs().max()
    assert torch.max(torch.abs(moved - expected)) <= 1e-4 * scale
