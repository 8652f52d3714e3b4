"""Driving a stream of the engine from a frame source, with questions due at stream times.

``run_stream`` feeds frames to an engine stream (``engine.client``). A question due at time T is
asked once every frame up to T is in the memory and before any later frame: pending frames of a
partial chunk are flushed first. Questions without a time are asked at the end of the stream.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine.records import Answer, SessionStats

_CLOCK = re.compile(r"^(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")
_SECONDS = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?$")


def parse_time(text: str) -> float:
    """Seconds from ``30``, ``30s``, ``1.5m``, ``2h``, ``250ms``, ``1:05`` or ``1:02:03``."""
    text = text.strip().lower()
    if m := _CLOCK.match(text):
        hours, minutes, seconds = m.group(1), m.group(2), m.group(3)
        if float(seconds) >= 60 or (hours is not None and int(minutes) >= 60):
            raise ValueError(f"cannot read {text!r} as a stream time: minutes and seconds after a colon run "
                             "from 0 to 59 (1:05 is 65 s; or write 135s)")
        return int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)
    if m := _SECONDS.match(text):
        scale = {"ms": 1e-3, "s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]
        return float(m.group(1)) * scale
    raise ValueError(f"cannot read {text!r} as a stream time (try 30s, 1:05 or 1:02:03)")


@dataclass(frozen=True)
class TimedQuestion:
    """A question and the stream time it is due at (None: at the end of the stream)."""

    question: str
    at_s: float | None = None

    @classmethod
    def parse(cls, text: str) -> TimedQuestion:
        """``TIME=QUESTION`` as given to ``--ask-at``."""
        if "=" not in text:
            raise ValueError(f"--ask-at expects TIME=QUESTION, got {text!r}")
        when, question = text.split("=", 1)
        if not question.strip():
            raise ValueError(f"--ask-at {text!r} has an empty question")
        return cls(question.strip(), parse_time(when))


@dataclass
class AskedAnswer:
    answer: Answer
    asked_at_s: float | None  # the time it was due at (None: end of stream)
    stats: SessionStats


def run_stream(
    stream,
    frames: Iterable,
    questions: list[TimedQuestion],
    *,
    on_answer: Callable[[AskedAnswer], None] | None = None,
    on_frame: Callable[[object], None] | None = None,
    on_token: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    pace: bool = False,
) -> list[AskedAnswer]:
    """Stream ``frames`` (objects with ``image`` and ``timestamp``) into ``stream`` (an engine
    client) and answer ``questions``.

    Frames are read here and prefilled on the engine's thread, so reading the next chunk
    overlaps prefilling this one (``feed``). A question due at T is answered once every frame up
    to T is in the memory (the partial chunk flushed) and before any later frame. ``pace``: at
    real time. A source that fails (``SourceError``) ends the stream early: the questions still
    owed are answered from the memory so far, then the error is raised; a source that failed
    before its first frame raises at once (no answer from an empty memory looks like a real one).
    """
    from .feed import Pacer, feed

    timed = sorted((q for q in questions if q.at_s is not None), key=lambda q: q.at_s or 0.0)
    at_end = [q for q in questions if q.at_s is None]
    answers: list[AskedAnswer] = []
    stopping = threading.Event()

    def ask(q: TimedQuestion) -> None:
        handle = stream.ask(q.question, flush=True)
        for piece in handle:
            if on_token:
                on_token(piece)
        result = AskedAnswer(handle.answer, q.at_s, stream.stats())
        answers.append(result)
        if on_answer:
            on_answer(result)

    def before(frame) -> None:
        while timed and frame.timestamp > (timed[0].at_s or 0.0):
            ask(timed.pop(0))

    def after(frame) -> None:
        if on_frame:
            on_frame(frame)
        if should_stop and should_stop():
            stopping.set()

    lost = feed(stream, frames, pacer=Pacer() if pace else None, stopping=stopping, before=before, on_frame=after,
                end=False)
    stream.end(None if lost is None else str(lost))
    if lost is not None and stream.counts().frames_submitted == 0:
        raise lost
    for q in [*timed, *at_end]:
        ask(q)
    stream.flush()
    if lost is not None:
        raise lost
    return answers
