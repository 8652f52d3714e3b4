"""The floor under a session's chunk prefill and decoding step: the bare model on the same cache.

``hermes bench --profile`` puts two ratios in every record, both measured at that step, on the
memory as the stream left it, in the same process and interleaved round by round:

- ``prefill_vs_bare``: our prefill of one chunk (``engine.prefill.prefill``: position ids, the
  model's forward through the ``StreamingCache``, the tokens' identities recorded; rolled back
  after) over a bare ``text_model`` forward of the same embeddings at the same positions, its
  position ids made beforehand, over a plain transformers ``DynamicCache`` holding copies of the
  same keys and values (what the official code runs);
- ``tpot_vs_bare``: the step's measured time per output token (``tpot_ms``: embedding, forward,
  logits, repetition penalty, argmax, text) over a bare greedy step: one token's ``text_model``
  forward over a ``DynamicCache`` of the same keys and values plus the question, and the LM head
  on its last hidden state. ``token_ms`` is our own greedy step timed beside it (one token through
  ``engine.prefill.prefill`` after the same prompt, the LM head, rolled back), so the step can be
  compared at the same moment too, whatever the machine's load did between the answers and here.

Medians over ``rounds`` after one unmeasured round.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from .cache import KIND_TEXT, KIND_VIDEO
from .prefill import prefill


@dataclass(frozen=True)
class Floor:
    prefill_ms: float  # ours, one chunk, median
    bare_prefill_ms: float  # the bare forward of the same chunk, median
    bare_token_ms: float  # a bare greedy step over the cache, median
    token_ms: float  # our greedy step at the same moment (engine prefill of one token + LM head), median

    @property
    def prefill_vs_bare(self) -> float:
        return self.prefill_ms / self.bare_prefill_ms


def plain_cache(cache) -> DynamicCache:
    """A transformers ``DynamicCache`` holding copies of every layer's keys and values (float, contiguous)."""
    plain = DynamicCache()
    for index, layer in enumerate(cache.stream_layers):
        plain.update(layer.stored_keys().clone(), layer.stored_values().clone(), index)
    return plain


@torch.no_grad()
def measure_floor(session, rounds: int = 3, prompt_tokens: int = 16) -> Floor:
    """Ours against the bare model at the session's current memory (left exactly as it was)."""
    adapter, cache, positions = session.adapter, session.cache, session.positions
    frames = session.config.chunk_frames
    chunk = adapter.encode(_frames(frames), session.units_seen)
    where = positions.for_chunk(chunk, session.units_seen, bounded=False)
    embeds = chunk.embeds.to(adapter.dtype)
    position_ids = adapter.position_ids(where)
    extra = adapter.chunk_inputs(chunk, embeds.shape[1])
    prompt = torch.full((prompt_tokens,), 11, dtype=torch.long)
    start = positions.next()
    prompt_embeds, prompt_ids = adapter.embed(prompt), adapter.position_ids(adapter.text_positions(start, prompt_tokens))
    token_embeds = adapter.embed(torch.tensor([13]))
    token_ids = adapter.position_ids(adapter.text_positions(start + prompt_tokens, 1))
    ours, bare, step, own_step = [], [], [], []
    for round_ in range(rounds + 1):
        mark = cache.mark()
        t0 = time.perf_counter()
        prefill(adapter, cache, chunk.embeds, where, KIND_VIDEO, chunk)
        elapsed = time.perf_counter() - t0
        cache.rollback(mark)
        plain = plain_cache(cache)
        t0 = time.perf_counter()
        adapter.text_model(inputs_embeds=embeds, position_ids=position_ids, cache=plain, use_cache=True, **extra)
        bare_elapsed = time.perf_counter() - t0
        plain = plain_cache(cache)
        adapter.text_model(inputs_embeds=prompt_embeds, position_ids=prompt_ids, cache=plain, use_cache=True)
        t0 = time.perf_counter()
        out = adapter.text_model(inputs_embeds=token_embeds, position_ids=token_ids, cache=plain, use_cache=True)
        int(adapter.logits(out.last_hidden_state[:, -1])[0].argmax())
        step_elapsed = time.perf_counter() - t0
        del plain
        mark = cache.mark()
        prefill(adapter, cache, prompt_embeds, adapter.text_positions(start, prompt_tokens), KIND_TEXT)
        t0 = time.perf_counter()
        hidden = prefill(adapter, cache, token_embeds, adapter.text_positions(start + prompt_tokens, 1), KIND_TEXT)
        int(adapter.logits(hidden[:, -1])[0].argmax())
        own_elapsed = time.perf_counter() - t0
        cache.rollback(mark)
        if round_:
            ours.append(elapsed * 1e3)
            bare.append(bare_elapsed * 1e3)
            step.append(step_elapsed * 1e3)
            own_step.append(own_elapsed * 1e3)
    return Floor(statistics.median(ours), statistics.median(bare), statistics.median(step), statistics.median(own_step))


def _frames(count: int):
    import numpy as np

    return np.zeros((count, 360, 640, 3), dtype=np.uint8)
