"""Forward active responding (OVO-Bench REC, SSR, CRR) and proactive output (StreamingBench).

OVO-Bench's forward tasks ask the same question again and again as the video goes on: each
``test_info`` entry of an item is one *probe* at its ``realtime``. The benchmark's own runner
re-encodes the video from 0 to each probe time; here each probe is a question asked of the
streaming memory at that time (the streaming protocol: one pass over each video, nothing
re-encoded). The prompts are the benchmark's (``ovo_prompt``) and so is the scoring
(``score``), as its scoring script does it:

- REC (repetition counting): the digits of the reply, joined, must equal the count.
- SSR (sequential steps) / CRR (clues): ``type`` 1 means "Yes", 0 "No"; a reply is right when it
  contains that word (case-sensitive), or is exactly ``Y`` / ``N``.

The **always-"Yes" baseline** is the score of the reply "Yes" to every probe, by the same
function: the share of SSR/CRR probes whose truth is "Yes" (67 % and 60 % on the full sets),
0 for REC. A model that only learned to say "Yes" reaches it; ``summarize_forward`` prints it
beside each task's score. SSR/CRR records also carry ``p_yes``: the ``--notify`` probe's p(yes)
(``engine.probe``, the benchmark's question asked verbatim) from the same memory at the same
moment — the data to tune ``--notify-threshold`` and ``--notify-margin`` on.

StreamingBench's Proactive Output (``sb_proactive``) asks, from ``time_stamp`` on, for an output
at the moment a condition holds. The benchmark polls once a second with "… Is it the right time
to output "X"? You can only answer yes or no." and, on "yes", asks the question for the output;
it polls until 4 s past the ground truth. It is right when the output contains
``ground_truth_output`` and the moment is within ±2 s of ``ground_truth_time_stamp``
(``score_proactive``). Here the polling is the ``--notify`` mechanism itself (``engine.probe`` +
``engine.notify``), run by the engine after each chunk: ``ProactiveTask.of(question)`` is what
one needs — the condition probed (``proactive_condition``: the benchmark's polling question,
inside the ``--notify`` probe's own frame), the window ``[start_s, stop_s]`` it is polled in,
and the question a fire is answered with (the item's own question); ``runner.run_job`` opens
the video's stream with one ``engine.notify.Condition`` per task and turns the stream's
``notification`` events into records (``ProactiveTask.record``). A task that never fires in its
window is wrong on both counts (``fired_at_s`` None). Its **always-"Yes" baseline** is the
benchmark's poller answering "yes" at once: on time when ``time_stamp`` is within ±2 s of the
truth (``proactive_yes_baseline``; the output it would give is not known, so time only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

OVO_REC, OVO_YES_NO, SB_PROACTIVE = "ovo_rec", "ovo_yes_no", "sb_proactive"
SCORINGS = (OVO_REC, OVO_YES_NO, SB_PROACTIVE)
FORWARD_TASKS = ("REC", "SSR", "CRR")
PROACTIVE_TOLERANCE_S = 2.0  # StreamingBench: |fired - ground truth| <= 2 s
PROACTIVE_POLL_AFTER_S = 4.0  # the benchmark stops polling 4 s after the ground-truth time
YES_REPLY = "Yes"
PROBE_THRESHOLD = 0.5  # the summary's probe accuracy: p(yes) >= this counts as "Yes" (--notify-threshold's default)

# The benchmark's prompts (OVO-Bench's constants module), in its words.
_REC = ("You're watching a video in which people may perform a certain type of action repetively. "
        "The person performing this kind of action are referred to as 'they' in the following statement.\n"
        "You're task is to count how many times have different people in the video perform this kind of action "
        "in total.\nOne complete motion counts as one. \nNow, answer the following question: {}\n"
        "Provide your answer as a single number (e.g., 0, 1, 2, 3…) indicating the total count.\n"
        "Do not include any additional text or explanation in your response.")
_SSR = ("You're watching a tutorial video which contain a sequential of steps. \n"
        "The following is one step from the whole procedures: \n{}\n"
        "Your task is to determine if the man or woman in the video is currently performing this step.\n"
        "Answer only with “Yes” or “No”.\nDo not include any additional text or explanation in your response.")
_CRR = ("You're responsible of answering questions based on the video content. \n"
        "The following question are relevant to the latest frames, i.e. the end of the video.\n{}\n"
        "Decide whether existing visual content, especially latest frames, i.e. frames that near the end of the "
        "video, provide enough information for answering the question.\n"
        "Answer only with “Yes” or “No”.\nDo not include any additional text or explanation in your response.")


def ovo_prompt(task: str, subject: str) -> str:
    """The benchmark's question for a probe: REC's ``subject`` is the activity, SSR's the step,
    CRR's the item's question."""
    if task == "REC":
        return _REC.format(f"How many times did they {subject}?")
    if task == "SSR":
        return _SSR.format(subject)
    if task == "CRR":
        return _CRR.format(subject)
    raise ValueError(f"not an OVO-Bench forward task: {task!r} (expected one of {', '.join(FORWARD_TASKS)})")


def yes_no(kind: int) -> str:
    """OVO-Bench's ``type``: 1 is "Yes", 0 "No"."""
    return "Yes" if int(kind) == 1 else "No"


