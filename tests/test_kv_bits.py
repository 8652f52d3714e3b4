"""``--kv-bits 8``: keys and values stored as int8 with a float16 scale per token and head.

The memory about halves against bf16; everything outside the cache still sees float keys and
values of the model's dtype (the attention's ``update``, ``stored_keys``, what policies see);
compaction moves codes and scales untouched; every policy, re-indexing, conversation memory and
snapshots work on it; a snapshot records it and is refused by a session of the other width.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_cli.engine import snapshot
from hermes_cli.engine.cache import KIND_VIDEO, StreamingCache, TokenMeta, dequantise, quantise
from hermes_cli.engine.config import SessionConfig
from hermes_cli.engine.session import Session
from hermes_cli.engine.snapshot import SnapshotError
from policies import POLICIES, make_policy
from tests.conftest import moving_square_frames
from tests.test_policies_stream import OPTIONS, Stream, ToyRotary, check_after_compression, check_choices, specs


def test_quantise_is_within_half_a_step_and_keeps_zeros():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 50, 64, generator=g) * torch.logspace(-3, 3, 50)[None, None, :, None]
    x[0, 0, 3] = 0.0
    codes, scales = quantise(x)
    assert codes.dtype == torch.int8 and scales.dtype == torch.float16 and scales.shape == (1, 2, 50, 1)
    back = dequantise(codes, scales, torch.float32)
    assert bool(((back - x).abs() <= scales.float() / 2 * (1 + 1e-3)).all())
    assert bool((back[0, 0, 3] == 0).all())
    assert int(codes.abs().max()) == 127  # the range is used


def filled(kv_bits: int, dtype=torch.bfloat16, n: int = 300) -> tuple[StreamingCache, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    keys, values = torch.randn(1, 2, n, 64, generator=g).to(dtype), torch.randn(1, 2, n, 64, generator=g).to(dtype)
    cache = StreamingCache(3, kv_bits=kv_bits)
    for layer in range(3):
        returned = cache.update(keys, values, layer)
        assert all(t.dtype == dtype and t.shape == keys.shape for t in returned)  # what attention reads
    cache.record(TokenMeta.new(KIND_VIDEO, cache.new_ids(n), torch.arange(n)[:, None],
                               frame=torch.arange(n) // 10, patch=torch.arange(n) % 10))
    return cache, keys, values


def test_the_cache_hands_out_float_keys_of_the_model_dtype_and_half_the_bytes():
    eight, keys, values = filled(8)
    sixteen, _, _ = filled(16)
    layer = eight.stream_layers[0]
    assert layer.keys.dtype == torch.int8
    for got, want in ((layer.stored_keys(), keys), (layer.stored_values(), values)):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        torch.testing.assert_close(got.float(), want.float(), atol=want.abs().max().item() / 127, rtol=0.02)
    view = eight.stream_view(0)
    assert view.keys.dtype == torch.bfloat16 and view.values.dtype == torch.bfloat16  # policies see floats
    assert eight.kv_bytes() == 3 * 300 * 2 * 2 * (64 + 2)  # codes + one float16 scale per token and head
    assert eight.kv_bytes() <= 0.55 * sixteen.kv_bytes()
    tail_k, _, _ = eight.copy_tail(eight.mark().__class__(250, eight.next_id))
    assert tail_k[0].dtype == torch.bfloat16 and tail_k[0].shape == (1, 2, 50, 64)


def test_compaction_moves_codes_and_scales_untouched_and_summaries_are_quantised():
    cache, _, _ = filled(8, torch.float32)
    plain, folded = cache.stream_layers[0], cache.stream_layers[1]
    codes, scales = plain.keys[:, :, :300].clone(), plain.key_scales[:, :, :300].clone()
    keep = torch.tensor([3, 7, 8, 100, 299])
    from policies import LayerChoice, Summary

    summary = Summary(key=torch.full((2, 64), 0.5), value=torch.full((2, 64), -2.0), position=torch.tensor([300]))
    cache.apply([LayerChoice(keep), LayerChoice(keep[:4], summary), LayerChoice(torch.tensor([0, 1, 2, 3, 4]))])
    assert torch.equal(plain.keys[:, :, :5], codes[:, :, keep]) and torch.equal(plain.key_scales[:, :, :5], scales[:, :, keep])
    torch.testing.assert_close(folded.stored_keys()[0, :, 4], torch.full((2, 64), 0.5), atol=0.5 / 254, rtol=0)
    torch.testing.assert_close(folded.stored_values()[0, :, 4], torch.full((2, 64), -2.0), atol=2 / 254, rtol=0)
    per_head = torch.tensor([[0, 5, 9, 10, 20, 21], [1, 2, 3, 50, 60, 299]])
    cache2, _, _ = filled(8, torch.float32)
    lay = cache2.stream_layers[0]
    codes = lay.values[:, :, :300].clone()
    cache2.apply([LayerChoice(per_head)] * 3)
    for h in range(2):
        assert torch.equal(lay.values[0, h, :6], codes[0, h, per_head[h]])


class EightBitStream(Stream):
    def __post_init__(self):
        super().__post_init__()
        self.cache = StreamingCache(self.spec.num_layers, kv_bits=8)


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_every_policy_keeps_the_cache_invariants_on_8_bits(name, data):
    spec = data.draw(specs(max_chunks=80), label="spec")
    stream = EightBitStream(make_policy(name, **data.draw(OPTIONS[name], label="options")), spec)
    for _ in range(spec.chunks):
        stream.append_chunk()
        n, before = stream.length, [dict(layer) for layer in stream.layers]
        choices = stream.compress_if_needed()
        if choices is not None:
            check_choices(choices, stream, n)
            check_after_compression(stream, choices, before)
    assert all(layer.keys.dtype == torch.int8 for layer in stream.cache.stream_layers)


def test_reindexing_rotates_8_bit_keys_and_requantises_them():
    cache, _, _ = filled(8, torch.float32, n=40)
    rotary = ToyRotary(64, 1)
    before = cache.stream_layers[0].stored_keys()[0].clone()
    new = torch.arange(40)[:, None] * 3 + 5
    cache.reposition(0, new, rotary)
    after = cache.stream_layers[0].stored_keys()[0]
    want = rotary.rotate(before, new - torch.arange(40)[:, None])
    torch.testing.assert_close(after, want, atol=want.abs().max().item() / 127, rtol=0)
    assert torch.equal(cache.meta(0).positions, new)


@pytest.fixture(scope="module")
def eight_bit_session(tiny_qwen):
    session = Session(tiny_qwen, make_policy("hermes"), SessionConfig(chunk_frames=4, budget=40, reindex="eager",
                                                                       max_new_tokens=3, kv_bits=8))
    session.ingest(moving_square_frames(20), [float(i) for i in range(20)])
    return session


def test_a_session_compresses_reindexes_and_answers_on_8_bits(eight_bit_session, tiny_qwen):
    session = eight_bit_session
    assert session.compressions >= 2 and session.positions.reindex_count >= 1
    assert all(layer.keys.dtype == torch.int8 for layer in session.cache.stream_layers)
    before = (session.cache.length, session.cache.kv_bytes())
    first = session.answer("What is moving?", record_logits=True)
    second = session.answer("And then?", record_logits=True)  # the first turn comes back as kept keys/values
    assert (session.cache.length, session.cache.kv_bytes()) == before
    assert all(torch.isfinite(l).all() for a in (first, second) for l in a.step_logits)
    sixteen = Session(tiny_qwen, make_policy("hermes"), SessionConfig(chunk_frames=4, budget=40, reindex="eager"))
    sixteen.ingest(moving_square_frames(20), [float(i) for i in range(20)])
    assert session.cache.kv_bytes() < 0.75 * sixteen.cache.kv_bytes()  # fp32 → int8 + float16 scales (tiny D)


def test_an_8_bit_snapshot_records_it_restores_exactly_and_is_refused_by_16_bits(tiny_qwen, tmp_path):
    eight_bit_session = Session(tiny_qwen, make_policy("hermes"), SessionConfig(
        chunk_frames=4, budget=40, reindex="eager", max_new_tokens=3, kv_bits=8, history=False))
    eight_bit_session.ingest(moving_square_frames(20), [float(i) for i in range(20)])
    path = tmp_path / "eight.safetensors"
    report = snapshot.save(eight_bit_session, path)
    snap = snapshot.read(path)
    assert snap.header["kv_bits"] == "8" and snap.header["format_version"] == "2" and snap.dtype == "float32"
    assert report.kv_bytes == eight_bit_session.cache.kv_bytes()
    config = eight_bit_session.config
    again = Session(tiny_qwen, make_policy("hermes"), config)
    snapshot.load(path, again)
    for mine, theirs in zip(again.cache.stream_layers, eight_bit_session.cache.stream_layers, strict=True):
        for name in mine.buffer_names():
            assert torch.equal(getattr(mine, name)[:, :, : mine.length], getattr(theirs, name)[:, :, : theirs.length])
    a = again.answer("What is moving?", record_logits=True)
    b = eight_bit_session.answer("What is moving?", record_logits=True)
    assert a.tokens == b.tokens and all(torch.equal(x, y) for x, y in zip(a.step_logits, b.step_logits, strict=True))
    again.ingest(moving_square_frames(8), [20.0 + i for i in range(8)])  # and it goes on
    sixteen_config = SessionConfig(**{**config.__dict__, "kv_bits": 16})
    sixteen = Session(tiny_qwen, make_policy("hermes"), sixteen_config)
    with pytest.raises(SnapshotError, match="8-bit keys and values.*--kv-bits 8.*--convert-memory"):
        snapshot.load(path, sixteen)
    snapshot.load(path, sixteen, convert_dtype=True)  # dequantised into a 16-bit memory
    assert sixteen.cache.stream_layers[0].keys.dtype == torch.float32
    torch.testing.assert_close(sixteen.cache.stream_layers[0].stored_keys(),
                               eight_bit_session.cache.stream_layers[0].stored_keys())
    plain = tmp_path / "sixteen.safetensors"
    snapshot.save(sixteen, plain)
    header = snapshot.read(plain).header
    assert header["format_version"] == "1" and header["kv_bits"] == "16"  # older readers still load 16 bits
    state = json.loads(header["state"])
    assert state["config"]["kv_bits"] == 16


def test_memory_sizes_of_a_full_memory_halve(tiny_llava):
    from hermes_cli.engine.microbench.kvbits import memory_sizes

    sizes = memory_sizes(tiny_llava, 500, 2)
    (kv16, file16), (kv8, file8) = sizes[16], sizes[8]
    layer = Session(tiny_llava, make_policy("full"), SessionConfig(budget=None, chunk_frames=2)).cache.stream_layers[0]
    dim = layer.keys.shape[-1]
    assert kv8 / kv16 == pytest.approx((dim + 2) / (dim * 4))  # fp32 → int8 + a float16 scale per token and head
    assert file8 < file16
