"""`hermes eval` on the forward-active-responding (OVO-Bench REC/SSR/CRR) and proactive (StreamingBench)
shapes: loading, the benchmarks' scoring, the always-"Yes" baseline, --dry-run's probe list, and
mini runs on generated videos with the tiny model (its answers are noise: the mechanics are
checked — for the proactive questions, the engine's --notify firing, made deterministic with
--notify-threshold 0 and --notify-consecutive, against the ±2 s window)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hermes_cli.cli.eval import evaluate
from hermes_cli.evaluation import forward
from hermes_cli.evaluation.annotations import load_annotations
from hermes_cli.evaluation.runner import EvalError
from hermes_cli.sources import open_source
from tests.media import make_video

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmark-samples"
app = typer.Typer()
app.command("eval")(evaluate)


@app.command("noop")
def _noop() -> None:
    pass


def invoke(*args: str):
    return CliRunner().invoke(app, ["eval", *args])


def test_rec_scores_the_counts_digits():
    assert forward.score(forward.OVO_REC, "3", "3") and forward.score(forward.OVO_REC, "They did it 3 times.", "3")
    assert not forward.score(forward.OVO_REC, "3 or 4", "3")  # the digits joined: "34"
    assert forward.score(forward.OVO_REC, "12", "12") and not forward.score(forward.OVO_REC, "1, 2", "1")
    assert not forward.score(forward.OVO_REC, "three", "3") and not forward.score(forward.OVO_REC, "Yes", "1")


def test_ssr_crr_score_yes_no_against_type():
    yes, no = forward.yes_no(1), forward.yes_no(0)
    assert (yes, no) == ("Yes", "No")
    assert forward.score(forward.OVO_YES_NO, "Yes.", yes) and forward.score(forward.OVO_YES_NO, "Y", yes)
    assert forward.score(forward.OVO_YES_NO, " N\n", no) and not forward.score(forward.OVO_YES_NO, "N", yes)
    assert not forward.score(forward.OVO_YES_NO, "yes", yes)  # case-sensitive, as the benchmark's script
    assert not forward.score(forward.OVO_YES_NO, "No", yes) and not forward.score(forward.OVO_YES_NO, None, yes)
    assert forward.yes_baseline(forward.OVO_YES_NO, yes) is True and forward.yes_baseline(forward.OVO_YES_NO, no) is False
    assert forward.yes_baseline(forward.OVO_REC, "2") is False and forward.yes_baseline(forward.SB_PROACTIVE, "3") is None


def test_proactive_scoring_window_is_two_seconds_either_side():
    s = forward.score_proactive
    assert s("3", 31.0, "3", 29.0) == {"time_correct": True, "answer_correct": True}
    assert s("3", 27.0, "3", 29.0)["answer_correct"] and not s("3", 26.9, "3", 29.0)["time_correct"]
    assert not s("3", 31.1, "3", 29.0)["time_correct"]
    assert s("The score is 3 now", 29.0, "3", 29.0)["answer_correct"]  # contains the output
    assert s("4", 29.0, "3", 29.0) == {"time_correct": True, "answer_correct": False}
    assert s(None, None, "3", 29.0) == {"time_correct": False, "answer_correct": False}  # never fired
    record = forward.proactive_record({"qid": "q", "answer": "3"}, "3", 30.0, 0.8, 29.0)
    assert record["kind"] == "proactive" and record["correct"] is True and record["fired_at_s"] == 30.0
    assert forward.proactive_yes_baseline(27.0, 29.0) and not forward.proactive_yes_baseline(26.5, 29.0)
    assert forward.proactive_condition('When X, output "3".', "3") == 'When X, output "3". Is it the right time to output "3"'


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared benchmark samples beside this checkout")
def test_shared_forward_sample_becomes_one_question_per_probe():
    raw = json.loads((SHARED / "ovobench_forward.json").read_text())
    aset = load_annotations(SHARED / "ovobench_forward.json")
    assert aset.problems == [] and len(aset.questions) == sum(len(item["test_info"]) for item in raw)
    by_id = {q.qid: q for q in aset.questions}
    for item in raw:
        for k, info in enumerate(item["test_info"]):
            q = by_id[f"{item['id']}/{k}"]
            assert q.task == item["task"] and q.end_s == float(info["realtime"])
            if item["task"] == "REC":
                assert q.answer == str(info["count"]) and q.scoring == forward.OVO_REC
                assert f"How many times did they {item['activity']}?" in q.question
            else:
                assert q.answer == ("Yes" if info["type"] == 1 else "No") and q.scoring == forward.OVO_YES_NO
                assert (info["step"] if item["task"] == "SSR" else item["question"]) in q.question
                assert "Answer only with “Yes” or “No”." in q.question
    pro = load_annotations(SHARED / "streamingbench_proactive.json")
    assert pro.problems == [] and [q.end_s for q in pro.questions] == [20.0, 170.0, 340.0]
    assert [q.extras["ground_truth_time_s"] for q in pro.questions] == [29.0, 178.0, 347.0]
    assert [q.answer for q in pro.questions] == ["3", "20", "40"]
    assert {q.scoring for q in pro.questions} == {forward.SB_PROACTIVE}
    task = forward.ProactiveTask.of(pro.questions[0])
    assert (task.start_s, task.stop_s, task.truth_time_s, task.truth_output) == (20.0, 33.0, 29.0, "3")
    assert task.condition == 'When the scoreboard shows 3 points for USA, output "3". Is it the right time to output "3"'
    assert task.record({"qid": task.qid, "answer": "3"}, "3", 28.0, 0.9)["correct"] is True
    assert task.record({"qid": task.qid, "answer": "3"}, None, None, None)["correct"] is False
    with pytest.raises(ValueError, match="not a scorable proactive"):
        forward.ProactiveTask.of(aset.questions[0])


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared benchmark samples beside this checkout")
def test_dry_run_lists_every_probe_with_its_time():
    raw = json.loads((SHARED / "ovobench_forward.json").read_text())
    result = invoke(str(SHARED / "ovobench_forward.json"), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    want = sorted((float(info["realtime"]), f"{item['id']}/{k}") for item in raw for k, info in enumerate(item["test_info"]))
    assert sorted((p["time_s"], p["qid"]) for p in data["probes"]) == want
    assert [p["time_s"] for p in data["probes"]] == sorted(t for t, _ in want)
    table = invoke(str(SHARED / "streamingbench_proactive.json"), "--dry-run")
    assert table.exit_code == 0 and "3 probes" in table.output and "3 at 29 s" in table.output
    assert "until s" in table.output  # a proactive question is polled from its time to 4 s past its truth
    listed = json.loads(invoke(str(SHARED / "streamingbench_proactive.json"), "--dry-run", "--json").output)["probes"]
    tasks = [forward.ProactiveTask.of(q) for q in load_annotations(SHARED / "streamingbench_proactive.json").questions]
    assert [(p["qid"], p["time_s"], p["poll_until_s"], p["ground_truth_time_s"]) for p in listed] == [
        (t.qid, t.start_s, t.truth_time_s + forward.PROACTIVE_POLL_AFTER_S, t.truth_time_s) for t in tasks]


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    """Generated videos in the two files' own shapes (two REC/SSR items share a video, as CRR's do)."""
    root = tmp_path_factory.mktemp("forward")
    videos = root / "videos"
    videos.mkdir()
    make_video(videos / "steps.mp4", seconds=9, fps=4, scene_change_at=5, colors=("red", "blue"))
    make_video(videos / "count.mp4", seconds=6, fps=4)
    items = [
        {"id": 1, "task": "REC", "video": "perception_test/count.mp4", "activity": "moving the square",
         "start_times": [0], "end_times": [3], "test_info": [{"realtime": 3, "count": 1}, {"realtime": 5.0, "count": 2}]},
        {"id": 2, "task": "SSR", "video": "COIN/steps.mp4", "tutorial": "Paint", "all_steps": ["paint red", "paint blue"],
         "start_time": [0, 5], "end_time": [5, 9],
         "test_info": [{"realtime": 2, "step": "paint red", "type": 1}, {"realtime": 4, "step": "paint blue", "type": 0},
                       {"realtime": 7, "step": "paint blue", "type": 1}]},
        {"id": 3, "task": "CRR", "video": "COIN/steps.mp4", "question": "What colour comes after red?",
         "answer": "Blue.", "ask_time": 3, "clue_time": 6,
         "test_info": [{"realtime": 3, "type": 0}, {"realtime": 6, "type": 1}, {"realtime": 8, "type": 1}]},
    ]
    ovo = root / "ovo_forward.json"
    ovo.write_text(json.dumps(items))
    proactive = root / "proactive.json"
    proactive.write_text(json.dumps([{"time": "[0:00:00 - 0:00:09]", "video_path": "./videos/steps.mp4", "questions": [
        {"task_type": "Proactive Output", "question": 'When the screen turns blue, output "blue".',
         "time_stamp": "00:00:02", "ground_truth_time_stamp": "00:00:05", "ground_truth_output": "blue"}]}]))
    return ovo, proactive, videos


def test_mini_run_scores_each_probe_from_the_streaming_memory(mini, tmp_path):
    ovo, _, videos = mini
    out = tmp_path / "forward.jsonl"
    result = invoke(str(ovo), "--videos-dir", str(videos), "--model", "tiny", "--chunk", "2", "--fps", "1",
                    "--policy", "fifo", "--budget", "40", "--max-new-tokens", "3", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "forward active responding" in result.output and 'always "Yes" %' in result.output
    assert "p(yes) ≥ 0.5 %" in result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 8 and {r["kind"] for r in records} == {"forward"}
    times = {name: [f.timestamp for f in open_source(str(videos / name), 1.0)] for name in ("steps.mp4", "count.mp4")}
    for r in records:
        assert r["correct"] == forward.score(r["scoring"], r["prediction"], r["answer"])
        assert r["yes_baseline"] == (r["answer"] == "Yes")
        seen = [t for t in times[Path(r["video_path"]).name] if t <= r["end_time_s"]]
        assert r["frames_seen"] == len(seen)  # asked of the memory at exactly its probe time
        assert r["answer_tokens"] <= 3
        if r["task"] == "REC":
            assert "p_yes" not in r
        else:  # the --notify probe of the same question at the same moment
            assert 0.0 <= r["p_yes"] <= 1.0
    summary = json.loads((tmp_path / "forward.summary.json").read_text())
    fw = summary["forward"]
    assert fw["n"] == 8 and set(fw["per_task"]) == {"REC", "SSR", "CRR"}
    assert fw["per_task"]["SSR"]["yes_baseline"] == pytest.approx(100 * 2 / 3, abs=0.01)
    assert fw["per_task"]["CRR"]["yes_baseline"] == pytest.approx(100 * 2 / 3, abs=0.01)
    assert fw["per_task"]["REC"]["yes_baseline"] == 0.0
    assert fw["correct"] == sum(r["correct"] for r in records)
    ssr = [r for r in records if r["task"] == "SSR"]
    assert fw["per_task"]["SSR"]["probe_accuracy"] == pytest.approx(
        100 * sum((r["p_yes"] >= 0.5) == (r["answer"] == "Yes") for r in ssr) / len(ssr), abs=0.01)
    assert fw["per_task"]["REC"]["probe_accuracy"] is None


def test_proactive_sample_fires_by_the_notify_rule(tmp_path):
    """The shared StreamingBench proactive items on a generated video of their length: one pass,
    each question polled with the --notify probe after every chunk of its window. Threshold 0 makes
    every poll hot, so --notify-consecutive 6 fires each at its 6th poll — deterministically, even
    with random weights — and the ±2 s window decides the time score."""
    if not SHARED.is_dir():
        pytest.skip("no ../shared benchmark samples beside this checkout")
    sample = SHARED / "streamingbench_proactive.json"
    items = load_annotations(sample).questions
    tasks = [forward.ProactiveTask.of(q) for q in items]
    videos = tmp_path / "videos"
    videos.mkdir()
    make_video(videos / "sample_17_proactive.mp4", seconds=max(t.stop_s for t in tasks) + 1, fps=1)
    out = tmp_path / "proactive.jsonl"
    args = [str(sample), "--videos-dir", str(videos), "--model", "tiny", "--chunk", "2", "--fps", "1",
            "--policy", "fifo", "--budget", "40", "--notify-threshold", "0", "--notify-cooldown", "0", "-o", str(out)]
    result = invoke(*args, "--notify-consecutive", "6")
    assert result.exit_code == 0, result.output
    assert "proactive output" in result.output and 'always "Yes" on time %' in result.output
    assert "not run" not in result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["qid"] for r in records] == [t.qid for t in tasks] and {r["kind"] for r in records} == {"proactive"}
    for r, t in zip(records, tasks, strict=True):
        # a chunk ends at the question's time (flushed there) and every 2 frames (2 s) after it:
        # the 6th poll is 10 s after the question
        assert r["fired_at_s"] == t.start_s + 10.0 and r["frames_seen"] == int(t.start_s + 10.0) + 1
        assert r["time_correct"] == (abs(r["fired_at_s"] - t.truth_time_s) <= 2.0)
        assert r["answer_correct"] == (r["time_correct"] and t.truth_output in r["prediction"]) == r["correct"]
        event = r["notification"]  # the engine's own notification event, as --json prints it
        assert event["notification"] == t.condition and event["stream_time_s"] == r["fired_at_s"]
        assert event["text"] == r["prediction"] and event["p_yes"] == r["p_yes"] and 0.0 <= r["p_yes"] <= r["p_yes_max"] <= 1.0
        assert r["yes_baseline"] is False  # each time_stamp is 7-9 s before its truth: "Yes" at once is early
        assert (r["poll_from_s"], r["poll_until_s"], r["ground_truth_time_s"]) == (t.start_s, t.stop_s, t.truth_time_s)
    # every chunk of the window is polled, after the fire too: 20…32 and 170…182 every 2 s; 340…350
    # and the stream's last chunk, the frame at 351 s (the end of the last window)
    assert [r["polls"] for r in records] == [7, 7, 7]
    # truths 9, 8 and 7 s after the question: fired 1 s late, 2 s late (the window's edge), 3 s late
    assert [r["time_correct"] for r in records] == [True, True, False]
    summary = json.loads((tmp_path / "proactive.summary.json").read_text())
    pro = summary["proactive"]
    assert (pro["n"], pro["fired"], pro["time_accuracy"], pro["yes_baseline"]) == (3, 3, 66.67, 0.0)
    assert pro["answer_accuracy"] == round(100 * sum(r["answer_correct"] for r in records) / 3, 2)
    assert pro["mean_offset_s"] == 2.0 and pro["mean_abs_offset_s"] == 2.0
    assert summary["settings"]["notify"]["consecutive"] == 6 and summary["questions"]["proactive"] == 3
    # the firing rule is part of what the results depend on: another one does not resume this file
    other = invoke(*args, "--notify-consecutive", "5")
    assert isinstance(other.exception, EvalError) and "notify={" in str(other.exception)


def test_proactive_question_that_never_fires_is_wrong_on_both_counts(mini, tmp_path):
    _, proactive, videos = mini
    out = tmp_path / "proactive.jsonl"
    args = [str(proactive), "--videos-dir", str(videos), "--model", "tiny", "--chunk", "2", "--fps", "1",
            "--notify-threshold", "0", "--notify-consecutive", "50", "-o", str(out), "--json"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["proactive"] == {"n": 1, "fired": 0, "time_accuracy": 0.0, "answer_accuracy": 0.0,
                                    "yes_baseline": 0.0, "mean_offset_s": None, "mean_abs_offset_s": None}
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["fired_at_s"] is None and record["prediction"] is None and record["notification"] is None
    assert (record["time_correct"], record["answer_correct"], record["correct"]) == (False, False, False)
    assert record["polls"] >= 3 and 0.0 <= record["p_yes_max"] <= 1.0  # it was polled: it just never fired
    again = invoke(*args)  # resumed: nothing left to run, the same summary
    assert again.exit_code == 0 and json.loads(again.output.strip().splitlines()[-1])["proactive"] == summary["proactive"]
    assert len(out.read_text().splitlines()) == 1


def test_proactive_polls_leave_the_other_questions_answers_as_they_were(mini, tmp_path):
    """A proactive question beside an ordinary one on the same video: one stream, both answered,
    and the ordinary answer is the one the stream gives without the polls (they leave the memory)."""
    _, _, videos = mini
    asked = {"task_type": "Object Perception", "question": "What colour is the screen?", "time_stamp": "00:00:04",
             "answer": "Red."}
    polled = {"task_type": "Proactive Output", "question": 'When the screen turns blue, output "blue".',
              "time_stamp": "00:00:04", "ground_truth_time_stamp": "00:00:05", "ground_truth_output": "blue"}
    answers = {}
    for name, questions in (("both", [asked, polled]), ("alone", [asked])):
        ann = tmp_path / f"{name}.json"
        ann.write_text(json.dumps([{"video_path": "./videos/steps.mp4", "questions": questions}]))
        out = tmp_path / f"{name}.jsonl"
        result = invoke(str(ann), "--videos-dir", str(videos), "--model", "tiny", "--chunk", "2", "--fps", "1",
                        "--max-new-tokens", "6", "--notify-threshold", "0", "-o", str(out))
        assert result.exit_code == 0, result.output
        answers[name] = {r["kind"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(answers["both"]) == {"open_ended", "proactive"}
    fired = answers["both"]["proactive"]
    assert fired["fired_at_s"] == 4.0 and fired["time_correct"] is True  # threshold 0: its first poll, 1 s early
    assert answers["both"]["open_ended"]["prediction"] == answers["alone"]["open_ended"]["prediction"]
    assert answers["both"]["open_ended"]["frames_seen"] == answers["alone"]["open_ended"]["frames_seen"]
