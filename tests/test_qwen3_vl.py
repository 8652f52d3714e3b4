"""Qwen3-VL (dense and MoE) streamed chunk by chunk equals the model's own one-shot forward.

The reference is the official pipeline end to end: the processor's prompt for the whole video
(its own ``<t seconds>`` markers from the frame times), its pixel values, and the model's own
``forward`` — which embeds, scatters the cells, adds DeepStack and computes positions with its
own ``get_rope_index``. Nothing of the adapter is used to build it.
"""

from __future__ import annotations

import pytest
import torch
from transformers.video_utils import VideoMetadata

from hermes_cli.engine.pseudo_query import approx_attention
from hermes_cli.engine.session import Session, SessionConfig
from hermes_cli.models.chat import conversation
from hermes_cli.models.loading import load_model
from hermes_cli.models.qwen3_vl import patch_timestamps, timestamp_text
from tests.conftest import moving_square_frames

FRAMES = 8
FPS = 2.0  # frame i at i / 2 s: timestamps 0.2, 1.2, … (two frames averaged per patch)


@pytest.fixture(scope="module", params=["tiny-qwen3-vl", "tiny-qwen3-vl-moe"])
def qwen3(request):
    return load_model(request.param, device="cpu", dtype="fp32")


def stream(adapter, frames, chunk, times=None, **config):
    session = Session(adapter, config=SessionConfig(chunk_frames=chunk, budget=None, repetition_penalty=1.0,
                                                    fps=FPS, **config))
    session.ingest(frames, times if times is not None else [i / FPS for i in range(len(frames))])
    session.flush()
    return session


def processor_inputs(adapter, frames, question, system_prompt, times=None):
    """The processor's own inputs for the whole video, its frames at ``times`` (default i / FPS)."""
    indices = list(range(len(frames))) if times is None else None
    fps = FPS
    if times is not None:  # arbitrary times: as frame indices of a 1000 fps clock
        fps, indices = 1000.0, [round(t * 1000) for t in times]
    text = adapter.processor.apply_chat_template(
        conversation(question, [], system_prompt), add_generation_prompt=True, tokenize=False
    )
    metadata = VideoMetadata(total_num_frames=len(frames), fps=fps, frames_indices=indices)
    return adapter.processor(text=[text], videos=[frames], video_metadata=[metadata], do_sample_frames=False,
                             cap_pixels_per_frame=True, return_tensors="pt")


def one_shot_logits(adapter, inputs, answer_ids):
    """Logits of one uncached forward of the model (its own positions and DeepStack) over prompt · answer."""
    extra = torch.tensor([answer_ids], dtype=torch.long)
    ids = torch.cat([inputs["input_ids"], extra], dim=1)
    types = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(extra)], dim=1)
    with torch.inference_mode():
        out = adapter.model(input_ids=ids, mm_token_type_ids=types, pixel_values_videos=inputs["pixel_values_videos"],
                            video_grid_thw=inputs["video_grid_thw"], use_cache=False)
    return out.logits[0].float(), ids[0], types


def streamed_sequence(session, question):
    """Ids and positions of prefix · video held in the cache · question, as the session laid them out."""
    adapter = session.adapter
    prefix = adapter.tokens(adapter.prefix_text(session.config.system_prompt))
    return prefix, adapter.tokens(adapter.question_text(question, [], session.config.system_prompt))


