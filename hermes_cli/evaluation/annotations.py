"""Benchmark annotations in the JSON shape HERMES and ReKV use, loaded and validated.

A file is a list of videos::

    [{"video_id": "…", "video_path": "/data/…/clip.mp4", "duration": 74.3,          # optional
      "task": "EPM", "clip_start_time": 387, "clip_end_time": 878,                  # optional
      "conversations": [
        {"question": "…", "answer": "…", "choices": ["…", "…"],                     # choices optional
         "end_time": 157.0, "time_stamp": "00:02:37", "start_time": 0,               # times optional
         "task": "Attribute Recognition", "question_type": "…"}]}]                  # optional

Seen in the wild (all accepted):

- times as seconds (``157``, ``157.0``), as strings (``"157"``, ``"00:02:37"``, ``"2:37"``);
  ``time_stamp`` stands in for a missing ``end_time``;
- choices as a list (``["Apples.", …]`` or ``["A. Apples.", …]``), as a dict (``{"A": "…"}``),
  under ``options`` / ``candidates``, or embedded in the question (``"…?\\n(A) …\\n(B) …"``);
- answers as the option text, a letter (``"B"``, ``"(B)"``, ``"B. text"``) or a 0-based index;
- the task in the conversation (``task``, ``question_type``) or on the video; otherwise the
  file's name stands in (MVBench ships one file per task);
- ``video_id`` as a string or a number; when missing, the video file's stem.

Two more shapes are converted to this one on reading (``_canonical``):

- OVO-Bench forward active responding (REC, SSR, CRR: an item with ``test_info``): each probe
  ``{"realtime": T, "count": N}`` / ``{"realtime": T, "step": …, "type": 0|1}`` becomes a question
  at ``end_time`` T with the benchmark's prompt (``forward.ovo_prompt``), the answer the count or
  Yes/No, and ``scoring`` ``ovo_rec`` / ``ovo_yes_no`` (``forward.score``); ``id`` is the video id.
- StreamingBench's own shape (``{"video_path", "questions": [{"task_type", "time_stamp", …}]}``,
  no ids: the file's stem): ``questions`` are the conversations; a Proactive Output question
  (``ground_truth_time_stamp``, ``ground_truth_output``) is asked at ``time_stamp``, answered by
  ``ground_truth_output``, with ``scoring`` ``sb_proactive`` and ``extras["ground_truth_time_s"]``.

Loading never stops at a bad entry: what does not fit is skipped or repaired and listed in
``AnnotationSet.problems``; ``problems_summary`` groups them for one short report.
A file that is not JSON, or not a list of videos, raises ``AnnotationError``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from ..app.streaming import parse_time
from ..errors import HermesError
from .answers import LETTERS, normalize, strip_marker
from .forward import FORWARD_TASKS, OVO_REC, OVO_YES_NO, SB_PROACTIVE, SCORINGS, ovo_prompt, yes_no

CHOICE_KEYS = ("choices", "options", "candidates")
TASK_KEYS = ("task", "question_type", "task_type")
KNOWN_VIDEO_KEYS = {
    "video_id", "video_path", "video", "conversations", "duration", "duration_category",
    "clip_start_time", "clip_end_time", "fps", *TASK_KEYS,
}
KNOWN_QUESTION_KEYS = {"question", "answer", "end_time", "start_time", "time_stamp", "scoring", *CHOICE_KEYS, *TASK_KEYS}
_EMBEDDED = re.compile(r"^\s*(?:\(([A-Z])\)|([A-Z])[\.\):])\s*(.+?)\s*$")


class AnnotationError(HermesError):
    """The file cannot be used at all (unreadable, not JSON, not a list of videos); one line."""


@dataclass
class Problem:
    where: str  # "video 3 (id 'abc'), question 2"
    kind: str  # short, groupable: "answer not among the choices"
    detail: str = ""


@dataclass
class Question:
    qid: str  # stable id: "<video_id>/<n>" (n counts the video's conversations from 0)
    video_index: int
    conv_index: int
    question: str
    answer: str | None  # the reference: option text for multiple choice, free text for open-ended
    choices: list[str] | None = None
    answer_letter: str | None = None
    end_s: float | None = None
    start_s: float | None = None
    task: str = ""
    extras: dict = field(default_factory=dict)
    scoring: str = ""  # "": multiple choice / open-ended; else one of SCORINGS

    @property
    def multiple_choice(self) -> bool:
        return bool(self.choices)

    @property
    def scorable(self) -> bool:
        return self.answer_letter is not None if self.multiple_choice else bool(self.answer)


@dataclass
class Video:
    index: int
    video_id: str
    video_path: str
    questions: list[Question] = field(default_factory=list)
    duration_s: float | None = None
    duration_category: str | None = None
    clip_start_s: float | None = None
    clip_end_s: float | None = None
    fps: float | None = None
    extras: dict = field(default_factory=dict)


@dataclass
class AnnotationSet:
    path: Path
    videos: list[Video]
    problems: list[Problem]
    entries: int  # video entries in the file, usable or not

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def questions(self) -> list[Question]:
        return [q for v in self.videos for q in v.questions]

    @property
    def timed(self) -> bool:
        """Whether most questions carry an end time (a streaming benchmark)."""
        qs = self.questions
        return bool(qs) and sum(q.end_s is not None for q in qs) * 2 >= len(qs)

    def tasks(self) -> Counter:
        return Counter(q.task for q in self.questions)


def load_annotations(path: str | Path) -> AnnotationSet:
    """Read and validate an annotation file; see the module docstring for the accepted shapes."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AnnotationError(f"no such annotation file: {path} — check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AnnotationError(f"cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise AnnotationError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    problems: list[Problem] = []
    entries = [_canonical(i, e, problems) for i, e in enumerate(_entries(data, path))]
    videos: list[Video] = []
    ids = Counter(str(e.get("video_id")) for e in entries if isinstance(e, dict) and e.get("video_id") is not None)
    for i, entry in enumerate(entries):
        video = _video(i, entry, path.stem, problems, ids)
        if video is not None:
            videos.append(video)
    return AnnotationSet(path, videos, problems, len(entries))


def _entries(data, path: Path) -> list:
    if isinstance(data, dict):  # {"videos": [...]}, or {id: entry, ...}
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) == 1 and all(isinstance(e, dict) for e in lists[0]):
            return lists[0]
        if data and all(isinstance(v, dict) for v in data.values()):
            return [{"video_id": k, **v} for k, v in data.items()]
    if not isinstance(data, list):
        raise AnnotationError(
            f"{path} holds a JSON {type(data).__name__}, not a list of videos "
            "(expected [{\"video_id\", \"video_path\", \"conversations\": [...]}, ...])"
        )
    return data


