"""The ``--notify`` probe: p(yes) for a condition from the memory as it is, in one short forward.

After a chunk, for a condition C, the probe appends the fixed question ``PROBE_TEMPLATE`` (C
filled in), rendered by the model's own chat template with no earlier turns and up to the
assistant header (``adapter.question_text``, the prompt a question gets), after the cache at
the next free position (``session.positions.text``), runs one forward, reads the logits of the
reply's first token and rolls the cache back: every cache tensor, token identity and position is
exactly as before (``StreamingCache.rollback`` only moves lengths back; nothing is recorded).

p(yes) is the softmax over two logits only, those of the "Yes" and the "No" token:
``p = exp(l_yes) / (exp(l_yes) + exp(l_no)) = sigmoid(l_yes - l_no)`` (``p_yes_from_logits``).

**Which tokens** (``reply_token``): each family's tokenizer is asked how the reply "Yes" (and
"No") begins *right after this prompt*: the prompt is tokenized with and without the word
appended and the first token that differs is taken. After Qwen's and LLaVA-OneVision's assistant
header (``…assistant\\n``) that is the capitalised word with no leading space — one token in
their real vocabularies; a SentencePiece vocabulary would give its ``▁Yes`` the same way, since
the context decides. The leading-space variants (`` Yes``), lower case (``yes``) and the
tokens' other spellings are *not* summed in: the probe asks for "Yes or No", so the model's first
reply token is the capitalised word, and two fixed logits keep p comparable from chunk to chunk
(the baseline in ``notify`` needs that). Where the word is several tokens (the built-in tiny
models' small vocabulary), its first token stands for it; a tokenizer whose "Yes" and "No" begin
with the same token is refused.

Several conditions share one forward (``yes_probabilities``): their prompts follow the cache side
by side, each at the same positions, masked so that each sees the cache and itself only — what
each would see alone.

``describe`` is what a fired condition says: a short answer (≤ 32 tokens) generated from the
memory at that moment, with no earlier turns and outside the stream's conversation.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .. import defaults
from ..models.base import ModelAdapter
from .notify import Notifier, NotifyEvent
from .pseudo_query import texts_mask
from .records import Answer

if TYPE_CHECKING:
    from .session import Session

PROBE_TEMPLATE = "Looking at the latest frames: {condition}? Answer Yes or No."
DESCRIBE_TEMPLATE = "Looking at the latest frames: {condition}. Describe what is happening in one short sentence."
YES, NO = "Yes", "No"

__all__ = ["DESCRIBE_TEMPLATE", "PROBE_TEMPLATE", "NotifyStep", "Probe", "describe", "describe_question",
           "notify_step", "p_yes_from_logits", "prepare_probe", "probe_question", "reply_token", "yes_probabilities",
           "yes_probability"]


def _condition(condition: str) -> str:
    text = condition.strip().rstrip("?.!").strip()
    if not text:
        raise ValueError("--notify needs a condition text, e.g. --notify \"a person enters\"")
    return text


def probe_question(condition: str) -> str:
    """The probe's question for ``condition`` (a trailing ``?``/``.`` of the condition is dropped)."""
    return PROBE_TEMPLATE.format(condition=_condition(condition))


def describe_question(condition: str) -> str:
    """What a fired condition is asked to describe."""
    return DESCRIBE_TEMPLATE.format(condition=_condition(condition))


def p_yes_from_logits(logits: Tensor, yes_id: int, no_id: int) -> float:
    """The softmax over the two logits ``logits[yes_id]`` and ``logits[no_id]`` (a (V,) vector): p("Yes")."""
    pair = torch.stack([logits[yes_id], logits[no_id]]).double()
    return float(torch.softmax(pair, dim=0)[0])


def reply_token(adapter: ModelAdapter, prompt: str, word: str) -> int:
    """The id of the first token of ``word`` as a reply right after ``prompt`` (see the module docstring)."""
    before = adapter.tokens(prompt).tolist()
    after = adapter.tokens(prompt + word).tolist()
    if after[: len(before)] == before and len(after) > len(before):
        return int(after[len(before)])
    # the word merged with the prompt's last token: fall back to the word alone
    alone = adapter.tokens(word).tolist()
    if not alone:
        raise ValueError(f"{adapter.name}: the tokenizer gives no token for {word!r}")
    return int(alone[0])


@dataclass(frozen=True)
class Probe:
    """A condition's probe, prepared once per model: prompt ids and the two reply tokens."""

    condition: str
    ids: Tensor  # (n,) the question and the assistant header
    yes_id: int
    no_id: int


_PREPARED: weakref.WeakKeyDictionary[ModelAdapter, dict[tuple[str, str | None], Probe]] = weakref.WeakKeyDictionary()


