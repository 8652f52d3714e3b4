"""Measurements that look inside a stream's session, for benchmarks: each is run on the engine
thread between two steps with ``engine.call(stream_id, fn)`` (no client readout gives them).

- ``cache_mark``: the cache's size and next token identity (an answer must leave them unchanged);
- ``hold``: keep the engine thread waiting until a gate opens, so that requests queued meanwhile
  (several streams' questions) are served back to back — the batched-decode benchmark;
- ``pseudo_query_variants``: what hermes's pseudo-query attention costs on top of a chunk's
  prefill, four ways, each from the same memory (rolled back in between);
- ``yes_probability_of``: the ``--notify`` probe's p(yes) of a condition, from the memory as it
  is (``hermes eval`` records it beside OVO-Bench's yes/no answers, to tune the probe).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from .session import Session

__all__ = ["cache_mark", "hold", "pseudo_query_variants", "yes_probability_of"]


def cache_mark(session: Session) -> tuple[int, int, int]:
    """(tokens per layer, bytes of keys and values held, next fresh token id)."""
    cache = session.cache
    return cache.length, cache.kv_bytes(), cache.next_id


def hold(gate: threading.Event, held: threading.Event | None = None,
         timeout_s: float = 120.0) -> Callable[[Session], None]:
    """A call that sets ``held`` (the engine thread is now waiting) and returns once ``gate`` is
    set (or after ``timeout_s``, so a benchmark that dies cannot wedge the engine)."""

    def wait(session: Session) -> None:
        if held is not None:
            held.set()
        gate.wait(timeout_s)

    return wait


def pseudo_query_variants(image: np.ndarray, chunk_frames: int, rounds: int, warmup_rounds: int,
                          on_time: Callable[[str, str, float], None] | None = None,
                          on_start: Callable[[dict], None] | None = None) -> Callable[[Session], dict]:
    """A call timing the next chunk (``chunk_frames`` copies of ``image``) four ways from the
    session's memory: ``plain`` (prefill alone), ``folded`` (the pseudo-queries in the prefill's
    forward), ``separate`` (prefill, then a row-only pseudo-query forward), ``eager`` (prefill,
    then the pseudo-query forward with eager attention and full weights). Each is rolled back.

    The session's adapter must encode synthetically (``bench_adapter(..., synthetic_vision=True)``).
    Returns ``{"seconds": {variant: [measured seconds]}, "memory_tokens", "chunk_tokens",
    "pseudo_queries": {name: text}, "pseudo_query_tokens"}``; ``on_start`` is given that dict
    (without ``seconds``) before the first run, ``on_time(round label, variant, seconds)`` each
    run as it ends (warm-up rounds too).
    """

    def measure(session: Session) -> dict:

        from policies import make_policy

        from . import pseudo_query
        from .cache import KIND_VIDEO
        from .prefill import prefill

        adapter, cache, positions = session.adapter, session.cache, session.positions
        hermes = make_policy("hermes")
        texts, layers = pseudo_query.wanted_texts(hermes, (), adapter.num_layers)
        chunk = adapter.encode(image[None].repeat(chunk_frames, axis=0), session.units_seen)
        where = positions.for_chunk(chunk, session.units_seen, bounded=False)
        start = max(positions.next(), int(where.max()) + 1)
        facts = {"memory_tokens": cache.length, "chunk_tokens": int(chunk.embeds.shape[1]), "pseudo_queries": texts,
                 "pseudo_query_tokens": sum(adapter.tokens(t).shape[0] for t in texts.values())}
        if on_start is not None:
            on_start(facts)

        def plain():
            prefill(adapter, cache, chunk.embeds, where, KIND_VIDEO, chunk)

        def folded():
            pseudo_query.prefill_measuring(adapter, cache, chunk, where, texts, start, layers)

        def separate():
            plain()
            pseudo_query.forward_attention(adapter, cache, texts, positions.next(), layers)

        def eager():
            plain()
            sizes, embeds, at = pseudo_query.side_by_side(adapter, texts, positions.next())
            mask = pseudo_query.additive(pseudo_query.texts_mask(cache.length, 0, sizes, adapter.device),
                                         adapter.dtype)
            inner = cache.mark()
            _, weights = adapter.forward(embeds, at, cache, attentions=True, attention_mask=mask)
            for w in weights:  # what the old path then averaged
                w[0].float().mean(dim=(0, 1))
            cache.rollback(inner)

        variants = {"plain": plain, "folded": folded, "separate": separate, "eager": eager}
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        for round_ in range(warmup_rounds + rounds):
            warm = round_ < warmup_rounds
            label = "warm-up" if warm else f"round {round_ + 1 - warmup_rounds}"
            for name, run in variants.items():
                mark = cache.mark()
                t0 = time.perf_counter()
                run()
                elapsed = time.perf_counter() - t0
                cache.rollback(mark)
                if not warm:
                    seconds[name].append(elapsed)
                if on_time is not None:
                    on_time(label, name, elapsed)
        return {"seconds": seconds, **facts}

    return measure


def yes_probability_of(condition: str, *, verbatim: bool = False) -> Callable[[Session], float]:
    """A call giving ``probe.yes_probability`` of ``condition`` (the memory is left as it was)."""

    def measure(session: Session) -> float:
        from .probe import yes_probability

        return yes_probability(session, condition, verbatim=verbatim)

    return measure
