"""Synthetic visual embeddings for benchmarks of the language model alone (no vision tower)."""

from __future__ import annotations

import torch


@torch.no_grad()
def synthetic_embeddings(adapter, n: int, seed: int) -> torch.Tensor:
    """(1, n, hidden) random embeddings at the scale of the model's token embeddings (seeded)."""
    table = adapter.text_model.embed_tokens.weight
    scale = adapter.__dict__.get("_synthetic_scale")
    if scale is None:
        scale = adapter.__dict__["_synthetic_scale"] = float(table[: min(4096, table.shape[0])].float().std())
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    embeds = torch.randn((1, n, table.shape[1]), generator=gen) * scale
    return embeds.to(device=table.device, dtype=table.dtype)
