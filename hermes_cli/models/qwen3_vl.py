"""Qwen3-VL (dense and MoE): text timestamps, interleaved M-RoPE and DeepStack, streamed exactly.

The official processor lays a video out one temporal patch (2 frames) at a time::

    <t seconds><|vision_start|><|video_pad|> × cells<|vision_end|>

``t`` is the mean of the patch's first and last frame time, written with one decimal
(``processing_qwen3_vl.py``). A chunk of this adapter is exactly that text for its patches, with
the times of the frames actually sampled (the session passes them), so a stream of chunks is the
token sequence the processor builds for the whole video.

Positions follow the model's own ``get_rope_index``: text tokens advance all three axes by one;
a patch's cells get ``(s, s + row, s + col)`` with ``s`` the next free position, after which the
next text starts at ``s + max(rows, cols)`` — the largest position held + 1. That is the
session's ``next_position`` rule, so a chunk's positions depend only on where it starts. The
rotary layout is interleaved M-RoPE; :class:`~hermes_cli.rope.RotaryDelta` probes it from the
model's rotary module, so re-indexing rotates cached keys exactly.

DeepStack: the vision tower also returns features of a few of its inner layers; the language
model adds feature ``i`` to the hidden states of the cells after decoder layer ``i``. ``encode``
keeps the chunk's features and cell mask; the forward that prefills that very chunk (recognised
by its embedding tensor) passes them to the language model.

Stream tokens that are text — the timestamp, ``<|vision_start|>`` and ``<|vision_end|>`` of a
patch — belong to that patch's unit (``unit`` = the patch they open or close) with ``patch``
indices after the grid cells (``cells``, ``cells + 1``, …) and no row/column, as
LLaVA-OneVision's newline. A policy that keeps or drops whole units (fifo, sink, uniform) keeps a
patch together with the timestamp that says when it was seen: a patch without its time cannot be
placed in the video, and a time without its patch is noise. Token-level scorers (HERMES,
InfiniPot-V) score them like any other token of the unit: the budget counts them, and no policy
needs to know about them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..positions.layout import VideoClock
from .base import EncodedChunk, ModelAdapter
from .qwen_vl import full_size_text, video_facts
from .synthetic import processor_grid, synthetic_embeddings
from .tiny import QWEN_SPECIALS, chat_template, make_tokenizer, seeded


@dataclass
class Qwen3Chunk(EncodedChunk):
    """An encoded chunk plus what its prefill needs: DeepStack features at its cells."""

    visual_mask: Tensor | None = None  # (n,) bool: the cells (video pad tokens)
    deepstack: list[Tensor] = field(default_factory=list)  # per injected layer: (cells, hidden)
    layout: list[tuple[int, int, int]] = field(default_factory=list)  # per patch: (text before, rows, cols)
    timestamps: list[float] = field(default_factory=list)  # per patch, seconds


def patch_timestamps(times: Sequence[float] | np.ndarray, temporal_patch: int) -> list[float]:
    """One time per temporal patch: the mean of its first and last frame's time (the processor's rule).

    A tail shorter than a patch is padded with its last time, as the processor pads indices.
    """
    times = [float(t) for t in times]
    if not times:
        return []
    while len(times) % temporal_patch:
        times.append(times[-1])
    return [(times[i] + times[i + temporal_patch - 1]) / 2 for i in range(0, len(times), temporal_patch)]


def timestamp_text(seconds: float) -> str:
    """The processor's marker before a temporal patch."""
    return f"<{seconds:.1f} seconds>"


