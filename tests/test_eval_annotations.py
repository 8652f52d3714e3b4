"""Benchmark annotation files load, in every shape the HERMES / ReKV sets use, and bad entries are reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes_cli.evaluation.annotations import AnnotationError, load_annotations, problems_summary
from hermes_cli.evaluation.runner import default_protocol

DATA = Path(__file__).parent / "data" / "benchmarks"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmark-samples"

# file -> (videos, questions, protocol, tasks)
EXPECTED = {
    "streamingbench_real.json": (2, 3, "streaming", {"Object Recognition", "Attribute Recognition", "Clips Summarize"}),
    "ovobench_backward.json": (2, 2, "streaming", {"EPM", "ASI"}),
    "rvs_ego.json": (1, 2, "streaming", {"rvs_ego"}),
    "rvs_movie.json": (1, 2, "streaming", {"rvs_movie"}),
    "videomme.json": (2, 3, "offline", {"Counting Problem", "Information Synopsis", "Action Reasoning"}),
    "mvbench.json": (2, 2, "offline", {"mvbench"}),
    "egoschema.json": (1, 1, "offline", {"egoschema"}),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_own_samples_load(name):
    aset = load_annotations(DATA / name)
    videos, questions, protocol, tasks = EXPECTED[name]
    assert (len(aset.videos), len(aset.questions)) == (videos, questions)
    assert aset.problems == []
    assert default_protocol(aset) == protocol
    assert set(aset.tasks()) == tasks
    for q in aset.questions:
        assert q.scorable
        if q.multiple_choice:
            assert q.answer == q.choices["ABCDE".index(q.answer_letter)]


def test_field_shapes():
    sb = load_annotations(DATA / "streamingbench_real.json").questions
    assert [q.end_s for q in sb] == [14.0, 95.0, 62.0]
    assert sb[0].answer_letter == "B" and sb[0].extras == {"required_ability": "working memory"}
    assert [q.qid for q in sb] == ["7/0", "7/1", "8/0"]
    movie = load_annotations(DATA / "rvs_movie.json")
    assert (movie.videos[0].clip_start_s, movie.videos[0].clip_end_s) == (120.0, 410.0)
    assert movie.questions[0].start_s == 120.0 and movie.questions[0].end_s == 205.0
    assert not movie.questions[0].multiple_choice and movie.questions[0].answer.startswith("They cheer")
    ego = load_annotations(DATA / "egoschema.json").questions[0]
    assert ego.answer_letter == "C" and ego.answer == "c is preparing dough for bread."  # a 0-based index
    vm = load_annotations(DATA / "videomme.json")
    assert [v.duration_category for v in vm.videos] == ["short", "long"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared benchmark samples beside this checkout")
@pytest.mark.parametrize("path", sorted(SHARED.glob("*.json")) if SHARED.is_dir() else [], ids=lambda p: p.name)
def test_shared_samples_load(path):
    aset = load_annotations(path)
    assert aset.questions and aset.problems == []
    assert all(q.scorable for q in aset.questions)


def test_quirks_are_repaired_or_reported():
    aset = load_annotations(DATA / "quirks.json")
    qs = {q.qid: q for q in aset.questions}
    assert qs["q1/0"].choices == ["A square.", "A circle."] and qs["q1/0"].answer_letter == "A"  # dict choices
    assert qs["q1/0"].end_s == 3.0  # "0:03"
    assert qs["q1/1"].question == "What is shown?" and qs["q1/1"].choices[1] == "a blue screen"  # embedded
    assert qs["q1/1"].answer_letter == "B" and qs["q1/1"].end_s == 4.0
    assert qs["q1/2"].choices == ["Left.", "Right."] and qs["q1/2"].answer_letter == "B"  # "A. " prefixes dropped
    assert qs["q1/2"].end_s == 5.0  # from time_stamp
    assert qs["q1/3"].answer_letter is None and not qs["q1/3"].scorable  # kept, not scored
    assert qs["q1/5"].end_s is None
    kinds = {p.kind for p in aset.problems}
    assert {"no question text: skipped", "no video_path: video skipped", "video entry is not an object",
            "question entry is not an object: skipped", "end_time is not a time: ignored"} <= kinds
    lines = problems_summary(aset.problems)
    assert len(lines) == len(kinds) and all("×" in line for line in lines)


def test_unusable_files_raise_one_line(tmp_path):
    for content, needle in (("{not json", "not valid JSON"), ('"text"', "not a list of videos")):
        path = tmp_path / "bad.json"
        path.write_text(content)
        with pytest.raises(AnnotationError, match=needle):
            load_annotations(path)
    with pytest.raises(AnnotationError, match="no such annotation file"):
        load_annotations(tmp_path / "absent.json")


def test_dict_wrappers(tmp_path):
    entry = {"video_path": "v.mp4", "conversations": [{"question": "q?", "answer": "a"}]}
    (tmp_path / "a.json").write_text(json.dumps({"videos": [entry]}))
    (tmp_path / "b.json").write_text(json.dumps({"vid9": entry}))
    assert load_annotations(tmp_path / "a.json").questions[0].qid == "v/0"
    assert load_annotations(tmp_path / "b.json").questions[0].qid == "vid9/0"
