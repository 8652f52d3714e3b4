"""What every model adapter provides: the seam that hides model differences from the session.

An adapter owns a loaded transformers model and its official processor. It turns frames into
input embeddings with a layout (which unit, row and column each token is), builds prompt token
ids with the model's chat format, assigns rotary positions (1-D or M-RoPE), and runs the
language model on explicit positions over a ``StreamingCache``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..positions.layout import VideoClock, text_positions, to_model_position_ids
from ..positions.rope import RotaryDelta, rotate_half
from . import attention
from .attention import PROBE_IMPLEMENTATION, RowProbe, base_attention
from .chat import conversation, split_prompt


@dataclass
class EncodedChunk:
    """A chunk of frames turned into language-model input.

    ``unit`` is the stream unit each token belongs to (a frame, or for Qwen a temporal patch of
    2 frames), ``patch`` its index inside the unit; ``row``/``col`` its spatial cell (-1 for a
    token with no cell, such as LLaVA-OneVision's newline).
    """

    embeds: Tensor  # (1, n, hidden)
    input_ids: Tensor  # (n,) the placeholder ids these embeddings replace (for one-shot checks)
    unit: Tensor  # (n,) int64, stream unit index
    patch: Tensor  # (n,) int64
    row: Tensor  # (n,) int64
    col: Tensor  # (n,) int64
    units: int  # how many units the chunk adds
    pixel_values: Tensor | None = None  # what the processor produced (for one-shot checks)
    grid_thw: Tensor | None = None




class ModelAdapter(ABC):
    """A loaded video-LLM behind one interface. Subclasses: one per model family."""

    family: str
    frames_per_unit: int = 1
    position_axes: int = 1

    def __init__(self, model, processor, *, name: str, random_weights: bool = False,
                 max_pixels: int | None = None) -> None:
        self.max_pixels = max_pixels  # per frame, where the family resizes by area (Qwen-VL)
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.name = name
        self.random_weights = random_weights
        self.rotary = RotaryDelta.from_rotary_embedding(self.text_model.rotary_emb)
        self.device_map: dict | None = None  # block -> device, when spread by --device auto
        self.input_device: torch.device | None = None  # where inputs go when spread
        self.synthetic_scale: float | None = None  # benchmarks' random embeddings: the token embeddings' scale
        self.synthetic_grids: dict[tuple[int, ...], tuple[int, int, int]] = {}  # (frames, h, w) -> patch grid

    # -- model facts ----------------------------------------------------------------------------
    @property
    @abstractmethod
    def text_model(self) -> Any:
        """The decoder-only language model (embeddings, layers, norm, rotary embedding)."""

    @property
    def text_config(self):
        return self.text_model.config

    @property
    def num_layers(self) -> int:
        return self.text_config.num_hidden_layers

    @property
    def device(self) -> torch.device:
        """Where inputs go: the first device of a model spread by ``--device auto``, else the model's."""
        return self.input_device or next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.text_model.parameters()).dtype

    @property
    def max_positions(self) -> int:
        return int(self.text_config.max_position_embeddings)

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def eos_token_ids(self) -> set[int]:
        ids = set()
        for token in ("<|im_end|>", "<|endoftext|>"):
            tid = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id:
                ids.add(tid)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # -- prompts ----------------------------------------------------------------------------------
    def tokens(self, text: str) -> Tensor:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)

    video_token: str  # the placeholder the chat template renders for the video

    def prefix_text(self, system_prompt: str | None) -> str:
        """Everything before the first video token (never evicted)."""
        return self._split("", [], system_prompt)[0]

    def question_text(self, question: str, history: list[tuple[str, str]], system_prompt: str | None = None) -> str:
        """What follows the video for a question (earlier turns included), up to the answer."""
        return self._split(question, history, system_prompt)[1]

    def recent_history(self, question: str, history: list[tuple[str, str]], system_prompt: str | None,
                       max_tokens: int) -> list[tuple[str, str]]:
        """The newest whole turns of ``history`` whose prompt tokens fit in ``max_tokens``.

        A turn's cost is what it adds to ``question_text`` as rendered by the chat template, so
        the question's prompt is at most ``max_tokens`` longer than without history.
        """
        if max_tokens <= 0 or not history:
            return []
        bare = len(self.tokens(self.question_text(question, [], system_prompt)))
        kept = 0
        for count in range(1, len(history) + 1):
            extra = len(self.tokens(self.question_text(question, history[-count:], system_prompt))) - bare
            if extra > max_tokens:
                break
            kept = count
        return history[len(history) - kept :] if kept else []

    def _split(self, question: str, history: list[tuple[str, str]], system_prompt: str | None) -> tuple[str, str]:
        rendered = self.processor.apply_chat_template(
            conversation(question, history, system_prompt), add_generation_prompt=True, tokenize=False
        )
        return split_prompt(rendered, self.video_token)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # -- video ------------------------------------------------------------------------------------
    @abstractmethod
    def encode(self, frames: np.ndarray, first_unit: int, times: Sequence[float] | None = None) -> EncodedChunk:
        """Embed frames (F, H, W, 3) uint8 seen at stream ``times`` (seconds); F must be a multiple
        of ``frames_per_unit``. Families whose prompt carries time (Qwen3-VL) use the times."""

    @abstractmethod
    def video_clock(self, video_start: int, fps: float) -> VideoClock:
        """The clock for a stream whose first video token sits at position ``video_start``."""

    def chunk_positions(self, chunk: EncodedChunk, clock: VideoClock, next_free: int) -> Tensor:
        """Positions (n, A) of a chunk. 1-D: consecutive from ``next_free``."""
        n = chunk.unit.shape[0]
        return torch.arange(next_free, next_free + n, dtype=torch.long).unsqueeze(1)

    def text_positions(self, start: int, n: int) -> Tensor:
        """Positions (n, A) of n text tokens starting at ``start`` (the same on every axis)."""
        return text_positions(start, n, self.position_axes)

    # -- running the language model ----------------------------------------------------------------
    def embed(self, ids: Tensor) -> Tensor:
        return self.text_model.embed_tokens(ids.to(self.device).unsqueeze(0))

    def position_ids(self, positions: Tensor) -> Tensor:
        """Session positions (n, A) in the layout the text model takes."""
        return to_model_position_ids(positions.to(self.device))

    @torch.no_grad()
    def forward(self, embeds: Tensor, positions: Tensor, cache, *, attentions: bool = False,
                attention_mask: Tensor | None = None, probe: RowProbe | None = None,
                chunk: EncodedChunk | None = None):
        """Run the language model on ``embeds`` at explicit ``positions``, appending to ``cache``.

        ``attention_mask``: a (1, 1, n, cached + n) mask replacing the causal one (additive, or
        boolean with True where a query may attend). ``probe``: rows whose attention weights to take
        from inside the model's own attention (filled in place, see ``models.attention``).
        ``attentions``: every layer's full weights, from the eager path (a reference for tests).
        ``chunk``: the encoded video the first embeddings come from, when they do (some families
        add per-chunk inputs, e.g. Qwen3-VL's DeepStack features).
        Returns (last hidden states (1, n, hidden), per-layer attention weights or None).
        """
        if probe is not None:
            with self.probing(probe):
                return self._run(embeds, positions, cache, False, attention_mask, chunk).last_hidden_state, None
        if attentions:  # SDPA returns no weights: run this (short) pass with eager attention
            with self.eager_attention():
                out = self._run(embeds, positions, cache, True, attention_mask, chunk)
            return out.last_hidden_state, out.attentions
        return self._run(embeds, positions, cache, False, attention_mask, chunk).last_hidden_state, None

    @torch.no_grad()
    def forward_rows(self, embeds: Tensor, positions: Sequence[Tensor], cache, *, attention_mask: Tensor) -> Tensor:
        """One pass of B rows at once (a batch of streams, see ``engine.cache.BatchView``):
        ``embeds`` (B, n, hidden), each row's session positions (n, A), the (B, 1, n, keys) mask.
        Returns the last hidden states (B, n, hidden)."""
        rows = [self.position_ids(p) for p in positions]  # (1, n) or (A, 1, n) each
        position_ids = torch.cat(rows, dim=0 if rows[0].dim() == 2 else 1)
        previous = self.text_model.config._attn_implementation
        self.text_model.set_attn_implementation(attention.ROWS_IMPLEMENTATION)  # grouped heads: no copied keys
        try:
            return self.text_model(
                inputs_embeds=embeds.to(self.dtype), attention_mask=attention_mask, position_ids=position_ids,
                cache=cache, use_cache=True,
            ).last_hidden_state
        finally:
            self.text_model.set_attn_implementation(previous)

    def _run(self, embeds: Tensor, positions: Tensor, cache, attentions: bool, attention_mask: Tensor | None,
             chunk: EncodedChunk | None = None):
        """One pass of the text model."""
        return self.text_model(
            inputs_embeds=embeds.to(self.dtype),
            attention_mask=attention_mask,
            position_ids=self.position_ids(positions),
            cache=cache,
            use_cache=True,
            output_attentions=attentions,
            **self.chunk_inputs(chunk, embeds.shape[1]),
        )

    def chunk_inputs(self, chunk: EncodedChunk | None, length: int) -> dict:
        """Extra inputs of the text model for a pass whose first tokens are ``chunk`` (of ``length``
        tokens in all). Default: none."""
        return {}

    @contextmanager
    def probing(self, probe: RowProbe):
        """Run the model's attention through ``probe_attention_forward`` with ``probe`` active."""
        previous = self.text_model.config._attn_implementation
        probe.base = base_attention(previous)
        attns = [layer.self_attn for layer in self.text_model.layers]
        for attn in attns:
            attn.hermes_probe = probe
        self.text_model.set_attn_implementation(PROBE_IMPLEMENTATION)
        try:
            yield
        finally:
            self.text_model.set_attn_implementation(previous)
            for attn in attns:
                attn.hermes_probe = None
            probe.base = None

    @contextmanager
    def eager_attention(self):
        previous = self.text_model.config._attn_implementation
        if previous == "eager":
            yield
            return
        self.text_model.set_attn_implementation("eager")
        try:
            yield
        finally:
            self.text_model.set_attn_implementation(previous)

    @torch.no_grad()
    def query_key_projections(self, embeds: Tensor, positions: Tensor,
                              only: Collection[int] | None = None) -> Iterator[tuple[int, Tensor, Tensor, float]]:
        """Per decoder layer (those in ``only``; default all), the *raw* token ``embeds``
        (1, n, hidden) through its ``input_layernorm`` and its query and key projections (and the
        per-head q/k norms where the model has them), rotated at session ``positions``, in float32:
        (layer index, queries (1, heads, n, D), keys (1, kv_heads, n, D), the attention's scaling).
        All the paper's approximate pseudo-query attention reads of the model
        (``engine.pseudo_query.approx_attention``)."""
        n = embeds.shape[1]
        embeds = embeds.to(self.dtype)
        cos, sin = self.text_model.rotary_emb(embeds, self.position_ids(positions))
        cos, sin = cos.unsqueeze(1).float(), sin.unsqueeze(1).float()
        for index, layer in enumerate(self.text_model.layers):
            if only is not None and index not in only:
                continue
            attn = layer.self_attn
            normed = layer.input_layernorm(embeds)
            q = attn.q_proj(normed).view(1, n, -1, attn.head_dim)
            k = attn.k_proj(normed).view(1, n, -1, attn.head_dim)
            if hasattr(attn, "q_norm"):  # Qwen3: per-head norms before the rotation
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2).float(), k.transpose(1, 2).float()
            c, s = cos.to(q.device), sin.to(q.device)  # layers may sit on other devices (--device auto)
            yield index, q * c + rotate_half(q) * s, k * c + rotate_half(k) * s, attn.scaling

    @torch.no_grad()
    def logits(self, hidden: Tensor) -> Tensor:
        return self.model.lm_head(hidden).float()
