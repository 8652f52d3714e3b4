"""Earlier turns of a conversation kept as keys and values, so a question never re-encodes them.

After each answer the text tokens of the conversation so far — earlier turns, the question's
prompt and the answer — are copied out of the cache before it is rolled back (``capture``),
trimmed to the newest whole turns that fit ``max_tokens``. The next question appends them back
after the stream (``attach``), their keys rotated to start at the next free position (text tokens
share one position on every axis, so the rotation is exact for M-RoPE too), and prefills only
what is new: the end of the previous answer the decoder had not fed back, the template's turn
break and the new question. TTFT then depends on the memory and ``max_tokens``, not on how many
questions came before.

The kept turns' keys and values were computed against the video memory of their time, not the
current one: that is the one difference from re-encoding the same turns as text (``history
reuse off``), which the session does whenever the kept turns do not match its history (after
``/clear``, or when a turn alone is larger than ``max_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..models.base import ModelAdapter
from .cache import KIND_TEXT, Mark, StreamingCache, TokenMeta
from .position_tracker import PositionTracker


@dataclass
class KeptTurns:
    """Keys and values (per layer (1, H, n, D)) of the newest turns, as they sat in the cache."""

    keys: list[Tensor]
    values: list[Tensor]
    positions: Tensor  # (n, A), consecutive, equal on every axis
    sizes: list[int]  # tokens per kept turn, oldest first
    last_turn: tuple[str, str]  # the (question, answer) the block ends with
    turns: int  # len(history) the block belongs after
    unfed: list[int]  # answer tokens of the last turn that were not fed back (their KV is missing)

    @property
    def length(self) -> int:
        return sum(self.sizes)


class ConversationMemory:
    """The kept turns of one session (see module docstring)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.kept: KeptTurns | None = None

    def usable(self, history: list[tuple[str, str]]) -> bool:
        """Whether the kept turns are exactly the newest of ``history``."""
        k = self.kept
        return k is not None and bool(history) and k.turns == len(history) and k.last_turn == tuple(history[-1])

    def prompt(self, adapter: ModelAdapter, question: str, history: list[tuple[str, str]],
               system_prompt: str | None) -> Tensor | None:
        """Token ids to prefill after the kept turns for ``question``; None when they are not usable
        or the template does not continue a turn by appending to it."""
        if not self.usable(history):
            return None
        q, a = history[-1]
        alone = adapter.question_text(q, [], system_prompt) + a
        joined = adapter.question_text(question, [(q, a)], system_prompt)
        if not joined.startswith(alone):
            return None
        rest = adapter.tokens(joined[len(alone):])
        assert self.kept is not None  # usable() said so
        return torch.cat([torch.tensor(self.kept.unfed, dtype=torch.long), rest])

    def attach(self, cache: StreamingCache, positions: PositionTracker, rotary) -> None:
        """Append the kept turns after everything the cache holds, rotated to the next free position."""
        k = self.kept
        if k is None:
            return
        start = positions.next()
        delta = start - int(k.positions[0, 0])
        keys = k.keys
        if delta and rotary is not None:  # one rotation for all layers (they share positions)
            shift = torch.full_like(k.positions, delta).to(keys[0].device)
            keys = list(rotary.rotate(torch.cat(keys), shift).split(1))
        meta = TokenMeta.new(KIND_TEXT, cache.new_ids(k.length), k.positions + delta)
        cache.append(keys, k.values, meta)

    def capture(self, cache: StreamingCache, mark: Mark, *, reused: bool, prompt_tokens: int,
                answer_tokens: list[int], turn: tuple[str, str], turns: int, text_history: int = 0,
                rotary=None) -> None:
        """Keep the conversation's tokens after ``mark`` (kept turns if ``reused``, this prompt, the
        answer) for the next question, trimmed to the newest whole turns within ``max_tokens``.

        ``text_history``: leading prompt tokens that were earlier turns re-encoded as text (kept
        as one unit, the first to go)."""
        keys, values, meta = cache.copy_tail(mark)
        earlier = self.kept.sizes if reused and self.kept is not None else []
        fed = cache.length - mark.length - sum(earlier) - prompt_tokens  # answer tokens fed back
        if text_history > 0:
            earlier = [*earlier, text_history]
        sizes = [*earlier, prompt_tokens - text_history + fed]
        drop = 0
        while sizes and sum(sizes) > self.max_tokens:
            drop += sizes.pop(0)
        if not sizes:
            self.kept = None
            return
        keys, values, positions = [k[:, :, drop:] for k in keys], [v[:, :, drop:] for v in values], meta.positions
        shift = int(positions[drop, 0] - positions[0, 0])
        if shift and rotary is not None:
            # Move the trimmed turns back to where the conversation started (the stream's next
            # position), so the next question attaches them without a rotation unless frames came.
            delta = torch.full_like(positions[drop:], -shift).to(keys[0].device)
            keys = list(rotary.rotate(torch.cat(keys), delta).split(1))
        positions = positions[drop:] - (shift if rotary is not None else 0)
        self.kept = KeptTurns(
            keys=keys, values=values, positions=positions.clone(), sizes=sizes, last_turn=turn, turns=turns,
            unfed=list(answer_tokens[fed:]),
        )

    def clear(self) -> None:
        self.kept = None
