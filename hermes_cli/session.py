"""A streaming session: frames in, chunk by chunk, into the model's cache; questions answered from it.

``Session.ingest`` encodes and prefills frames in chunks and lets the memory policy compress the
cache after each chunk. ``Session.ask`` appends the question after the cache, decodes greedily
with its own loop on explicit positions, streams the answer, and then rolls the cache back to
exactly what it held before the question. A lock serialises the model between an ingesting
thread and a questioning one.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from policies import Policy, StreamState
from policies.full import FullPolicy

from .memory import KIND_PREFIX, KIND_TEXT, KIND_VIDEO, StreamingCache, TokenMeta
from .models.base import EncodedChunk, ModelAdapter, VideoClock
from .rope import compact_positions, next_position_after

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
NO_FRAMES_ANSWER = "I have not seen any frames yet — ask again once the stream has started."
REINDEX_MODES = ("lazy", "eager", "off")


class PositionLimitError(RuntimeError):
    """The stream would pass the model's position limit and re-indexing is off."""


@dataclass
class SessionConfig:
    """How a session streams and answers. ``budget`` counts stream tokens per layer."""

    budget: int | None = 6000
    chunk_frames: int = 16
    fps: float = 1.0
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    max_new_tokens: int = 128
    repetition_penalty: float = 1.1
    history: bool = True
    reindex: str = "lazy"
    reindex_margin: int | None = None  # lazy: compact when the next position passes limit - margin
    pseudo_query: str = "forward"  # "forward": true per-layer attention; "approx": the reference's shortcut

    def __post_init__(self) -> None:
        if self.reindex not in REINDEX_MODES:
            raise ValueError(f"reindex must be one of {', '.join(REINDEX_MODES)}, got {self.reindex!r}")
        if self.pseudo_query not in ("forward", "approx"):
            raise ValueError(f"pseudo_query must be 'forward' or 'approx', got {self.pseudo_query!r}")
        if self.chunk_frames < 1:
            raise ValueError("chunk_frames must be at least 1")
        if self.fps <= 0:
            raise ValueError("fps must be positive")
        if self.budget is not None and self.budget < 1:
            raise ValueError("budget must be a positive number of tokens")


@dataclass
class Answer:
    """One answered question and what it cost."""

    question: str
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    stream_time_s: float = 0.0
    frames_seen: int = 0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    step_logits: list[Tensor] = field(default_factory=list)  # only when recorded
    no_frames: bool = False

    def record(self) -> dict:
        """When it was asked and what it cost, as reported in JSON output."""
        return {
            "stream_time_s": self.stream_time_s,
            "frames_seen": self.frames_seen,
            "ttft_ms": None if self.ttft_ms is None else round(self.ttft_ms, 3),
            "tpot_ms": None if self.tpot_ms is None else round(self.tpot_ms, 3),
            "answer_tokens": len(self.tokens),
        }


@dataclass
class ChunkReport:
    frames: int
    tokens: int
    prefill_ms: float
    compress_ms: float
    compressed: bool
    reindexed: bool


