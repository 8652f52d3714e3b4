"""InfiniPot-V's reference profile keeps a token set per key-value head, as the official code does.

The official code scores every head on its own (TaR: −mean cosine of a key to the same patch in
the recent frames; VaN: that head's value norms), forces the recent frames and the TaR picks in,
and lets each head take its own top-|C| — so slot j of head 0 and of head 1 hold different tokens.
Here: the first compression equals that procedure, worked independently on seeded tensors; the
cache gathers each head's own keys, values and identities and keeps them right through many
compressions; positions are compacted one per token whichever heads hold it; a per-head memory
survives a snapshot and is refused by a policy that keeps one set per layer.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_cli.engine.cache import KIND_VIDEO, StreamingCache, TokenMeta
from hermes_cli.engine.compression import Signals, compress
from hermes_cli.engine.session import Session, SessionConfig
from policies import make_policy
from policies.infinipot import recent_frames_mask
from tests.conftest import moving_square_frames
from tests.test_policies_stream import Spec, Stream, ToyRotary


def official_per_head(keys: torch.Tensor, values: torch.Tensor, tokens_per_frame: int, keep_frames: int,
                      tar_ratio: float, query_ratio: float) -> torch.Tensor:
    """The official ``tar_val`` step (no pooling) on whole frames, worked from its description:
    keys/values (H, N, D) → kept indices (H, keep_frames · tokens_per_frame), sorted per head."""
    heads, n, dim = keys.shape
    frames = n // tokens_per_frame
    keep = keep_frames * tokens_per_frame
    tar_budget = keep - round((1 - tar_ratio) * keep)
    query = int(frames * query_ratio) * tokens_per_frame
    unit = keys / (keys.norm(dim=-1, keepdim=True) + 1e-9)
    recent = unit[:, n - query :].reshape(heads, -1, 1, tokens_per_frame, dim)  # (H, q, 1, t, D)
    older = unit[:, : n - query].reshape(heads, 1, -1, tokens_per_frame, dim)  # (H, 1, k, t, D)
    tar = -(recent * older).sum(-1).mean(dim=1).reshape(heads, -1)  # (H, older tokens)
    forced = torch.cat([tar.topk(tar_budget - query, dim=-1).indices,
                        torch.arange(n - query, n).expand(heads, -1)], dim=-1)
    van = values.norm(dim=-1)
    van[torch.arange(heads)[:, None], forced] = van.max() + 1
    return van.topk(keep, dim=-1).indices.sort(dim=-1).values


def cache_of(keys: torch.Tensor, values: torch.Tensor, tokens_per_frame: int) -> StreamingCache:
    """One layer holding (H, N, D) keys/values of N // tokens_per_frame whole frames, 1-D positions."""
    n = keys.shape[1]
    cache = StreamingCache(1)
    cache.update(keys[None].clone(), values[None].clone(), 0)
    frame = torch.arange(n) // tokens_per_frame
    cache.record(TokenMeta.new(KIND_VIDEO, cache.new_ids(n), torch.arange(n)[:, None], frame=frame,
                               patch=torch.arange(n) % tokens_per_frame))
    return cache


def test_the_first_compression_equals_the_official_per_head_selection():
    heads, tpf, frames, dim = 4, 4, 8, 8
    g = torch.Generator().manual_seed(3)
    keys, values = torch.randn(heads, frames * tpf, dim, generator=g), torch.randn(heads, frames * tpf, dim, generator=g)
    budget = frames * tpf
    policy = make_policy("infinipot", profile="reference", ratio=0.5, recent_fraction=0.25)
    cache = cache_of(keys, values, tpf)
    (choice,) = compress(cache, policy, Signals(budget=budget, tokens_per_frame=tpf))
    expected = official_per_head(keys, values, tpf, keep_frames=frames // 2, tar_ratio=0.5, query_ratio=0.25)
    assert torch.equal(choice.keep, expected)
    assert len({tuple(row.tolist()) for row in expected}) > 1  # the heads really keep different tokens
    held = cache.stream_layers[0]
    for h in range(heads):  # each head holds its own tokens' keys, values and identities
        assert torch.equal(held.stored_keys()[0, h], keys[h, expected[h]])
        assert torch.equal(held.stored_values()[0, h], values[h, expected[h]])
        assert torch.equal(cache.meta(0).token_id[h], expected[h])
    # the paper profile (and per_head off) keeps one set per layer from head-averaged scores
    (shared,) = compress(cache_of(keys, values, tpf), make_policy("infinipot", ratio=0.5), Signals(budget, tpf))
    assert shared.keep.dim() == 1


def token_keys(view) -> list[dict[int, torch.Tensor]]:
    """Per head: token id -> its key in that head."""
    out = []
    for h in range(view.keys.shape[0]):
        ids = (view.token_id[h] if view.per_head else view.token_id).tolist()
        out.append({t: view.keys[h, j].clone() for j, t in enumerate(ids)})  # the cache is compacted in place
    return out


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16), tokens_per_frame=st.integers(1, 4), cap_units=st.integers(4, 10),
       axes=st.sampled_from([1, 3]), newline=st.booleans())
