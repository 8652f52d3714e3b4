"""Answer letters read from realistic model replies; lenient match; aggregation per task and duration."""

from __future__ import annotations

import pytest

from hermes_cli.evaluation.answers import format_question, lenient_match, parse_letter
from hermes_cli.evaluation.runner import duration_bucket, eval_summary

CHOICES = ["A compass.", "A map.", "An altitude meter.", "A weather radar."]

REPLIES = [
    ("B", "B"),
    ("B.", "B"),
    ("(B)", "B"),
    ("(b)", "B"),
    ("b", "B"),
    ("B) A map.", "B"),
    ("B. A map.", "B"),
    ("[C]", "C"),
    ("**D**", "D"),
    ("D: A weather radar", "D"),
    ("C, an altitude meter", "C"),
    ("Answer: C", "C"),
    ("The answer is (D).", "D"),
    ("The correct answer is B. A map is shown on the center screen.", "B"),
    ("I think the best option is C because the needle moves.", "C"),
    ("Option D", "D"),
    ("A map.", "B"),  # the option's text, not the letter A
    ("a map", "B"),
    ("It shows a map on the screen.", "B"),
    ("An altitude meter", "C"),
    ("A", "A"),
    ("A.", "A"),
    ("(A) A compass.", "A"),
    ("E", None),  # not an option
    ("I am not sure.", None),
    ("", None),
    ("Either (A) or (C).", None),  # two options named
    ("The screen displays a compass next to a weather radar.", None),
]


@pytest.mark.parametrize("reply,expected", REPLIES)
def test_parse_letter(reply, expected):
    assert parse_letter(reply, CHOICES) == expected


def test_parse_letter_long_options():
    choices = [
        "The individual organized serving trays.",
        "The individual replenished bread inventory by placing new buns onto the shelves.",
        "The individual checked inventory levels.",
    ]
    assert parse_letter("The individual replenished bread inventory by placing new buns onto the shelves", choices) == "B"
    assert parse_letter("B - the individual replenished bread", choices) == "B"
    assert parse_letter("Answer:\nC", choices) == "C"


def test_prompt_letters():
    prompt = format_question("What is on the screen?", CHOICES)
    assert prompt.splitlines()[1:5] == ["(A) A compass.", "(B) A map.", "(C) An altitude meter.", "(D) A weather radar."]
    assert "letter" in prompt.splitlines()[-1]
    assert format_question("  Open question?  ", None) == "Open question?"


def test_lenient_match():
    ref = "Chopping vegetables."
    assert lenient_match("The person is chopping some vegetables on a board.", ref) == 1.0
    assert lenient_match("They chop.", ref) == 0.0
    assert lenient_match("Someone is chopping onions.", ref) == 0.5
    assert lenient_match("anything", "the a of") == 0.0


def test_duration_buckets():
    assert duration_bucket("medium", 30) == "medium"
    assert [duration_bucket(None, s) for s in (None, 60, 600, 3600)] == [None, "short", "medium", "long"]


def _mc(qid, task, correct, bucket="short", letter="A"):
    return {"qid": qid, "kind": "multiple_choice", "task": task, "correct": correct, "parsed_letter": letter,
            "duration_bucket": bucket, "ttft_ms": 10.0, "tpot_ms": 2.0, "settings": {"model": "m"}}


def test_aggregation_per_task_and_duration():
    records = [
        _mc("1", "Counting", True), _mc("2", "Counting", False), _mc("3", "Counting", True, "long"),
        _mc("4", "OCR", False, "long", letter=None), _mc("5", "OCR", None),
        {"qid": "6", "kind": "open_ended", "task": "rvs", "lenient_match": 0.75, "correct": None, "ttft_ms": 20.0,
         "tpot_ms": None, "judge": {"pred": "yes", "score": 4, "model": "j"}},
        {"qid": "7", "kind": "open_ended", "task": "rvs", "lenient_match": 0.25, "correct": None, "ttft_ms": None,
         "tpot_ms": None, "judge": {"pred": "no", "score": 1, "model": "j"}},
    ]
    s = eval_summary(records, selected=8)
    mc = s["multiple_choice"]
    assert (mc["n"], mc["correct"], mc["accuracy"]) == (4, 2, 50.0)
    assert mc["per_task"] == {"Counting": {"n": 3, "correct": 2, "accuracy": 66.67}, "OCR": {"n": 1, "correct": 0, "accuracy": 0.0}}
    assert mc["per_duration"]["long"] == {"n": 2, "correct": 1, "accuracy": 50.0}
    assert mc["unparsed"] == 1 and mc["unscored"] == 1
    oe = s["open_ended"]
    assert oe["lenient_match"]["mean_score"] == 0.5 and oe["lenient_match"]["accuracy"] == 50.0
    assert oe["judge"] == {"n": 2, "accuracy": 50.0, "mean_score": 2.5, "model": "j"}
    assert s["questions"] == {"selected": 8, "answered": 7, "multiple_choice": 5, "open_ended": 2}
    assert s["timing"]["ttft_ms_mean"] == pytest.approx(70 / 6, abs=1e-3)