def _video(i: int, entry, set_name: str, problems: list[Problem], ids: Counter) -> Video | None:
    where = f"video {i}"
    if not isinstance(entry, dict):
        problems.append(Problem(where, "video entry is not an object", type(entry).__name__))
        return None
    raw_path = entry.get("video_path", entry.get("video"))
    raw_id = entry.get("video_id")
    if raw_id is not None:
        where = f"video {i} (id {raw_id!r})"
    if not isinstance(raw_path, str) or not raw_path.strip():
        problems.append(Problem(where, "no video_path: video skipped"))
        return None
    video_id = str(raw_id) if raw_id is not None else PurePath(raw_path).stem
    if raw_id is None:
        problems.append(Problem(where, "no video_id: the file name stands in", video_id))
    unique = raw_id is None or ids[str(raw_id)] <= 1
    video = Video(index=i, video_id=video_id, video_path=raw_path.strip())
    video.duration_s = _number(entry, "duration", where, problems)
    video.clip_start_s = _time(entry, "clip_start_time", where, problems)
    video.clip_end_s = _time(entry, "clip_end_time", where, problems)
    video.fps = _number(entry, "fps", where, problems)
    if isinstance(entry.get("duration_category"), str):
        video.duration_category = entry["duration_category"]
    if video.clip_start_s is not None and video.clip_end_s is not None and video.clip_end_s < video.clip_start_s:
        problems.append(Problem(where, "clip_end_time before clip_start_time: clip ignored"))
        video.clip_start_s = video.clip_end_s = None
    video.extras = {k: v for k, v in entry.items() if k not in KNOWN_VIDEO_KEYS}
    video_task = _task(entry)
    conversations = entry.get("conversations")
    if isinstance(conversations, dict):
        conversations = [conversations]
    if not isinstance(conversations, list) or not conversations:
        problems.append(Problem(where, "no conversations: video skipped"))
        return None
    for k, conv in enumerate(conversations):
        q = _question(video, k, conv, f"{where}, question {k}", problems, unique)
        if q is not None:
            q.task = (_task(conv) if isinstance(conv, dict) else None) or video_task or set_name
            video.questions.append(q)
    return video if video.questions else None


