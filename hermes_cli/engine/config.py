"""How a session streams and answers: ``SessionConfig``, checked once when it is made."""

from __future__ import annotations

from dataclasses import dataclass

from .. import defaults


@dataclass(frozen=True)
class SessionConfig:
    """Settings of one session. ``budget`` counts stream tokens per decoder layer (None: no cap).

    Messages name the command-line options, since that is where users set them.
    """

    budget: int | None = defaults.BUDGET
    chunk_frames: int = defaults.CHUNK_FRAMES
    fps: float = defaults.FPS
    system_prompt: str | None = defaults.SYSTEM_PROMPT
    max_new_tokens: int = defaults.MAX_NEW_TOKENS
    repetition_penalty: float = defaults.REPETITION_PENALTY
    history: bool = True
    history_tokens: int = defaults.HISTORY_TOKENS  # prompt tokens of earlier turns per question, newest first
    history_kv: bool = defaults.HISTORY_KV  # keep earlier turns' keys and values (False: re-encode them as text)
    reindex: str = defaults.REINDEX
    reindex_margin: int | None = None  # lazy: compact when the next position passes limit - margin
    pseudo_query: str = defaults.PSEUDO_QUERY  # "approx": the paper's method; "forward": a real forward (ours)
    reindex_spacing: str = defaults.REINDEX_SPACING  # "rank": dense rank per axis (Eq. 11); "interval": ours
    penalise_prompt: bool = False  # repetition penalty over the prompt too (ours); default: generated tokens only
    pseudo_query_history: bool = True  # pseudo-queries follow the last Q/A even when the prompt carries no history
    kv_bits: int = defaults.KV_BITS  # 16: keys/values in the model's dtype; 8: int8 + float16 scales, dequantised on use

    def __post_init__(self) -> None:
        if self.reindex not in defaults.REINDEX_MODES:
            raise ValueError(f"--reindex must be one of {', '.join(defaults.REINDEX_MODES)}, got {self.reindex!r}")
        if self.pseudo_query not in defaults.PSEUDO_QUERY_MODES:
            raise ValueError(
                f"--pseudo-query must be one of {', '.join(defaults.PSEUDO_QUERY_MODES)}, got {self.pseudo_query!r}"
            )
        if self.reindex_spacing not in defaults.REINDEX_SPACINGS:
            raise ValueError(f"--reindex-spacing must be one of {', '.join(defaults.REINDEX_SPACINGS)}, got {self.reindex_spacing!r}")
        if self.kv_bits not in defaults.KV_BITS_CHOICES:
            raise ValueError(f"--kv-bits must be one of {', '.join(map(str, defaults.KV_BITS_CHOICES))}, got {self.kv_bits}")
        if self.chunk_frames < 1:
            raise ValueError(f"--chunk must be at least 1 frame, got {self.chunk_frames}")
        if self.fps <= 0:
            raise ValueError(f"--fps must be a positive number of frames per second, got {self.fps:g}")
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"--budget must be a positive number of tokens, got {self.budget}")
        if self.history_tokens < 0:
            raise ValueError(f"--history-tokens cannot be negative, got {self.history_tokens}")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"the repetition penalty must be positive, got {self.repetition_penalty}")
