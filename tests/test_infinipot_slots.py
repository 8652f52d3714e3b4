"""InfiniPot-V under ``profile=reference`` follows the official code past the first compression.

The official code (aiha-lab/InfiniPot-V, ``kvcache_utils.py``) works on *position slots*: it
reshapes the layer's vision tokens into (frames, tokens_per_frame) whatever tokens the slots
hold. TaR pairs slot j of an old block with slot j of the recent blocks, and the layer-adaptive
VaN pooling lays the same slots out as a (frames, rows, width) grid, so after a first thinning
both meet unrelated patches. The procedure is worked out below from that arithmetic, per
key-value head, on seeded tensors, and a real ``StreamingCache`` compressed by the policy must
keep, per layer and head, the same tokens at each of four compressions.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hermes_cli.engine.cache import KIND_VIDEO, StreamingCache, TokenMeta
from hermes_cli.engine.compression import Signals, compress
from policies import make_policy


def official_pooling(layer: int, num_layers: int) -> tuple[int, int]:
    """(dimensions, kernel) of a layer: quartile ``layer // max(1, L // 4)`` of 3-D 7, 2-D 5, 1-D 3, none."""
    quartile = layer // max(1, num_layers // 4)
    return (3, 2, 1, 0)[quartile], (7, 5, 3, 1)[quartile]


