"""Prompt text from the model's own chat template, split around the video.

The stream layout is ``prefix · video tokens · suffix``: the prefix (system prompt and the
opening of the first user turn) is prefilled once and never evicted; the suffix (the question,
earlier turns, the assistant header) is appended at question time and removed afterwards.
"""

from __future__ import annotations


def conversation(question: str, history: list[tuple[str, str]], system_prompt: str | None) -> list[dict]:
    """Chat messages for ``history`` + ``question``; the video belongs to the first user turn."""
    messages: list[dict] = []
    if system_prompt:
        messages.append({"role": "system", "content": [{"type": "text", "text": system_prompt}]})
    turns = [*history, (question, None)]
    for i, (q, a) in enumerate(turns):
        content = ([{"type": "video"}] if i == 0 else []) + [{"type": "text", "text": q}]
        messages.append({"role": "user", "content": content})
        if a is not None:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": a}]})
    return messages


def split_prompt(rendered: str, placeholder: str) -> tuple[str, str]:
    """Split a rendered prompt at its single video placeholder into (prefix, suffix)."""
    if rendered.count(placeholder) != 1:
        raise ValueError(f"the chat template must render exactly one {placeholder!r} for the video")
    prefix, suffix = rendered.split(placeholder)
    return prefix, suffix
