"""The approximate pseudo-query (the HERMES paper's method) against a hand computation.

Per layer: raw token embeddings → that layer's RMS ``input_layernorm`` → query and key
projections → RoPE at the text positions (for text, M-RoPE puts the same position on every axis,
which is textbook 1-D RoPE) → softmax of ``q·k / √D`` over the cached keys *and* the
pseudo-query's own keys, with no causal mask.
"""

from __future__ import annotations

import math

import pytest
import torch

from hermes_cli.engine.pseudo_query import approx_attention


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angle = positions.to(torch.float64)[:, None] * inv_freq
    angle = torch.cat((angle, angle), dim=-1)
    half = dim // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.double() * angle.cos() + rotated.double() * angle.sin()).float()


def by_hand(layer, embeds: torch.Tensor, positions: torch.Tensor, cached: torch.Tensor, theta: float, eps: float):
    x = embeds[0].double()
    normed = (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * layer.input_layernorm.weight.double()).float()
    attn = layer.self_attn
    d = attn.head_dim
    q = torch.nn.functional.linear(normed, attn.q_proj.weight, attn.q_proj.bias).view(len(x), -1, d).transpose(0, 1)
    k = torch.nn.functional.linear(normed, attn.k_proj.weight, attn.k_proj.bias).view(len(x), -1, d).transpose(0, 1)
    q, k = rope(q, positions, theta), rope(k, positions, theta)
    keys = torch.cat([cached[0], k], dim=1)  # (kv heads, cached + q, D)
    group = q.shape[0] // keys.shape[0]
    out = torch.empty(q.shape[0], q.shape[1], keys.shape[1])
    for head in range(q.shape[0]):
        logits = q[head].double() @ keys[head // group].double().T / math.sqrt(d)
        out[head] = torch.softmax(logits, dim=-1).float()
    return out


@pytest.mark.parametrize("family", ["qwen", "llava"])
def test_approx_attention_applies_each_layer_norm_and_covers_its_own_keys(family, tiny_qwen, tiny_llava):
    adapter = tiny_qwen if family == "qwen" else tiny_llava
    model = adapter.text_model
    generator = torch.Generator().manual_seed(5)
    saved = [layer.input_layernorm.weight.detach().clone() for layer in model.layers]
    try:
        with torch.no_grad():  # realistic norms are far from 1: make each layer's norm matter
            for layer in model.layers:
                layer.input_layernorm.weight.copy_(0.2 + 3 * torch.rand(layer.input_layernorm.weight.shape, generator=generator))
        ids = torch.tensor([5, 17, 33, 2, 9])
        embeds = adapter.embed(ids)
        start, q = 40, ids.shape[0]
        positions = adapter.text_positions(start, q)
        kv_heads, d = model.layers[0].self_attn.k_proj.out_features // model.layers[0].self_attn.head_dim, \
            model.layers[0].self_attn.head_dim
        cached = [torch.randn(1, kv_heads, 12, d, generator=generator) for _ in model.layers]
        weights = approx_attention(adapter, embeds, positions, cached)
        config = adapter.text_config
        theta = float(config.rope_parameters["rope_theta"])
        for index, (layer, got) in enumerate(zip(model.layers, weights)):
            expected = by_hand(layer, embeds, torch.arange(start, start + q), cached[index], theta, config.rms_norm_eps)
            assert got.shape == (1, expected.shape[0], q, 12 + q)
            torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=1e-4)
            assert bool((got[0, :, 0, 12 + 1 :] > 0).all())  # the first token sees later own keys: no causal mask
    finally:
        with torch.no_grad():
            for layer, weight in zip(model.layers, saved):
                layer.input_layernorm.weight.copy_(weight)