@pytest.mark.parametrize("chunk", [2, 4, 8])
def test_streamed_answer_equals_the_models_own_forward(qwen3, chunk):
    frames = moving_square_frames(FRAMES)
    session = stream(qwen3, frames, chunk)
    answer = session.answer("What is happening in the video?", max_new_tokens=6, record_logits=True)
    inputs = processor_inputs(qwen3, frames, answer.question, session.config.system_prompt)
    logits, ids, types = one_shot_logits(qwen3, inputs, answer.tokens)

    # The same tokens: the stream's prefix, chunks and question are the processor's prompt.
    prefix, question = streamed_sequence(session, answer.question)
    chunks = [qwen3.encode(frames[i : i + chunk], i // 2, times=[(i + j) / FPS for j in range(chunk)])
              for i in range(0, FRAMES, chunk)]
    streamed_ids = torch.cat([prefix, *(c.input_ids for c in chunks), question])
    assert torch.equal(streamed_ids, inputs["input_ids"][0])
    stamps = [s for c in chunks for s in c.timestamps]
    assert stamps == patch_timestamps([i / FPS for i in range(FRAMES)], 2) == [0.25, 1.25, 2.25, 3.25]
    assert timestamp_text(stamps[0]) == "<0.2 seconds>"  # the processor's format, rounded half to even

    # The same positions: the cache's equal the model's own get_rope_index for this video.
    expected, _ = qwen3.model.model.get_rope_index(ids.unsqueeze(0), mm_token_type_ids=types,
                                                   video_grid_thw=inputs["video_grid_thw"])
    held = session.cache.meta(0).positions
    assert torch.equal(held.T, expected[:, 0, : held.shape[0]])
    assert session.positions.next() == int(expected[:, 0, held.shape[0]].max())

    first = ids.shape[0] - len(answer.tokens) - 1
    worst = max(float(torch.max(torch.abs(s - logits[first + k]))) for k, s in enumerate(answer.step_logits))
    assert worst <= 1e-5, worst
    assert logits[first : first + len(answer.tokens)].argmax(-1).tolist() == answer.tokens
    if len(answer.step_logits) > len(answer.tokens):  # stopped on an end-of-turn token
        assert int(logits[first + len(answer.tokens)].argmax()) in qwen3.eos_token_ids


def test_timestamps_are_those_of_the_frames_actually_sampled(qwen3):
    """Irregular frame times (a variable-rate source): the markers follow them, as the processor's do."""
    frames = moving_square_frames(8)
    times = [0.0, 0.4, 1.5, 1.9, 3.0, 3.1, 7.2, 8.0]
    session = stream(qwen3, frames, 4, times=times)
    inputs = processor_inputs(qwen3, frames, "When?", session.config.system_prompt, times=times)
    text = qwen3.tokenizer.decode(inputs["input_ids"][0])
    for stamp in ("<0.2 seconds>", "<1.7 seconds>", "<3.0 seconds>", "<7.6 seconds>"):
        assert stamp in text
    prefix, question = streamed_sequence(session, "When?")
    chunks = [qwen3.encode(frames[i : i + 4], i // 2, times=times[i : i + 4]) for i in (0, 4)]
    assert torch.equal(torch.cat([prefix, *(c.input_ids for c in chunks), question]), inputs["input_ids"][0])
    held = session.cache.meta(0).positions
    assert held.shape[0] == prefix.shape[0] + sum(c.input_ids.shape[0] for c in chunks)


def test_deepstack_reaches_the_prefill(qwen3):
    """Without DeepStack the streamed logits differ: the features are really injected per chunk."""
    frames = moving_square_frames(4)
    with_ds = stream(qwen3, frames, 2).answer("What?", max_new_tokens=1, record_logits=True).step_logits[0]
    original = qwen3.model.model.visual.deepstack_visual_indexes
    qwen3.model.model.visual.deepstack_visual_indexes = []
    try:
        without = stream(qwen3, frames, 2).answer("What?", max_new_tokens=1, record_logits=True).step_logits[0]
    finally:
        qwen3.model.model.visual.deepstack_visual_indexes = original
    assert torch.max(torch.abs(with_ds - without)) > 1e-3


def test_text_tokens_of_a_patch_belong_to_its_unit(qwen3):
    """Timestamp, vision start and end tokens carry their patch's unit, off the cell grid."""
    chunk = qwen3.encode(moving_square_frames(4), 5, times=[10.0, 10.5, 11.0, 11.5])
    text = chunk.row < 0
    assert torch.equal(chunk.input_ids != qwen3.video_token_id, text)
    assert torch.equal(torch.unique(chunk.unit), torch.tensor([5, 6]))
    cells = chunk.layout[0][1] * chunk.layout[0][2]
    assert bool((chunk.patch[text] >= cells).all()) and bool((chunk.patch[~text] < cells).all())
    first = chunk.unit == 5  # the first patch's tokens come first, timestamp then cells then end
    assert bool(first[: int(first.sum())].all())
    assert qwen3.tokenizer.decode(chunk.input_ids[: chunk.layout[0][0]]) == "<10.2 seconds><|vision_start|>"


# -- re-indexing ------------------------------------------------------------------------------------
LIMIT = 256


def test_reindex_rotates_keys_like_a_forward_at_the_new_positions(qwen3):
    """Every layer's cached keys moved by the rotary delta (interleaved M-RoPE, read from the
    model) equal, at layer 0, a fresh prefill of the same chunks at the new positions."""
    from hermes_cli.positions.layout import compact_positions

    assert qwen3.rotary.interleaved and qwen3.rotary.mrope_section == (4, 2, 2)
    frames = moving_square_frames(8)
    session = stream(qwen3, frames, 4)
    p = session.cache.prefix_length()
    old = session.cache.meta(0).positions[p:].clone()
    new = compact_positions(old, p)  # dense ranks per axis: the cells' h/w gaps and text steps close
    assert not torch.equal(old, new)
    for layer in range(session.cache.num_layers):
        session.cache.reposition(layer, new, qwen3.rotary)
    fresh = Session(qwen3, config=SessionConfig(chunk_frames=4, budget=None, fps=FPS))
    start = 0
    for i in (0, 4):
        chunk = qwen3.encode(frames[i : i + 4], i // 2, times=[(i + j) / FPS for j in range(4)])
        n = chunk.embeds.shape[1]
        qwen3.forward(chunk.embeds, new[start : start + n], fresh.cache)
        start += n
    moved = session.cache.stream_layers[0].stored_keys()[0, :, p:]
    expected = fresh.cache.stream_layers[0].stored_keys()[0, :, p:]
    assert float(torch.max(torch.abs(moved - expected)) / expected.abs().max()) < 1e-4


@pytest.fixture(scope="module", params=["tiny-qwen3-vl", "tiny-qwen3-vl-moe"])
def short_qwen3(request):
    return load_model(request.param, device="cpu", dtype="fp32", max_positions=LIMIT)


@pytest.mark.parametrize("mode", ["lazy", "eager"])
def test_a_stream_past_the_position_limit_keeps_answering(short_qwen3, mode):
    from policies import make_policy

    session = Session(short_qwen3, make_policy("fifo"),
                      SessionConfig(chunk_frames=4, budget=120, reindex=mode, max_new_tokens=3, fps=FPS))
    answers = []
    for start in range(0, 96, 8):
        session.ingest(moving_square_frames(8, seed=start), [(start + i) / FPS for i in range(8)])
        answers.append(session.answer("what now?", record_logits=True))
    stats = session.stats().positions
    # 48 patches of 12 timestamp/start tokens, 12 cells (3×4) and an end: 17 positions each
    assert 3 * LIMIT < 48 * 17
    nxt = stats.next if isinstance(stats.next, int) else max(stats.next)
    assert nxt < LIMIT and stats.limit == LIMIT
    assert stats.reindex_count >= 1
    if mode == "eager":
        assert stats.reindex_count == session.compressions
    for answer in answers:
        assert answer.tokens and all(torch.isfinite(logits).all() for logits in answer.step_logits)
    for layer in range(session.cache.num_layers):  # the prefix never moves
        prefix = session.cache.meta(layer).positions[: session.cache.prefix_length()]
        assert torch.equal(prefix[:, 0], torch.arange(prefix.shape[0]))


# -- policies end to end -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full", "fifo", "sink", "uniform", "infinipot", "hermes"])
def test_every_policy_keeps_a_two_minute_stream_under_budget(two_minutes, policy):
    """The same end-to-end check as for the other families, through the CLI on tiny Qwen3-VL."""
    import json

    from typer.testing import CliRunner

    from hermes_cli.cli.main import app

    result = CliRunner().invoke(app, ["watch", two_minutes, "--model", "tiny-qwen3-vl", "--policy", policy,
                                      "--budget", "512", "--ask", "What changed?", "--max-new-tokens", "2", "--json"])
    assert result.exit_code == 0, result.output
    (record,) = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    cache = record["cache"]
    assert record["frames_seen"] == 120
    assert len(set(cache["tokens_per_layer"])) == 1
    if policy == "full":  # 60 patches of 4×5 cells, each with its timestamp, start and end tokens
        assert cache["budget"] is None and max(cache["video_tokens_per_layer"]) > 60 * 20
    else:
        assert cache["budget"] == 512 and cache["compressions"] >= 1
        assert max(cache["stream_tokens_per_layer"]) <= 512
        assert max(cache["video_tokens_per_layer"]) <= 512
    assert record["prefill_ms_last_chunk"] > 0


# -- full-size architectures -----------------------------------------------------------------------------
@pytest.mark.parametrize("name, billions", [("qwen3-vl-2b", 2.1), ("qwen3-vl-4b", 4.4), ("qwen3-vl-8b", 8.8)])
def test_full_size_configs_build_the_real_architecture(name, billions):
    """The shipped configs build Qwen3-VL (on the meta device: no memory) of the published size,
    and the text-only estimate agrees with the built language model."""
    from hermes_cli.models.archs import arch_config
    from hermes_cli.models.qwen3_vl import full_size_model
    from tests.model_sizes import parameter_estimate

    config, _, cls = full_size_model(arch_config(name))
    with torch.device("meta"):
        model = cls(config)
    total = sum(p.numel() for p in model.parameters())
    text = sum(p.numel() for p in model.model.language_model.parameters())
    text += 0 if config.tie_word_embeddings else model.lm_head.weight.numel()
    assert total == pytest.approx(billions * 1e9, rel=0.05)
    assert parameter_estimate(name) == text
    assert config.text_config.rope_parameters["mrope_interleaved"]


def test_synthetic_encode_has_the_real_layout(qwen3):
    """Benchmarks without the vision tower get encode's exact token layout (and DeepStack shapes)."""
    frames = moving_square_frames(4, size=(90, 120))
    real = qwen3.encode(frames, 6)
    fake = qwen3.synthetic_encode(4, 6, (90, 120))
    assert fake.embeds.shape == real.embeds.shape
    for name in ("unit", "patch", "row", "col", "input_ids"):
        assert torch.equal(getattr(fake, name), getattr(real, name)), name
    assert [d.shape for d in fake.deepstack] == [d.shape for d in real.deepstack]


@pytest.mark.parametrize("pseudo_query", ["forward", "approx"])
def test_hermes_runs_unchanged_on_qwen3(qwen3, pseudo_query):
    """HERMES's layer split and pseudo-queries (true forward, or the reference's shortcut through
    Qwen3's query norm) keep the budget and its summary token on Qwen3-VL."""
    from policies import make_policy

    session = Session(qwen3, make_policy("hermes"),
                      SessionConfig(chunk_frames=4, budget=80, fps=FPS, pseudo_query=pseudo_query, max_new_tokens=2))
    for start in range(0, 24, 8):
        session.ingest(moving_square_frames(8, seed=start), [(start + i) / FPS for i in range(8)])
        session.answer("what now?")
    stats = session.stats().cache
    assert session.compressions >= 2
    assert max(stats.stream_tokens_per_layer) <= 80
    assert len(set(stats.tokens_per_layer)) == 1
    approx = approx_attention(qwen3, qwen3.embed(qwen3.tokens("what?")), qwen3.text_positions(500, 3),
                              session.cache.held_keys())
    assert len(approx) == qwen3.num_layers
    assert all(torch.allclose(w.sum(-1), torch.ones(())) for w in approx)


def test_the_default_model_on_a_gpu_considers_qwen3_vl(monkeypatch):
    from hermes_cli.models import registry as models

    monkeypatch.delenv("HERMES_MODEL", raising=False)
    present: set[str] = set()
    monkeypatch.setattr(models, "locally_present", lambda name: name in present)
    for gib, expected in ((80, "Qwen/Qwen3-VL-8B-Instruct"), (16, "Qwen/Qwen3-VL-4B-Instruct"),
                          (8, "Qwen/Qwen3-VL-2B-Instruct"), (4, "llava-hf/llava-onevision-qwen2-0.5b-ov-hf")):
        monkeypatch.setattr(models, "gpu_free_gib", lambda gib=gib: float(gib))
        assert models.default_model()[0] == expected
    present.add("Qwen/Qwen2.5-VL-7B-Instruct")  # weights already here are preferred over a download
    monkeypatch.setattr(models, "gpu_free_gib", lambda: 40.0)
    assert models.default_model()[0] == "Qwen/Qwen2.5-VL-7B-Instruct"
    present.add("Qwen/Qwen3-VL-8B-Instruct")
    assert models.default_model()[0] == "Qwen/Qwen3-VL-8B-Instruct"
    monkeypatch.setattr(models, "gpu_free_gib", lambda: None)
    assert models.default_model() == ("llava-hf/llava-onevision-qwen2-0.5b-ov-hf", "no GPU")
    monkeypatch.setenv("HERMES_MODEL", "tiny")
    assert models.default_model() == ("tiny", "from HERMES_MODEL")


# -- --device auto ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, policy, pseudo_query", [
    ("tiny-qwen3-vl", "hermes", "approx"),
    pytest.param("tiny-qwen3-vl", "hermes", "forward", marks=pytest.mark.slow),
    pytest.param("tiny-qwen3-vl-moe", "fifo", "forward", marks=pytest.mark.slow),
])
def test_device_auto_with_offload_answers_like_one_device(name, policy, pseudo_query):
    """A max_memory that fits only part of the model on the CPU sends the rest to disk (accelerate's
    device_map="auto"); the stream compresses, re-indexes and answers exactly as on one device."""
    from policies import make_policy

    spread = load_model(name, device="auto", dtype="fp32", max_memory={"cpu": 1_200_000}, max_positions=LIMIT)
    assert set(spread.device_map.values()) == {"cpu", "disk"} and spread.device == torch.device("cpu")
    single = load_model(name, device="cpu", dtype="fp32", max_positions=LIMIT)

    def run(adapter):
        session = Session(adapter, make_policy(policy), SessionConfig(
            chunk_frames=4, budget=100, fps=FPS, max_new_tokens=3, pseudo_query=pseudo_query, reindex="eager"))
        answers = []
        for start in range(0, 32, 8):
            session.ingest(moving_square_frames(8, seed=start), [(start + i) / FPS for i in range(8)])
            answers.append(session.answer("what now?", record_logits=True))
        return session, answers

    one, expected = run(single)
    two, got = run(spread)
    assert one.compressions >= 2 and two.positions.reindex_count == one.positions.reindex_count >= 2
    assert [a.tokens for a in got] == [a.tokens for a in expected]
    for a, b in zip(got, expected):
        for x, y in zip(a.step_logits, b.step_logits):
            assert torch.max(torch.abs(x - y)) <= 1e-6
    for layer in range(one.cache.num_layers):
        assert torch.equal(two.cache.meta(layer).positions, one.cache.meta(layer).positions)


def test_max_memory_is_read_from_the_environment(monkeypatch):
    from hermes_cli.models.placement import (
        devices_used,
        main_device,
        max_memory_from_env,
        parse_max_memory,
    )

    assert parse_max_memory("0=70GiB, 1=70GiB,cpu=200GiB") == {0: "70GiB", 1: "70GiB", "cpu": "200GiB"}
    assert parse_max_memory("cpu=1200000") == {"cpu": 1200000}
    with pytest.raises(ValueError, match="DEVICE=SIZE"):
        parse_max_memory("cpu")
    monkeypatch.setenv("HERMES_MAX_MEMORY", "cpu=2MB")
    assert max_memory_from_env() == {"cpu": "2MB"}
    layout = {"a": 1, "b": 0, "c": "cpu", "d": "disk"}
    assert main_device(layout) == torch.device("cuda", 0)
    assert devices_used(layout) == ["cuda:1", "cuda:0", "cpu", "disk"]
    assert main_device({"a": "cpu", "b": "disk"}) == torch.device("cpu")


def test_an_odd_tail_is_padded_as_the_processor_pads_it(qwen3):
    """7 frames: the last patch repeats the last frame and its time, in the stream as in the processor."""
    frames = moving_square_frames(7)
    session = stream(qwen3, frames, 4)
    answer = session.answer("What?", max_new_tokens=3, record_logits=True)
    inputs = processor_inputs(qwen3, frames, answer.question, session.config.system_prompt)
    assert "<3.0 seconds>" in qwen3.tokenizer.decode(inputs["input_ids"][0])  # frames 6 and 6 (padding): 3.0 s
    logits, ids, _ = one_shot_logits(qwen3, inputs, answer.tokens)
    held = session.cache.meta(0).positions.shape[0]
    _, question = streamed_sequence(session, answer.question)
    assert ids.shape[0] == held + question.shape[0] + len(answer.tokens)
    first = ids.shape[0] - len(answer.tokens) - 1
    for step, streamed in enumerate(answer.step_logits):
        assert torch.max(torch.abs(streamed - logits[first + step])) <= 1e-5


def test_a_template_that_wraps_the_video_streams_the_trained_layout(qwen3):
    """With the official template's ``<|vision_start|><|video_pad|><|vision_end|>`` the stream is the
    original processor's layout (the group replaced by the per-patch blocks), the same tokens as
    with a bare placeholder — not transformers 5.24's blocks inside an extra start/end pair."""
    from hermes_cli.models.qwen3_vl import Qwen3VLAdapter
    from hermes_cli.models.tiny import chat_template

    bare = qwen3.processor
    wrapped = type(bare)(image_processor=bare.image_processor, tokenizer=bare.tokenizer,
                         video_processor=bare.video_processor,
                         chat_template=chat_template("<|vision_start|><|video_pad|><|vision_end|>"))
    adapter = Qwen3VLAdapter(qwen3.model, wrapped, name="wrapped")
    for a in (adapter, qwen3):
        assert not a.prefix_text("sys").endswith("<|vision_start|>")
    assert adapter.prefix_text("sys") == qwen3.prefix_text("sys")
    assert adapter.question_text("Why?", []) == qwen3.question_text("Why?", [])
    frames = moving_square_frames(4)
    reference = processor_inputs(qwen3, frames, "Why?", "sys")["input_ids"][0]  # bare: the trained layout
    stream_ids = torch.cat([adapter.tokens(adapter.prefix_text("sys")),
                            adapter.encode(frames, 0, times=[i / FPS for i in range(4)]).input_ids,
                            adapter.tokens(adapter.question_text("Why?", [], "sys"))])
    assert torch.equal(stream_ids, reference)


def test_max_pixels_caps_each_frame(qwen3):
    """--max-pixels is per frame whatever the chunk length (the processor budgets the whole chunk)."""
    cells = {}
    for n in (2, 8):
        qwen3.max_pixels = 64 * 64
        try:
            chunk = qwen3.encode(moving_square_frames(n, size=(240, 320)), 0)
        finally:
            qwen3.max_pixels = None
        cells[n] = {(rows * cols) for _, rows, cols in chunk.layout}
    full = qwen3.encode(moving_square_frames(2, size=(240, 320)), 0).layout[0]
    assert cells[2] == cells[8] and max(cells[2]) * 32 * 32 <= 64 * 64 < full[1] * full[2] * 32 * 32
