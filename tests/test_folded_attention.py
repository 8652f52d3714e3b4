"""Pseudo-query attention folded into a chunk's prefill equals the separate pass and the eager
reference, per layer, on both model families (Qwen2.5-VL with M-RoPE, LLaVA-OneVision), and
compression keeps exactly the same tokens whichever way the attention was measured."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hermes_cli.engine import pseudo_query
from hermes_cli.engine.cache import KIND_VIDEO
from hermes_cli.engine.prefill import prefill
from hermes_cli.engine.pseudo_query import additive, prefill_measuring, texts_mask
from hermes_cli.engine.session import Session, SessionConfig
from hermes_cli.models.attention import row_attention
from policies import make_policy
from policies.hermes import HermesPolicy
from tests.conftest import moving_square_frames

TOL = 1e-5
TEXTS = {"mixed": "Describe the current scene in detail; Summarize the video.", "global": "Summarize the video."}


def eager_attention(adapter, cache, texts, start):
    """Today's reference: the full eager forward's weights, averaged over heads and each text's tokens."""
    p, length = cache.prefix_length(), cache.length
    ids = [adapter.tokens(t) for t in texts.values()]
    sizes = [t.shape[0] for t in ids]
    positions = torch.cat([adapter.text_positions(start, n) for n in sizes])
    mask = additive(texts_mask(length, 0, sizes, adapter.device), adapter.dtype)
    mark = cache.mark()
    try:
        _, weights = adapter.forward(adapter.embed(torch.cat(ids)), positions, cache, attentions=True,
                                     attention_mask=mask)
    finally:
        cache.rollback(mark)
    out, offset = {}, 0
    for name, n in zip(texts, sizes, strict=True):
        out[name] = [w[0, :, offset : offset + n].float().mean(dim=(0, 1))[p:length] for w in weights]
        offset += n
    return out


def session_for(adapter, budget=100_000, policy="hermes"):
    return Session(adapter, make_policy(policy), SessionConfig(chunk_frames=4, budget=budget, repetition_penalty=1.0,
                                                                    pseudo_query="forward"))


def test_texts_mask_hides_pseudo_queries_from_the_chunk_and_texts_from_each_other():
    m = texts_mask(cached=2, chunk=2, sizes=[2, 1], device="cpu")[0, 0].int()
    assert m.tolist() == [
        # cache  chunk  text a  text b
        [1, 1,   1, 0,   0, 0,   0],
        [1, 1,   1, 1,   0, 0,   0],
        [1, 1,   1, 1,   1, 0,   0],
        [1, 1,   1, 1,   1, 1,   0],
        [1, 1,   1, 1,   0, 0,   1],
    ]


def test_row_attention_is_the_grouped_softmax_mean_on_a_hand_made_case():
    query = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]])  # (1, H=2, r=1, D=2), both heads on one key head
    key = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]]])  # (1, Hkv=1, K=3, D=2)
    mask = torch.tensor([True, True, False]).view(1, 1, 1, 3)
    got = row_attention(query, key, mask, 1.0, (0, 3))
    e = torch.e
    head0 = torch.tensor([e, 1.0, 0.0]) / (e + 1)
    head1 = torch.tensor([1.0, e, 0.0]) / (e + 1)
    assert torch.allclose(got, (head0 + head1) / 2)
    assert torch.allclose(row_attention(query, key, mask, 1.0, (1, 2)), ((head0 + head1) / 2)[1:2])


@pytest.mark.parametrize("additive", [False, True])
def test_row_attention_in_blocks_of_rows_equals_all_rows_at_once(additive, monkeypatch):
    """Rows scored a few at a time (a tiny SCORE_BLOCK_BYTES) give the same mean as all at once."""
    import hermes_cli.models.attention as attention

    g = torch.Generator().manual_seed(1)
    query, key = torch.randn(1, 6, 7, 4, generator=g), torch.randn(1, 2, 9, 4, generator=g)
    allowed = torch.rand(1, 1, 7, 9, generator=g) > 0.3
    allowed[..., 0] = True  # every row sees something
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min) if additive else allowed
    whole = row_attention(query, key, mask, 0.5, (2, 8))
    monkeypatch.setattr(attention, "SCORE_BLOCK_BYTES", 6 * 9 * 4 * 2)  # two rows per block
    assert attention.rows_per_block(6, 9) == 2
    assert torch.allclose(row_attention(query, key, mask, 0.5, (2, 8)), whole, atol=1e-7)
    expected = torch.softmax((query.view(1, 2, 3, 7, 4) @ key.transpose(-1, -2)[:, :, None]) * 0.5
                             + torch.where(allowed, 0.0, float("-inf"))[:, :, None], dim=-1)
    assert torch.allclose(whole, expected[0, ..., 2:8].mean(dim=(0, 1, 2)), atol=1e-6)