def test_each_head_keeps_its_own_tokens_through_a_long_stream(seed, tokens_per_frame, cap_units, axes, newline):
    budget = cap_units * tokens_per_frame
    spec = Spec(seed=seed, chunks=60, tokens_per_frame=tokens_per_frame, max_frames_per_chunk=2, newline=newline,
                axes=axes, num_layers=3, budget=budget)
    policy = make_policy("infinipot", profile="reference", recent_fraction=0.25)
    stream = Stream(policy, spec, heads=3)
    target = policy.target(budget)
    differed = False
    for _ in range(spec.chunks):
        stream.append_chunk()
        before = [token_keys(stream.cache.stream_view(l)) for l in range(spec.num_layers)]
        if stream.compress_if_needed() is None:
            continue
        for l in range(spec.num_layers):
            view = stream.cache.stream_view(l)
            assert view.per_head and view.token_id.shape == (stream.heads, target)
            for h, held in enumerate(token_keys(view)):  # a head's keys are its own, never another head's
                assert all(torch.equal(key, before[l][h][t]) for t, key in held.items())
                head = view.head(h)
                recent = recent_frames_mask(head.frame, policy.recent_units(head.n, tokens_per_frame))
                assert bool((head.frame[recent] >= 0).all())
            rows = {tuple(row.tolist()) for row in view.token_id}
            differed |= len(rows) > 1
        assert stream.cache.length == target
    assert stream.compressions >= 5 and differed


def test_reposition_rotates_each_head_by_its_own_tokens_delta():
    heads, tpf, frames, dim = 2, 2, 6, 4
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(heads, frames * tpf, dim, generator=g), torch.randn(heads, frames * tpf, dim, generator=g)
    cache = cache_of(keys, values, tpf)
    keep = torch.tensor([[0, 3, 5, 8, 10, 11], [1, 2, 6, 7, 9, 11]])
    cache.apply([make_choice(keep)])
    rotary = ToyRotary(dim, 1)
    old = cache.meta(0).positions.clone()
    new = old + torch.arange(1, 7)[None, :, None] * torch.tensor([1, -1])[:, None, None]  # another delta per head
    cache.reposition(0, new, rotary)
    moved = cache.stream_layers[0].stored_keys()[0]
    for h in range(heads):
        assert torch.allclose(moved[h], rotary.rotate(keys[h, keep[h]], (new - old)[h]))
    assert torch.equal(cache.meta(0).positions, new)


def make_choice(keep):
    from policies import LayerChoice

    return LayerChoice(keep)


@pytest.fixture(scope="module")
def per_head_session(tiny_qwen):
    """tiny Qwen2.5-VL under infinipot profile=reference with eager re-indexing, several compressions."""
    session = Session(tiny_qwen, make_policy("infinipot", profile="reference", recent_fraction=0.25),
                      SessionConfig(chunk_frames=4, budget=48, reindex="eager", max_new_tokens=2))
    session.ingest(moving_square_frames(24), [float(i) for i in range(24)])
    return session


def test_a_per_head_memory_gets_one_position_per_token_and_answers(per_head_session):
    session = per_head_session
    assert session.compressions >= 3 and session.positions.reindex_count == session.compressions
    p = session.cache.prefix_length()
    for layer in range(session.cache.num_layers):
        meta = session.cache.meta(layer).select(slice(p, None))
        assert meta.per_head
        where: dict[int, tuple] = {}
        for h in range(meta.heads):
            for t, pos in zip(meta.token_id[h].tolist(), meta.positions[h].tolist()):
                assert where.setdefault(t, tuple(pos)) == tuple(pos)  # the same position in every head
        temporal = torch.unique(meta.positions[..., 0])
        assert torch.equal(temporal, p + torch.arange(temporal.numel()))  # compacted over the union
    answer = session.answer("What is moving?", record_logits=True)
    assert all(torch.isfinite(logits).all() for logits in answer.step_logits)
    assert max(session.cache.stream_counts()) <= 48


def test_a_per_head_memory_survives_a_snapshot_and_hermes_refuses_it(per_head_session, tmp_path, tiny_qwen):
    from hermes_cli.engine import snapshot

    path = tmp_path / "memory.hermes"
    snapshot.save(per_head_session, path)
    again = Session(tiny_qwen, make_policy("infinipot", profile="reference", recent_fraction=0.25),
                    per_head_session.config)
    snapshot.load(path, again)
    for layer in range(again.cache.num_layers):
        assert torch.equal(again.cache.meta(layer).token_id, per_head_session.cache.meta(layer).token_id)
        assert torch.equal(again.cache.stream_layers[layer].stored_keys(),
                           per_head_session.cache.stream_layers[layer].stored_keys())
    done = again.compressions
    again.ingest(moving_square_frames(8), [24.0 + i for i in range(8)])  # and it goes on compressing
    assert again.compressions > done
    hermes = Session(tiny_qwen, make_policy("hermes"), per_head_session.config)
    with pytest.raises(snapshot.SnapshotError, match="per key-value head.*profile=reference"):
        snapshot.load(path, hermes, accept_policy=True)
