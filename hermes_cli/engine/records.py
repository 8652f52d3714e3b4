"""Typed records of what a session did: answers, chunks and stats snapshots.

Each record serialises to the JSON that ``--json``, ``hermes eval`` and ``hermes bench`` print
(``to_json``); readers use the attributes, never string keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from torch import Tensor


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


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
    prompt_tokens: int = 0  # tokens prefilled for the question (earlier turns re-encoded as text included)
    context_tokens: int = 0  # earlier turns' tokens in front of the question (re-encoded or kept)

    def record(self) -> dict:
        """When it was asked and what it cost, as reported in JSON output."""
        return {
            "stream_time_s": self.stream_time_s,
            "frames_seen": self.frames_seen,
            "ttft_ms": _ms(self.ttft_ms),
            "tpot_ms": _ms(self.tpot_ms),
            "answer_tokens": len(self.tokens),
        }


@dataclass(frozen=True)
class ChunkReport:
    """One prefilled chunk: its size and what prefill and compression cost."""

    frames: int
    tokens: int
    prefill_ms: float
    compress_ms: float
    compressed: bool
    reindexed: bool
    encode_ms: float = 0.0  # vision encoding (part of prefill_ms)
    pseudo_query_ms: float = 0.0  # a separate pseudo-query pass (part of compress_ms; 0 when folded)
    folded: bool = False  # the pseudo-queries rode in this chunk's prefill (their cost is in prefill_ms)
    notify_ms: float = 0.0  # the --notify probes after this chunk (not part of prefill_ms)


@dataclass(frozen=True)
class CacheStats:
    tokens_per_layer: list[int]
    video_tokens_per_layer: list[int]
    stream_tokens_per_layer: list[int]
    prefix_tokens: int
    budget: int | None  # None: the policy keeps everything
    kv_bytes: int
    compressions: int

    @property
    def stream_tokens(self) -> int:
        """The fullest layer's stream tokens (what a budget bounds)."""
        return max(self.stream_tokens_per_layer or [0])

    @property
    def tokens(self) -> int:
        return max(self.tokens_per_layer or [0])


@dataclass(frozen=True)
class PositionStats:
    next: int | list[int]  # per axis for M-RoPE
    limit: int
    reindex: str
    reindex_count: int


@dataclass(frozen=True)
class MemoryStats:
    rss_bytes: int | None
    peak_rss_bytes: int | None
    gpu_peak_bytes: int | None
    gpu_allocated_bytes: int | None


@dataclass(frozen=True)
class SessionStats:
    """A consistent snapshot of a session, as the readouts and ``--json`` report it."""

    stream_time_s: float
    frames_seen: int
    units_seen: int
    units_kept: int
    cache: CacheStats
    positions: PositionStats
    last_chunk: ChunkReport | None
    memory: MemoryStats
    model: str
    random_weights: bool
    policy: str

    @property
    def prefill_ms_last_chunk(self) -> float | None:
        return None if self.last_chunk is None else self.last_chunk.prefill_ms

    @property
    def compress_ms_last_chunk(self) -> float | None:
        return None if self.last_chunk is None else self.last_chunk.compress_ms

    def to_json(self) -> dict:
        """The JSON object (field names are part of the command-line interface)."""
        return {
            "stream_time_s": round(self.stream_time_s, 3),
            "frames_seen": self.frames_seen,
            "units_seen": self.units_seen,
            "units_kept": self.units_kept,
            "cache": asdict(self.cache),
            "positions": asdict(self.positions),
            "prefill_ms_last_chunk": _ms(self.prefill_ms_last_chunk),
            "compress_ms_last_chunk": _ms(self.compress_ms_last_chunk),
            "memory": asdict(self.memory),
            "model": self.model,
            "random_weights": self.random_weights,
            "policy": self.policy,
        }
