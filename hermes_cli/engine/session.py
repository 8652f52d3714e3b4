"""A streaming session: frames in, chunk by chunk, into the model's cache; questions answered from it.

``Session.ingest`` encodes and prefills frames in chunks and lets the memory policy compress the
cache after each chunk (``compression``); positions belong to a ``PositionTracker``; ``ask``
answers from the cache as it is (``decoding``) and leaves it exactly as it was.

A session is one stream's state, driven by one thread: the engine's (``core.Engine``), the one
way to use sessions from several threads and to host many on one model.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np

from policies import Policy
from policies.full import FullPolicy

from ..errors import EXIT_BUG, HermesError
from ..models.base import ModelAdapter
from . import pseudo_query
from .cache import KIND_PREFIX, KIND_VIDEO, StreamingCache
from .compression import Signals, compress
from .config import SessionConfig
from .conversation import ConversationMemory
from .decoding import AnswerDecode, pieces
from .position_tracker import PositionLimitError, PositionTracker
from .prefill import prefill
from .readouts import memory_stats
from .records import Answer, CacheStats, ChunkReport, PositionStats, SessionStats

NO_FRAMES_ANSWER = "I have not seen any frames yet — ask again once the stream has started."

__all__ = [
    "Answer",
    "AnswerOpenError",
    "AnswerStream",
    "ChunkReport",
    "OpenAnswer",
    "PositionLimitError",
    "Session",
    "SessionConfig",
]


class AnswerOpenError(HermesError, RuntimeError):
    """Frames were offered while an answer's tokens are in the cache (finish or close it first):
    the caller's mistake, not the user's."""

    exit_code = EXIT_BUG


class OpenAnswer:
    """An answer whose tokens are in its stream's cache until ``close()``: ``start()`` prefills the
    question and takes the first token, ``step()`` one more (both return the new text); ``decode``
    is None for the fixed reply to a question before any frame."""

    def __init__(self, session: Session, answer: Answer, decode: AnswerDecode | None, *, own_history: bool) -> None:
        self.session, self.answer, self.decode, self.own_history = session, answer, decode, own_history
        self.closed = False

    @property
    def done(self) -> bool:
        return self.decode is None or self.decode.done

    @property
    def completed(self) -> bool:
        """Ended by itself (not cut short): it enters the history."""
        return self.decode is None or self.decode.completed

    def start(self) -> str:
        return self.answer.text if self.decode is None else self.decode.start()

    def step(self) -> str:
        assert self.decode is not None
        return self.decode.step()

    def close(self) -> None:
        """End it (mid-way too): the cache is exactly as before the question."""
        if not self.closed:
            self.closed = True
            self.session._close_answer(self)


class AnswerStream:
    """An answer being decoded: iterate for its text pieces; ``answer`` fills as it goes."""

    def __init__(self, answer: Answer, pieces: Iterator[str]) -> None:
        self.answer = answer
        self._pieces = pieces

    def __iter__(self) -> Iterator[str]:
        return self._pieces

    def close(self) -> None:
        """Stop decoding early; the memory is restored."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()