def score(scoring: str, reply: str | None, truth: str) -> bool:
    """Whether ``reply`` is right for a probe whose reference is ``truth`` (the count, or Yes/No)."""
    if reply is None:
        return False
    if scoring == OVO_REC:
        return "".join(re.findall(r"\d+", reply)) == str(truth)
    if scoring == OVO_YES_NO:
        if reply.strip() == truth[0]:  # the benchmark takes a bare "Y" / "N" too
            return True
        return truth in reply
    raise ValueError(f"no reply score for {scoring!r}")


def yes_baseline(scoring: str, truth: str) -> bool | None:
    """The always-"Yes" reply's score for this probe (None where there is no such baseline)."""
    return score(scoring, YES_REPLY, truth) if scoring in (OVO_REC, OVO_YES_NO) else None


def proactive_condition(question: str, output: str) -> str:
    """StreamingBench's polling question, as a ``--notify`` condition."""
    return f"{question.strip()} Is it the right time to output \"{output}\""


def score_proactive(output: str | None, fired_at_s: float | None, truth_output: str, truth_time_s: float,
                    tolerance_s: float = PROACTIVE_TOLERANCE_S) -> dict:
    """``{"time_correct", "answer_correct"}`` as StreamingBench counts them: the moment within
    ±``tolerance_s`` of the truth, and then the output containing ``truth_output``. Never fired
    (``fired_at_s`` None): neither."""
    on_time = fired_at_s is not None and abs(fired_at_s - truth_time_s) <= tolerance_s
    return {"time_correct": on_time, "answer_correct": bool(on_time and output is not None and truth_output in output)}


def proactive_yes_baseline(start_s: float, truth_time_s: float, tolerance_s: float = PROACTIVE_TOLERANCE_S) -> bool:
    """Whether a poller that says "yes" at its first poll (``start_s``, the question's time) is on time."""
    return abs(start_s - truth_time_s) <= tolerance_s


def proactive_record(base: dict, output: str | None, fired_at_s: float | None, p_yes: float | None,
                     truth_time_s: float) -> dict:
    """A proactive question's record: ``base`` (the runner's fields for the question) plus when it
    fired, what it said and the score (``correct`` is ``answer_correct``)."""
    verdict = score_proactive(output, fired_at_s, base.get("answer") or "", truth_time_s)
    return {**base, "kind": "proactive", "prediction": output, "fired_at_s": fired_at_s, "p_yes": p_yes,
            "ground_truth_time_s": truth_time_s, **verdict, "correct": verdict["answer_correct"]}


class ProactiveQuestion(Protocol):
    """What ``ProactiveTask.of`` reads of an ``annotations.Question`` (which imports this module)."""

    qid: str
    question: str
    answer: str | None
    end_s: float | None
    scoring: str
    extras: dict


