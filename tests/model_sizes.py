"""A full-size architecture's language-model parameters, computed from its shipped configuration
without building it: the tests' independent check of what the builders make."""

from __future__ import annotations

from hermes_cli.models.archs import arch_config


def parameter_estimate(name: str) -> int:
    """Parameters the architecture has, computed from its configuration without building it."""
    cfg = arch_config(name)
    t = cfg["text_config"]
    h, layers, inter, vocab = t["hidden_size"], t["num_hidden_layers"], t["intermediate_size"], t["vocab_size"]
    head = h // t["num_attention_heads"]
    kv = t["num_key_value_heads"] * head
    attn = h * h + h + 2 * (h * kv + kv) + h * h  # q (bias), k, v (bias), o
    if cfg["model_type"] == "qwen3_vl":  # explicit head_dim; no biases; per-head q/k norms
        q, kv = t["num_attention_heads"] * t["head_dim"], t["num_key_value_heads"] * t["head_dim"]
        attn = h * q + 2 * h * kv + q * h + 2 * t["head_dim"]
    per_layer = attn + 3 * h * inter + 2 * h
    text = vocab * h * (1 if t.get("tie_word_embeddings") else 2) + layers * per_layer + h
    return int(text)  # the vision tower and projector are not counted


