"""Tests for hermes_cli.positions.rope: rotary-delta correction of post-RoPE cached keys and compaction.

The exactness tests compare against the real transformers text models (tiny, random weights,
seeded): the same input embeddings are run at positions P_old and at P_new, each into a fresh
DynamicCache, and the P_old keys rotated by Δ = P_new − P_old must equal the P_new keys.
Layer 0 is the exact test: its keys are RoPE(k_proj(norm(embeddings)), position) and depend on
nothing else, so the only difference between the two runs is the rotation. Deeper layers' keys
also depend on attention over *other* positions (relative offsets change when positions are
compacted), so they are not expected to match and are not tested here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # until the project is installed / configures pythonpath
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hermes_cli.positions.layout import (  # noqa: E402
    compact_positions,
    from_model_position_ids,
    next_position_after,
    text_positions,
    to_model_position_ids,
)
from hermes_cli.positions.rope import RotaryDelta, rotate_half  # noqa: E402

REL_TOL = 1e-4  # max |rotated − reference| ≤ REL_TOL · max |reference|
HIDDEN, HEADS, KV_HEADS = 64, 4, 2
HEAD_DIM = HIDDEN // HEADS  # 16 → 8 frequencies
MAX_POS = 4096


# ---------------------------------------------------------------------- tiny real models
def _common(**extra):
    return dict(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=300,
        max_position_embeddings=MAX_POS,
        bos_token_id=0,
        eos_token_id=1,
        **extra,
    )


_MODELS: dict = {}


def qwen2_text_model(rope_parameters: dict):
    """LLaVA-OneVision's language model is a Qwen2Model: 1-D RoPE (Qwen2RotaryEmbedding)."""
    key = ("qwen2", tuple(sorted(rope_parameters.items())))
    if key not in _MODELS:
        from transformers import Qwen2Config
        from transformers.models.qwen2.modeling_qwen2 import Qwen2Model

        torch.manual_seed(0)
        _MODELS[key] = Qwen2Model(Qwen2Config(**_common(rope_parameters=rope_parameters))).eval()
    return _MODELS[key]


def qwen25vl_text_model():
    """Qwen2.5-VL text model, M-RoPE with mrope_section [2, 3, 3] (sums to head_dim/2 = 8)."""
    key = ("qwen2.5-vl",)
    if key not in _MODELS:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLTextModel

        rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}
        torch.manual_seed(1)
        _MODELS[key] = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**_common(rope_parameters=rope))).eval()
    return _MODELS[key]


def qwen3vl_text_model():
    """Qwen3-VL text model: interleaved M-RoPE, mrope_section [4, 2, 2]."""
    key = ("qwen3-vl",)
    if key not in _MODELS:
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel

        rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2],
                "mrope_interleaved": True}
        torch.manual_seed(2)
        cfg = Qwen3VLTextConfig(**_common(rope_parameters=rope, head_dim=HEAD_DIM))
        _MODELS[key] = Qwen3VLTextModel(cfg).eval()
    return _MODELS[key]


def layer0_keys(model, embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Run ``embeds`` (1, N, H) at explicit ``positions`` (N, A) into a fresh cache; layer-0 keys."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(
            inputs_embeds=embeds,
            position_ids=to_model_position_ids(positions),
            cache=cache,
            use_cache=True,
        )
    return cache.layers[0].keys  # (1, kv_heads, N, head_dim)


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def _assert_angles_match_model(rd: RotaryDelta, model, positions: torch.Tensor) -> None:
    """angles() is bit-identical to the model's own cos/sin layout (up to attention_scaling)."""
    emb = torch.zeros(1, positions.shape[0], HIDDEN)
    cos, sin = model.rotary_emb(emb, to_model_position_ids(positions))
    ang = rd.angles(positions)
    s = model.rotary_emb.attention_scaling
    assert torch.equal(cos[0], ang.cos() * s)
    assert torch.equal(sin[0], ang.sin() * s)


# ---------------------------------------------------------------------- 1. exactness
ROPE_1D = {
    "default": {"rope_type": "default", "rope_theta": 1e4},
    "linear": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
    # YaRN has attention_scaling != 1: catches a delta that applies the scaling twice.
    "yarn": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
             "original_max_position_embeddings": 1024},
}

MEASURED: dict[str, float] = {}


