"""The streaming engine: streamed prefill + cached answers equal one uncached forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hermes_cli.engine.cache import KIND_VIDEO
from hermes_cli.engine.session import Session, SessionConfig
from tests.conftest import moving_square_frames

FRAMES = 8


def stream(adapter, frames, chunk, **config):
    session = Session(adapter, config=SessionConfig(chunk_frames=chunk, budget=None, repetition_penalty=1.0, **config))
    session.ingest(frames, [float(i) for i in range(len(frames))])
    session.flush()
    return session


def one_shot_logits(adapter, session, frames, chunk, prompt_ids, answer_ids):
    """Logits of one uncached forward of the full model over prefix · video · question · answer."""
    model = adapter.model
    prefix = adapter.tokens(adapter.prefix_text(session.config.system_prompt))
    chunks = [adapter.encode(frames[i : i + chunk], 0) for i in range(0, len(frames), chunk)]
    video_ids = torch.cat([c.input_ids for c in chunks])
    ids = torch.cat([prefix, video_ids, prompt_ids, torch.tensor(answer_ids, dtype=torch.long)]).unsqueeze(0)
    positions = session_positions(session, ids.shape[1])
    kwargs = {}
    if adapter.position_axes == 3:
        kwargs["pixel_values_videos"] = torch.cat([c.pixel_values for c in chunks])
        grids = torch.cat([c.grid_thw for c in chunks])
        kwargs["video_grid_thw"] = torch.tensor([[int(grids[:, 0].sum()), int(grids[0, 1]), int(grids[0, 2])]])
        kwargs["position_ids"] = positions.T.unsqueeze(1)
    else:
        kwargs["pixel_values_videos"] = torch.cat([c.pixel_values for c in chunks])
        kwargs["position_ids"] = positions[:, 0].unsqueeze(0)
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False, **kwargs).logits[0].float(), ids[0]


def session_positions(session, total):
    """Positions the session used: the cache's (prefix + video), then text from next_position()."""
    held = session.cache.meta(0).positions
    start = session.positions.next()
    text = session.adapter.text_positions(start, total - held.shape[0])
    return torch.cat([held, text])


@pytest.mark.parametrize("chunk", [2, 4, 8])
def test_streamed_answer_equals_one_uncached_forward(adapter, chunk):
    frames = moving_square_frames(FRAMES)
    session = stream(adapter, frames, chunk)
    answer = session.answer("What is happening in the video?", max_new_tokens=6, record_logits=True)
    history = []
    prompt = adapter.tokens(adapter.question_text(answer.question, history, session.config.system_prompt))
    logits, ids = one_shot_logits(adapter, session, frames, chunk, prompt, answer.tokens)
    first = ids.shape[0] - len(answer.tokens) - 1
    for step, streamed in enumerate(answer.step_logits):
        reference = logits[first + step]
        assert torch.max(torch.abs(streamed - reference)) <= 1e-4, f"step {step}"
    # The same greedy answer: teacher-forced argmax of the one-shot logits reproduces every token.
    greedy = logits[first : first + len(answer.tokens)].argmax(-1).tolist()
    assert greedy == answer.tokens
    if len(answer.step_logits) > len(answer.tokens):  # stopped on an end-of-turn token
        assert int(logits[first + len(answer.tokens)].argmax()) in adapter.eos_token_ids