class Qwen3VLAdapter(ModelAdapter):
    family = "qwen3-vl"
    position_axes = 3

    def __init__(self, model, processor, **kwargs) -> None:
        super().__init__(model, processor, **kwargs)
        self.frames_per_unit, self.merge, self.video_token, self.video_token_id = video_facts(processor)
        self.vision_start = processor.vision_start_token
        self.vision_end = processor.vision_end_token
        self.vision_end_id = int(processor.vision_end_token_id)
        if model.config.model_type == "qwen3_vl_moe":
            self.family = "qwen3-vl-moe"
        self.fps = 1.0  # frame rate of the stream, for chunks that come without times

    @property
    def text_model(self):
        return self.model.model.language_model

    def _split(self, question, history, system_prompt):
        """The chat template's prompt around the video, without a wrapper around the placeholder.

        Qwen3-VL's template renders ``<|vision_start|><|video_pad|><|vision_end|>``; the original
        processor replaces that whole group with the per-patch blocks (each has its own start and
        end), the layout the model was trained with. transformers 5.24 replaces only the pad and
        leaves the outer pair around the blocks; the stream keeps the trained layout.
        """
        prefix, suffix = super()._split(question, history, system_prompt)
        if prefix.endswith(self.vision_start) and suffix.startswith(self.vision_end):
            prefix, suffix = prefix[: -len(self.vision_start)], suffix[len(self.vision_end):]
        return prefix, suffix

    # -- video --------------------------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, frames: np.ndarray, first_unit: int, times: Sequence[float] | None = None) -> Qwen3Chunk:
        """Embed frames (F, H, W, 3) with their stream times in seconds (default: unit clock at ``fps``)."""
        if frames.shape[0] % self.frames_per_unit:
            raise ValueError(f"Qwen-VL chunks need a multiple of {self.frames_per_unit} frames")
        if times is None:
            start = first_unit * self.frames_per_unit
            times = [(start + i) / self.fps for i in range(frames.shape[0])]
        out = self.processor.video_processor(
            videos=[frames], return_tensors="pt", do_sample_frames=False, cap_pixels_per_frame=True,
            **self._size(frames.shape[0]),
        )
        pixels = out["pixel_values_videos"].to(self.device)
        grid = out["video_grid_thw"].to(self.device)
        vision = self.model.model.get_video_features(pixels, grid, return_dict=True)
        features = torch.cat(vision.pooler_output, dim=0)
        deepstack = [torch.cat(f, dim=0) for f in vision.deepstack_features]
        t, h, w = (int(x) for x in grid[0])
        return self._chunk(features, deepstack, (t, h, w), first_unit, patch_timestamps(times, self.frames_per_unit),
                           pixel_values=out["pixel_values_videos"])

    @torch.no_grad()
    def synthetic_encode(self, frames_count: int, first_unit: int, frame_hw: tuple[int, int]) -> Qwen3Chunk:
        """Random cell features (and DeepStack features) with exactly ``encode``'s token layout.

        For benchmarks of the language model; the grid is what the official video processor
        gives frames of size ``frame_hw`` (asked once per size on blank frames); timestamps
        follow the unit clock at ``fps``.
        """
        if frames_count % self.frames_per_unit:
            raise ValueError(f"Qwen-VL chunks need a multiple of {self.frames_per_unit} frames")
        t, h, w = processor_grid(self, frames_count, frame_hw, self._size(frames_count))
        cells = t * (h // self.merge) * (w // self.merge)
        features = synthetic_embeddings(self, cells, first_unit)[0]
        layers = len(getattr(self.model.config.vision_config, "deepstack_visual_indexes", ()) or ())
        deepstack = [synthetic_embeddings(self, cells, first_unit * 31 + i + 1)[0] for i in range(layers)]
        start = first_unit * self.frames_per_unit
        times = [(start + i) / self.fps for i in range(frames_count)]
        return self._chunk(features, deepstack, (t, h, w), first_unit, patch_timestamps(times, self.frames_per_unit))

    def _chunk(self, features: Tensor, deepstack: list[Tensor], grid_thw: tuple[int, int, int], first_unit: int,
               stamps: list[float], **extra) -> Qwen3Chunk:
        """The processor's token layout for ``grid_thw``: per patch, timestamp text, start, cells, end."""
        t, h, w = grid_thw
        rows, cols = h // self.merge, w // self.merge
        cells = rows * cols
        ids, unit, patch, row, col, layout = [], [], [], [], [], []
        k = torch.arange(cells)
        for u in range(t):
            before = self.tokens(timestamp_text(stamps[u]) + self.vision_start)
            n_text = before.shape[0]
            ids += [before, torch.full((cells,), self.video_token_id, dtype=torch.long),
                    torch.tensor([self.vision_end_id])]
            unit.append(torch.full((n_text + cells + 1,), first_unit + u, dtype=torch.long))
            patch += [cells + torch.arange(n_text), k, torch.tensor([cells + n_text])]
            minus = torch.full((n_text,), -1, dtype=torch.long)
            row += [minus, k // cols, torch.tensor([-1])]
            col += [minus, k % cols, torch.tensor([-1])]
            layout.append((n_text, rows, cols))
        input_ids = torch.cat(ids)
        mask = input_ids == self.video_token_id
        embeds = self.embed(input_ids).clone()
        embeds[0, mask.to(embeds.device)] = features.to(embeds.device, embeds.dtype)
        chunk = Qwen3Chunk(
            embeds=embeds, input_ids=input_ids, unit=torch.cat(unit), patch=torch.cat(patch),
            row=torch.cat(row), col=torch.cat(col), units=t, grid_thw=torch.tensor([list(grid_thw)]),
            visual_mask=mask, deepstack=deepstack, layout=layout, timestamps=stamps[:t], **extra,
        )
        return chunk

    def _size(self, frames: int) -> dict:
        """The processor's size override for ``max_pixels`` per frame (none: the model's own setting).

        Qwen3-VL's video processor budgets ``longest_edge`` over all the frames it is given and
        floors each frame at 1.05 × ``shortest_edge``; both are set so a frame gets ``max_pixels``.
        """
        if self.max_pixels is None:
            return {}
        size = self.processor.video_processor.size
        shortest = min(size["shortest_edge"], int(self.max_pixels / 1.05))
        return {"size": {"shortest_edge": shortest, "longest_edge": self.max_pixels * frames}}

    # -- positions ------------------------------------------------------------------------------------
    def video_clock(self, video_start: int, fps: float) -> VideoClock:
        """Positions need no clock (text timestamps carry time); it records ``fps`` for timeless chunks.

        ``interval`` 1: re-indexing ranks every axis densely.
        """
        self.fps = float(fps)
        return VideoClock(t_origin=video_start, hw_origin=video_start, unit_origin=0, interval=1.0)

    def chunk_positions(self, chunk: EncodedChunk, clock: VideoClock, next_free: int) -> Tensor:
        """``get_rope_index``'s layout from ``next_free``: text +1 on all axes; a patch's cells at
        (s, s + row, s + col), after which text resumes at s + max(rows, cols)."""
        assert isinstance(chunk, Qwen3Chunk), "Qwen3-VL positions need the chunk's text/cell layout"
        parts, cur = [], int(next_free)
        for n_text, rows, cols in chunk.layout:
            parts.append((cur + torch.arange(n_text, dtype=torch.long)).unsqueeze(1).expand(-1, 3))
            cur += n_text
            k = torch.arange(rows * cols, dtype=torch.long)
            parts.append(torch.stack([torch.full_like(k, cur), cur + k // cols, cur + k % cols], dim=1))
            cur += max(rows, cols)
            parts.append(torch.full((1, 3), cur, dtype=torch.long))
            cur += 1
        return torch.cat(parts)

    # -- running the language model ---------------------------------------------------------------------
    def chunk_inputs(self, chunk: EncodedChunk | None, length: int) -> dict:
        """The prefill of a chunk adds its DeepStack features at its cells (tokens after the chunk,
        e.g. pseudo-queries prefilled with it, are no cells)."""
        if not (isinstance(chunk, Qwen3Chunk) and chunk.deepstack and chunk.visual_mask is not None):
            return {}
        mask = torch.zeros(length, dtype=torch.bool)
        mask[: chunk.visual_mask.shape[0]] = chunk.visual_mask.cpu()
        return {"visual_pos_masks": mask.to(self.device).unsqueeze(0), "deepstack_visual_embeds": chunk.deepstack}


# -- built-in and full-size random-weight models (families.py) -------------------------------------
def _qwen3_vl_config(moe: bool, num_layers: int, max_positions: int, ids):
    """A tiny Qwen3-VL configuration: interleaved M-RoPE (sections 4, 2, 2 of 8 frequencies), a
    3-block vision tower whose blocks 0 and 1 feed DeepStack, 16-pixel patches merged 2×2."""
    text = dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2],
                         "mrope_interleaved": True},
        bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
    )
    if moe:
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1)
    vision = dict(
        depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
        spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64, deepstack_visual_indexes=[0, 1],
    )
    return dict(
        text_config=text, vision_config=vision,
        video_token_id=ids("<|video_pad|>"), image_token_id=ids("<|image_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
    )


def tiny_model(name: str, num_layers: int = 10, max_positions: int = 32768):
    """(model, processor) of a built-in random-weight Qwen3-VL (``tiny-qwen3-vl-moe``: Qwen3-VL-MoE,
    4 experts, top 2).

    Frames keep their area up to 16 cells of 32×32 pixels each (``max_video_tokens``) whatever
    the chunk length, so a chunk's frames are processed exactly as in the whole video. The chat
    template renders the video as the bare ``<|video_pad|>`` that the processor expands into
    ``<t seconds><|vision_start|>cells<|vision_end|>`` per temporal patch.
    """
    import transformers
    from transformers import Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    moe = name.endswith("-moe")
    Config: Any = transformers.Qwen3VLMoeConfig if moe else transformers.Qwen3VLConfig
    Model: Any = transformers.Qwen3VLMoeForConditionalGeneration if moe else transformers.Qwen3VLForConditionalGeneration

    tokenizer = make_tokenizer(QWEN_SPECIALS)
    config = Config(**_qwen3_vl_config(moe, num_layers, max_positions, tokenizer.convert_tokens_to_ids))
    size = {"shortest_edge": 32 * 32 * 2, "longest_edge": 32 * 32 * 100_000}
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(size=size, patch_size=16),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(size=size, max_video_tokens=16),
        chat_template=chat_template("<|video_pad|>"),
    )
    return seeded(lambda: Model(config)), processor


def full_size_model(cfg: dict):
    """(config, processor, model class) of a full-size Qwen3-VL from its shipped configuration."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer, ids, text = full_size_text(cfg)
    config = Qwen3VLConfig(
        text_config=text, vision_config=dict(cfg["vision_config"]),
        video_token_id=ids["video"], image_token_id=ids["image"],
        vision_start_token_id=ids["vstart"], vision_end_token_id=ids["vend"],
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
    )
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(),  # the library's defaults: Qwen3-VL's video sizes
        chat_template=chat_template("<|vision_start|><|video_pad|><|vision_end|>"),
    )
    return config, processor, Qwen3VLForConditionalGeneration
