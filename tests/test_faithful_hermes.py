"""HERMES as the paper and the official code have it, pinned on small hand-made tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from policies import LayerTokens, StreamState, make_policy
from policies.hermes import (
    LOCAL_QUERY,
    layer_roles,
    pseudo_query_texts,
    resample,
    rewrite_choice_answer,
    smooth_by_index,
)


def test_index_aligned_smoothing_is_the_seed_formula_slot_by_slot():
    # λ = 0.1 / 0.3 / 0.4 for a shallow, a middle and a deep layer; deepest first, S̃ of the layer above.
    scores = [torch.tensor([0.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0.2, 0.4, 0.6])]
    smoothed = smooth_by_index(scores, [0.1, 0.3, 0.4])
    middle = [0.7 * 1.0 + 0.3 * 0.2, 0.7 * 0.0 + 0.3 * 0.4, 0.7 * 0.5 + 0.3 * 0.6]  # .76, .12, .53
    shallow = [0.1 * 0.76, 0.9 * 1.0 + 0.1 * 0.12, 0.1 * 0.53]
    assert smoothed[2].tolist() == pytest.approx([0.2, 0.4, 0.6])
    assert smoothed[1].tolist() == pytest.approx(middle)
    assert smoothed[0].tolist() == pytest.approx(shallow)


def test_unequal_lengths_interpolate_the_layer_above_along_the_index():
    # Layer above holds 2 tokens [0, 1], this layer 4: half-pixel sampling at (i + .5)·2/4 − .5
    # = −.25 (→ 0), .25, .75, 1.25 (→ the last) gives 0, .25, .75, 1.
    above, here = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0, 1.0, 1.0])
    assert resample(above, 4).tolist() == pytest.approx([0.0, 0.25, 0.75, 1.0])
    smoothed = smooth_by_index([here, above], [0.3, 0.4])
    assert smoothed[0].tolist() == pytest.approx([0.7, 0.7 + 0.3 * 0.25, 0.7 + 0.3 * 0.75, 1.0])
    # Shrinking: 5 → 2 samples at 0.75 and 3.25.
    assert resample(torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]), 2).tolist() == pytest.approx([0.75, 3.25])


@pytest.mark.parametrize("size, n", [(7, 3), (3, 7), (10, 10), (1, 4), (13, 5)])
def test_resample_equals_torch_linear_interpolation(size, n):
    x = torch.rand(size, generator=torch.Generator().manual_seed(size * 31 + n))
    expected = F.interpolate(x.view(1, 1, -1), size=n, mode="linear", align_corners=False).view(-1)
    torch.testing.assert_close(resample(x, n), expected)


def test_the_reference_profile_splits_layers_in_float_as_the_official_code():
    exact = [r.kind for r in layer_roles(90, 0.1, 0.7)]
    floated = [r.kind for r in make_policy("hermes", profile="reference").roles(90)]
    assert exact.index("deep") == 63  # int(0.7 · 90) = 63 exactly
    assert floated.index("deep") == 62  # the official code: int(90 · (1 − 0.3)) = int(62.999…) = 62
    assert [r.kind for r in make_policy("hermes", profile="reference").roles(28)] == [r.kind for r in layer_roles(28, 0.1, 0.7)]


def one_layer_state(axes: int) -> StreamState:
    n = 4
    tokens = LayerTokens(
        keys=torch.zeros(1, n, 2), values=torch.zeros(1, n, 2), token_id=torch.arange(n), frame=torch.arange(n),
        patch=torch.zeros(n, dtype=torch.long), positions=torch.arange(n).unsqueeze(1).expand(-1, axes),
        is_summary=torch.zeros(n, dtype=torch.bool),
    )
    return StreamState([tokens], 2, 1)


def test_reference_constants_follow_the_family():
    paper, reference = make_policy("hermes"), make_policy("hermes", profile="reference")
    assert paper.constants(one_layer_state(1)) == (0.75, 0.6, 20.0, 12.0)
    assert reference.constants(one_layer_state(3)) == (0.75, 0.6, 20.0, 12.0)  # Qwen-VL code: the paper's
    assert reference.constants(one_layer_state(1)) == (1.0, 0.9, 20.0, 19.5)  # LLaVA-OV code
    forced = make_policy("hermes", profile="reference", family="qwen-vl")
    assert forced.constants(one_layer_state(1)) == (0.75, 0.6, 20.0, 12.0)
    role = layer_roles(24, 0.1, 0.7)[9]  # p = 7 / 14 = 0.5
    assert reference.omega(role, (1.0, 0.9, 20.0, 19.5)) == pytest.approx(0.55)
    assert reference.decay(role, (1.0, 0.9, 20.0, 19.5)) == pytest.approx(10.25)
    with pytest.raises(ValueError, match="profile"):
        make_policy("hermes", profile="official")


def test_a_choice_letter_becomes_the_option_text_in_the_pseudo_queries():
    question = "What does the man hold?\n(A) a red cup\n(B) B) a phone\n(C) a book"
    assert rewrite_choice_answer(question, "B") == "a phone"  # letter → option; "B) " stripped
    assert rewrite_choice_answer(question, "(C).") == "a book"
    assert rewrite_choice_answer(question, "He holds A) a red cup") == "He holds a red cup"
    assert rewrite_choice_answer("No options here", "D") == "D"
    texts = pseudo_query_texts(((question, "A"),))
    assert texts["local"] == f"Find recent details related to: Question: {question} Answer: a red cup. " + LOCAL_QUERY
    raw = pseudo_query_texts(((question, "A"),), rewrite_choices=False)
    assert "Answer: A." in raw["local"]
