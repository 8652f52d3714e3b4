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
from .tiny import LLAVA_SPECIALS, WHOLE_WORDS, chat_template, make_tokenizer, seeded, token_ids


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


# -- built-in and full-size random-weight models (families.py) -------------------------------------
def tiny_model(name: str, num_layers: int = 10, max_positions: int = 32768):
    """(model, processor) of the built-in random-weight LLaVA-OneVision with ``num_layers``
    decoder layers."""
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, LlavaOnevisionProcessor
    from transformers.models.llava_onevision.image_processing_llava_onevision import (
        LlavaOnevisionImageProcessor,
    )
    from transformers.models.llava_onevision.video_processing_llava_onevision import (
        LlavaOnevisionVideoProcessor,
    )

    tokenizer = make_tokenizer(LLAVA_SPECIALS)
    ids = tokenizer.convert_tokens_to_ids
    image_size, patch = 56, 14  # 4×4 patches, pooled to 2×2 = 4 tokens per frame
    config = LlavaOnevisionConfig(  # type: ignore[call-arg]  # transformers' typed config __init__ omits inherited kwargs
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=2, image_size=image_size, patch_size=patch,
        ),
        text_config=dict(
            model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4},
            bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
        ),
        image_token_id=ids("<image>"), video_token_id=ids("<video>"),
        vision_feature_select_strategy="full", vision_feature_layer=-1,
        image_grid_pinpoints=[[image_size, image_size]],
    )
    size = {"height": image_size, "width": image_size}
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(size=size, image_grid_pinpoints=[[image_size, image_size]]),
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(size=size),
        num_image_tokens=(image_size // patch) ** 2,
        vision_feature_select_strategy="full",
        chat_template=chat_template("<video>\n"),
    )
    return seeded(lambda: LlavaOnevisionForConditionalGeneration(config)), processor


def full_size_model(cfg: dict):
    """(config, processor, model class) of a full-size LLaVA-OneVision from its shipped configuration."""
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, LlavaOnevisionProcessor
    from transformers.models.llava_onevision.image_processing_llava_onevision import LlavaOnevisionImageProcessor
    from transformers.models.llava_onevision.video_processing_llava_onevision import LlavaOnevisionVideoProcessor

    tokenizer = make_tokenizer(LLAVA_SPECIALS, WHOLE_WORDS)
    ids = token_ids(tokenizer, {"eos": "<|im_end|>", "pad": "<|endoftext|>", "image": "<image>", "video": "<video>"})
    text = {k: v for k, v in cfg["text_config"].items()}
    text.update(bos_token_id=ids["pad"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    vision = dict(cfg["vision_config"])
    size = vision["image_size"]
    config = LlavaOnevisionConfig(  # type: ignore[call-arg]  # transformers' typed config __init__ omits inherited kwargs
        vision_config=vision,
        text_config=text,
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        projector_hidden_act=cfg.get("projector_hidden_act", "gelu"),
        vision_feature_layer=cfg.get("vision_feature_layer", -1),
        vision_feature_select_strategy=cfg.get("vision_feature_select_strategy", "full"),
        vision_aspect_ratio=cfg.get("vision_aspect_ratio", "anyres_max_9"),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
    )
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(size={"height": size, "width": size}),
        tokenizer=tokenizer,
        video_processor=LlavaOnevisionVideoProcessor(size={"height": size, "width": size}),
        num_image_tokens=(size // vision["patch_size"]) ** 2,
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        chat_template=chat_template("<video>\n"),
    )
    return config, processor, LlavaOnevisionForConditionalGeneration