def prepare_probe(adapter: ModelAdapter, condition: str, system_prompt: str | None = None, *,
                  verbatim: bool = False) -> Probe:
    """The probe of ``condition`` for this model (cached per adapter, condition and system prompt).

    ``verbatim``: ``condition`` is the whole question, asked as it is (a benchmark's own yes/no
    prompt), instead of filling ``PROBE_TEMPLATE``.
    """
    key = (("=" if verbatim else "?") + condition, system_prompt)
    known = _PREPARED.setdefault(adapter, {})
    if key not in known:
        question = condition if verbatim else probe_question(condition)
        prompt = adapter.question_text(question, [], system_prompt)
        yes_id, no_id = reply_token(adapter, prompt, YES), reply_token(adapter, prompt, NO)
        if yes_id == no_id:
            raise ValueError(f"{adapter.name}: 'Yes' and 'No' begin with the same token ({yes_id}); "
                             "the probe cannot tell them apart")
        known[key] = Probe(condition, adapter.tokens(prompt), yes_id, no_id)
    return known[key]


@torch.no_grad()
def yes_probabilities(session: Session, conditions: Sequence[str], *, verbatim: bool = False) -> dict[str, float]:
    """p(yes) of each condition from the memory as it is now, in one forward; the memory is left
    exactly as it was. Raises ``ValueError`` before any frame, ``AnswerOpenError`` while an answer's
    tokens are in the cache (the probe would see them). ``verbatim``: see ``prepare_probe``."""
    adapter, cache = session.adapter, session.cache
    probes = [prepare_probe(adapter, c, session.config.system_prompt, verbatim=verbatim)
              for c in dict.fromkeys(conditions)]
    if not probes:
        return {}
    session._refuse_while_answering()
    if session.units_seen == 0:
        raise ValueError("the probe needs frames in the memory: call it after a chunk")
    sizes = [p.ids.shape[0] for p in probes]
    start = session.positions.next()
    positions = torch.cat([session.positions.text(k, start=start) for k in sizes])
    embeds = adapter.embed(torch.cat([p.ids for p in probes]))
    mask = texts_mask(cache.length, 0, sizes, adapter.device) if len(probes) > 1 else None
    mark = cache.mark()
    try:
        hidden, _ = adapter.forward(embeds, positions, cache, attention_mask=mask)
    finally:
        cache.rollback(mark)  # nothing was recorded: lengths go back, the rest is untouched
    last = torch.tensor(sizes).cumsum(0) - 1
    logits = adapter.logits(hidden[0, last.to(hidden.device)])
    return {p.condition: p_yes_from_logits(row, p.yes_id, p.no_id) for p, row in zip(probes, logits, strict=True)}


def yes_probability(session: Session, condition: str, *, verbatim: bool = False) -> float:
    """p(yes) of one condition (see ``yes_probabilities``)."""
    return yes_probabilities(session, [condition], verbatim=verbatim)[condition]


def describe(session: Session, condition: str, max_new_tokens: int = defaults.NOTIFY_DESCRIBE_TOKENS, *,
             question: str | None = None) -> Answer:
    """A short description generated from the memory at this moment (``describe_question``, or
    ``question``); greedy, no earlier turns, and it does not enter the stream's conversation.
    The memory is left exactly as it was."""
    text = question if question is not None else describe_question(condition)
    opened = session.open_answer(text, max_new_tokens=max_new_tokens, history=[])
    try:
        opened.start()
        while not opened.done:
            opened.step()
    finally:
        opened.close()
    return opened.answer


@dataclass
class NotifyStep:
    """What ``notify_step`` did after one chunk."""

    p_yes: dict[str, float]  # the p(yes) of every condition polled
    events: list[NotifyEvent] = field(default_factory=list)  # the conditions that fired, described
    probe_ms: float = 0.0  # the probes' forward (what ``notify_ms_per_chunk`` counts)
    describe_ms: float = 0.0  # the descriptions of the fired conditions


def notify_step(session: Session, notifier: Notifier, *, since: float | None = None,
                max_new_tokens: int = defaults.NOTIFY_DESCRIBE_TOKENS) -> NotifyStep:
    """The ``--notify`` work after a chunk: probe every condition of ``notifier`` due at the
    session's stream time (one forward; none due: no forward), step their state machines,
    describe each condition that fires (by its own question, where it has one) and make its event.

    ``since``: the ``time.perf_counter()`` at the end of the chunk's prefill and compression, from
    which an event's ``latency_ms`` counts (default: now). The memory is left exactly as it was.
    """
    t0 = time.perf_counter()
    start = t0 if since is None else since
    p_yes = yes_probabilities(session, notifier.due(session.stream_time_s))
    t1 = time.perf_counter()
    step = NotifyStep(p_yes, probe_ms=(t1 - t0) * 1e3)
    for condition in notifier.update(p_yes):
        answer = describe(session, condition, max_new_tokens, question=notifier.question(condition))
        step.events.append(NotifyEvent(condition, session.stream_time_s, session.frames_seen, p_yes[condition],
                                       answer.text.strip(), (time.perf_counter() - start) * 1e3))
    step.describe_ms = (time.perf_counter() - t1) * 1e3
    return step
