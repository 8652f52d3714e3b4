"""Answering from the cache: greedy decoding on explicit positions, then an exact rollback.

transformers' ``generate()`` derives positions from the cache's physical length, which is wrong
after eviction, so the loop here places every token itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator

import torch
from torch import Tensor

from ..models.base import ModelAdapter
from .cache import KIND_TEXT, Mark, StreamingCache
from .positions import PositionTracker
from .prefill import prefill
from .records import Answer


def greedy_answer(adapter: ModelAdapter, cache: StreamingCache, positions: PositionTracker, prompt: Tensor,
                  answer: Answer, *, max_new_tokens: int, repetition_penalty: float,
                  penalise_prompt: bool = False, record_logits: bool = False,
                  setup: Callable[[], None] | None = None,
                  keep: Callable[[Mark], None] | None = None) -> Generator[str, None, None]:
    """Append ``prompt`` after the cache, decode greedily and yield text as it becomes valid UTF-8.

    The repetition penalty covers the generated tokens (and the prompt too with
    ``penalise_prompt``). Fills ``answer`` (text, tokens, TTFT, TPOT). The cache is rolled back to
    exactly what it held before, also when the consumer stops early (the generator is closed).
    ``setup`` runs first (inside the timing, its appends rolled back too: e.g. earlier turns'
    keys and values); ``keep(mark)`` sees the cache just before the rollback of a completed answer.
    """
    eos = adapter.eos_token_ids
    mark = cache.mark()
    t0 = time.perf_counter()
    step_times: list[float] = []
    try:
        if setup is not None:
            setup()
        where = positions.text(prompt.shape[0])
        embeds = adapter.embed(prompt)
        seen = prompt.tolist() if penalise_prompt else []
        shown = ""
        for step in range(max_new_tokens):
            hidden = prefill(adapter, cache, embeds, where, KIND_TEXT)
            logits = adapter.logits(hidden[:, -1])[0]
            if record_logits:
                answer.step_logits.append(logits.detach().cpu())
            token = int(penalised(logits, seen, repetition_penalty).argmax())
            now = time.perf_counter()
            if step == 0:
                answer.ttft_ms = (now - t0) * 1e3
            else:
                step_times.append(now)
            if token in eos:
                break
            answer.tokens.append(token)
            seen.append(token)
            text = adapter.decode(answer.tokens)
            if len(text) > len(shown) and not text.endswith("\ufffd"):
                yield text[len(shown):]
                shown = text
            answer.text = text
            where = positions.text(1, start=int(where[-1].max()) + 1)
            embeds = adapter.embed(torch.tensor([token]))
        if keep is not None:
            keep(mark)
    finally:
        cache.rollback(mark)
        if step_times:
            first = t0 + (answer.ttft_ms or 0) / 1e3
            answer.tpot_ms = (step_times[-1] - first) / len(step_times) * 1e3


def penalised(logits: Tensor, seen: list[int], penalty: float) -> Tensor:
    """Repetition penalty as in CTRL / transformers: divide positive, multiply negative logits."""
    if penalty == 1.0 or not seen:
        return logits
    idx = torch.tensor(sorted(set(seen)), device=logits.device)
    picked = logits[idx]
    out = logits.clone()
    out[idx] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return out
