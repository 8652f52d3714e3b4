"""Synthetic visual embeddings for benchmarks of the language model alone (no vision tower)."""

from __future__ import annotations

import numpy as np
import torch


@torch.no_grad()
def synthetic_embeddings(adapter, n: int, seed: int) -> torch.Tensor:
    """(1, n, hidden) random embeddings at the scale of the model's token embeddings (seeded)."""
    table = adapter.text_model.embed_tokens.weight
    if adapter.synthetic_scale is None:
        adapter.synthetic_scale = float(table[: min(4096, table.shape[0])].float().std())
    scale = adapter.synthetic_scale
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    embeds = torch.randn((1, n, table.shape[1]), generator=gen) * scale
    return embeds.to(device=table.device, dtype=table.dtype)


def processor_grid(adapter, frames_count: int, frame_hw: tuple[int, int], size: dict) -> tuple[int, int, int]:
    """The (t, h, w) patch grid the official video processor gives ``frames_count`` frames of
    ``frame_hw`` pixels (Qwen-VL families): asked once per shape on blank frames, then remembered."""
    key = (frames_count, *frame_hw)
    if key not in adapter.synthetic_grids:
        blank = np.zeros((frames_count, *frame_hw, 3), dtype=np.uint8)
        out = adapter.processor.video_processor(
            videos=[blank], return_tensors="pt", do_sample_frames=False, cap_pixels_per_frame=True, **size,
        )
        adapter.synthetic_grids[key] = tuple(int(x) for x in out["video_grid_thw"][0])
    return adapter.synthetic_grids[key]
