"""What benchmarks feed a model: synthetic frames, synthetic visual embeddings for the language
model alone (no vision tower), and ``bench_adapter``, the adapter as the benchmarks drive it.

Below the engine and the benchmarks both, so that ``hermes bench`` and the engine's own
micro-benchmarks (``engine/microbench/``) share them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

if TYPE_CHECKING:
    from .base import ModelAdapter


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


def synthetic_frames(size: tuple[int, int] = (360, 640), fps: float = 1.0,
                     seed: int = 0) -> Iterator[tuple[np.ndarray, float]]:
    """Endless (frame, timestamp): a moving coloured square on a noisy background, ``size`` = (H, W)."""
    rng = np.random.default_rng(seed)
    h, w = size
    side = max(4, min(h, w) // 5)
    background = rng.integers(0, 40, size=(h, w, 3), dtype=np.uint8)
    i = 0
    while True:
        frame = background.copy()
        x = (i * 13) % max(1, w - side)
        y = (i * 7) % max(1, h - side)
        frame[y : y + side, x : x + side] = [(50 * i) % 256, 200, 255 - (30 * i) % 256]
        yield frame, i / fps
        i += 1


def bench_adapter(adapter: ModelAdapter, synthetic_vision: bool = False) -> ModelAdapter:
    """``adapter`` as the benchmark drives it (see ``BenchAdapter``), typed as what it stands in for."""
    return cast("ModelAdapter", BenchAdapter(adapter, synthetic_vision))


class BenchAdapter:
    """The model adapter with two benchmark changes, everything else passed through.

    Answers run to ``max_new_tokens`` (no end-of-sequence token), so TPOT is always measured;
    with ``synthetic_vision`` each chunk gets random visual embeddings of the real token layout
    (``synthetic_encode``) instead of running the vision tower.
    """

    def __init__(self, adapter, synthetic_vision: bool = False) -> None:
        if synthetic_vision and not hasattr(adapter, "synthetic_encode"):
            raise ValueError(f"{adapter.family} has no synthetic vision mode")
        self._adapter = adapter
        self.synthetic_vision = synthetic_vision

    def __getattr__(self, name):
        return getattr(self._adapter, name)

    @property
    def eos_token_ids(self) -> set[int]:
        return set()

    def encode(self, frames: np.ndarray, first_unit: int, times=None):
        if self.synthetic_vision:
            return self._adapter.synthetic_encode(frames.shape[0], first_unit, tuple(frames.shape[1:3]))
        return self._adapter.encode(frames, first_unit, times)