class Session:
    """One stream through one model under one memory policy."""

    def __init__(self, adapter: ModelAdapter, policy: Policy | None = None, config: SessionConfig | None = None):
        self.adapter = adapter
        self.policy = policy or FullPolicy()
        self.config = config or SessionConfig()
        if self.adapter.frames_per_unit > 1 and self.config.chunk_frames % self.adapter.frames_per_unit:
            raise ValueError(
                f"{adapter.family} groups {adapter.frames_per_unit} frames per temporal patch: "
                f"--chunk must be a multiple of {adapter.frames_per_unit}"
            )
        self.lock = threading.RLock()
        self.cache = StreamingCache(adapter.num_layers)
        self.history: list[tuple[str, str]] = []
        self.frames_seen = 0
        self.units_seen = 0
        self.unit_times: list[float] = []  # timestamp of each unit's first frame
        self.stream_time_s = 0.0
        self.reindex_count = 0
        self.compressions = 0
        self.last_chunk: ChunkReport | None = None
        self.last_answer: Answer | None = None
        self.warnings: list[str] = []  # things the user should know, each said once
        self._pending: list[tuple[np.ndarray, float]] = []
        self._tokens_per_unit: int | None = None
        self._prefill_prefix()
        self.clock: VideoClock = adapter.video_clock(self.cache.length, self.config.fps)

    # -- the prefix ---------------------------------------------------------------------------
    def _prefill_prefix(self) -> None:
        ids = self.adapter.tokens(self.adapter.prefix_text(self.config.system_prompt))
        positions = self.adapter.text_positions(0, ids.shape[0])
        self._forward(self.adapter.embed(ids), positions, KIND_PREFIX)

    def _forward(self, embeds: Tensor, positions: Tensor, kind: int, chunk: EncodedChunk | None = None):
        first_id = self.cache.new_ids(embeds.shape[1])
        if chunk is None:
            meta = TokenMeta.new(kind, first_id, positions)
        else:
            meta = TokenMeta.new(kind, first_id, positions, frame=chunk.unit, patch=chunk.patch)
        hidden, _ = self.adapter.forward(embeds, positions, self.cache)
        self.cache.record(meta)
        return hidden

    # -- positions ----------------------------------------------------------------------------
    def next_position(self) -> int:
        """Where text appended now would start: the largest position held + 1, on every axis."""
        held = self.cache.max_positions()
        return 0 if held is None else next_position_after(held)

    @property
    def position_limit(self) -> int:
        return self.adapter.max_positions

    @property
    def reindex_margin(self) -> int:
        if self.config.reindex_margin is not None:
            return self.config.reindex_margin
        return min(1024, self.position_limit // 4)

    def reindex(self) -> None:
        """Compact positions: the prefix stays, stream tokens get offset + dense rank per axis.

        The temporal axis of M-RoPE keeps its native spacing (rank × interval), so a stream
        with nothing evicted keeps its positions. Cached keys are rotated by the position delta
        in place (no recomputation); the video clock continues after the compacted positions.
        """
        p = self.cache.prefix_length()
        steps = [self.clock.interval] + [1.0] * (self.adapter.position_axes - 1)
        distinct_units = 0
        for layer in range(self.cache.num_layers):
            old = self.cache.meta(layer).positions[p:]
            new = compact_positions(old, p, steps)
            self.cache.reposition(layer, new, self.adapter.rotary)
            distinct_units = max(distinct_units, int(torch.unique(new[:, 0]).numel()))
        self.reindex_count += 1
        self.clock = VideoClock(
            t_origin=p,
            hw_origin=p,
            unit_origin=self.units_seen - distinct_units,
            interval=self.clock.interval,
        )

    def _positions_for(self, chunk: EncodedChunk) -> Tensor:
        positions = self.adapter.chunk_positions(chunk, self.clock, self.next_position())
        if self.config.reindex == "lazy" and int(positions.max()) >= self.position_limit - self.reindex_margin:
            self.reindex()
            positions = self.adapter.chunk_positions(chunk, self.clock, self.next_position())
        if int(positions.max()) >= self.position_limit:
            if self.config.reindex == "off":
                hint = "use --reindex lazy or eager"
            elif self.policy.target(self.config.budget) is None:
                hint = f"the {self.policy.name} policy keeps every token: use one with a budget (e.g. --policy hermes)"
            else:
                hint = "the memory holds more tokens than the model has positions: set a smaller --budget"
            raise PositionLimitError(
                f"the stream reached the model's position limit ({self.position_limit}) — {hint}"
            )
        return positions

    # -- ingesting ----------------------------------------------------------------------------
    def ingest(self, frames, timestamps) -> list[ChunkReport]:
        """Queue frames (H, W, 3 uint8, with their stream times) and prefill every full chunk."""
        reports = []
        for frame, ts in zip(frames, timestamps, strict=True):
            self._pending.append((np.asarray(frame), float(ts)))
            if len(self._pending) >= self.config.chunk_frames:
                reports.append(self._ingest_chunk(self._pending))
                self._pending = []
        return reports

    def flush(self) -> ChunkReport | None:
        """Prefill the frames still queued (end of stream), padding to whole temporal patches."""
        if not self._pending:
            return None
        pending, self._pending = self._pending, []
        real = len(pending)
        per = self.adapter.frames_per_unit
        while len(pending) % per:
            pending.append(pending[-1])
        return self._ingest_chunk(pending, real)

    def _ingest_chunk(self, items: list[tuple[np.ndarray, float]], real: int | None = None) -> ChunkReport:
        """Encode, prefill and (if over budget) compress one chunk; ``real`` frames were not padding."""
        frames = np.stack([f for f, _ in items])
        times = [t for _, t in items]
        with self.lock:
            t0 = time.perf_counter()
            timed = {"times": times} if "times" in inspect.signature(self.adapter.encode).parameters else {}
            chunk = self.adapter.encode(frames, self.units_seen, **timed)
            positions = self._positions_for(chunk)
            self._forward(chunk.embeds, positions, KIND_VIDEO, chunk)
            prefill_ms = (time.perf_counter() - t0) * 1e3
            if self._tokens_per_unit is None:
                self._tokens_per_unit = max(1, chunk.embeds.shape[1] // max(chunk.units, 1))
                self._check_chunk_fits(chunk.embeds.shape[1])
            self.unit_times.extend(times[:: self.adapter.frames_per_unit][: chunk.units])
            self.units_seen += chunk.units
            self.frames_seen += len(items) if real is None else real
            self.stream_time_s = max(self.stream_time_s, times[-1])
            t1 = time.perf_counter()
            compressed = self._compress_if_needed()
            reindexed = compressed and self.config.reindex == "eager"
            if reindexed:
                self.reindex()
            compress_ms = (time.perf_counter() - t1) * 1e3
            self.last_chunk = ChunkReport(real or len(items), chunk.embeds.shape[1], prefill_ms, compress_ms, compressed, reindexed)
            return self.last_chunk

    def _check_chunk_fits(self, tokens: int) -> None:
        target = self.policy.target(self.config.budget, self._tokens_per_unit or 1)
        if target is not None and tokens > target:
            hint = "lower --chunk or --max-pixels" if self.adapter.position_axes == 3 else "lower --chunk"
            self.warnings.append(
                f"one chunk ({tokens} tokens) is larger than the memory ({target} tokens/layer): "
                f"each chunk evicts the one before — {hint}, or raise --budget"
            )

    # -- compressing --------------------------------------------------------------------------
    def _compress_if_needed(self) -> bool:
        budget = self.config.budget
        n = max(self.cache.stream_counts())
        if not self.policy.should_compress(n, budget):
            return False
        attention = self._pseudo_query_attention(self.policy.pseudo_queries(tuple(self.history)))
        state = StreamState(
            layers=[
                self.cache.stream_view(l, {name: att[l] for name, att in attention.items()})
                for l in range(self.cache.num_layers)
            ],
            budget=budget,
            tokens_per_frame=self._tokens_per_unit or 1,
            frames_seen=self.units_seen,
            rotary=self.adapter.rotary,
            history=tuple(self.history),
        )
        self.cache.apply(self.policy.select(state))
        self.compressions += 1
        return True

    def _pseudo_query_attention(self, texts: dict[str, str]) -> dict[str, list[Tensor]]:
        """Per pseudo-query, per layer: attention (N,) from its tokens to each stream token.

        ``forward`` mode runs every pseudo-query in one real forward on top of the cache — each
        text at the positions right after the cache and masked from the others, so each sees
        exactly what a forward of its own would — and takes each layer's attention weights,
        averaged over heads and the text's tokens; the tokens are then removed. ``approx``
        projects the raw token embeddings through each layer's query projection.
        """
        if not texts:
            return {}
        p, length = self.cache.prefix_length(), self.cache.length
        ids = {name: self.adapter.tokens(text) for name, text in texts.items()}
        start = self.next_position()
        if self.config.pseudo_query == "approx":
            weights = {
                name: self.adapter.approx_attention(
                    self.adapter.embed(t), self.adapter.text_positions(start, t.shape[0]), self.cache
                )
                for name, t in ids.items()
            }
            return {name: [w[0].float().mean(dim=(0, 1))[p:length] for w in ws] for name, ws in weights.items()}
        sizes = [t.shape[0] for t in ids.values()]
        embeds = self.adapter.embed(torch.cat(list(ids.values())))
        positions = torch.cat([self.adapter.text_positions(start, n) for n in sizes])
        mask = side_by_side_mask(length, sizes, self.adapter.dtype, self.adapter.device)
        mark = self.cache.mark()
        try:
            _, weights = self.adapter.forward(embeds, positions, self.cache, attentions=True, attention_mask=mask)
        finally:
            self.cache.rollback(mark)
        out: dict[str, list[Tensor]] = {}
        offset = 0
        for name, n in zip(ids, sizes):
            out[name] = [w[0, :, offset : offset + n].float().mean(dim=(0, 1))[p:length] for w in weights]
            offset += n
        return out

    # -- asking -------------------------------------------------------------------------------
    def answer(self, question: str, *, max_new_tokens: int | None = None, record_logits: bool = False) -> Answer:
        """Answer a question fully (see ``ask``) and return it."""
        for _ in self.ask(question, max_new_tokens=max_new_tokens, record_logits=record_logits):
            pass
        assert self.last_answer is not None
        return self.last_answer

    def ask(self, question: str, *, max_new_tokens: int | None = None, record_logits: bool = False) -> Iterator[str]:
        """Yield the answer piece by piece; afterwards the cache is exactly as before the question.

        The question is answered from the memory as it is: it is never used for compression.
        """
        answer = Answer(question=question)
        self.last_answer = answer
        with self.lock:
            answer.stream_time_s, answer.frames_seen = self.stream_time_s, self.frames_seen
            if self.units_seen == 0:
                answer.text, answer.no_frames = NO_FRAMES_ANSWER, True
                yield answer.text
                return
            yield from self._decode(answer, max_new_tokens or self.config.max_new_tokens, record_logits)
        if self.config.history:
            self.history.append((question, answer.text))

    def _decode(self, answer: Answer, max_new_tokens: int, record_logits: bool) -> Iterator[str]:
        history = self.history if self.config.history else []
        prompt = self.adapter.tokens(self.adapter.question_text(answer.question, history, self.config.system_prompt))
        eos = self.adapter.eos_token_ids
        mark = self.cache.mark()
        t0 = time.perf_counter()
        step_times: list[float] = []
        try:
            start = self.next_position()
            embeds, positions = self.adapter.embed(prompt), self.adapter.text_positions(start, prompt.shape[0])
            seen = prompt.tolist()
            shown = ""
            for step in range(max_new_tokens):
                hidden = self._forward(embeds, positions, KIND_TEXT)
                logits = self.adapter.logits(hidden[:, -1])[0]
                if record_logits:
                    answer.step_logits.append(logits.detach().cpu())
                token = int(penalised(logits, seen, self.config.repetition_penalty).argmax())
                now = time.perf_counter()
                if step == 0:
                    answer.ttft_ms = (now - t0) * 1e3
                else:
                    step_times.append(now)
                if token in eos:
                    break
                answer.tokens.append(token)
                seen.append(token)
                text = self.adapter.decode(answer.tokens)
                if len(text) > len(shown) and not text.endswith("\ufffd"):
                    yield text[len(shown):]
                    shown = text
                answer.text = text
                start = int(positions[-1].max()) + 1
                embeds, positions = self.adapter.embed(torch.tensor([token])), self.adapter.text_positions(start, 1)
        finally:
            self.cache.rollback(mark)
            if step_times:
                first = t0 + (answer.ttft_ms or 0) / 1e3
                answer.tpot_ms = (step_times[-1] - first) / len(step_times) * 1e3

    # -- readouts -----------------------------------------------------------------------------
    def stats(self) -> dict:
        """What the readouts and ``--json`` report (a consistent snapshot: taken under the lock)."""
        with self.lock:
            return self._stats()

    def _stats(self) -> dict:
        from .readouts import memory_stats

        cache = self.cache
        video = cache.count(KIND_VIDEO)
        stream = cache.stream_counts()
        last = self.last_chunk
        return {
            "stream_time_s": round(self.stream_time_s, 3),
            "frames_seen": self.frames_seen,
            "units_seen": self.units_seen,
            "units_kept": len(set().union(*self.held_units())),
            "cache": {
                "tokens_per_layer": [l.length for l in cache.stream_layers],
                "video_tokens_per_layer": video,
                "stream_tokens_per_layer": stream,
                "prefix_tokens": cache.prefix_length(),
                "budget": self.config.budget if self.policy.target(self.config.budget) is not None else None,
                "kv_bytes": cache.kv_bytes(),
                "compressions": self.compressions,
            },
            "positions": {
                "next": self._next_positions(),
                "limit": self.position_limit,
                "reindex": self.config.reindex,
                "reindex_count": self.reindex_count,
            },
            "prefill_ms_last_chunk": None if last is None else round(last.prefill_ms, 3),
            "compress_ms_last_chunk": None if last is None else round(last.compress_ms, 3),
            "memory": memory_stats(self.adapter.device),
            "model": self.adapter.name,
            "random_weights": self.adapter.random_weights,
            "policy": self.policy.name,
        }

    def _next_positions(self):
        nxt = self.next_position()
        return nxt if self.adapter.position_axes == 1 else [nxt] * self.adapter.position_axes

    def held_units(self) -> list[list[int]]:
        """Per layer, the stream units (frames or temporal patches) it still holds tokens of."""
        out = []
        for l in range(self.cache.num_layers):
            meta = self.cache.meta(l)
            units = meta.frame[(meta.kind == KIND_VIDEO)]
            out.append(sorted(set(units.tolist())))
        return out


def side_by_side_mask(cached: int, sizes: list[int], dtype: torch.dtype, device) -> Tensor:
    """Additive attention mask (1, 1, Q, cached + Q) for texts placed side by side after a cache.

    Every text sees the whole cache and, causally, its own tokens — never another text's.
    """
    total = sum(sizes)
    text = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    index = torch.arange(total)
    allowed = (text[:, None] == text[None, :]) & (index[None, :] <= index[:, None])
    allowed = torch.cat([torch.ones(total, cached, dtype=torch.bool), allowed], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def penalised(logits: Tensor, seen: list[int], penalty: float) -> Tensor:
    """Repetition penalty as in CTRL / transformers: divide positive, multiply negative logits."""
    if penalty == 1.0 or not seen:
        return logits
    idx = torch.tensor(sorted(set(seen)), device=logits.device)
    picked = logits[idx]
    out = logits.clone()
    out[idx] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return out
