"""Compression inside the engine: pseudo-query attention, applying choices, budgets end to end."""

from __future__ import annotations

import pytest
import torch

from hermes_cli.engine.cache import KIND_SUMMARY
from hermes_cli.engine.session import Session, SessionConfig
from policies import POLICIES, make_policy
from tests.conftest import moving_square_frames


def attention_of(session, texts):
    """The pseudo-query attention the session's next compression would use."""
    from hermes_cli.engine.pseudo_query import measure

    return measure(session.adapter, session.cache, texts, session.positions.next(),
                                  session.config.pseudo_query)


def session_for(adapter, policy, budget, **config):
    return Session(adapter, make_policy(policy), SessionConfig(chunk_frames=4, budget=budget, repetition_penalty=1.0, **config))


@pytest.mark.parametrize("mode", ["forward", "approx"])
def test_pseudo_query_attention_covers_every_stream_token_and_leaves_no_trace(tiny_qwen, mode):
    session = session_for(tiny_qwen, "hermes", 10_000, pseudo_query=mode)
    session.ingest(moving_square_frames(8), [float(i) for i in range(8)])
    before = session.cache.mark()
    attention = attention_of(session, {"global": "Summarize the video."})
    assert session.cache.mark() == before
    stream = session.cache.stream_counts()[0]
    assert len(attention["global"]) == tiny_qwen.num_layers
    for layer in attention["global"]:
        assert layer.shape == (stream,) and torch.all(layer >= 0) and float(layer.sum()) <= 1 + 1e-5


def test_forward_and_approx_attention_differ(tiny_qwen):
    """The true per-layer attention is not the reference code's embedding shortcut."""
    results = {}
    for mode in ("forward", "approx"):
        session = session_for(tiny_qwen, "hermes", 10_000, pseudo_query=mode)
        session.ingest(moving_square_frames(8), [float(i) for i in range(8)])
        results[mode] = attention_of(session, {"g": "What happened?"})["g"]
    assert torch.allclose(results["forward"][0], results["forward"][0])
    assert not torch.allclose(results["forward"][-1], results["approx"][-1], atol=1e-4)


@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"full"}))
def test_a_budget_larger_than_the_stream_changes_nothing(tiny_llava, policy):
    frames = moving_square_frames(8)
    answers = []
    for name in (policy, "full"):
        session = session_for(tiny_llava, name, 100_000)
        session.ingest(frames, [float(i) for i in range(8)])
        answers.append(session.answer("What is it?", max_new_tokens=3, record_logits=True))
        assert session.compressions == 0
    assert answers[0].tokens == answers[1].tokens
    for a, b in zip(answers[0].step_logits, answers[1].step_logits):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["forward", "approx"])
def test_hermes_in_the_engine_keeps_layers_equal_with_one_deep_summary(tiny_qwen, mode):
    session = Session(tiny_qwen, make_policy("hermes", fold_old_summary=True),
                      SessionConfig(chunk_frames=4, budget=60, repetition_penalty=1.0, pseudo_query=mode))
    for start in range(0, 24, 4):
        session.ingest(moving_square_frames(4, seed=start), [float(start + i) for i in range(4)])
        lengths = {layer.length for layer in session.cache.stream_layers}
        assert len(lengths) == 1
        assert max(session.cache.stream_counts()) <= 60 + 24  # budget + one chunk at most
    assert session.compressions >= 1 and max(session.cache.stream_counts()) <= 60
    summaries = session.cache.count(KIND_SUMMARY)
    deep_from = int(0.7 * tiny_qwen.num_layers)
    assert summaries[deep_from:] == [1] * (tiny_qwen.num_layers - deep_from)
    assert summaries[:deep_from] == [0] * deep_from
    answer = session.answer("What now?", max_new_tokens=2, record_logits=True)
    assert all(torch.isfinite(l).all() for l in answer.step_logits)


def test_infinipot_compresses_to_its_ratio_when_the_cap_is_reached(tiny_llava):
    session = session_for(tiny_llava, "infinipot", 40)
    session.ingest(moving_square_frames(12), [float(i) for i in range(12)])  # 3 chunks of 17 tokens
    assert session.compressions >= 1
    assert max(session.cache.stream_counts()) <= 40


@pytest.mark.parametrize("mode", ["forward", "approx"])
@pytest.mark.parametrize("which", ["qwen", "llava"])
def test_pseudo_queries_side_by_side_equal_separate_passes(tiny_qwen, tiny_llava, which, mode):
    """One masked pass of all pseudo-queries gives each exactly its own pass's attention."""
    adapter = tiny_qwen if which == "qwen" else tiny_llava
    session = session_for(adapter, "hermes", 10_000, pseudo_query=mode)
    session.ingest(moving_square_frames(8), [float(i) for i in range(8)])
    texts = {"mixed": "Describe the scene; summarize the story.", "global": "Summarize the video narrative."}
    together = attention_of(session, texts)
    for name, text in texts.items():
        alone = attention_of(session, {name: text})[name]
        for a, b in zip(together[name], alone):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_side_by_side_texts_mask_shape_and_blocks():
    from hermes_cli.engine.pseudo_query import additive, texts_mask

    mask = additive(texts_mask(3, 0, [2, 2], "cpu"), torch.float32)[0, 0]
    allowed = (mask == 0).int().tolist()
    assert allowed == [
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 1],
    ]


@pytest.mark.parametrize("block", [1 << 30, 1])  # bytes: every row at once, one row at a time
@pytest.mark.parametrize("which", ["qwen", "llava"])
def test_reduced_approx_attention_is_the_mean_of_the_full_weights(tiny_qwen, tiny_llava, which, block, monkeypatch):
    """The batched, reduced approximate pass equals each text's full weights averaged over heads and
    tokens, whether its rows are scored all at once or a few at a time."""
    import hermes_cli.models.attention as attention
    from hermes_cli.engine.pseudo_query import approx_attention

    monkeypatch.setattr(attention, "SCORE_BLOCK_BYTES", block)
    adapter = tiny_qwen if which == "qwen" else tiny_llava
    session = session_for(adapter, "hermes", 10_000)
    session.ingest(moving_square_frames(8), [float(i) for i in range(8)])
    ids = [adapter.tokens("Describe the scene."), adapter.tokens("Summarize the video narrative so far.")]
    start, keys = session.positions.next(), session.cache.held_keys()
    sizes = [t.shape[0] for t in ids]
    embeds = adapter.embed(torch.cat(ids))
    positions = torch.cat([adapter.text_positions(start, n) for n in sizes])
    reduced = approx_attention(adapter, embeds, positions, keys, sizes, reduce=True)
    cached = session.cache.length
    for index, t in enumerate(ids):
        full = approx_attention(adapter, adapter.embed(t), adapter.text_positions(start, t.shape[0]), keys)
        assert all(w.shape == (1, adapter.text_config.num_attention_heads, t.shape[0], cached + t.shape[0]) for w in full)
        for layer, weights in enumerate(full):
            assert torch.allclose(reduced[layer][index], weights[0, :, :, :cached].mean(dim=(0, 1)), atol=1e-7, rtol=1e-5)