def test_qwen_stream_positions_equal_get_rope_index(tiny_qwen):
    adapter, frames, chunk = tiny_qwen, moving_square_frames(FRAMES), 2
    session = stream(adapter, frames, chunk)
    prefix = adapter.tokens(adapter.prefix_text(session.config.system_prompt))
    chunks = [adapter.encode(frames[i : i + chunk], 0) for i in range(0, FRAMES, chunk)]
    video = torch.cat([c.input_ids for c in chunks])
    suffix = adapter.tokens(adapter.question_text("Why?", [], session.config.system_prompt))
    ids = torch.cat([prefix, video, suffix]).unsqueeze(0)
    types = (ids == adapter.video_token_id).int() * 2
    grid = torch.tensor([[len(chunks), int(chunks[0].grid_thw[0, 1]), int(chunks[0].grid_thw[0, 2])]])
    expected, _ = adapter.model.model.get_rope_index(
        ids, mm_token_type_ids=types, video_grid_thw=grid,
        second_per_grid_ts=torch.tensor([adapter.frames_per_unit / session.config.fps]),
    )
    streamed = session.cache.meta(0).positions
    n = streamed.shape[0]
    assert torch.equal(streamed.T, expected[:, 0, :n])
    # Text after the video continues from the largest position + 1 on all axes (the layout the
    # model was trained with; transformers 5.24 restarts it at start + max(h, w) instead).
    assert session.positions.next() == int(streamed.max()) + 1


def snapshot(session):
    cache = session.cache
    return [
        (layer.stored_keys().clone(), layer.stored_values().clone(),
         *(t.clone() for t in layer.meta._fields()))
        for layer in cache.stream_layers
    ], cache.next_id


def test_ask_leaves_memory_bit_identical(adapter):
    session = stream(adapter, moving_square_frames(6), 2, history=False)
    before, next_id = snapshot(session)
    first = session.answer("What colour is the square?", max_new_tokens=5)
    after, next_id_after = snapshot(session)
    assert next_id == next_id_after
    for layer_before, layer_after in zip(before, after):
        for a, b in zip(layer_before, layer_after):
            assert torch.equal(a, b)
    second = session.answer("When did the scene change?", max_new_tokens=5)
    alone = stream(adapter, moving_square_frames(6), 2, history=False).answer("When did the scene change?", max_new_tokens=5)
    assert second.tokens == alone.tokens
    assert first.ttft_ms is not None and first.ttft_ms > 0


def test_history_goes_into_the_next_prompt(tiny_qwen):
    session = stream(tiny_qwen, moving_square_frames(4), 2)
    session.answer("one", max_new_tokens=2)
    assert session.history and session.history[0][0] == "one"
    text = tiny_qwen.question_text("two", session.history, session.config.system_prompt)
    assert text.index("one") < text.index("two")


def test_question_before_any_frame_is_answered_as_such(tiny_llava):
    session = Session(tiny_llava, config=SessionConfig(chunk_frames=2, budget=None))
    answer = session.answer("Anything?")
    assert answer.no_frames and "not seen any frames" in answer.text
    assert session.cache.count(KIND_VIDEO) == [0] * tiny_llava.num_layers


def test_stats_report_the_cache(tiny_qwen):
    session = stream(tiny_qwen, moving_square_frames(4), 2)
    stats = session.stats()
    video = stats.cache.video_tokens_per_layer
    assert len(video) == tiny_qwen.num_layers and len(set(video)) == 1 and video[0] > 0
    assert stats.cache.kv_bytes == session.cache.kv_bytes() > 0
    assert stats.frames_seen == 4 and stats.policy == "full" and stats.random_weights
    record = stats.to_json()  # the JSON keeps its fields
    assert record["cache"]["video_tokens_per_layer"] == video and record["positions"]["limit"] == stats.positions.limit
    assert set(record) >= {"stream_time_s", "frames_seen", "units_seen", "units_kept", "cache", "positions",
                           "prefill_ms_last_chunk", "compress_ms_last_chunk", "memory", "model", "random_weights",
                           "policy"}


def test_qwen_rejects_odd_chunks(tiny_qwen):
    with pytest.raises(ValueError, match="multiple of 2"):
        Session(tiny_qwen, config=SessionConfig(chunk_frames=3))