def official_pool(van: torch.Tensor, tokens_per_frame: int, rows: int, dims: int, kernel: int) -> torch.Tensor:
    """The official average pooling of per-head value norms (H, N), N a whole number of frames.

    1-D: along the slot sequence. 2-D / 3-D: the slots reshaped (H, frames, rows, -1); the kernel
    shrinks to min(kernel, frames, rows, cols), one less when even, and below 2 nothing is pooled;
    2-D pools each frame, 3-D across frames too. Stride 1, padding kernel // 2, counted (zeros).
    """
    heads, n = van.shape
    if dims == 0:
        return van
    if dims == 1:
        return F.avg_pool1d(van[:, None], kernel, stride=1, padding=kernel // 2)[:, 0]
    grid = van.reshape(heads, n // tokens_per_frame, rows, -1)
    kernel = min(kernel, *grid.shape[1:])
    kernel -= 1 if kernel % 2 == 0 else 0
    if kernel < 2:
        return van
    if dims == 2:  # (H, frames, rows, cols) read as a batch of H, frames as channels: each frame alone
        pooled = F.avg_pool2d(grid, kernel, stride=1, padding=kernel // 2)
    else:
        pooled = F.avg_pool3d(grid[:, None], kernel, stride=1, padding=kernel // 2)[:, 0]
    return pooled.reshape(heads, n)


def official_step(keys: torch.Tensor, values: torch.Tensor, tokens_per_frame: int, keep_frames: int,
                  tar_ratio: float, query_ratio: float, pooling: tuple[int, int] = (0, 1), rows: int = 1
                  ) -> torch.Tensor:
    """One official compression of per-head slot arrays (H, N, D): kept slots (H, keep) per head.

    frames = N // tpf; the last int(frames · query_ratio) · tpf slots are the recent frames; older
    slot s = (block b, slot j) scores −mean over recent blocks q of cos(K[b, j], K[q, j]); the
    recent slots and the top (tar_budget − recent) scores are forced above every (pooled) value
    norm; each head keeps its top ``keep_frames · tpf``, in slot order.
    """
    heads, n, dim = keys.shape
    frames = n // tokens_per_frame
    keep = keep_frames * tokens_per_frame
    tar_budget = keep - round((1 - tar_ratio) * keep)
    query = int(frames * query_ratio) * tokens_per_frame
    unit = keys / (keys.norm(dim=-1, keepdim=True) + 1e-9)
    recent = unit[:, n - query :].reshape(heads, -1, 1, tokens_per_frame, dim)  # (H, q, 1, t, D)
    older = unit[:, : n - query].reshape(heads, 1, -1, tokens_per_frame, dim)  # (H, 1, k, t, D)
    tar = -(recent * older).sum(-1).mean(dim=1).reshape(heads, -1)
    forced = torch.cat([tar.topk(tar_budget - query, dim=-1).indices, torch.arange(n - query, n).expand(heads, -1)],
                       dim=-1)
    van = official_pool(values.norm(dim=-1), tokens_per_frame, rows, *pooling)
    van[torch.arange(heads)[:, None], forced] = van.max() + 1
    return van.topk(keep, dim=-1).indices.sort(dim=-1).values


def test_reference_keeps_the_official_tokens_per_head_over_four_compressions():
    heads, tpf, dim, cap_frames, chunk_frames = 3, 4, 8, 8, 4
    budget, ratio, alpha, r = cap_frames * tpf, 0.5, 0.75, 0.25
    policy = make_policy("infinipot", profile="reference", ratio=ratio, alpha=alpha, recent_fraction=r)
    g = torch.Generator().manual_seed(11)
    cache = StreamingCache(1)
    slots_k = torch.empty(heads, 0, dim)  # the official code's per-head arrays, slot by slot
    slots_v = torch.empty(heads, 0, dim)
    slots_id = torch.empty(heads, 0, dtype=torch.long)
    frame = 0
    compressions, unrelated = 0, False
    while compressions < 4:
        keys, values = torch.randn(heads, chunk_frames * tpf, dim, generator=g), torch.randn(heads, chunk_frames * tpf, dim, generator=g)
        n = keys.shape[1]
        cache.update(keys[None].clone(), values[None].clone(), 0)
        first = cache.new_ids(n)
        cache.record(TokenMeta.new(KIND_VIDEO, first, torch.arange(first, first + n)[:, None],
                                   frame=frame + torch.arange(n) // tpf, patch=torch.arange(n) % tpf))
        frame += chunk_frames
        slots_k, slots_v = torch.cat([slots_k, keys], 1), torch.cat([slots_v, values], 1)
        slots_id = torch.cat([slots_id, torch.arange(first, first + n).expand(heads, -1)], 1)
        if not policy.should_compress(cache.length, budget):
            continue
        expected = official_step(slots_k, slots_v, tpf, keep_frames=int(ratio * cap_frames), tar_ratio=alpha,
                                 query_ratio=r)
        (choice,) = compress(cache, policy, Signals(budget=budget, tokens_per_frame=tpf))
        assert torch.equal(choice.keep, expected), f"compression {compressions + 1}"
        gather = expected[..., None].expand(-1, -1, dim)
        slots_k, slots_v = torch.gather(slots_k, 1, gather), torch.gather(slots_v, 1, gather)
        slots_id = torch.gather(slots_id, 1, expected)
        meta = cache.meta(0)
        assert torch.equal(meta.token_id, slots_id)
        held = cache.stream_layers[0]
        assert torch.equal(held.stored_keys()[0], slots_k) and torch.equal(held.stored_values()[0], slots_v)
        # after a thinning some slot holds another patch than its slot number: the pairing matters
        unrelated |= bool((meta.patch != torch.arange(meta.patch.shape[-1]) % tpf).any())
        compressions += 1
    assert unrelated


@pytest.mark.parametrize("tpf, width", [(49, 0), (12, 4), (16, 0)])  # 7 × 7; 3 × 4 and 4 × 4 shrink the kernels
def test_reference_pooling_keeps_the_official_tokens_per_layer_and_head_over_four_compressions(tpf, width):
    """van_pool on, four layers (one per quartile: 3-D k7, 2-D k5, 1-D k3, none), slots pooled as the official grid."""
    layers, heads, dim, cap_frames, chunk_frames = 4, 2, 8, 8, 4
    budget, ratio, alpha, r = cap_frames * tpf, 0.5, 0.75, 0.25
    cols = width or round(tpf**0.5)
    rows = tpf // cols
    policy = make_policy("infinipot", profile="reference", ratio=ratio, alpha=alpha, recent_fraction=r,
                         van_pool=True, van_grid_width=width)
    g = torch.Generator().manual_seed(3)
    cache = StreamingCache(layers)
    slots_k = [torch.empty(heads, 0, dim) for _ in range(layers)]
    slots_v = [torch.empty(heads, 0, dim) for _ in range(layers)]
    slots_id = [torch.empty(heads, 0, dtype=torch.long) for _ in range(layers)]
    frame, compressions, unrelated = 0, 0, False
    while compressions < 4:
        n = chunk_frames * tpf
        first = cache.new_ids(n)
        for l in range(layers):
            keys, values = torch.randn(heads, n, dim, generator=g), torch.randn(heads, n, dim, generator=g)
            cache.update(keys[None].clone(), values[None].clone(), l)
            slots_k[l], slots_v[l] = torch.cat([slots_k[l], keys], 1), torch.cat([slots_v[l], values], 1)
            slots_id[l] = torch.cat([slots_id[l], torch.arange(first, first + n).expand(heads, -1)], 1)
        cache.record(TokenMeta.new(KIND_VIDEO, first, torch.arange(first, first + n)[:, None],
                                   frame=frame + torch.arange(n) // tpf, patch=torch.arange(n) % tpf))
        frame += chunk_frames
        if not policy.should_compress(cache.length, budget):
            continue
        choices = compress(cache, policy, Signals(budget=budget, tokens_per_frame=tpf))
        for l, choice in enumerate(choices):
            expected = official_step(slots_k[l], slots_v[l], tpf, keep_frames=int(ratio * cap_frames), tar_ratio=alpha,
                                     query_ratio=r, pooling=official_pooling(l, layers), rows=rows)
            assert torch.equal(choice.keep, expected), f"compression {compressions + 1}, layer {l}"
            gather = expected[..., None].expand(-1, -1, dim)
            slots_k[l], slots_v[l] = torch.gather(slots_k[l], 1, gather), torch.gather(slots_v[l], 1, gather)
            slots_id[l] = torch.gather(slots_id[l], 1, expected)
            meta = cache.meta(l)
            assert torch.equal(meta.token_id, slots_id[l])
            unrelated |= bool((meta.patch != torch.arange(meta.patch.shape[-1]) % tpf).any())
        compressions += 1
    assert unrelated  # the grid's cells held other patches than their slot numbers say


def test_identity_pairing_stays_the_default_and_differs_after_thinning():
    """The default pairs by (frame, patch); with slots paired the same stream keeps other tokens."""
    tpf, dim, budget = 4, 8, 32
    g = torch.Generator().manual_seed(5)
    chunks = [(torch.randn(1, 2, 16, dim, generator=g), torch.randn(1, 2, 16, dim, generator=g)) for _ in range(8)]

    def run(**options) -> list[torch.Tensor]:
        policy = make_policy("infinipot", ratio=0.5, alpha=0.75, recent_fraction=0.25, **options)
        cache, kept, frame = StreamingCache(1), [], 0
        for keys, values in chunks:
            cache.update(keys.clone(), values.clone(), 0)
            first = cache.new_ids(16)
            cache.record(TokenMeta.new(KIND_VIDEO, first, torch.arange(first, first + 16)[:, None],
                                       frame=frame + torch.arange(16) // tpf, patch=torch.arange(16) % tpf))
            frame += 4
            if policy.should_compress(cache.length, budget):
                kept.append(compress(cache, policy, Signals(budget=budget, tokens_per_frame=tpf))[0].keep)
        return kept

    assert make_policy("infinipot").slot_pairing() is False
    assert make_policy("infinipot", profile="reference").slot_pairing() is True
    by_identity, by_slot = run(), run(pair_by_slot=True)
    assert torch.equal(by_identity[0], by_slot[0])  # before any thinning slots are identities
    assert any(not torch.equal(a, b) for a, b in zip(by_identity[1:], by_slot[1:], strict=True))


def test_identity_pooling_stays_the_default_and_differs_after_thinning():
    """The paper profile pools a patch with its held neighbours; with slots pooled the same stream keeps other tokens."""
    tpf, dim, budget, n = 64, 8, 512, 256  # 8 × 8 frames (a 7 × 7 window is smaller), a cap of 8, chunks of 4
    g = torch.Generator().manual_seed(8)
    chunks = [(torch.randn(1, 2, n, dim, generator=g), torch.randn(1, 2, n, dim, generator=g)) for _ in range(8)]

    def run(**options) -> list[torch.Tensor]:
        policy = make_policy("infinipot", ratio=0.5, alpha=0.25, recent_fraction=0.25, van_pool=True, **options)
        cache, kept, frame = StreamingCache(1), [], 0
        for keys, values in chunks:
            cache.update(keys.clone(), values.clone(), 0)
            first = cache.new_ids(n)
            cache.record(TokenMeta.new(KIND_VIDEO, first, torch.arange(first, first + n)[:, None],
                                       frame=frame + torch.arange(n) // tpf, patch=torch.arange(n) % tpf))
            frame += 4
            if policy.should_compress(cache.length, budget):
                kept.append(compress(cache, policy, Signals(budget=budget, tokens_per_frame=tpf))[0].keep)
        return kept

    assert make_policy("infinipot").slot_pooling() is False
    assert make_policy("infinipot", profile="reference").slot_pooling() is True
    by_identity, by_slot = run(), run(pool_by_slot=True)
    assert torch.equal(by_identity[0], by_slot[0])  # before any thinning slots are identities
    assert any(not torch.equal(a, b) for a, b in zip(by_identity[1:], by_slot[1:], strict=True))
