"""InfiniPot-V's recent window is fixed by the cap, not by how many units a layer happens to hold.

The paper (Algorithm 2, Table A2) and the reference code take ``f = |M| / tokens_per_frame``
frames for the cap and keep the newest ``int(r · f)`` of them whole. Compression thins old units
without removing them all, so counting the distinct units held instead grows the window without
bound and squeezes TaR out. Over long random streams the window must stay put and TaR keep its
share ``int(α · |C|)`` (recent tokens included).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import make_policy
from policies.infinipot import recent_frames_mask, tar_picks, tar_scores
from tests.test_policies_stream import Spec, Stream


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    tokens_per_frame=st.integers(1, 5),
    frames_per_chunk=st.integers(1, 3),
    cap_units=st.integers(4, 12),
    recent_fraction=st.sampled_from([0.125, 0.25, 0.5]),
    alpha=st.sampled_from([0.25, 0.5, 0.75]),
)
def test_the_recent_window_stays_at_r_times_the_cap_in_units(
    seed, tokens_per_frame, frames_per_chunk, cap_units, recent_fraction, alpha
):
    budget = cap_units * tokens_per_frame
    spec = Spec(seed=seed, chunks=150, tokens_per_frame=tokens_per_frame, max_frames_per_chunk=frames_per_chunk,
                newline=False, axes=1, num_layers=2, budget=budget)
    policy = make_policy("infinipot", recent_fraction=recent_fraction, alpha=alpha)
    stream = Stream(policy, spec)
    window = int(recent_fraction * cap_units)  # floor(r · |M| / tokens_per_frame)
    assert policy.recent_units(budget, tokens_per_frame) == window
    target = policy.target(budget)
    compressions = 0
    for _ in range(spec.chunks):
        stream.append_chunk()
        if not policy.should_compress(stream.length, budget):
            continue
        state = stream.state()
        choices = policy.select(state)
        for layer, choice in zip(state.layers, choices):
            recent = recent_frames_mask(layer.frame, window)
            units = torch.unique(layer.frame[recent])
            held = torch.unique(layer.frame)
            assert units.tolist() == held[-window:].tolist() if window else units.numel() == 0
            kept = torch.zeros(layer.n, dtype=torch.bool)
            kept[choice.keep] = True
            assert bool(kept[recent].all())  # the window is kept whole
            scores = tar_scores(layer, recent, tokens_per_frame)
            quota = int(alpha * target) - int(recent.sum())
            picks = tar_picks(scores, quota)
            assert bool(kept[picks].all())  # TaR's share is forced in
            available = int(torch.isfinite(scores).sum())
            assert int(picks.sum()) == min(max(quota, 0), available)
        stream.cache.apply(choices)
        compressions += 1
    assert compressions >= 10


def test_the_window_does_not_grow_while_thinned_units_pile_up():
    """The case of the issue: many thinned old units held; the window stays at int(r · f) units."""
    tokens_per_frame, cap_units = 4, 16
    budget = cap_units * tokens_per_frame
    spec = Spec(seed=7, chunks=200, tokens_per_frame=tokens_per_frame, max_frames_per_chunk=2, newline=False,
                axes=1, num_layers=1, budget=budget)
    policy = make_policy("infinipot")  # r = 0.125 -> 2 units; alpha 0.5 of |C| = 48 -> 24 tokens
    stream = Stream(policy, spec)
    most_units_held = 0
    for _ in range(spec.chunks):
        stream.append_chunk()
        if policy.should_compress(stream.length, budget):
            state = stream.state()
            layer = state.layers[0]
            most_units_held = max(most_units_held, int(torch.unique(layer.frame).numel()))
            (choice,) = policy.select(state)
            recent = recent_frames_mask(layer.frame, policy.recent_units(budget, tokens_per_frame))
            assert int(torch.unique(layer.frame[recent]).numel()) == 2
            kept = torch.zeros(layer.n, dtype=torch.bool)
            kept[choice.keep] = True
            picks = tar_picks(tar_scores(layer, recent, tokens_per_frame), 24 - int(recent.sum()))
            assert int(picks.sum()) == 24 - int(recent.sum()) and bool(kept[picks | recent].all())
            stream.cache.apply([choice])
    assert most_units_held > 2 * cap_units // 2  # thinned units really piled up (the old window grew with them)


# ------------------------------------------------------------------- profile=reference


def test_reference_tar_share_and_frame_count_follow_the_official_code():
    paper, reference = make_policy("infinipot", alpha=0.3), make_policy("infinipot", alpha=0.3, profile="reference")
    assert paper.tar_share(10) == 3  # int(0.3 · 10)
    assert reference.tar_share(10) == 10 - round(0.7 * 10) == 3
    assert paper.tar_share(7) == 2 and reference.tar_share(7) == 7 - round(4.9) == 2
    assert make_policy("infinipot", alpha=0.5).tar_share(5) == 2  # int(2.5)
    assert make_policy("infinipot", alpha=0.5, profile="reference").tar_share(5) == 5 - round(2.5) == 3  # banker's round
    # f: the cap's frames (paper) or the layer's length at compression (official code's current_frame_num)
    assert paper.recent_units(64, 4) == int(0.125 * 16) == 2
    assert reference.recent_units(72, 4) == int(0.125 * 18) == 2


def test_reference_pooling_matches_torch_average_pooling_with_counted_padding():
    from policies.infinipot import pool_sequence, pool_slots

    g = torch.Generator().manual_seed(2)
    scores = torch.rand(12, generator=g)
    expected = torch.nn.AvgPool1d(3, stride=1, padding=1)(scores.view(1, 1, -1)).view(-1)
    torch.testing.assert_close(pool_sequence(scores, 3), expected)
    # three whole frames of a 3 × 4 grid of slots, zero padding counted (count_include_pad)
    frames = torch.rand(3, 3, 4, generator=g)
    pooled = pool_slots(frames.reshape(-1), 12, 4, 2, 3, official=True)
    expected = torch.nn.AvgPool2d(3, stride=1, padding=1)(frames.unsqueeze(1)).reshape(-1)  # each frame alone
    torch.testing.assert_close(pooled, expected)
    pooled = pool_slots(frames.reshape(-1), 12, 4, 3, 3, official=True)
    expected = torch.nn.AvgPool3d(3, stride=1, padding=1)(frames.unsqueeze(0)).reshape(-1)  # across frames too
    torch.testing.assert_close(pooled, expected)


def test_reference_pooling_fits_the_kernel_to_the_grid_and_leaves_the_remainder():
    """The official kernel is min(kernel, frames, rows, cols), one less when even, none below 2;
    slots past the last whole frame keep their scores; a partial last row is zero padding."""
    from policies.infinipot import pool_slots

    g = torch.Generator().manual_seed(6)
    frames = torch.rand(3, 3, 4, generator=g)
    tail = torch.rand(5, generator=g)  # n mod tokens_per_frame newest slots (a newline, a partial chunk)
    scores = torch.cat([frames.reshape(-1), tail])
    k3 = torch.nn.AvgPool3d(3, stride=1, padding=1)(frames.unsqueeze(0)).reshape(-1)
    for kernel in (7, 5, 3, 4):  # min(kernel, 3 frames, 3 rows, 4 cols) = 3 (4 → 3 as well)
        torch.testing.assert_close(pool_slots(scores, 12, 4, 3, kernel, official=True), torch.cat([k3, tail]))
    two = scores[:24]  # two frames: min(7, 2, 3, 4) = 2, even → 1: nothing is pooled
    assert torch.equal(pool_slots(two, 12, 4, 3, 7, official=True), two)
    assert torch.equal(pool_slots(two, 12, 4, 2, 5, official=True), two)  # 2-D too: the frame count bounds it
    # 10 slots per frame in rows of 4: the third row's last two cells are padding
    ten = torch.rand(3, 10, generator=g)
    padded = torch.cat([ten, torch.zeros(3, 2)], 1).view(3, 1, 3, 4)
    expected = torch.nn.AvgPool2d(3, stride=1, padding=1)(padded).view(3, 12)[:, :10].reshape(-1)
    torch.testing.assert_close(pool_slots(ten.reshape(-1), 10, 4, 2, 3, official=True), expected)


def test_reference_pooling_by_quartile():
    # 8 layers: quartiles 0..3 pool 3-D k7, 2-D k5, 1-D k3, none; 3 frames of 3 × 3 slots fit both kernels to 3
    policy = make_policy("infinipot", van_pool=True, profile="reference")
    from tests.test_policies_formulas import layer

    g = torch.Generator().manual_seed(4)
    values = torch.rand(1, 27, 2, generator=g)
    tokens = layer([0] * 9 + [1] * 9 + [2] * 9, list(range(9)) * 3, values=values)
    van = values.norm(dim=-1).mean(0)
    torch.testing.assert_close(policy.salience(tokens, 7, 8, 9), van)
    seq = torch.nn.AvgPool1d(3, stride=1, padding=1)(van.view(1, 1, -1)).view(-1)
    torch.testing.assert_close(policy.salience(tokens, 4, 8, 9), seq)
    grid = torch.nn.AvgPool2d(3, stride=1, padding=1)(van.view(3, 1, 3, 3)).reshape(-1)
    torch.testing.assert_close(policy.salience(tokens, 2, 8, 9), grid)
    cube = torch.nn.AvgPool3d(3, stride=1, padding=1)(van.view(1, 3, 3, 3)).reshape(-1)
    torch.testing.assert_close(policy.salience(tokens, 0, 8, 9), cube)
    torch.testing.assert_close(policy.salience(tokens, 1, 8, 9), cube)