@dataclass(frozen=True)
class ProactiveTask:
    """One proactive question as the engine's notify loop runs it.

    After every chunk whose stream time is within ``[start_s, stop_s]`` the engine probes
    ``condition`` (``engine.probe.yes_probabilities``) and steps its ``notify.ConditionState``;
    when it fires, the output is generated from the memory by ``question`` (``engine.probe.
    describe``) and ``record`` scores it. Never fired by ``stop_s``: ``record(base, None, None, None)``.
    """

    qid: str
    question: str
    condition: str
    start_s: float
    stop_s: float
    truth_output: str
    truth_time_s: float

    @classmethod
    def of(cls, q: ProactiveQuestion) -> ProactiveTask:
        truth_time = q.extras.get("ground_truth_time_s")
        if q.scoring != SB_PROACTIVE or truth_time is None:
            raise ValueError(f"{q.qid} is not a scorable proactive question")
        output = q.answer or ""
        return cls(q.qid, q.question, proactive_condition(q.question, output), q.end_s or 0.0,
                   float(truth_time) + PROACTIVE_POLL_AFTER_S, output, float(truth_time))

    def record(self, base: dict, output: str | None, fired_at_s: float | None, p_yes: float | None) -> dict:
        return {**proactive_record(base, output, fired_at_s, p_yes, self.truth_time_s),
                "poll_from_s": self.start_s, "poll_until_s": self.stop_s,
                "yes_baseline": proactive_yes_baseline(self.start_s, self.truth_time_s)}


def summarize_forward(records: list[dict]) -> dict | None:
    """Per task: probes scored, correct, accuracy %, the always-"Yes" baseline % and, for SSR/CRR,
    the accuracy % of the ``--notify`` probe's p(yes) >= 0.5 on the same question (records'
    ``p_yes``; None without records)."""
    rows = [r for r in records if r.get("kind") == "forward" and r.get("correct") is not None]
    if not rows:
        return None

    def block(group: list[dict]) -> dict:
        n = len(group)
        right = sum(bool(r["correct"]) for r in group)
        base = [r for r in group if r.get("yes_baseline") is not None]
        probed = [r for r in group if r.get("p_yes") is not None]
        return {"n": n, "correct": right, "accuracy": round(100 * right / n, 2),
                "yes_baseline": round(100 * sum(bool(r["yes_baseline"]) for r in base) / len(base), 2) if base else None,
                "probe_accuracy": round(100 * sum((r["p_yes"] >= PROBE_THRESHOLD) == (r["answer"] == "Yes")
                                                  for r in probed) / len(probed), 2) if probed else None}

    tasks = sorted({r["task"] for r in rows})
    return {**block(rows), "per_task": {t: block([r for r in rows if r["task"] == t]) for t in tasks}}


def summarize_proactive(records: list[dict]) -> dict | None:
    """The proactive records (None without any): how many fired, time accuracy and answer
    accuracy %, the always-"Yes" poller's time accuracy %, and the mean and mean absolute offset
    of the fired moments from the ground truth (s; None when none fired)."""
    rows = [r for r in records if r.get("kind") == "proactive"]
    if not rows:
        return None
    n = len(rows)
    fired = [r for r in rows if r.get("fired_at_s") is not None]
    offsets = [r["fired_at_s"] - r["ground_truth_time_s"] for r in fired]
    base = [r for r in rows if r.get("yes_baseline") is not None]
    return {"n": n, "fired": len(fired),
            "time_accuracy": round(100 * sum(bool(r["time_correct"]) for r in rows) / n, 2),
            "answer_accuracy": round(100 * sum(bool(r["answer_correct"]) for r in rows) / n, 2),
            "yes_baseline": round(100 * sum(bool(r["yes_baseline"]) for r in base) / len(base), 2) if base else None,
            "mean_offset_s": round(sum(offsets) / len(offsets), 3) if offsets else None,
            "mean_abs_offset_s": round(sum(abs(o) for o in offsets) / len(offsets), 3) if offsets else None}