@pytest.mark.parametrize("rope_name", list(ROPE_1D))
def test_exact_1d_compaction_matches_model(rope_name):
    model = qwen2_text_model(ROPE_1D[rope_name])
    rd = RotaryDelta.from_rotary_embedding(model.rotary_emb)
    assert rd.mrope_section is None and rd.num_axes == 1 and rd.head_dim == HEAD_DIM
    assert torch.equal(rd.inv_freq, model.rotary_emb.inv_freq.float())

    g = torch.Generator().manual_seed(3)
    n, prefix = 48, 7
    p_old = torch.sort(torch.randperm(3000, generator=g)[:n] + prefix).values[:, None]
    p_new = compact_positions(p_old, prefix)
    assert torch.equal(p_new[:, 0], prefix + torch.arange(n))
    emb = torch.randn(1, n, HIDDEN, generator=g)

    k_old, k_new = layer0_keys(model, emb, p_old), layer0_keys(model, emb, p_new)
    _assert_angles_match_model(rd, model, p_old)

    rotated = rd.rotate(k_old, p_new - p_old)
    err = rel_err(rotated, k_new)
    MEASURED[f"1d-{rope_name}"] = err
    assert err <= REL_TOL, err

    scale = model.rotary_emb.attention_scaling
    if scale != 1.0:
        # Applying attention_scaling again in the delta (cos·s, sin·s) is measurably wrong.
        cos, sin = rd.cos_sin(p_new - p_old)
        twice = k_old * cos * scale + rotate_half(k_old) * sin * scale
        assert rel_err(twice, k_new) > 10 * REL_TOL


def _mrope_old_new(n: int, g: torch.Generator):
    """Uneven M-RoPE moves: different Δ per axis and per token (positions may collide)."""
    p_old = torch.randint(0, 2500, (n, 3), generator=g)
    p_new = torch.randint(0, 600, (n, 3), generator=g)
    return p_old, p_new


@pytest.mark.parametrize("family", ["qwen2.5-vl", "qwen3-vl"])
def test_exact_mrope_uneven_deltas_match_model(family):
    model = qwen25vl_text_model() if family == "qwen2.5-vl" else qwen3vl_text_model()
    rd = RotaryDelta.from_rotary_embedding(model.rotary_emb)
    assert rd.num_axes == 3 and rd.head_dim == HEAD_DIM
    assert rd.interleaved == (family == "qwen3-vl")

    g = torch.Generator().manual_seed(4)
    n = 40
    p_old, p_new = _mrope_old_new(n, g)
    delta = p_new - p_old
    assert (delta[:, 0] != delta[:, 1]).any() and (delta[:, 1] != delta[:, 2]).any()
    emb = torch.randn(1, n, HIDDEN, generator=g)

    _assert_angles_match_model(rd, model, p_old)
    k_old, k_new = layer0_keys(model, emb, p_old), layer0_keys(model, emb, p_new)
    err = rel_err(rd.rotate(k_old, delta), k_new)
    MEASURED[f"mrope-{family}"] = err
    assert err <= REL_TOL, err

    # Rotating with the wrong axis layout must fail: the test is sensitive to the sections.
    wrong = RotaryDelta(rd.inv_freq, None)  # treats every dim as axis t
    assert rel_err(wrong.rotate(k_old, delta[:, :1]), k_new) > 10 * REL_TOL


def test_exact_mrope_video_compaction_and_summary_alignment():
    """A Qwen2.5-VL-like layout: text prefix, then a video whose temporal step is 8 (0.5 fps,
    2 frames per grid, 2 tokens/s), 4 temporal groups of a 2×3 grid; evict some tokens, compact,
    correct the keys, compare with the model run at the compacted positions. Then rotate all
    evicted keys to one common target (the summary token of spec §7)."""
    model = qwen25vl_text_model()
    rd = RotaryDelta.from_rotary_embedding(model.rotary_emb)
    prefix = 5
    grid = [
        (prefix + 8 * t, prefix + h, prefix + w) for t in range(4) for h in range(2) for w in range(3)
    ]
    video = torch.tensor(grid)  # (24, 3)
    keep = torch.tensor([0, 2, 3, 7, 8, 13, 17, 18, 20, 23])
    evicted = torch.tensor(sorted(set(range(len(grid))) - set(keep.tolist())))
    p_old = video[keep]
    p_new = compact_positions(p_old, prefix)
    # t: {5, 13, 21, 29} → {5, 6, 7, 8};  h: {5, 6} → same;  w: {5, 6, 7} → same
    assert torch.equal(torch.unique(p_new[:, 0]), torch.arange(5, 9))
    assert torch.equal(p_new[:, 1:], p_old[:, 1:])

    g = torch.Generator().manual_seed(5)
    emb = torch.randn(1, len(grid), HIDDEN, generator=g)
    k_old = layer0_keys(model, emb[:, keep], p_old)
    k_new = layer0_keys(model, emb[:, keep], p_new)
    err = rel_err(rd.rotate(k_old, p_new - p_old), k_new)
    MEASURED["mrope-video-compaction"] = err
    assert err <= REL_TOL, err

    target = next_position_after(p_new, floor=prefix)
    assert target == 9
    p_ev = video[evicted]
    k_ev = layer0_keys(model, emb[:, evicted], p_ev)
    at_target = rd.rotate(k_ev, target - p_ev)
    ref = layer0_keys(model, emb[:, evicted], torch.full((len(evicted), 3), target))
    err = rel_err(at_target, ref)
    MEASURED["mrope-summary-to-target"] = err
    assert err <= REL_TOL, err


