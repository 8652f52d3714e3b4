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
        stream.apply(choices)
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
            stream.apply([choice])
    assert most_units_held > 2 * cap_units // 2  # thinned units really piled up (the old window grew with them)
