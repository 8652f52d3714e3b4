"""Token metadata grows in place like the keys and values: a decoding step copies nothing held,
rollbacks stay exact, and what ``copy_tail`` hands out survives later appends."""

from __future__ import annotations

import torch

from hermes_cli.engine.cache import KIND_TEXT, KIND_VIDEO, StreamingCache, TokenMeta


def append(cache: StreamingCache, n: int, kind: int = KIND_TEXT) -> None:
    start = 0 if cache.meta(0) is None else int(cache.meta(0).positions.max()) + 1
    for layer in range(cache.num_layers):
        cache.update(torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4), layer)
    cache.record(TokenMeta.new(kind, cache.new_ids(n), torch.arange(start, start + n)[:, None]))


def test_appends_write_into_spare_room_and_rollbacks_stay_exact():
    cache = StreamingCache(3)
    for layer in range(3):
        cache.update(torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4), layer)
    cache.record(TokenMeta.new(KIND_VIDEO, cache.new_ids(10), torch.arange(10)[:, None], frame=torch.arange(10),
                               patch=torch.zeros(10, dtype=torch.long)))
    where = cache.meta(1).token_id.data_ptr()
    mark = cache.mark()
    for _ in range(20):  # decoding steps
        append(cache, 1)
    assert cache.meta(1).token_id.data_ptr() == where  # grown in place, nothing held was copied
    assert cache.meta(2).token_id.tolist() == list(range(30)) and cache.meta(2).positions[:, 0].tolist() == list(range(30))
    keys, values, tail = cache.copy_tail(mark)
    cache.rollback(mark)
    assert cache.meta(0).token_id.tolist() == list(range(10))
    append(cache, 5)  # overwrites the slots the rolled-back tokens had
    assert cache.meta(0).token_id.tolist() == list(range(10)) + list(range(10, 15))
    assert tail.token_id.tolist() == list(range(10, 30))  # the copy is its own
    assert torch.equal(cache.meta(0).frame[:10], torch.arange(10)) and bool((cache.meta(0).frame[10:] == -1).all())


def test_a_compression_hands_the_chunks_room_back_and_decoding_grows_by_an_eighth():
    """At rest a stream holds what it keeps: after ``apply`` every layer's buffers are exactly its
    length (the room a chunk took while it was prefilled is freed), with no stale metadata store;
    a decoding step then reserves an eighth more (never double), and what is held is unchanged."""
    from policies import LayerChoice

    cache = StreamingCache(2)
    for layer in range(2):
        cache.update(torch.randn(1, 2, 600, 4), torch.randn(1, 2, 600, 4), layer)
    cache.record(TokenMeta.new(KIND_VIDEO, cache.new_ids(600), torch.arange(600)[:, None],
                               frame=torch.arange(600) // 10, patch=torch.arange(600) % 10))
    mark = cache.mark()
    append(cache, 1)  # an answer's step, rolled back: the buffers keep spare room (600 + 75)
    cache.rollback(mark)
    assert cache.capacities() == [675, 675]
    keep = torch.arange(0, 600, 3)
    kept_keys = [l.stored_keys()[:, :, keep].clone() for l in cache.stream_layers]
    cache.apply([LayerChoice(keep), LayerChoice(keep)])
    assert cache.capacities() == [200, 200]
    assert all(l._meta_store is None for l in cache.stream_layers)
    for layer, keys in zip(cache.stream_layers, kept_keys, strict=True):
        assert torch.equal(layer.stored_keys(), keys)
        assert layer.meta.token_id.tolist() == keep.tolist()
    append(cache, 1)
    assert cache.capacities() == [200 + 64, 200 + 64]  # an eighth of 200 is below the 64-token step
    assert cache.meta(0).token_id.tolist() == [*keep.tolist(), 600]