@pytest.mark.parametrize("family", ["qwen", "llava"])
def test_folded_equals_separate_and_eager_per_layer(family, tiny_qwen, tiny_llava):
    adapter = tiny_qwen if family == "qwen" else tiny_llava
    session = session_for(adapter)
    session.ingest(moving_square_frames(4), [0.0, 1.0, 2.0, 3.0])
    cache = session.cache
    chunk = adapter.encode(moving_square_frames(4, seed=5), session.units_seen)
    where = session.positions.for_chunk(chunk, session.units_seen, bounded=True)
    layers = {"mixed": [1, 2, 3], "global": [7, 8, 9]}
    before = cache.mark()

    prefill(adapter, cache, chunk.embeds, where, KIND_VIDEO, chunk)
    plain = [(l.stored_keys().clone(), l.stored_values().clone(), l.meta) for l in cache.stream_layers]
    start = session.positions.next()
    separate = pseudo_query.measure(adapter, cache, TEXTS, start, "forward", layers)
    everywhere = pseudo_query.measure(adapter, cache, TEXTS, start, "forward")
    eager = eager_attention(adapter, cache, TEXTS, start)
    cache.rollback(before)

    fold_start = max(session.positions.next(), int(where.max()) + 1)
    assert fold_start == start  # after the prefix and chunk, on every axis (M-RoPE included)
    folded = prefill_measuring(adapter, cache, chunk, where, TEXTS, fold_start, layers)

    for name in TEXTS:
        for layer in range(adapter.num_layers):
            reference = eager[name][layer]
            assert torch.allclose(everywhere[name][layer], reference, atol=TOL, rtol=0)
            if layer in layers[name]:
                assert folded[name][layer].shape == reference.shape
                assert torch.allclose(folded[name][layer], reference, atol=TOL, rtol=0), (name, layer)
                assert torch.allclose(separate[name][layer], reference, atol=TOL, rtol=0), (name, layer)
            else:  # nothing computed where no role reads it
                assert folded[name][layer] is None and separate[name][layer] is None
    # the pseudo-queries left no trace: the cache is that of a plain prefill of the chunk
    for layer, (keys, values, meta) in zip(cache.stream_layers, plain, strict=True):
        assert layer.length == keys.shape[2]
        assert torch.allclose(layer.stored_keys(), keys, atol=TOL, rtol=0)
        assert torch.allclose(layer.stored_values(), values, atol=TOL, rtol=0)
        assert torch.equal(layer.meta.token_id, meta.token_id) and torch.equal(layer.meta.positions, meta.positions)
    assert cache.next_id == plain[0][2].token_id.max() + 1


def kept_tokens(session):
    return [session.cache.meta(l).token_id.tolist() for l in range(session.cache.num_layers)]


@pytest.mark.parametrize("family", ["qwen", "llava"])
def test_compression_keeps_the_same_tokens_folded_separate_or_eager(family, tiny_qwen, tiny_llava, monkeypatch):
    adapter = tiny_qwen if family == "qwen" else tiny_llava
    per_chunk = adapter.encode(moving_square_frames(4), 0).embeds.shape[1]  # tokens a 4-frame chunk adds
    budget = per_chunk + per_chunk // 2
    histories, reports = {}, {}
    for way in ("folded", "separate", "eager"):
        session = session_for(adapter, budget)
        if way != "folded":  # the same plan, measured after the prefill instead of inside it
            plan = pseudo_query.plan
            monkeypatch.setattr(pseudo_query, "plan",
                                lambda *a, plan=plan, **k: dataclasses.replace(plan(*a, **k), fold=False))
        if way == "eager":
            monkeypatch.setattr(pseudo_query, "measure", lambda a, c, t, s, mode, layers=None:
                                eager_attention(a, c, t, s))
        kept, chunks = [], []
        for start in range(0, 20, 4):
            frames = moving_square_frames(4, seed=start)
            chunks += session.ingest(frames, [float(start + i) for i in range(4)])
            kept.append(kept_tokens(session))
            if start == 8:  # a question in between: the pseudo-queries then carry the last turn
                session.answer("What now?", max_new_tokens=2)
        histories[way], reports[way] = kept, chunks
        monkeypatch.undo()
    assert histories["folded"] == histories["separate"] == histories["eager"]
    folded = reports["folded"]
    assert [r.compressed for r in folded] == [False, True, True, True, True]  # from the second chunk on
    assert [r.folded for r in folded] == [r.compressed for r in folded]
    assert all(r.pseudo_query_ms == 0 for r in folded)
    assert not any(r.folded for r in reports["separate"])
    assert all(r.pseudo_query_ms > 0 for r in reports["separate"] if r.compressed)


def test_hermes_reads_attention_only_where_its_roles_need_it():
    layers = HermesPolicy().attention_layers(10)
    assert layers == {"mixed": [1, 2, 3, 4, 5, 6], "global": [7, 8, 9]}
    assert make_policy("fifo").attention_layers(10) == {}


def test_a_failed_folded_prefill_leaves_the_cache_as_it_was(tiny_llava, monkeypatch):
    session = session_for(tiny_llava)
    session.ingest(moving_square_frames(4), [0.0, 1.0, 2.0, 3.0])
    cache = session.cache
    before = (cache.mark(), [l.length for l in cache.stream_layers])
    chunk = tiny_llava.encode(moving_square_frames(4, seed=1), session.units_seen)
    where = session.positions.for_chunk(chunk, session.units_seen, bounded=True)
    calls = {"n": 0}
    original = type(cache).update

    def failing_update(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(cache), "update", failing_update)
    with pytest.raises(RuntimeError, match="boom"):
        prefill_measuring(tiny_llava, cache, chunk, where, TEXTS, int(where.max()) + 1)
    assert (cache.mark(), [l.length for l in cache.stream_layers]) == before
