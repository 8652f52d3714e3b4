"""Prompts for benchmark questions, answer-letter parsing, and a lenient open-ended match.

Multiple choice: the options are shown as letters, ``(A) …``, and the model is asked for the
letter. Models answer in many shapes — ``B``, ``(B)``, ``B.``, ``Answer: B``, ``The answer is
(B) a map``, or just the option's text — ``parse_letter`` reads them all and returns None when
the reply names no option (or names several).

Open-ended (RVS-Ego / RVS-Movie): the papers score answers with an LLM judge. ``lenient_match``
is a built-in stand-in that needs no network — the share of the reference answer's content words
that the prediction contains — and is reported under that name, never as the papers' metric.
"""

from __future__ import annotations

import re
import string

LETTERS = string.ascii_uppercase
MC_INSTRUCTION = "Answer with the option's letter from the given choices directly."

# A reply that opens with a letter marker: "(B)", "[b]", "B.", "B)", "B:".
_LEADING_MARKER = re.compile(r"^\s*(?:[\(\[]\s*([A-Za-z])\s*[\)\]]|([A-Za-z])\s*[\.\):])\s*")
_ANSWER_IS = re.compile(
    r"(?:answer|option|choice)\s*(?:is|would be|should be|:|=|-)?\s*(?:option\s*)?[\(\[]?\s*([A-Za-z])\s*[\)\]]?(?![\w'])",
    re.IGNORECASE,
)
_LONE_CAPITAL = re.compile(r"(?<![\w'])([A-Z])(?![\w'])")
_WORD = re.compile(r"[a-z0-9]+")

STOPWORDS = frozenset(
    ["a", "an", "the", "and", "or", "but", "of", "to", "in", "on", "at", "by", "for", "with", "from", "into", "onto", "over", "under", "is", "are", "was", "were", "be", "been", "being", "it", "its", "it's", "this", "that", "these", "those", "there", "here", "they", "them", "their", "he", "she", "his", "her", "him", "i", "me", "my", "we", "our", "you", "your", "as", "so", "than", "then", "do", "does", "did", "doing", "has", "have", "had", "having", "not", "no", "yes", "very", "can", "could", "will", "would", "should", "may", "might", "some", "any", "all", "each", "which", "who", "whom", "what", "when", "where", "why", "how", "while", "also", "just", "about", "up", "down", "out", "off", "again", "further", "once"]
)


def letter(index: int) -> str:
    return LETTERS[index]


def normalize(text: str) -> str:
    """Lower case, punctuation removed, single spaces: for comparing option texts."""
    return " ".join(_WORD.findall(text.lower()))


def strip_marker(choice: str) -> tuple[str | None, str]:
    """``"A. Apples."`` → ("A", "Apples."); a choice without a leading letter marker → (None, choice)."""
    m = _LEADING_MARKER.match(choice)
    if m and m.end() < len(choice):
        return (m.group(1) or m.group(2)).upper(), choice[m.end():].strip()
    return None, choice.strip()


def format_question(question: str, choices: list[str] | None) -> str:
    """The prompt for one benchmark question: the question, then lettered options and the instruction."""
    if not choices:
        return question.strip()
    lines = [question.strip(), *(f"({letter(i)}) {c}" for i, c in enumerate(choices)), MC_INSTRUCTION]
    return "\n".join(lines)


def parse_letter(text: str, choices: list[str]) -> str | None:
    """The option letter a free-text reply names, or None.

    Reading order: the reply is exactly one option's text; the reply starts with a letter marker
    (``B``, ``(B)``, ``B.``, ``B)``); an explicit "answer/option … B"; a marked letter anywhere
    (``(B)``); the one option whose text the reply contains; a lone capital letter. Letters outside
    the options never count; a reply naming two different options is None.
    """
    n = len(choices)
    valid = set(LETTERS[:n])
    reply = text.strip().replace("*", "").replace("`", "")
    if not reply or n == 0:
        return None
    norm = normalize(reply)
    normalized_choices = [normalize(c) for c in choices]
    # 1. the whole reply is an option's text ("A map." is option B, not the letter A)
    for i, c in enumerate(normalized_choices):
        if c and norm == c:
            return letter(i)
    # 2. a leading marker: "B", "(B)", "B.", "B) a map", "b"
    if len(reply) == 1 and reply.upper() in valid:
        return reply.upper()
    m = _LEADING_MARKER.match(reply)
    if m:
        found = (m.group(1) or m.group(2)).upper()
        if found in valid:
            return found
    head = re.match(r"^([A-Z])(?:\s*$|\s*[,;\-–—]\s)", reply)
    if head and head.group(1) in valid:
        return head.group(1)
    # 3. "the answer is (C)", "Answer: c", "option D"
    named = {g.upper() for g in _ANSWER_IS.findall(reply) if g.upper() in valid}
    named |= {g.upper() for g in re.findall(r"[\(\[]\s*([A-Za-z])\s*[\)\]]", reply) if g.upper() in valid}
    named |= {g for g in re.findall(r"(?<![\w'])([A-Z])[\.\)](?=\s|$)", reply) if g in valid}
    if len(named) == 1:
        return named.pop()
    if len(named) > 1:
        return None
    # 4. the reply contains exactly one option's text (longest wins when one contains another)
    contained = [i for i, c in enumerate(normalized_choices) if c and f" {c} " in f" {norm} "]
    if contained:
        best = max(contained, key=lambda i: len(normalized_choices[i]))
        others = [i for i in contained if normalized_choices[i] not in normalized_choices[best]]
        return letter(best) if not others else None
    # 5. a lone capital letter that is an option ("I pick C because …"); "A" is too often the article
    lone = {g for g in _LONE_CAPITAL.findall(reply) if g in valid and g != "A" and g != "I"}
    if len(lone) == 1:
        return lone.pop()
    return None


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def content_words(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS}


def lenient_match(prediction: str, reference: str) -> float:
    """Share (0–1) of the reference's content words (stop words dropped, crude stemming) found in
    the prediction. A lenient, judge-free stand-in for the papers' GPT judge — not comparable to it."""
    ref = content_words(reference)
    if not ref:
        return 0.0
    return round(len(ref & content_words(prediction)) / len(ref), 4)


LENIENT_THRESHOLD = 0.5  # a prediction "matches" when it holds at least half the reference's content words
