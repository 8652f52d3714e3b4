"""OpenAI chat completions over a stream's memory: reading a request, writing the replies.

``"model": "hermes:stream/<id>"`` answers from that stream's memory as it is; the served model's
own name with a ``video_url`` content part answers about that video (a one-off stream). The
conversation is the request's ``messages``: earlier user/assistant pairs are the answer's
history (the stream's own conversation is not touched), the last user message is the question.
System messages are accepted and not used: a stream's system prompt is part of its memory.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from ..engine.records import Answer
from .guard import Refused

__all__ = ["STREAM_MODEL_PREFIX", "ChatRequest", "chunk", "completion", "parse_chat", "usage"]

STREAM_MODEL_PREFIX = "hermes:stream/"


@dataclass(frozen=True)
class ChatRequest:
    model: str  # as the request named it (echoed in the replies)
    stream_id: str | None  # hermes:stream/<id>
    video_url: str | None  # a one-off video (with the served model's name)
    question: str
    history: list[tuple[str, str]]
    max_tokens: int | None
    stream: bool
    id: str
    created: int


def _text_of(content, role: str, index: int) -> tuple[str, list[str]]:
    """(text, video urls) of one message's content."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise Refused(422, f"messages[{index}].content must be a string or a list of content parts")
    texts, videos = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "video_url" and role == "user":
            url = part.get("video_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str):
                raise Refused(422, f'messages[{index}]: a video_url part is {{"type": "video_url", "video_url": '
                              '{"url": URL}}')
            videos.append(url)
        else:
            raise Refused(422, f"messages[{index}]: content part type {kind!r} is not supported "
                          "(text, and video_url in a user message)")
    return "\n".join(texts), videos


def parse_chat(body: dict, *, served_model: str, max_tokens: int, max_question_chars: int) -> ChatRequest:
    """Check a ``POST /v1/chat/completions`` body; ``Refused`` with one line on any fault."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Refused(422, f'model must name a stream ("{STREAM_MODEL_PREFIX}ID") or the served model '
                      f"{served_model!r} with a video_url part")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refused(422, "messages must be a non-empty list of {role, content} objects")
    turns: list[tuple[str, str]] = []
    videos: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user", "assistant"):
            raise Refused(422, f"messages[{i}] must be an object with role system, user or assistant")
        role = message["role"]
        text, found = _text_of(message.get("content", ""), role, i)
        if role in ("system", "developer"):
            continue
        videos += found
        if turns and turns[-1][0] == role:
            raise Refused(422, f"messages[{i}]: user and assistant messages must alternate")
        turns.append((role, text))
    if not turns or turns[-1][0] != "user" or turns[0][0] != "user":
        raise Refused(422, "messages must start and end with a user message (the last one is the question)")
    question = turns[-1][1].strip()
    if not question:
        raise Refused(422, "the last user message has no text: ask a question")
    if len(question) > max_question_chars:
        raise Refused(413, f"the question is {len(question)} characters; this server takes at most "
                      f"{max_question_chars} (--max-question-chars)")
    history = [(turns[k][1], turns[k + 1][1]) for k in range(0, len(turns) - 1, 2)]
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= max_tokens):
        raise Refused(422, f"max_tokens must be a whole number from 1 to {max_tokens}, got {limit!r}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise Refused(422, f"stream must be true or false, got {stream!r}")
    if body.get("n", 1) != 1:
        raise Refused(422, "n must be 1: a stream's memory gives one answer per question")
    stream_id = None
    if model.startswith(STREAM_MODEL_PREFIX):
        stream_id = model[len(STREAM_MODEL_PREFIX):]
        if videos:
            raise Refused(422, "a video_url part goes with the served model's name, not with a stream")
    elif model != served_model:
        raise Refused(404, f"model {model!r} does not exist here: use {STREAM_MODEL_PREFIX}ID or {served_model!r} "
                      "(GET /v1/models lists them; the model is fixed when the server starts)", "not_found_error")
    elif len(videos) != 1:
        raise Refused(422, f"model {served_model!r} answers about one video: give one video_url content part, or "
                      f"ask an open stream with model {STREAM_MODEL_PREFIX}ID")
    return ChatRequest(model, stream_id, videos[0] if videos else None, question, history, limit, stream,
                       f"chatcmpl-{uuid.uuid4().hex}", int(time.time()))


def finish_reason(answer: Answer, max_new_tokens: int) -> str:
    return "length" if len(answer.tokens) >= max_new_tokens else "stop"


def usage(answer: Answer) -> dict:
    return {"prompt_tokens": answer.prompt_tokens, "completion_tokens": len(answer.tokens),
            "total_tokens": answer.prompt_tokens + len(answer.tokens)}


def extras(answer: Answer, epoch: int = 1) -> dict:
    """What the memory answered from and what it cost (beside OpenAI's fields): ``as_of`` is the
    stream time the memory held, ``epoch`` which placement of the stream answered (one process:
    always 1; a cluster bumps it on every move or failover)."""
    return {"as_of": round(answer.stream_time_s, 3), "epoch": epoch, "stream_time_s": round(answer.stream_time_s, 3), "frames_seen": answer.frames_seen,
            "ttft_ms": None if answer.ttft_ms is None else round(answer.ttft_ms, 3),
            "tpot_ms": None if answer.tpot_ms is None else round(answer.tpot_ms, 3), "no_frames": answer.no_frames,
            "token_ids": list(answer.tokens), "context_tokens": answer.context_tokens}


def completion(request: ChatRequest, answer: Answer, max_new_tokens: int, epoch: int = 1) -> dict:
    """The ``chat.completion`` object of a non-streamed reply."""
    return {"id": request.id, "object": "chat.completion", "created": request.created, "model": request.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                         "finish_reason": finish_reason(answer, max_new_tokens), "logprobs": None}],
            "usage": usage(answer), "hermes": extras(answer, epoch)}


def chunk(request: ChatRequest, delta: dict, finish: str | None = None, **more) -> str:
    """One ``chat.completion.chunk`` SSE event."""
    body = {"id": request.id, "object": "chat.completion.chunk", "created": request.created, "model": request.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **more}
    return f"data: {json.dumps(body)}\n\n"