def _canonical(i: int, entry, problems: list[Problem]):
    """An OVO-Bench forward item or a StreamingBench-shaped entry in the HERMES shape (see the
    module docstring); any other entry as it is."""
    if not isinstance(entry, dict) or "conversations" in entry:
        return entry
    if isinstance(entry.get("test_info"), list):
        return _ovo_forward(i, entry, problems)
    if isinstance(entry.get("questions"), list):
        return _streamingbench(i, entry, problems)
    return entry


def _ovo_forward(i: int, entry: dict, problems: list[Problem]) -> dict:
    """One OVO-Bench forward item: one question per ``test_info`` probe."""
    task = str(entry.get("task", "")).strip().upper()
    where = f"video {i} (id {entry.get('id')!r})"
    rest = {k: v for k, v in entry.items() if k not in ("id", "video", "task", "test_info", "question", "answer")}
    out = {"video_id": entry.get("id"), "video_path": entry.get("video", entry.get("video_path")), "task": task, **rest}
    if task not in FORWARD_TASKS:
        problems.append(Problem(where, "test_info for a task that is not REC, SSR or CRR: skipped", task[:20]))
        return {**out, "conversations": []}
    subject = {"REC": entry.get("activity"), "CRR": entry.get("question")}.get(task)
    conversations: list = []
    for k, info in enumerate(entry["test_info"]):
        if not isinstance(info, dict):
            conversations.append(info)  # reported as not an object
            continue
        here = f"{where}, probe {k}"
        about = info.get("step") if task == "SSR" else subject
        if not isinstance(about, str) or not about.strip():
            field_name = {"REC": "activity", "SSR": "step", "CRR": "question"}[task]
            problems.append(Problem(here, f"no {field_name} for the {task} prompt: skipped"))
            continue
        if info.get("realtime") is None:
            problems.append(Problem(here, "probe without realtime: asked at the end of the video"))
        if task == "REC":
            count = info.get("count")
            answer = str(count) if isinstance(count, int) and not isinstance(count, bool) else None
            scoring, extra = OVO_REC, {"count": count}
        else:
            kind = info.get("type")
            answer = yes_no(kind) if kind in (0, 1) and not isinstance(kind, bool) else None
            scoring, extra = OVO_YES_NO, {"type": kind}
        conversations.append({"question": ovo_prompt(task, about.strip()), "answer": answer,
                              "end_time": info.get("realtime"), "task": task, "scoring": scoring,
                              "probe": about.strip(), **extra})
    if isinstance(entry.get("answer"), str):  # CRR's reference answer: kept, not what is scored
        out["reference_answer"] = entry["answer"]
    return {**out, "conversations": conversations}


