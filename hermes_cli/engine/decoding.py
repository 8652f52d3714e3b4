"""Answering from the cache: greedy decoding on explicit positions, a step at a time, then an
exact rollback.

transformers' ``generate()`` derives positions from the cache's physical length, which is wrong
after eviction, so every token is placed here. ``AnswerDecode`` is one answer as a sequence of
steps (the engine interleaves them, and decodes the open answers of several streams together in
one batch: ``decode_batch``); ``greedy_answer`` runs one answer alone, as a generator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence

import torch
from torch import Tensor

from ..models.base import ModelAdapter
from .cache import KIND_TEXT, BatchView, Mark, StreamingCache, TokenMeta
from .position_tracker import PositionTracker
from .prefill import prefill
from .records import Answer


class AnswerDecode:
    """One greedy answer over one stream's cache, step by step.

    ``start()`` attaches what ``setup`` adds (earlier turns), prefills the prompt and takes the
    first token; while not ``done``, the next token's input is ``next_embeds``/``next_where`` and
    ``take(logits)`` chooses it; ``close()`` always ends it: the cache goes back exactly to what it
    held before ``start`` (a completed answer's turn is first handed to ``keep``). ``take`` and
    ``start`` return the text that became valid UTF-8 with the new token ("" if none).
    """

    def __init__(self, adapter: ModelAdapter, cache: StreamingCache, positions: PositionTracker, prompt: Tensor,
                 answer: Answer, *, max_new_tokens: int, repetition_penalty: float,
                 penalise_prompt: bool = False, record_logits: bool = False,
                 setup: Callable[[], None] | None = None, keep: Callable[[Mark], None] | None = None) -> None:
        self.adapter, self.cache, self.positions = adapter, cache, positions
        self.prompt, self.answer = prompt, answer
        self.max_new_tokens, self.repetition_penalty = max_new_tokens, repetition_penalty
        self.record_logits = record_logits
        self.seen: list[int] = prompt.tolist() if penalise_prompt else []
        self._setup, self._keep = setup, keep
        self.mark = cache.mark()
        self.steps = 0  # forwards run (the prompt's included)
        self.done = False
        self.completed = False  # ended by itself (eos or the token limit), not cut short
        self.closed = False
        self.next_embeds: Tensor | None = None
        self.next_where: Tensor | None = None
        self._shown = ""
        self._t0 = 0.0
        self._step_times: list[float] = []

    def start(self) -> str:
        """Attach the setup, prefill the prompt, take the first token."""
        self._t0 = time.perf_counter()
        if self._setup is not None:
            self._setup()
        where = self.positions.text(self.prompt.shape[0])
        hidden = prefill(self.adapter, self.cache, self.adapter.embed(self.prompt), where, KIND_TEXT)
        self.next_where = where
        return self.take(self.adapter.logits(hidden[:, -1])[0])

    def step(self) -> str:
        """One token alone: a forward of the last token over this cache, then ``take``."""
        assert self.next_embeds is not None and self.next_where is not None
        hidden = prefill(self.adapter, self.cache, self.next_embeds, self.next_where, KIND_TEXT)
        return self.take(self.adapter.logits(hidden[:, -1])[0])

    def take(self, logits: Tensor) -> str:
        """Choose the next token from the last position's ``logits`` (V,)."""
        answer = self.answer
        step = self.steps
        self.steps += 1
        if self.record_logits:
            answer.step_logits.append(logits.detach().cpu())
        token = int(penalised(logits, self.seen, self.repetition_penalty).argmax())
        now = time.perf_counter()
        if step == 0:
            answer.ttft_ms = (now - self._t0) * 1e3
        else:
            self._step_times.append(now)
        if token in self.adapter.eos_token_ids:
            self._end()
            return ""
        answer.tokens.append(token)
        self.seen.append(token)
        text = self.adapter.decode(answer.tokens)
        piece = ""
        if len(text) > len(self._shown) and not text.endswith("\ufffd"):
            piece = text[len(self._shown):]
            self._shown = text
        answer.text = text
        if self.steps >= self.max_new_tokens:
            self._end()
        else:
            assert self.next_where is not None
            self.next_where = self.positions.text(1, start=int(self.next_where[-1].max()) + 1)
            self.next_embeds = self.adapter.embed(torch.tensor([token]))
        return piece

    def _end(self) -> None:
        self.done = self.completed = True

    def close(self) -> None:
        """End the answer (also mid-way): keep a completed turn, roll the cache back, time it."""
        if self.closed:
            return
        self.closed, self.done = True, True
        try:
            if self.completed and self._keep is not None:
                self._keep(self.mark)
        finally:
            self.cache.rollback(self.mark)
            if self._step_times:
                first = self._t0 + (self.answer.ttft_ms or 0) / 1e3
                self.answer.tpot_ms = (self._step_times[-1] - first) / len(self._step_times) * 1e3


def decode_batch(adapter: ModelAdapter, view: BatchView, decodes: Sequence[AnswerDecode]) -> list[str | Exception]:
    """One token for each of ``decodes`` (open answers on different streams, in ``view``'s row
    order) in one forward: the streams' caches as one padded batch with a key mask and per-row
    positions. Each stream's own cache gets its token appended (and recorded), as a step alone
    would; returns each answer's new text — or the exception its own ``take`` raised (the other
    rows are unaffected). If the forward itself fails, every row's cache is rolled back to where
    it was before the step and the exception is raised."""
    embeds = torch.cat([d.next_embeds for d in decodes if d.next_embeds is not None], dim=0)
    wheres = [d.next_where for d in decodes if d.next_where is not None]
    if embeds.shape[0] != len(decodes) or len(wheres) != len(decodes):
        raise RuntimeError("every answer in a batch step needs its next token")
    marks = [d.cache.mark() for d in decodes]
    try:
        ids = [d.cache.new_ids(1) for d in decodes]
        hidden = adapter.forward_rows(embeds, wheres, view, attention_mask=view.step_mask())
        for d, first_id, where in zip(decodes, ids, wheres, strict=True):
            d.cache.record(TokenMeta.new(KIND_TEXT, first_id, where))
        logits = adapter.logits(hidden[:, -1])
    except BaseException:
        for d, mark in zip(decodes, marks, strict=True):
            d.cache.rollback(mark)
        raise
    view.advance()
    results: list[str | Exception] = []
    for b, d in enumerate(decodes):
        try:
            results.append(d.take(logits[b]))
        except Exception as exc:  # this row's fault alone
            results.append(exc)
    return results


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
    yield from pieces(AnswerDecode(adapter, cache, positions, prompt, answer, max_new_tokens=max_new_tokens,
                                   repetition_penalty=repetition_penalty, penalise_prompt=penalise_prompt,
                                   record_logits=record_logits, setup=setup, keep=keep))


def pieces(answer) -> Generator[str, None, None]:
    """Run a step-by-step answer (``AnswerDecode``, ``session.OpenAnswer``: ``start``, ``step``,
    ``done``, ``close``) alone to its end, yielding its text; closed also when the consumer stops."""
    try:
        piece = answer.start()
        if piece:
            yield piece
        while not answer.done:
            piece = answer.step()
            if piece:
                yield piece
    finally:
        answer.close()


def penalised(logits: Tensor, seen: list[int], penalty: float) -> Tensor:
    """Repetition penalty as in CTRL / transformers: divide positive, multiply negative logits."""
    if penalty == 1.0 or not seen:
        return logits
    idx = torch.tensor(sorted(set(seen)), device=logits.device)
    picked = logits[idx]
    out = logits.clone()
    out[idx] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return out


class BatchDecoder:
    """Steps a changing set of open answers together: one answer alone takes ``AnswerDecode.step``
    (bit-identical to decoding it by itself); two or more share one ``decode_batch`` forward over
    a ``BatchView``, built when the set changes and kept while it does not."""

    def __init__(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter
        self._view: BatchView | None = None
        self._rows: list[int] = []

    def step(self, decodes: Sequence[AnswerDecode]) -> list[str | Exception]:
        """One token for each answer (none may be done); their new text, in order (or the
        exception a row's own step raised: see ``decode_batch``)."""
        if len(decodes) == 1:
            self.reset()
            try:
                return [decodes[0].step()]
            except Exception as exc:
                return [exc]
        rows = [id(d) for d in decodes]
        if self._view is None or rows != self._rows:
            self._view = BatchView([d.cache for d in decodes])
            self._rows = rows
        try:
            return decode_batch(self.adapter, self._view, decodes)
        except BaseException:
            self.reset()
            raise

    def reset(self) -> None:
        """Forget the view (its rows' caches stay as they are)."""
        self._view, self._rows = None, []