class Session:
    """One stream through one model under one memory policy.

    This is a stream's whole state — cache, positions, policy and its parameters, conversation,
    counters, frames waiting for the next chunk — and the unit that snapshots save and restore.
    It has no lock: exactly one thread drives it, the engine's (``engine.core.Engine``), which
    hosts many sessions on one model. While an answer is open (``open_answer`` was called and the
    answer is not closed) its tokens are in the cache, and ``ingest`` and ``flush`` raise
    ``AnswerOpenError`` instead of queuing frames that the answer's rollback would drop.
    """

    def __init__(self, adapter: ModelAdapter, policy: Policy | None = None, config: SessionConfig | None = None):
        self.adapter = adapter
        self.policy = policy or FullPolicy()
        self.config = config or SessionConfig()
        if self.adapter.frames_per_unit > 1 and self.config.chunk_frames % self.adapter.frames_per_unit:
            raise ValueError(
                f"{adapter.family} groups {adapter.frames_per_unit} frames per temporal patch: "
                f"--chunk must be a multiple of {adapter.frames_per_unit}"
            )
        self.cache = StreamingCache(adapter.num_layers, kv_bits=self.config.kv_bits)
        self.positions = PositionTracker(adapter, self.cache, self.config.fps, self.config.reindex,
                                         self.config.reindex_margin, self.config.reindex_spacing)
        self.history: list[tuple[str, str]] = []
        kv_turns = self.config.history and self.config.history_kv and self.config.history_tokens > 0
        self.conversation = ConversationMemory(self.config.history_tokens) if kv_turns else None
        self.frames_seen = 0
        self.units_seen = 0
        self.unit_times: list[float] = []  # timestamp of each unit's first frame
        self.stream_time_s = 0.0
        self.compressions = 0
        self.last_chunk: ChunkReport | None = None
        self.last_answer: Answer | None = None  # for readouts (the toolbar's TTFT)
        self.warnings: list[str] = []  # things the user should know, each said once
        self._pending: list[tuple[np.ndarray, float]] = []
        self._open_answer: Answer | None = None  # an answer whose tokens are in the cache
        self._tokens_per_unit: int | None = None
        ids = adapter.tokens(adapter.prefix_text(self.config.system_prompt))
        prefill(adapter, self.cache, adapter.embed(ids), self.positions.text(ids.shape[0], start=0), KIND_PREFIX)
        self.positions.start_video()

    @property
    def tokens_per_unit(self) -> int | None:
        """Stream tokens one unit (frame, or Qwen temporal patch) adds; known after the first chunk."""
        return self._tokens_per_unit

    @property
    def budget(self) -> int | None:
        """The cap the policy holds the memory to (None: it keeps everything)."""
        return self.config.budget if self.policy.target(self.config.budget) is not None else None

    # -- ingesting ----------------------------------------------------------------------------
    def ingest(self, frames: Sequence[np.ndarray], timestamps: Sequence[float]) -> list[ChunkReport]:
        """Queue frames (H, W, 3 uint8, with their stream times) and prefill every full chunk.

        Raises ``AnswerOpenError`` (queuing nothing) while an answer is open.
        """
        reports = []
        self._refuse_while_answering()
        for frame, ts in zip(frames, timestamps, strict=True):
            self._pending.append((np.asarray(frame), float(ts)))
            if len(self._pending) >= self.config.chunk_frames:
                reports.append(self._ingest_chunk(self._pending))
                self._pending = []
        return reports

    @property
    def pending_frames(self) -> int:
        """Frames queued for the next chunk (not yet in the memory)."""
        return len(self._pending)

    def _refuse_while_answering(self) -> None:
        if self._open_answer is not None:
            raise AnswerOpenError(
                f"an answer to {self._open_answer.question!r} is still open: read it to the end or close it "
                "before ingesting (its rollback would drop the frames)"
            )

    def flush(self) -> ChunkReport | None:
        """Prefill the frames still queued (end of stream), padding to whole temporal patches.

        Raises ``AnswerOpenError`` while an answer is open.
        """
        self._refuse_while_answering()
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
        t0 = time.perf_counter()
        chunk = self.adapter.encode(frames, self.units_seen, times)
        encode_ms = (time.perf_counter() - t0) * 1e3
        where = self.positions.for_chunk(chunk, self.units_seen, bounded=self.budget is not None)
        step = pseudo_query.plan(self.policy, tuple(self.history), self.adapter.num_layers,
                                 held=max(self.cache.stream_counts()), chunk_tokens=chunk.embeds.shape[1],
                                 budget=self.config.budget, mode=self.config.pseudo_query)
        attention = None
        if step.fold:  # this chunk triggers a compression: its pseudo-queries ride in its prefill
            start = max(self.positions.next(), int(where.max()) + 1)
            attention = pseudo_query.prefill_measuring(self.adapter, self.cache, chunk, where, step.texts, start,
                                                      step.layers)
        else:
            prefill(self.adapter, self.cache, chunk.embeds, where, KIND_VIDEO, chunk)
        prefill_ms = (time.perf_counter() - t0) * 1e3
        if self._tokens_per_unit is None:
            self._tokens_per_unit = max(1, chunk.embeds.shape[1] // max(chunk.units, 1))
            self._check_chunk_fits(chunk.embeds.shape[1])
        self.unit_times.extend(times[:: self.adapter.frames_per_unit][: chunk.units])
        self.units_seen += chunk.units
        self.frames_seen += len(items) if real is None else real
        self.stream_time_s = max(self.stream_time_s, times[-1])
        t1 = time.perf_counter()
        compressed, pseudo_query_ms = self._compress(step, attention)
        reindexed = compressed and self.config.reindex == "eager"
        if reindexed:
            self.positions.reindex(self.units_seen)
        compress_ms = (time.perf_counter() - t1) * 1e3
        self.last_chunk = ChunkReport(real or len(items), chunk.embeds.shape[1], prefill_ms, compress_ms,
                                      compressed, reindexed, encode_ms=encode_ms,
                                      pseudo_query_ms=pseudo_query_ms, folded=step.fold)
        return self.last_chunk

    def _check_chunk_fits(self, tokens: int) -> None:
        target = self.policy.target(self.config.budget, self._tokens_per_unit or 1)
        if target is not None and tokens > target:
            hint = "lower --chunk or --max-pixels" if self.adapter.position_axes == 3 else "lower --chunk"
            self.warnings.append(
                f"one chunk ({tokens} tokens) is larger than the memory ({target} tokens/layer): "
                f"each chunk evicts the one before — {hint}, or raise --budget"
            )

    def _compress(self, step: pseudo_query.Plan, attention: pseudo_query.Attention | None) -> tuple[bool, float]:
        """Compress when ``step`` says the chunk brought the memory over budget; (whether it did,
        ms of a separate pseudo-query pass). ``attention``: measured in the chunk's prefill, or None."""
        if not step.compress:
            return False, 0.0
        pseudo_query_ms = 0.0
        if attention is None:
            t0 = time.perf_counter()
            attention = pseudo_query.measure(self.adapter, self.cache, step.texts, self.positions.next(), step.mode,
                                             step.layers)
            pseudo_query_ms = (time.perf_counter() - t0) * 1e3 if step.texts else 0.0
        assert self.config.budget is not None  # a plan that compresses has a budget
        signals = Signals(budget=self.config.budget, tokens_per_frame=self._tokens_per_unit or 1,
                          attention=attention, rotary=self.adapter.rotary)
        compress(self.cache, self.policy, signals)
        self.compressions += 1
        return True, pseudo_query_ms

    # -- asking -------------------------------------------------------------------------------
    def answer(self, question: str, *, max_new_tokens: int | None = None, record_logits: bool = False) -> Answer:
        """Answer a question fully (see ``ask``) and return it."""
        stream = self.ask(question, max_new_tokens=max_new_tokens, record_logits=record_logits)
        for _ in stream:
            pass
        return stream.answer

    def ask(self, question: str, *, max_new_tokens: int | None = None, record_logits: bool = False) -> AnswerStream:
        """The answer, streamed piece by piece; afterwards the cache is exactly as before the question.

        The question is answered from the memory as it is: it is never used for compression.
        Decoding happens inside each step of the iteration; between pieces the answer is *open*
        (see the class). Exhausting or closing the stream closes the answer; only a completed
        answer enters the history.
        """
        opened = self.open_answer(question, max_new_tokens=max_new_tokens, record_logits=record_logits)
        return AnswerStream(opened.answer, pieces(opened))

    def open_answer(self, question: str, *, max_new_tokens: int | None = None, record_logits: bool = False,
                    history: Sequence[tuple[str, str]] | None = None) -> OpenAnswer:
        """An answer to decode step by step (``OpenAnswer``: the engine's unit of decoding work).

        ``history``: the earlier turns to answer with instead of this stream's own (a client that
        keeps the conversation itself, e.g. an HTTP request's messages); such an answer does not
        enter the stream's history. Raises ``AnswerOpenError`` while another answer is open.
        """
        if self._open_answer is not None:
            raise AnswerOpenError(f"an answer to {self._open_answer.question!r} is still open")
        answer = Answer(question=question)
        answer.stream_time_s, answer.frames_seen = self.stream_time_s, self.frames_seen
        self.last_answer = answer
        if self.units_seen == 0:
            answer.text, answer.no_frames = NO_FRAMES_ANSWER, True
            return OpenAnswer(self, answer, None, own_history=history is None)
        turns = list(self.history) if history is None else [(q, a) for q, a in history]
        prompt, setup, keep = self._question_prompt(answer, turns, capture=history is None)
        decode = AnswerDecode(
            self.adapter, self.cache, self.positions, prompt, answer,
            max_new_tokens=max_new_tokens or self.config.max_new_tokens,
            repetition_penalty=self.config.repetition_penalty, penalise_prompt=self.config.penalise_prompt,
            record_logits=record_logits, setup=setup, keep=keep,
        )
        self._open_answer = answer
        return OpenAnswer(self, answer, decode, own_history=history is None)

    def _close_answer(self, opened: OpenAnswer) -> None:
        if opened.decode is not None:
            try:
                opened.decode.close()  # rolls the cache back
            finally:
                self._open_answer = None
        if opened.completed and opened.own_history and (self.config.history or self.config.pseudo_query_history):
            self.history.append((opened.answer.question, opened.answer.text))

    # -- snapshots (see engine/snapshot.py) ------------------------------------------------------
    def stream_state(self) -> dict:
        """The stream's counters, conversation and queued frames (copies).

        Frames of a chunk already prefilled are never reported as queued, even in the moment
        between the prefill and ``ingest`` emptying its queue (another thread may save then).
        """
        pending = [(f.copy(), t) for f, t in list(self._pending)]
        if self.frames_seen and pending and pending[0][1] <= self.stream_time_s:
            pending = []  # the queue of a chunk already in the memory
        return {
            "frames_seen": self.frames_seen, "units_seen": self.units_seen, "unit_times": list(self.unit_times),
            "stream_time_s": self.stream_time_s, "compressions": self.compressions,
            "tokens_per_unit": self._tokens_per_unit, "history": [list(t) for t in self.history],
            "warnings": list(self.warnings), "pending": pending,
        }

    def restore_stream_state(self, state: dict) -> None:
        """Take back a ``stream_state()`` (with the cache and positions restored)."""
        self.frames_seen, self.units_seen = int(state["frames_seen"]), int(state["units_seen"])
        self.unit_times = [float(t) for t in state["unit_times"]]
        self.stream_time_s, self.compressions = float(state["stream_time_s"]), int(state["compressions"])
        self._tokens_per_unit = state["tokens_per_unit"]
        self.history = [(q, a) for q, a in state["history"]]
        self.warnings = list(state["warnings"])
        self._pending = [(np.asarray(f), float(t)) for f, t in state["pending"]]

    def _question_prompt(self, answer: Answer, turns: list[tuple[str, str]], *, capture: bool = True):
        """(prompt ids, setup, keep) for ``AnswerDecode``: earlier ``turns`` within ``history_tokens``,
        newest first — as kept keys and values when they match the history, else as text.
        ``capture``: the completed turn is kept as keys and values for the next question."""
        config, adapter = self.config, self.adapter
        history = turns if config.history else []
        memory = self.conversation
        prompt = memory.prompt(adapter, answer.question, history, config.system_prompt) if memory else None
        if prompt is not None and memory is not None and memory.kept is not None:
            answer.prompt_tokens, answer.context_tokens = int(prompt.shape[0]), memory.kept.length
            setup = lambda: memory.attach(self.cache, self.positions, adapter.rotary)  # noqa: E731
            text_history = 0
        else:
            recent = adapter.recent_history(answer.question, history, config.system_prompt, config.history_tokens)
            prompt = adapter.tokens(adapter.question_text(answer.question, recent, config.system_prompt))
            bare = len(adapter.tokens(adapter.question_text(answer.question, [], config.system_prompt)))
            text_history = max(0, int(prompt.shape[0]) - bare) if recent else 0
            answer.prompt_tokens, answer.context_tokens = int(prompt.shape[0]), text_history
            setup = None
        if memory is None or not capture:
            return prompt, setup, None
        reused, count = setup is not None, len(self.history) + 1

        def keep(mark):
            memory.capture(self.cache, mark, reused=reused, prompt_tokens=int(prompt.shape[0]),
                           answer_tokens=answer.tokens, turn=(answer.question, answer.text), turns=count,
                           text_history=text_history, rotary=adapter.rotary)

        return prompt, setup, keep

    # -- readouts -----------------------------------------------------------------------------
    def stats(self) -> SessionStats:
        """What the readouts and ``--json`` report."""
        cache = self.cache
        return SessionStats(
            stream_time_s=self.stream_time_s,
            frames_seen=self.frames_seen,
            units_seen=self.units_seen,
            units_kept=len(set().union(*self.held_units())),
            cache=CacheStats(
                tokens_per_layer=[l.length for l in cache.stream_layers],
                video_tokens_per_layer=cache.count(KIND_VIDEO),
                stream_tokens_per_layer=cache.stream_counts(),
                prefix_tokens=cache.prefix_length(),
                budget=self.budget,
                kv_bytes=cache.kv_bytes(),
                compressions=self.compressions,
            ),
            positions=PositionStats(
                next=self.positions.next_per_axis(),
                limit=self.positions.limit,
                reindex=self.config.reindex,
                reindex_count=self.positions.reindex_count,
            ),
            last_chunk=self.last_chunk,
            memory=memory_stats(self.adapter.device),
            model=self.adapter.name,
            random_weights=self.adapter.random_weights,
            policy=self.policy.name,
        )

    def held_units(self) -> list[list[int]]:
        """Per layer, the stream units (frames or temporal patches) it still holds tokens of."""
        out = []
        for l in range(self.cache.num_layers):
            meta = self.cache.meta(l)
            out.append(sorted(set(meta.frame[meta.kind == KIND_VIDEO].tolist())))
        return out
