"""StreamingCache on its own: appends, rollback, apply, reposition and the model-free compression step."""

from __future__ import annotations

import pytest
import torch

from hermes_cli.engine.cache import KIND_PREFIX, KIND_SUMMARY, KIND_TEXT, KIND_VIDEO, StreamingCache, TokenMeta
from hermes_cli.engine.compression import Signals, compress
from hermes_cli.positions.layout import text_positions
from policies import LayerChoice, make_policy
from policies.base import Summary

H, D = 2, 4


def append(cache: StreamingCache, n: int, kind: int, *, frames: list[int] | None = None, seed: int = 0,
           start: int | None = None) -> None:
    """What the model's attention and the engine do for n new tokens: update every layer, then record."""
    gen = torch.Generator().manual_seed(seed)
    for layer in range(cache.num_layers):
        keys = torch.randn(1, H, n, D, generator=gen)
        cache.update(keys, keys + 100, layer)
    first = cache.new_ids(n)
    start = (0 if cache.max_positions() is None else int(cache.max_positions().max()) + 1) if start is None else start
    positions = text_positions(start, n)
    frame = None if frames is None else torch.tensor(frames)
    cache.record(TokenMeta.new(kind, first, positions, frame=frame, patch=None if frames is None else torch.zeros(n, dtype=torch.long)))


def filled(layers: int = 3, prefix: int = 2, units: int = 4, per_unit: int = 3) -> StreamingCache:
    cache = StreamingCache(layers)
    append(cache, prefix, KIND_PREFIX, seed=1)
    append(cache, units * per_unit, KIND_VIDEO, frames=[u for u in range(units) for _ in range(per_unit)], seed=2)
    return cache


def test_update_appends_and_every_layer_has_the_same_length():
    cache = filled()
    assert cache.length == 2 + 12 and all(l.length == cache.length for l in cache.stream_layers)
    assert cache.prefix_length() == 2 and cache.count(KIND_VIDEO) == [12, 12, 12]
    assert cache.stream_counts() == [12, 12, 12]
    assert cache.kv_bytes() == 3 * (2 * H * D * 4) * cache.length  # keys + values, fp32, only what is held


def test_rollback_is_exact_and_forgets_identities():
    cache = filled()
    before = [l.stored_keys().clone() for l in cache.stream_layers]
    mark = cache.mark()
    append(cache, 5, KIND_TEXT, seed=9)
    assert cache.length == mark.length + 5
    cache.rollback(mark)
    assert cache.length == mark.length and cache.next_id == mark.next_id
    for layer, old in zip(cache.stream_layers, before, strict=True):
        assert torch.equal(layer.stored_keys(), old) and len(layer.held_meta()) == mark.length


def test_record_refuses_metadata_out_of_sync():
    cache = filled()
    with pytest.raises(RuntimeError, match="out of sync"):
        cache.record(TokenMeta.new(KIND_TEXT, cache.new_ids(1), text_positions(99, 1)))


def test_apply_keeps_chosen_tokens_in_order_and_appends_summaries():
    cache = filled(layers=2)
    keys = [cache.stream_view(l).keys.clone() for l in range(2)]
    ids = [cache.stream_view(l).token_id.clone() for l in range(2)]
    summary = Summary(key=torch.ones(H, D), value=torch.full((H, D), 2.0), position=torch.tensor([77]))
    cache.apply([LayerChoice(torch.tensor([0, 5, 11]), summary), LayerChoice(torch.tensor([1, 2, 3, 4]))])
    assert cache.length == 2 + 4  # equal lengths: 3 kept + summary, 4 kept
    first, second = cache.stream_view(0), cache.stream_view(1)
    assert torch.equal(first.keys[:, :3], keys[0][:, [0, 5, 11]]) and torch.equal(first.token_id[:3], ids[0][[0, 5, 11]])
    assert first.is_summary.tolist() == [False, False, False, True]
    assert torch.equal(first.keys[:, 3], torch.ones(H, D)) and torch.equal(first.values[:, 3], torch.full((H, D), 2.0))
    assert int(first.positions[3, 0]) == 77 and cache.count(KIND_SUMMARY) == [1, 0]
    assert torch.equal(second.keys, keys[1][:, 1:5])


@pytest.mark.parametrize("choices, message", [
    ([LayerChoice(torch.tensor([0, 1])), LayerChoice(torch.tensor([0]))], "different sizes"),
    ([LayerChoice(torch.tensor([1, 0])), LayerChoice(torch.tensor([2, 3]))], "strictly increasing"),
    ([LayerChoice(torch.tensor([0, 12])), LayerChoice(torch.tensor([2, 3]))], "inside the layer"),
    ([LayerChoice(torch.tensor([0]))], "2 layers"),
])
def test_apply_refuses_bad_choices(choices, message):
    with pytest.raises(ValueError, match=message):
        filled(layers=2).apply(choices)


def test_apply_refuses_while_a_question_is_in_the_cache():
    cache = filled(layers=1)
    append(cache, 2, KIND_TEXT)
    with pytest.raises(RuntimeError, match="between questions"):
        cache.apply([LayerChoice(torch.arange(3))])


def test_reposition_rotates_keys_by_the_delta_and_moves_positions():
    class Shift:  # a stand-in rotation: adds the delta to every key element
        def rotate(self, keys, delta):
            return keys + delta[:, 0].to(keys.dtype)[None, None, :, None]

    cache = filled(layers=1)
    old_keys, old_positions = cache.stream_view(0).keys.clone(), cache.stream_view(0).positions.clone()
    new_positions = old_positions + 10
    cache.reposition(0, new_positions, Shift())
    view = cache.stream_view(0)
    assert torch.equal(view.positions, new_positions) and torch.allclose(view.keys, old_keys + 10)
    assert torch.equal(cache.meta(0).positions[:2, 0], torch.arange(2))  # the prefix stays


def test_compress_runs_a_policy_without_a_model():
    """The compression step on a hand-made cache: fifo keeps the newest budget tokens in every layer."""
    cache = filled(layers=3, units=4, per_unit=3)
    newest_ids = cache.stream_view(0).token_id[-6:].clone()
    choices = compress(cache, make_policy("fifo"), Signals(budget=6, tokens_per_frame=3))
    assert [c.size for c in choices] == [6, 6, 6] and cache.stream_counts() == [6, 6, 6]
    for layer in range(3):
        assert torch.equal(cache.stream_view(layer).token_id, newest_ids)
