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
from .tiny import QWEN_SPECIALS, WHOLE_WORDS, chat_template, make_tokenizer, seeded, token_ids


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


# -- built-in and full-size random-weight models (families.py) -------------------------------------
def tiny_model(name: str, num_layers: int = 10, max_positions: int = 32768):
    """(model, processor) of the built-in random-weight Qwen2.5-VL (``tiny``) with ``num_layers``
    decoder layers."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    tokenizer = make_tokenizer(QWEN_SPECIALS)
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(  # type: ignore[call-arg]  # transformers' typed config __init__ omits inherited kwargs
        text_config=dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
            bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
        ),
        vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, window_size=56,
            fullatt_block_indexes=[1], patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
            tokens_per_second=2,
        ),
        video_token_id=ids("<|video_pad|>"), image_token_id=ids("<|image_pad|>"),  # type: ignore[arg-type]  # transformers' typed config __init__ omits inherited kwargs
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),  # type: ignore[arg-type]  # transformers' typed config __init__ omits inherited kwargs
        bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
    )
    size = {"shortest_edge": 56 * 56, "longest_edge": 112 * 84}
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(size=size),
        chat_template=chat_template("<|vision_start|><|video_pad|><|vision_end|>"),
    )
    return seeded(lambda: Qwen2_5_VLForConditionalGeneration(config)), processor


def full_size_text(cfg: dict):
    """(tokenizer, special token ids, text config) shared by the Qwen-VL families."""
    tokenizer = make_tokenizer(QWEN_SPECIALS, WHOLE_WORDS)
    ids = token_ids(tokenizer, {
        "eos": "<|im_end|>", "pad": "<|endoftext|>", "image": "<|image_pad|>", "video": "<|video_pad|>",
        "vstart": "<|vision_start|>", "vend": "<|vision_end|>",
    })
    text = dict(cfg["text_config"])
    text.update(bos_token_id=ids["pad"], eos_token_id=ids["eos"], pad_token_id=ids["pad"])
    return tokenizer, ids, text


def full_size_model(cfg: dict):
    """(config, processor, model class) of a full-size Qwen2.5-VL from its shipped configuration."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    tokenizer, ids, text = full_size_text(cfg)
    config = Qwen2_5_VLConfig(  # type: ignore[call-arg]  # transformers' typed config __init__ omits inherited kwargs
        text_config=text,
        vision_config=dict(cfg["vision_config"]),
        video_token_id=ids["video"], image_token_id=ids["image"],
        vision_start_token_id=ids["vstart"], vision_end_token_id=ids["vend"],
        bos_token_id=ids["pad"], eos_token_id=ids["eos"], pad_token_id=ids["pad"],
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),  # the library's defaults: Qwen2.5-VL's video sizes
        chat_template=chat_template("<|vision_start|><|video_pad|><|vision_end|>"),
    )
    return config, processor, Qwen2_5_VLForConditionalGeneration
