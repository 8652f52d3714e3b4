"""LLaVA-OneVision: a SigLIP tower, 2×2 pooling (27×27 → 14×14 = 196 tokens per frame), and a
Qwen2 language model with 1-D RoPE.

Each chunk is one ``<video>`` block as the official processor lays it out: the frames' pooled
tokens, then one learned newline token. Positions are consecutive, so a stream of chunks is the
same token sequence as a prompt with one ``<video>`` per chunk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ..positions.layout import VideoClock
from .base import EncodedChunk, ModelAdapter
from .synthetic import synthetic_embeddings


class LlavaOneVisionAdapter(ModelAdapter):
    family = "llava-onevision"
    position_axes = 1
    frames_per_unit = 1

    def __init__(self, model, processor, **kwargs) -> None:
        super().__init__(model, processor, **kwargs)
        self.video_token = processor.video_token
        self.video_token_id = int(processor.video_token_id)

    @property
    def text_model(self):
        return self.model.model.language_model

    @torch.no_grad()
    def encode(self, frames: np.ndarray, first_unit: int, times: Sequence[float] | None = None) -> EncodedChunk:
        out = self.processor.video_processor(videos=[frames], return_tensors="pt", do_sample_frames=False)
        pixels = out["pixel_values_videos"].to(self.device, self.model.dtype)
        cfg = self.model.config
        features = self.model.model.get_video_features(
            pixels,
            vision_feature_layer=cfg.vision_feature_layer,
            vision_feature_select_strategy=cfg.vision_feature_select_strategy,
            return_dict=True,
        ).pooler_output
        embeds = features.reshape(1, -1, features.shape[-1])
        return self._chunk(embeds, frames.shape[0], first_unit, pixel_values=out["pixel_values_videos"])

    @torch.no_grad()
    def synthetic_encode(self, frames_count: int, first_unit: int, frame_hw: tuple[int, int]) -> EncodedChunk:
        """Random visual embeddings with exactly ``encode``'s token layout, without the vision tower.

        For benchmarks of the language model: ``frames_count`` frames of pooled SigLIP cells (the
        tower's patch grid, 2×2-pooled) and one newline token. ``frame_hw`` does not matter here:
        every frame is resized to the tower's square input.
        """
        n = frames_count * self.pooled_side**2 + 1
        return self._chunk(synthetic_embeddings(self, n, first_unit), frames_count, first_unit)

    @property
    def pooled_side(self) -> int:
        """Cells per side of a frame after the tower's 2×2 pooling (27 → 14 for SigLIP-384)."""
        vision = self.model.config.vision_config
        return math.ceil((vision.image_size // vision.patch_size) / 2)

    def _chunk(self, embeds, frames: int, first_unit: int, **extra) -> EncodedChunk:
        """The token layout of a ``<video>`` block: each frame's pooled cells, row-major, then a newline."""
        side = self.pooled_side
        per_frame = side * side
        k = torch.arange(frames * per_frame)
        newline = torch.tensor([-1])
        return EncodedChunk(
            embeds=embeds,
            input_ids=torch.full((embeds.shape[1],), self.video_token_id, dtype=torch.long),
            unit=torch.cat([first_unit + k // per_frame, torch.tensor([first_unit + frames - 1])]),
            patch=torch.cat([k % per_frame, torch.tensor([per_frame])]),
            row=torch.cat([(k % per_frame) // side, newline]),
            col=torch.cat([k % side, newline]),
            units=frames,
            **extra,
        )

    def video_clock(self, video_start: int, fps: float) -> VideoClock:
        return VideoClock(t_origin=video_start, hw_origin=video_start, unit_origin=0, interval=1.0)
