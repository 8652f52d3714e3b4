"""Qwen2.5-VL (and Qwen2-VL, whose temporal positions count patches instead of seconds):
M-RoPE over (t, h, w).

A stream is one video: the prefix ends with ``<|vision_start|>``, each chunk adds temporal
patches (2 frames each) of ``<|video_pad|>`` embeddings, and ``<|vision_end|>`` opens the
question suffix. A unit (temporal patch) u gets temporal position ``start + floor(u × interval)``
with interval = tokens_per_second × 2 / fps, exactly as the model's ``get_rope_index`` computes
it for the whole video; cells get ``start + row`` / ``start + col``.

Text after the video continues from the largest position held + 1 on all axes, as the original
Qwen2.5-VL code does (transformers 5.24's ``get_rope_index`` restarts text after a video at
``start + max(h, w)``, which overlaps the video's temporal positions; we keep the trained layout).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..positions.layout import VideoClock, scaled_positions, time_interval
from .base import EncodedChunk, ModelAdapter
from .synthetic import processor_grid, synthetic_embeddings


def video_facts(processor) -> tuple[int, int, str, int]:
    """What a Qwen-VL processor (2, 2.5 or 3) says about video: frames per temporal patch, the
    spatial merge size, the video placeholder token and its id."""
    vp = processor.video_processor
    return int(vp.temporal_patch_size), int(vp.merge_size), processor.video_token, int(processor.video_token_id)


class QwenVLAdapter(ModelAdapter):
    family = "qwen2.5-vl"
    position_axes = 3

    def __init__(self, model, processor, **kwargs) -> None:
        super().__init__(model, processor, **kwargs)
        self.frames_per_unit, self.merge, self.video_token, self.video_token_id = video_facts(processor)
        # Qwen2.5-VL spaces temporal patches by real time; Qwen2-VL counts them 0, 1, 2, …
        self.time_aligned = model.config.model_type != "qwen2_vl"
        if not self.time_aligned:
            self.family = "qwen2-vl"
        self.tokens_per_second = float(getattr(model.config.vision_config, "tokens_per_second", 2) or 2)

    @property
    def text_model(self):
        return self.model.model.language_model

    @torch.no_grad()
    def encode(self, frames: np.ndarray, first_unit: int, times: Sequence[float] | None = None) -> EncodedChunk:
        if frames.shape[0] % self.frames_per_unit:
            raise ValueError(f"Qwen-VL chunks need a multiple of {self.frames_per_unit} frames")
        out = self.processor.video_processor(
            videos=[frames], return_tensors="pt", do_sample_frames=False, cap_pixels_per_frame=True, **self._size()
        )
        pixels = out["pixel_values_videos"].to(self.device)
        grid = out["video_grid_thw"].to(self.device)
        features = self.model.model.get_video_features(pixels, grid, return_dict=True).pooler_output
        embeds = torch.cat(features, dim=0).unsqueeze(0)
        t, h, w = (int(x) for x in grid[0])
        return self._chunk(embeds, (t, h, w), first_unit, pixel_values=out["pixel_values_videos"])

    @torch.no_grad()
    def synthetic_encode(self, frames_count: int, first_unit: int, frame_hw: tuple[int, int]) -> EncodedChunk:
        """Random visual embeddings with exactly ``encode``'s token layout, without the vision tower.

        For benchmarks of the language model. The grid (temporal patches × merged rows × merged
        columns) is what the official video processor gives frames of size ``frame_hw``: it is
        asked once per (frames, size) on blank frames, and remembered.
        """
        if frames_count % self.frames_per_unit:
            raise ValueError(f"Qwen-VL chunks need a multiple of {self.frames_per_unit} frames")
        t, h, w = processor_grid(self, frames_count, frame_hw, self._size())
        n = t * (h // self.merge) * (w // self.merge)
        return self._chunk(synthetic_embeddings(self, n, first_unit), (t, h, w), first_unit)

    def _chunk(self, embeds, grid_thw: tuple[int, int, int], first_unit: int, **extra) -> EncodedChunk:
        """The token layout of a grid (t, h, w) of patches, merged ``merge``×``merge``: t-major, then rows."""
        t, h, w = grid_thw
        h, w = h // self.merge, w // self.merge
        n = t * h * w
        k = torch.arange(n)
        return EncodedChunk(
            embeds=embeds,
            input_ids=torch.full((n,), self.video_token_id, dtype=torch.long),
            unit=first_unit + k // (h * w),
            patch=k % (h * w),
            row=(k % (h * w)) // w,
            col=k % w,
            units=t,
            grid_thw=torch.tensor([list(grid_thw)]),
            **extra,
        )

    def _size(self) -> dict:
        """The processor's size override for ``max_pixels`` (none: the model's own setting)."""
        if self.max_pixels is None:
            return {}
        size = self.processor.video_processor.size
        shortest = min(size["shortest_edge"], self.max_pixels)
        return {"size": {"shortest_edge": shortest, "longest_edge": self.max_pixels}}

    def video_clock(self, video_start: int, fps: float) -> VideoClock:
        interval = time_interval(self.tokens_per_second, self.frames_per_unit, fps) if self.time_aligned else 1.0
        return VideoClock(t_origin=video_start, hw_origin=video_start, unit_origin=0, interval=interval)

    def chunk_positions(self, chunk: EncodedChunk, clock: VideoClock, next_free: int):
        t = clock.t_origin + scaled_positions(chunk.unit - clock.unit_origin, clock.interval)
        return torch.stack([t, clock.hw_origin + chunk.row, clock.hw_origin + chunk.col], dim=1)
