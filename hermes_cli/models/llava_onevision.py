"""LLaVA-OneVision: a SigLIP tower, 2×2 pooling (27×27 → 14×14 = 196 tokens per frame), and a
Qwen2 language model with 1-D RoPE.

Each chunk is one ``<video>`` block as the official processor lays it out: the frames' pooled
tokens, then one learned newline token. Positions are consecutive, so a stream of chunks is the
same token sequence as a prompt with one ``<video>`` per chunk.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .base import EncodedChunk, ModelAdapter, VideoClock
from .chat import conversation, split_prompt
from .random_arch import synthetic_embeddings


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

    def prefix_text(self, system_prompt: str | None) -> str:
        return self._split("", [], system_prompt)[0]

    def question_text(self, question: str, history: list[tuple[str, str]], system_prompt: str | None = None) -> str:
        return self._split(question, history, system_prompt)[1]

    def _split(self, question, history, system_prompt):
        rendered = self.processor.apply_chat_template(
            conversation(question, history, system_prompt), add_generation_prompt=True, tokenize=False
        )
        return split_prompt(rendered, self.video_token)

    @torch.no_grad()
    def encode(self, frames: np.ndarray, first_unit: int) -> EncodedChunk:
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
        f = frames.shape[0]
        per_frame = (embeds.shape[1] - 1) // f
        side = int(round(per_frame**0.5))
        k = torch.arange(f * per_frame)
        newline = torch.tensor([-1])
        return EncodedChunk(
            embeds=embeds,
            input_ids=torch.full((embeds.shape[1],), self.video_token_id, dtype=torch.long),
            unit=torch.cat([first_unit + k // per_frame, torch.tensor([first_unit + f - 1])]),
            patch=torch.cat([k % per_frame, torch.tensor([per_frame])]),
            row=torch.cat([(k % per_frame) // side, newline]),
            col=torch.cat([k % side, newline]),
            units=f,
            pixel_values=out["pixel_values_videos"],
        )

    @torch.no_grad()
    def synthetic_encode(self, frames_count: int, first_unit: int, frame_hw: tuple[int, int]) -> EncodedChunk:
        """Random visual embeddings with exactly ``encode``'s token layout, without the vision tower.

        For benchmarks of the language model: ``frames_count`` frames of pooled SigLIP cells (the
        tower's patch grid, 2×2-pooled) and one newline token. ``frame_hw`` does not matter here:
        every frame is resized to the tower's square input.
        """
        vision = self.model.config.vision_config
        side = math.ceil((vision.image_size // vision.patch_size) / 2)
        per_frame = side * side
        n = frames_count * per_frame + 1
        embeds = synthetic_embeddings(self, n, first_unit)
        k = torch.arange(frames_count * per_frame)
        newline = torch.tensor([-1])
        return EncodedChunk(
            embeds=embeds,
            input_ids=torch.full((n,), self.video_token_id, dtype=torch.long),
            unit=torch.cat([first_unit + k // per_frame, torch.tensor([first_unit + frames_count - 1])]),
            patch=torch.cat([k % per_frame, torch.tensor([per_frame])]),
            row=torch.cat([(k % per_frame) // side, newline]),
            col=torch.cat([k % side, newline]),
            units=frames_count,
        )

    def video_clock(self, video_start: int, fps: float) -> VideoClock:
        return VideoClock(t_origin=video_start, hw_origin=video_start, unit_origin=0, interval=1.0)
