"""Each policy's formulas pinned on small hand-built tensors, expected values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from policies import LayerTokens, StreamState, make_policy
from policies.base import top_k_sorted, top_k_tiered
from policies.hermes import (
    GLOBAL_QUERY,
    LOCAL_QUERY,
    align_by_id,
    fold_summary,
    layer_roles,
    min_max,
    recency,
    smooth_across_layers,
)
from policies.infinipot import box_sum, pool_kernel, recent_frames_mask, tar_scores, value_norms
from policies.uniform import evenly_spaced_frames


def layer(frames, patches, keys=None, values=None, *, ids=None, positions=None, summary=None, attention=None):
    """LayerTokens for tokens at (frame, patch); keys/values default to zeros of shape (1, N, 2)."""
    n = len(frames)
    keys = torch.zeros(1, n, 2) if keys is None else torch.as_tensor(keys, dtype=torch.float32)
    values = torch.zeros(1, n, 2) if values is None else torch.as_tensor(values, dtype=torch.float32)
    return LayerTokens(
        keys=keys,
        values=values,
        token_id=torch.arange(n) if ids is None else torch.tensor(ids),
        frame=torch.tensor(frames),
        patch=torch.tensor(patches),
        positions=torch.arange(n).unsqueeze(1) if positions is None else torch.tensor(positions).reshape(n, -1),
        is_summary=torch.zeros(n, dtype=torch.bool) if summary is None else torch.tensor(summary),
        attention=attention or {},
    )


def state(layers, budget, tokens_per_frame=1, rotary=None):
    return StreamState(layers, budget, tokens_per_frame, rotary)


class Rope1D:
    """Textbook 1-D RoPE, independent of the engine: angle = pos · inv_freq, cat((f, f)), rotate_half."""

    def __init__(self, dim: int, base: float = 10.0):
        self.inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)

    def at(self, vectors, positions):
        """Rotate (..., N, D) vectors by their (N,) positions."""
        angle = positions.to(torch.float64).unsqueeze(-1) * self.inv_freq
        angle = torch.cat((angle, angle), dim=-1)
        half = vectors.shape[-1] // 2
        rotated_half = torch.cat((-vectors[..., half:], vectors[..., :half]), dim=-1)
        return (vectors * angle.cos() + rotated_half * angle.sin()).to(vectors.dtype)

    def rotate(self, keys, delta):
        return self.at(keys, delta[:, 0])


# ---------------------------------------------------------------------------------- hermes


def test_recency_is_exp_of_scaled_age():
    # N = 5: d = (4 - i) / 4 = 1, .75, .5, .25, 0 ; k = 20
    expected = [math.exp(-20), math.exp(-15), math.exp(-10), math.exp(-5), 1.0]
    assert recency(5, 20.0).tolist() == pytest.approx(expected, rel=1e-6)


def test_recency_of_a_single_token_is_one():
    assert recency(1, 20.0).tolist() == [1.0]  # d = 0 / max(0, 1)


def test_min_max_uses_epsilon():
    assert min_max(torch.tensor([1.0, 3.0, 5.0])).tolist() == pytest.approx([0.0, 2 / (4 + 1e-6), 4 / (4 + 1e-6)])
    assert min_max(torch.tensor([2.0, 2.0])).tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    "num_layers, shallow, middle, deep",
    [
        (24, range(0, 2), range(2, 16), range(16, 24)),
        (28, range(0, 2), range(2, 19), range(19, 28)),
        (36, range(0, 3), range(3, 25), range(25, 36)),
        (64, range(0, 6), range(6, 44), range(44, 64)),
        (90, range(0, 9), range(9, 63), range(63, 90)),  # 0.7 · 90 = 63 exactly, not float 62.99
    ],
)
def test_layer_split(num_layers, shallow, middle, deep):
    kinds = [role.kind for role in layer_roles(num_layers, 0.1, 0.7)]
    assert kinds == ["shallow"] * len(shallow) + ["middle"] * len(middle) + ["deep"] * len(deep)


def test_middle_layer_weights_follow_depth():
    policy = make_policy("hermes")
    roles = layer_roles(24, 0.1, 0.7)  # l_s = 2, l_d = 16
    assert roles[9].depth == 0.5  # (9 - 2) / (16 - 2)
    assert policy.omega(roles[9]) == pytest.approx(0.45)  # 0.75 - 0.6 · 0.5
    assert policy.decay(roles[9]) == pytest.approx(14.0)  # 20 - 12 · 0.5
    assert (policy.omega(roles[2]), policy.decay(roles[2])) == (0.75, 20.0)
    assert (policy.omega(roles[0]), policy.decay(roles[0])) == (1.0, 20.0)
    assert policy.omega(roles[16]) == 0.0


def test_middle_layer_score_mixes_attention_and_recency():
    policy = make_policy("hermes")
    role = layer_roles(24, 0.1, 0.7)[9]  # ω = 0.45, k = 14
    tokens = layer([0, 1, 2], [0, 0, 0], attention={"mixed": torch.tensor([0.2, 0.6, 0.2])})
    r = [math.exp(-14), math.exp(-7), 1.0]  # d = 1, .5, 0
    r_hat = [(x - r[0]) / (1 - r[0] + 1e-6) for x in r]
    a_hat = [0.0, 0.4 / (0.4 + 1e-6), 0.0]
    expected = [0.55 * a + 0.45 * b for a, b in zip(a_hat, r_hat)]
    assert policy.layer_score(tokens, role, 9).tolist() == pytest.approx(expected, rel=1e-5)


def test_shallow_layers_need_no_attention_and_deep_layers_use_global():
    policy = make_policy("hermes")
    roles = layer_roles(24, 0.1, 0.7)
    tokens = layer([0, 1, 2], [0, 0, 0], attention={"global": torch.tensor([3.0, 1.0, 2.0])})
    assert policy.layer_score(tokens, roles[0], 0).argmax() == 2  # recency only: the newest
    assert policy.layer_score(tokens, roles[20], 20).tolist() == pytest.approx([2 / (2 + 1e-6), 0.0, 1 / (2 + 1e-6)])
    with pytest.raises(ValueError, match="'mixed'"):
        policy.layer_score(tokens, roles[5], 5)


def test_smoothing_runs_from_the_deepest_layer_up_by_token_identity():
    roles = layer_roles(3, 0.34, 0.67)  # int(1.02) = 1, int(2.01) = 2: one layer of each kind
    assert [r.kind for r in roles] == ["shallow", "middle", "deep"]
    weights = [make_policy("hermes").smoothing_weight(r) for r in roles]
    assert weights == [0.1, 0.3, 0.4]
    ids = [torch.tensor([1, 2, 4]), torch.tensor([2, 3, 4]), torch.tensor([1, 2, 3])]
    scores = [torch.tensor([0.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.2, 0.4, 0.6])]
    smoothed = smooth_across_layers(scores, ids, weights)
    # deep: unchanged. middle ids 2, 3, 4 see deep 0.4, 0.6, (4 missing) 0:
    middle = [0.7 * 1.0 + 0.3 * 0.4, 0.7 * 0.0 + 0.3 * 0.6, 0.7 * 0.5 + 0.3 * 0.0]  # .82, .18, .35
    # shallow ids 1, 2, 4 see the *smoothed* middle: (1 missing) 0, 0.82, 0.35:
    shallow = [0.0, 0.9 * 1.0 + 0.1 * 0.82, 0.1 * 0.35]  # 0, .982, .035
    assert smoothed[2].tolist() == pytest.approx([0.2, 0.4, 0.6])
    assert smoothed[1].tolist() == pytest.approx(middle)
    assert smoothed[0].tolist() == pytest.approx(shallow)


def test_align_by_id_looks_up_unsorted_ids():
    values = torch.tensor([10.0, 20.0, 30.0])
    assert align_by_id(values, torch.tensor([7, 3, 5]), torch.tensor([5, 6, 7, 3])).tolist() == [30.0, 0.0, 10.0, 20.0]


def summary_layer():
    values = torch.tensor([[[1.0, 0.0], [2.0, 0.0], [9.0, 9.0], [4.0, 2.0], [5.0, 0.0], [6.0, 4.0]]])
    return layer(
        [0, 1, -1, 2, 3, 4], [0, 0, -1, 0, 0, 0], values=values, keys=torch.ones(1, 6, 2),
        summary=[False, False, True, False, False, False],
        attention={"global": torch.tensor([0.9, 0.1, 5.0, 0.8, 0.2, 0.3])},  # the old summary draws most
    )


def test_an_old_summary_competes_in_top_k_like_any_token():
    # One layer: it is deep (int(0.1) = int(0.7) = 0). Budget 3: keep 2 + a summary.
    (choice,) = make_policy("hermes").select(state([summary_layer()], budget=3))
    assert choice.keep.tolist() == [0, 2]  # the old summary (5.0) and token 0 (0.9) win
    # evicted: 1, 3, 4, 5 -> mean value ((2+4+5+6)/4, (0+2+0+4)/4)
    torch.testing.assert_close(choice.summary.value, torch.tensor([[4.25, 1.5]]))
    assert choice.summary.position.tolist() == [3]  # max kept position 2, + 1


def test_summary_value_is_mean_of_evicted_values_and_the_old_summary_is_folded():
    # fold_old_summary (ours): the old summary never stays as is.
    (choice,) = make_policy("hermes", fold_old_summary=True).select(state([summary_layer()], budget=3))
    assert choice.keep.tolist() == [0, 3]  # the two best non-summary tokens
    # evicted: 1, 2 (old summary), 4, 5 -> mean value ((2+9+5+6)/4, (0+9+0+4)/4)
    torch.testing.assert_close(choice.summary.value, torch.tensor([[5.5, 3.25]]))
    assert choice.summary.position.tolist() == [4]  # max kept position 3, + 1


def test_summary_key_is_mean_of_phase_aligned_keys():
    rope = Rope1D(dim=4)
    base = torch.tensor([[[1.0, 0.0, 0.5, -1.0], [0.0, 2.0, 1.0, 0.0], [1.0, 1.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]])
    positions = torch.tensor([0, 3, 7, 8])
    tokens = layer([0, 1, 2, 3], [0, 0, 0, 0], keys=rope.at(base, positions), values=torch.zeros(1, 4, 4),
                   positions=positions.tolist())
    summary = fold_summary(tokens, keep=torch.tensor([2]), evicted=torch.tensor([0, 1, 3]), rotary=rope)
    assert summary.position.tolist() == [8]  # kept position 7, + 1
    # Rotating each evicted key to position 8 and averaging = the averaged unrotated keys at 8.
    expected = rope.at(base[:, [0, 1, 3]].mean(dim=1, keepdim=True), torch.tensor([8]))[:, 0]
    torch.testing.assert_close(summary.key, expected, atol=1e-6, rtol=0)
    unaligned = fold_summary(tokens, torch.tensor([2]), torch.tensor([0, 1, 3]), rotary=None)
    torch.testing.assert_close(unaligned.key, tokens.keys[:, [0, 1, 3]].mean(dim=1))
    assert not torch.allclose(unaligned.key, summary.key)


def test_summary_position_is_the_overall_max_of_kept_plus_one_or_per_axis():
    tokens = layer([0, 1, 2], [0, 0, 0], keys=torch.zeros(1, 3, 2), positions=[[5, 9, 1], [6, 2, 8], [9, 9, 9]])
    summary = fold_summary(tokens, keep=torch.tensor([0, 1]), evicted=torch.tensor([2]), rotary=None)
    assert summary.position.tolist() == [10, 10, 10]  # official code: max over every axis, + 1, on all axes
    per_axis = fold_summary(tokens, torch.tensor([0, 1]), torch.tensor([2]), rotary=None, per_axis=True)
    assert per_axis.position.tolist() == [7, 10, 9]


def test_pseudo_query_texts_before_and_after_a_question():
    policy = make_policy("hermes")
    assert LOCAL_QUERY == ("Describe the current scene in detail, focusing on specific objects, fine-grained "
                           "actions, and spatial relationships.")
    assert GLOBAL_QUERY == ("Summarize the video narrative, identifying main characters, key events, timeline "
                            "changes, and the overall theme.")
    assert policy.pseudo_queries(()) == {"mixed": LOCAL_QUERY + "; " + GLOBAL_QUERY, "global": GLOBAL_QUERY}
    history = (("Who came in?", "A dog"), ("What colour is the car?", "Red"))
    c = "Question: What colour is the car? Answer: Red"
    local = f"Find recent details related to: {c}. " + LOCAL_QUERY
    global_ = f"Context summary: {c}. " + GLOBAL_QUERY
    assert policy.pseudo_queries(history) == {"mixed": local + "; " + global_, "global": global_}


# ------------------------------------------------------------------------------- infinipot


def grid_layer(keys_by_token, frames, patches, values=None):
    """Keys given per token as (H, D) rows."""
    keys = torch.tensor(keys_by_token, dtype=torch.float32).permute(1, 0, 2)
    return layer(frames, patches, keys=keys, values=values)


def test_tar_static_patch_is_redundant_and_changing_patch_is_not():
    # Two heads; 3 frames × 2 patches + one newline token of frame 0 (patch 2). Recent: frame 2.
    e0, e1 = [1.0, 0.0], [0.0, 1.0]
    keys = [
        [e0, e0], [e0, e1],  # frame 0: patch 0 static; patch 1: head 0 orthogonal, head 1 equal
        [e0, e0],  # newline of frame 0
        [e0, e0], [[0.0, -1.0], [0.0, -2.0]],  # frame 1: patch 1 opposite in both heads
        [[2.0, 0.0], [3.0, 0.0]], [e1, e1],  # frame 2 (recent); norms do not matter
    ]
    tokens = grid_layer(keys, [0, 0, 0, 1, 1, 2, 2], [0, 1, 2, 0, 1, 0, 1])
    recent = recent_frames_mask(tokens.frame, 1)  # the newest unit held
    assert recent.tolist() == [False] * 5 + [True, True]
    tar = tar_scores(tokens, recent, tokens_per_frame=2).tolist()
    assert tar[:2] == pytest.approx([-1.0, -0.5])  # static: -cos = -1; heads (0 + 1) / 2
    assert tar[3:5] == pytest.approx([-1.0, 1.0])
    assert tar[2] == tar[5] == tar[6] == -math.inf  # newline and recent tokens get no TaR score


def test_tar_averages_over_recent_frames_and_skips_tokens_without_partner():
    e0, e1 = [[1.0, 0.0]], [[0.0, 1.0]]
    # 4 frames × 2 patches, 2 recent units -> frames 2, 3; frame 3 lost its patch 1
    keys = [e0, e0, e0, e1, e0, e0, e1]
    tokens = grid_layer(keys, [0, 0, 1, 1, 2, 2, 3], [0, 1, 0, 1, 0, 1, 0])
    recent = recent_frames_mask(tokens.frame, 2)
    tar = tar_scores(tokens, recent, tokens_per_frame=2).tolist()
    assert tar[0] == pytest.approx(-(1.0 + 0.0) / 2)  # frame 2 patch 0 = e0, frame 3 patch 0 = e1
    assert tar[2] == pytest.approx(-0.5)
    assert tar[1] == pytest.approx(-1.0)  # only frame 2 has a patch 1
    assert tar[3] == pytest.approx(0.0)


def test_value_norm_is_averaged_over_heads():
    values = torch.tensor([[[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]], [[0.0, 1.0], [0.0, 3.0], [2.0, 0.0]]])
    assert value_norms(values).tolist() == pytest.approx([3.0, 2.0, 2.0])  # (5+1)/2, (1+3)/2, (2+2)/2


def test_van_ranks_older_tokens_after_the_recent_frame():
    # 8 frames of 1 token; budget 8 -> |C| = 6; recent = frame 7; alpha 0: no TaR picks.
    norms = [5.0, 1.0, 7.0, 3.0, 0.5, 6.0, 2.0, 0.1]
    tokens = layer(list(range(8)), [0] * 8, keys=torch.randn(1, 8, 2), values=torch.tensor(norms).view(1, 8, 1))
    (choice,) = make_policy("infinipot", alpha=0.0).select(state([tokens], budget=8))
    assert choice.keep.tolist() == [0, 2, 3, 5, 6, 7]  # the 5 largest norms among 0..6 + frame 7


def test_alpha_splits_the_kept_set_between_tar_and_van():
    # 8 frames × 2 patches, budget 16 -> |C| = 12; recent_fraction 0.25 -> frames 6, 7 (4 tokens);
    # alpha 0.5 -> int(6) - 4 = 2 TaR picks.
    e0, e1 = [[1.0, 0.0]], [[0.0, 1.0]]
    keys = [e0, e1] * 8
    keys[2] = [[-1.0, 0.0]]  # frame 1 patch 0 opposite to the recent frames: TaR +1
    keys[7] = [[1.0, 0.0]]  # frame 3 patch 1 orthogonal: TaR 0; every other older token: -1
    norms = torch.arange(1.0, 17.0)
    norms[2], norms[7] = 0.1, 0.2  # the TaR picks have the smallest value norms
    tokens = grid_layer(keys, [t // 2 for t in range(16)], [t % 2 for t in range(16)], values=norms.view(1, 16, 1))
    (with_tar,) = make_policy("infinipot", recent_fraction=0.25).select(state([tokens], 16, tokens_per_frame=2))
    # recent 12..15, TaR 2 and 7, then the 6 largest norms among the rest: 5, 6, 8..11
    assert with_tar.keep.tolist() == [2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    (van_only,) = make_policy("infinipot", recent_fraction=0.25, alpha=0.0).select(state([tokens], 16, 2))
    assert van_only.keep.tolist() == [3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15]  # 2 and 7 lost


def test_infinipot_compresses_at_the_cap_to_the_ratio():
    policy = make_policy("infinipot")
    assert policy.target(4000) == 3000
    assert policy.should_compress(4000, 4000) and not policy.should_compress(3999, 4000)


def test_pool_kernel_by_layer_quartile():
    assert [pool_kernel(l, 28) for l in (0, 6, 7, 13, 14, 20, 21, 27)] == [7, 7, 5, 5, 3, 3, 1, 1]


def test_box_sum_adds_a_zero_padded_window():
    maps = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]])
    # 3 × 3 windows: corner (0, 0) sees 1 + 2 + 4 + 5 = 12; (0, 1) sees 1 + 2 + 3 + 4 + 5 + 6 = 21 ...
    assert box_sum(maps, 3).tolist() == [[[12.0, 21.0, 16.0], [12.0, 21.0, 16.0]]]
    assert box_sum(maps, 1).tolist() == maps.tolist()


def test_van_pooling_averages_a_frame_neighbourhood():
    # One frame of 2×2 patches + a recent frame; kernel 7 covers the whole frame: every token of
    # frame 0 scores the frame's mean norm, so ties keep the older tokens.
    norms = torch.tensor([1.0, 9.0, 2.0, 3.0, 1.0, 1.0, 1.0, 1.0])
    tokens = layer([0] * 4 + [1] * 4, [0, 1, 2, 3] * 2, keys=torch.randn(1, 8, 2), values=norms.view(1, 8, 1))
    # |M| = 8 holds f = 2 units of 4 tokens; r = 0.5 -> 1 recent unit (frame 1)
    plain = make_policy("infinipot", alpha=0.0, ratio=0.625, recent_fraction=0.5).select(state([tokens], 8, 4))
    pooled = make_policy("infinipot", alpha=0.0, ratio=0.625, recent_fraction=0.5, van_pool=True).select(
        state([tokens], 8, 4)
    )
    assert plain[0].keep.tolist() == [1, 4, 5, 6, 7]  # the largest norm of frame 0 (9.0)
    assert pooled[0].keep.tolist() == [0, 4, 5, 6, 7]  # all of frame 0 score 3.75: the oldest wins


# ------------------------------------------------------------------------- fifo, sink, uniform


def test_fifo_keeps_the_newest():
    tokens = layer(list(range(10)), [0] * 10)
    assert make_policy("fifo").select(state([tokens], 4))[0].keep.tolist() == [6, 7, 8, 9]


def test_sink_keeps_the_start_and_the_newest():
    tokens = layer(list(range(10)), [0] * 10)
    assert make_policy("sink", n_sink=2).select(state([tokens], 6))[0].keep.tolist() == [0, 1, 6, 7, 8, 9]
    # the sink takes at most half the budget, so the newest tokens are always kept too
    assert make_policy("sink", n_sink=8).select(state([tokens], 6))[0].keep.tolist() == [0, 1, 2, 7, 8, 9]


def test_uniform_grid_spans_first_to_newest_frame():
    assert evenly_spaced_frames(list(range(10)), 4) == [0, 3, 6, 9]  # grid 0, 3, 6, 9
    assert evenly_spaced_frames([0, 2, 5, 6, 7, 8, 9], 3) == [0, 5, 9]  # grid 0, 4.5, 9
    assert evenly_spaced_frames([0, 4, 5, 9], 3) == [0, 4, 9]  # 4 and 5 tie at 4.5: the older
    assert evenly_spaced_frames([0, 1, 2, 9], 3) == [0, 2, 9]  # 4.5: nearest held is 2
    assert evenly_spaced_frames([3, 8], 1) == [8]


def test_uniform_keeps_whole_frames_and_drops_newlines_to_hit_the_target():
    # 10 frames × 2 patches, a newline (patch 2) after frames 4 and 9; budget 9 -> 4 frames, 8 tokens.
    frames, patches = [], []
    for f in range(10):
        frames += [f, f] + ([f] if f in (4, 9) else [])
        patches += [0, 1] + ([2] if f in (4, 9) else [])
    tokens = layer(frames, patches)
    policy = make_policy("uniform")
    assert policy.target(9, tokens_per_frame=2) == 8
    (choice,) = policy.select(state([tokens], 9, tokens_per_frame=2))
    kept = list(zip(tokens.frame[choice.keep].tolist(), tokens.patch[choice.keep].tolist()))
    assert kept == [(0, 0), (0, 1), (3, 0), (3, 1), (6, 0), (6, 1), (9, 0), (9, 1)]


# ------------------------------------------------------------------------------------ base


def test_top_k_helpers_rank_then_restore_order():
    assert top_k_sorted(torch.tensor([1.0, 3.0, 3.0, 2.0]), 2).tolist() == [1, 2]
    assert top_k_sorted(torch.tensor([3.0, 1.0, 3.0, 3.0]), 2).tolist() == [0, 2]  # ties: the older
    # tier 1 first (indices 1, 3), then the best score of tier 0 (index 0: 5.0)
    assert top_k_tiered(torch.tensor([0, 1, 0, 1]), torch.tensor([5.0, 1.0, 3.0, 2.0]), 3).tolist() == [0, 1, 3]