def _streamingbench(i: int, entry: dict, problems: list[Problem]) -> dict:
    """A StreamingBench-shaped entry: its ``questions`` are the conversations (Proactive Output converted)."""
    raw_path = entry.get("video_path")
    rest = {k: v for k, v in entry.items() if k != "questions"}
    if entry.get("video_id") is None and isinstance(raw_path, str) and raw_path.strip():
        rest["video_id"] = PurePath(raw_path.replace("\\", "/")).stem  # the set has no ids: the file names it
    conversations = []
    for k, q in enumerate(entry["questions"]):
        if isinstance(q, dict) and ("ground_truth_time_stamp" in q or "ground_truth_output" in q):
            where = f"video {i}, question {k}"
            q = dict(q)
            truth = _time(q, "ground_truth_time_stamp", where, problems)
            output = q.pop("ground_truth_output", None)
            q.pop("ground_truth_time_stamp", None)
            if truth is None:
                problems.append(Problem(where, "proactive question without ground_truth_time_stamp: not scored"))
            q.update(answer=str(output) if output is not None else None, scoring=SB_PROACTIVE,
                     ground_truth_time_s=truth)
        conversations.append(q)
    return {**rest, "conversations": conversations}


def _task(obj) -> str | None:
    for key in TASK_KEYS:
        value = obj.get(key) if isinstance(obj, dict) else None
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _question(video: Video, k: int, conv, where: str, problems: list[Problem], unique_id: bool) -> Question | None:
    if not isinstance(conv, dict):
        problems.append(Problem(where, "question entry is not an object: skipped"))
        return None
    text = conv.get("question")
    if not isinstance(text, str) or not text.strip():
        problems.append(Problem(where, "no question text: skipped"))
        return None
    qid = f"{video.video_id}/{k}" if unique_id else f"{video.video_id}@{video.index}/{k}"
    choices = _choices(conv, where, problems)
    if choices is None:
        text, choices = _embedded_choices(text)
    raw_answer = conv.get("answer")
    q = Question(qid, video.index, k, text.strip(), None, choices or None)
    if choices:
        q.answer_letter = _answer_letter(raw_answer, choices)
        if q.answer_letter is not None:
            q.answer = choices[LETTERS.index(q.answer_letter)]
        elif raw_answer is None:
            problems.append(Problem(where, "no answer: prediction recorded, not scored"))
        else:
            problems.append(Problem(where, "answer not among the choices: prediction recorded, not scored", str(raw_answer)[:60]))
            q.answer = str(raw_answer)
    elif isinstance(raw_answer, (str, int, float)) and not isinstance(raw_answer, bool) and str(raw_answer).strip():
        q.answer = str(raw_answer).strip()
    else:
        problems.append(Problem(where, "no answer: prediction recorded, not scored"))
    q.end_s = _time(conv, "end_time", where, problems)
    stamp = _time(conv, "time_stamp", where, problems)
    if q.end_s is None:
        q.end_s = stamp
    elif stamp is not None and abs(stamp - q.end_s) > 1.0:
        problems.append(Problem(where, "time_stamp disagrees with end_time: end_time used", f"{stamp:g} vs {q.end_s:g}"))
    q.start_s = _time(conv, "start_time", where, problems)
    if q.start_s is not None and q.end_s is not None and q.start_s > q.end_s:
        problems.append(Problem(where, "start_time after end_time: start_time ignored"))
        q.start_s = None
    q.extras = {key: v for key, v in conv.items() if key not in KNOWN_QUESTION_KEYS}
    scoring = conv.get("scoring") or ""
    if scoring and scoring not in SCORINGS:
        problems.append(Problem(where, "unknown scoring: scored as an ordinary question", str(scoring)[:30]))
        scoring = ""
    q.scoring = scoring
    return q