def test_flush_pads_an_odd_tail_for_qwen(tiny_qwen):
    session = Session(tiny_qwen, config=SessionConfig(chunk_frames=4, budget=None))
    session.ingest(moving_square_frames(5), [float(i) for i in range(5)])
    session.flush()
    assert session.units_seen == 3 and session.frames_seen == 5
    assert np.all(np.diff(session.unit_times) > 0)


def test_an_abandoned_answer_still_restores_the_memory(tiny_qwen):
    """Ctrl-C mid-answer closes the generator: the question's tokens leave the cache."""
    session = stream(tiny_qwen, moving_square_frames(4), 2)
    before = session.cache.mark()
    pieces = session.ask("Tell me everything.", max_new_tokens=20)
    next(iter(pieces))
    assert session.cache.length > before.length
    pieces.close()
    assert session.cache.length == before.length and session.history == []
    assert not hasattr(session, "lock")  # one thread drives a session: the engine's


def test_max_pixels_caps_tokens_per_frame_for_qwen(tiny_qwen):
    frames = moving_square_frames(2, size=(240, 320))
    full = tiny_qwen.encode(frames, 0)
    tiny_qwen.max_pixels = 56 * 56
    try:
        capped = tiny_qwen.encode(frames, 0)
    finally:
        tiny_qwen.max_pixels = None
    assert capped.embeds.shape[1] < full.embeds.shape[1]
    assert torch.equal(capped.unit, torch.zeros_like(capped.unit))  # one temporal patch either way


def test_a_chunk_larger_than_the_memory_is_warned_once(tiny_llava):
    from policies import make_policy

    session = Session(tiny_llava, make_policy("fifo"), SessionConfig(chunk_frames=4, budget=10))
    session.ingest(moving_square_frames(12), [float(i) for i in range(12)])
    assert len(session.warnings) == 1 and "17 tokens" in session.warnings[0] and "--chunk" in session.warnings[0]
    roomy = Session(tiny_llava, make_policy("fifo"), SessionConfig(chunk_frames=4, budget=100))
    roomy.ingest(moving_square_frames(4), [float(i) for i in range(4)])
    assert roomy.warnings == []


def test_qwen2_vl_counts_temporal_patches_like_its_get_rope_index():
    """Qwen2-VL shares the adapter; its temporal positions step by 1 per patch, not by time."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor

    from hermes_cli.models.qwen_vl import QwenVLAdapter
    from hermes_cli.models.tiny import build_tiny

    _, processor = build_tiny("tiny")
    ids = processor.tokenizer.convert_tokens_to_ids
    config = Qwen2VLConfig(
        text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, patch_size=14, spatial_merge_size=2,
                           temporal_patch_size=2),
        video_token_id=ids("<|video_pad|>"), image_token_id=ids("<|image_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config).eval()
    adapter = QwenVLAdapter(model, Qwen2VLProcessor(image_processor=processor.image_processor,
                                                   tokenizer=processor.tokenizer,
                                                   video_processor=processor.video_processor,
                                                   chat_template=processor.chat_template), name="tiny-qwen2-vl")
    assert adapter.family == "qwen2-vl"
    frames = moving_square_frames(8)
    session = stream(adapter, frames, 4)
    prefix = adapter.tokens(adapter.prefix_text(session.config.system_prompt))
    chunks = [adapter.encode(frames[i : i + 4], 0) for i in (0, 4)]
    video = torch.cat([c.input_ids for c in chunks])
    sequence = torch.cat([prefix, video]).unsqueeze(0)
    grid = torch.tensor([[4, int(chunks[0].grid_thw[0, 1]), int(chunks[0].grid_thw[0, 2])]])
    expected, _ = model.model.get_rope_index(sequence, mm_token_type_ids=(sequence == adapter.video_token_id).int() * 2,
                                             video_grid_thw=grid)
    assert torch.equal(session.cache.meta(0).positions.T, expected[:, 0])
    answer = session.answer("What?", max_new_tokens=2, record_logits=True)
    assert all(torch.isfinite(l).all() for l in answer.step_logits)