# ---------------------------------------------------------------------- 2. identities
def test_contiguous_positions_unchanged_and_zero_delta_is_identity():
    p = (11 + torch.arange(20))[:, None]
    assert torch.equal(compact_positions(p, 11), p)
    p3 = torch.stack([3 + torch.arange(6), 5 + torch.arange(6), 7 + torch.arange(6)], 1)
    assert torch.equal(compact_positions(p3, torch.tensor([3, 5, 7])), p3)

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for rd in (RotaryDelta(1e4 ** -(torch.arange(0, 16, 2) / 16)),
                   RotaryDelta(1e4 ** -(torch.arange(0, 16, 2) / 16), [2, 3, 3])):
            k = torch.randn(2, 3, 20, 16, generator=torch.Generator().manual_seed(6)).to(dtype)
            zero = torch.zeros(20, rd.num_axes, dtype=torch.long)
            out = rd.rotate(k, zero)
            assert out.dtype == dtype and torch.equal(out, k)


# ---------------------------------------------------------------------- 3. compaction
def test_compact_positions_hand_made_mrope():
    p = torch.tensor([
        [10, 3, 7],
        [10, 4, 9],
        [14, 3, 7],
        [14, 4, 8],
        [18, 3, 9],
    ])
    out = compact_positions(p, 2)
    expected = torch.tensor([
        [2, 2, 2],
        [2, 3, 4],
        [3, 2, 2],
        [3, 3, 3],
        [4, 2, 4],
    ])
    assert out.dtype == torch.int64 and torch.equal(out, expected)
    # per-axis offsets
    out = compact_positions(p, torch.tensor([100, 0, 50]))
    assert torch.equal(out, expected - 2 + torch.tensor([100, 0, 50]))
    # unsorted input, 1-D (N,) input
    assert torch.equal(compact_positions(torch.tensor([40, 3, 17]), 1), torch.tensor([3, 1, 2]))
    assert next_position_after(out) == 103
    assert next_position_after(torch.empty(0, 3, dtype=torch.long), floor=5) == 5
    assert next_position_after(torch.tensor([[1, 2, 3]]), floor=10) == 10


positions_strategy = st.integers(1, 40).flatmap(
    lambda n: st.tuples(
        st.lists(st.lists(st.integers(0, 10_000), min_size=3, max_size=3), min_size=n, max_size=n),
        st.integers(0, 500),
    )
)


@settings(max_examples=150, deadline=None)
@given(positions_strategy)
def test_compact_positions_properties(data):
    rows, offset = data
    p = torch.tensor(rows, dtype=torch.long)
    out = compact_positions(p, offset)
    assert out.shape == p.shape and out.dtype == torch.int64
    for a in range(3):
        old, new = p[:, a], out[:, a]
        # order preserved and equality preserved, both ways
        assert torch.equal(old[:, None] < old[None, :], new[:, None] < new[None, :])
        assert torch.equal(old[:, None] == old[None, :], new[:, None] == new[None, :])
        # dense: the distinct new values are offset, offset + 1, …
        assert torch.equal(torch.unique(new), offset + torch.arange(torch.unique(old).numel()))
    assert torch.equal(compact_positions(out, offset), out)  # idempotent
    assert next_position_after(out, floor=offset) == int(out.max()) + 1