def _choices(conv: dict, where: str, problems: list[Problem]) -> list[str] | None:
    key = next((k for k in CHOICE_KEYS if k in conv), None)
    if key is None or conv[key] is None:
        return None
    raw = conv[key]
    if isinstance(raw, dict):
        items = sorted(raw.items(), key=lambda kv: str(kv[0]))
        if not all(str(k).strip().upper() in LETTERS for k, _ in items):
            problems.append(Problem(where, "choice keys are not letters: taken in key order"))
        raw = [v for _, v in items]
    if not isinstance(raw, list) or not raw or len(raw) > len(LETTERS):
        problems.append(Problem(where, f"{key} is not a list of options: asked as open-ended"))
        return []
    choices = [str(c).strip() for c in raw]
    markers = [strip_marker(c) for c in choices]
    if all(m == LETTERS[i] for i, (m, _) in enumerate(markers)):  # ["A. Apples.", "B. Candles.", ...]
        choices = [t for _, t in markers]
    if len(set(map(normalize, choices))) < len(choices):
        problems.append(Problem(where, "duplicate choices"))
    return choices


def _embedded_choices(text: str) -> tuple[str, list[str]]:
    """Split ``"Q?\\n(A) x\\n(B) y"`` into ("Q?", ["x", "y"]); no options → (text, [])."""
    lines = text.splitlines()
    options: list[str] = []
    first = None
    for n, line in enumerate(lines):
        m = _EMBEDDED.match(line)
        if m and (m.group(1) or m.group(2)) == LETTERS[len(options)]:
            first = n if first is None else first
            options.append(m.group(3))
        elif options:
            break
    if len(options) >= 2 and first:
        return "\n".join(lines[:first]).strip(), options
    return text, []


def _answer_letter(raw, choices: list[str]) -> str | None:
    if raw is None or isinstance(raw, bool):
        return None
    n = len(choices)
    if isinstance(raw, int) or (isinstance(raw, float) and raw.is_integer()):
        return LETTERS[int(raw)] if 0 <= int(raw) < n else None
    if not isinstance(raw, str):
        return None
    text = raw.strip()
    norm = normalize(text)
    matches = [i for i, c in enumerate(choices) if normalize(c) == norm]
    if len(matches) == 1:
        return LETTERS[matches[0]]
    if len(text) == 1 and text.upper() in LETTERS[:n]:
        return text.upper()
    marker, rest = strip_marker(text)
    if marker is not None and marker in LETTERS[:n] and (
        not rest or normalize(rest) == normalize(choices[LETTERS.index(marker)])
    ):
        return marker
    if re.fullmatch(r"\(?([A-Z])\)?\.?", text) and text.strip("().") in LETTERS[:n]:
        return text.strip("().")
    if text.isdigit() and 0 <= int(text) < n:
        return LETTERS[int(text)]
    return None


def _number(obj: dict, key: str, where: str, problems: list[Problem]) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value)
            if number >= 0:
                return number
        except ValueError:
            pass
    problems.append(Problem(where, f"{key} is not a non-negative number: ignored", repr(value)[:40]))
    return None


def _time(obj: dict, key: str, where: str, problems: list[Problem]) -> float | None:
    value = obj.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value >= 0:
            return float(value)
    elif isinstance(value, str):
        try:
            return parse_time(value)
        except ValueError:
            pass
    problems.append(Problem(where, f"{key} is not a time: ignored", repr(value)[:40]))
    return None


def problems_summary(problems: list[Problem], examples: int = 2) -> list[str]:
    """One line per kind of problem: how many, and where the first ones are."""
    kinds: dict[str, list[Problem]] = {}
    for p in problems:
        kinds.setdefault(p.kind, []).append(p)
    lines = []
    for kind, items in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        shown = "; ".join(p.where + (f" [{p.detail}]" if p.detail else "") for p in items[:examples])
        more = f"; +{len(items) - examples} more" if len(items) > examples else ""
        lines.append(f"{len(items)} × {kind} ({shown}{more})")
    return lines
