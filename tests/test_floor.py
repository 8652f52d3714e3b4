"""``--profile``'s floor: the bare forward computes what our prefill computes, on the same cache."""

from __future__ import annotations

import torch

from hermes_cli.engine.cache import KIND_VIDEO
from hermes_cli.engine.floor import measure_floor, plain_cache
from hermes_cli.engine.prefill import prefill
from hermes_cli.engine.session import Session, SessionConfig
from policies import make_policy
from tests.conftest import moving_square_frames


def test_the_bare_forward_sees_the_same_chunk_and_cache_and_the_memory_is_left_as_it_was(tiny_qwen):
    session = Session(tiny_qwen, make_policy("hermes"), SessionConfig(chunk_frames=4, budget=40))
    session.ingest(moving_square_frames(12), [float(i) for i in range(12)])
    cache = session.cache
    chunk = tiny_qwen.encode(moving_square_frames(4), session.units_seen)
    where = session.positions.for_chunk(chunk, session.units_seen, bounded=False)
    mark = cache.mark()
    ours = prefill(tiny_qwen, cache, chunk.embeds, where, KIND_VIDEO, chunk)
    cache.rollback(mark)
    with torch.no_grad():
        bare = tiny_qwen.text_model(inputs_embeds=chunk.embeds.to(tiny_qwen.dtype), position_ids=tiny_qwen.position_ids(where),
                                    cache=plain_cache(cache), use_cache=True).last_hidden_state
    torch.testing.assert_close(bare, ours)
    before = (cache.length, cache.next_id, [l.stored_keys().clone() for l in cache.stream_layers])
    floor = measure_floor(session, rounds=1)
    assert floor.prefill_ms > 0 and floor.bare_prefill_ms > 0 and floor.bare_token_ms > 0 and floor.token_ms > 0
    assert (cache.length, cache.next_id) == before[:2]
    assert all(torch.equal(a, l.stored_keys()) for a, l in zip(before[2], cache.stream_layers, strict=True))