# ---------------------------------------------------------------------- 4. composition
@pytest.mark.parametrize("mrope", [None, (2, 3, 3)])
def test_rotation_composes(mrope):
    g = torch.Generator().manual_seed(7)
    inv = 1e4 ** -(torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    rd = RotaryDelta(inv, mrope)
    a = rd.num_axes
    k = torch.randn(1, 2, 30, 16, generator=g)
    d1 = torch.randint(-3000, 3000, (30, a), generator=g)
    d2 = torch.randint(-3000, 3000, (30, a), generator=g)
    two_steps = rd.rotate(rd.rotate(k, d1), d2)
    one_step = rd.rotate(k, d1 + d2)
    err = rel_err(two_steps, one_step)
    MEASURED[f"compose-{mrope}"] = err
    assert err <= 1e-5, err
    # a rotation preserves the norm of every rotary pair, hence of the key
    assert torch.allclose(two_steps.norm(dim=-1), k.norm(dim=-1), rtol=1e-5)
    # and the inverse undoes it
    assert rel_err(rd.rotate(rd.rotate(k, d1), -d1), k) <= 1e-5


# ---------------------------------------------------------------------- API edges
def test_constructor_layouts_and_errors():
    inv = torch.ones(8)
    assert RotaryDelta(inv, [2, 3, 3]).axis_of_dim.tolist() == [0, 0, 1, 1, 1, 2, 2, 2] * 2
    assert RotaryDelta(inv, [4, 2, 2], interleaved=True).axis_of_freq.tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    with pytest.raises(ValueError):
        RotaryDelta(inv, [2, 3, 2])  # does not sum to head_dim / 2
    rd = RotaryDelta(inv, [2, 3, 3])
    with pytest.raises(ValueError):
        rd.rotate(torch.zeros(4, 12), torch.zeros(4, 3, dtype=torch.long))  # wrong head_dim
    with pytest.raises(ValueError):
        rd.rotate(torch.zeros(4, 16), torch.zeros(4, 2, dtype=torch.long))  # wrong axis count
    with pytest.raises(ValueError):
        rd.rotate(torch.zeros(5, 16), torch.zeros(4, 3, dtype=torch.long))  # wrong N
    with pytest.raises(TypeError):
        rd.angles(torch.zeros(4, 3))  # float positions
    # one axis broadcasts to all three, like the model's expand(3, …)
    p = torch.arange(5)[:, None]
    assert torch.equal(rd.angles(p), rd.angles(p.expand(5, 3)))


def test_dynamic_rope_is_refused():
    model = qwen2_text_model({"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0})
    with pytest.raises(ValueError, match="dynamic"):
        RotaryDelta.from_rotary_embedding(model.rotary_emb)


def test_position_id_conversions_round_trip():
    p3 = torch.randint(0, 99, (7, 3))
    ids = to_model_position_ids(p3)
    assert ids.shape == (3, 1, 7)
    assert torch.equal(from_model_position_ids(ids), p3)
    packed = torch.cat([torch.arange(7).view(1, 1, 7), ids])  # (4, 1, 7): text row first
    assert torch.equal(from_model_position_ids(packed), p3)
    p1 = torch.arange(4, 11)[:, None]
    assert to_model_position_ids(p1).shape == (1, 7)
    assert torch.equal(from_model_position_ids(to_model_position_ids(p1)), p1)
    assert torch.equal(text_positions(4, 3, 3), torch.tensor([[4] * 3, [5] * 3, [6] * 3]))


def test_report_measured():
    """Prints the measured errors (visible with ``pytest -s``); runs last in file order."""
    for name, err in sorted(MEASURED.items()):
        print(f"rope max rel err {name:>26}: {err:.2e}")
        assert err <= REL_TOL


def test_compact_positions_with_a_step_keeps_native_spacing():
    """M-RoPE temporal positions offset + floor(u × 4/3) come back unchanged with step 4/3;
    after evicting units 1 and 2 the survivors close up in the same spacing."""
    interval = 4 / 3
    u = torch.arange(6)
    t = 10 + (u.to(torch.float32) * torch.tensor(interval, dtype=torch.float32)).long()
    p = torch.stack([t, 10 + u % 2, 10 + u % 3], dim=1)
    assert torch.equal(compact_positions(p, 10, [interval, 1.0, 1.0]), p)
    kept = p[[0, 3, 4, 5]]
    expected_t = 10 + (torch.arange(4).to(torch.float32) * torch.tensor(interval, dtype=torch.float32)).long()
    assert torch.equal(compact_positions(kept, 10, [interval, 1.0, 1.0])[:, 0], expected_t)
    with pytest.raises(ValueError, match="step"):
        compact_positions(p, 10, [0.0, 1.0, 1.0])
