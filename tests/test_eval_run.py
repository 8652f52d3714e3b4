"""`hermes eval` end to end on a mini benchmark made here: synthetic videos with a scene change at a
known time, multiple-choice and open-ended questions with end times, the tiny random-weight model.

Tiny answers are noise, so these tests check the mechanics: when each question is asked (after
exactly the frames up to its end time), one stream per video file, records, resume, dry runs.
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hermes_cli.cli.eval import evaluate
from hermes_cli.errors import HermesError
from hermes_cli.evaluation.annotations import load_annotations
from hermes_cli.evaluation.runner import EvalSettings, VideoFinder, run_eval, select_questions
from hermes_cli.sources import open_source
from tests.media import make_video

DATA = Path(__file__).parent / "data" / "benchmarks"
FPS, CHUNK, BUDGET = 1.0, 2, 12

app = typer.Typer()
app.command("eval")(evaluate)


@app.command("noop")
def _noop() -> None:  # a second command keeps `eval` a subcommand, as in the real app
    pass


runner = CliRunner()


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """Two videos (one missing) and an annotation file mixing StreamingBench / OVO / RVS shapes."""
    root = tmp_path_factory.mktemp("bench")
    videos = root / "videos"
    (videos / "sub").mkdir(parents=True)
    make_video(videos / "street.mp4", seconds=8, fps=4, scene_change_at=6, colors=("red", "blue"))
    make_video(videos / "sub" / "park.mp4", seconds=6, fps=5, vfr=True)
    color = ["Red.", "Blue.", "Green."]
    annotations = [
        {"video_id": "street-1", "video_path": "/remote/streams/street.mp4", "task": "color", "conversations": [
            {"question": "What color is the background right now?", "choices": color, "answer": "Red.", "end_time": 2.5},
            {"question": "And now?", "choices": color, "answer": "B", "time_stamp": "00:00:06"},
            {"question": "What changed in the scene?", "answer": "The background turned from red to blue.",
             "start_time": 0, "end_time": 7.3, "task": "describe"},
        ]},
        {"video_id": "street-2", "video_path": "/remote/streams/street.mp4", "task": "motion", "conversations": [
            {"question": "Where does the white square move?", "choices": ["Left to right.", "Up.", "Nowhere."],
             "answer": "Left to right.", "end_time": 4.2},
        ]},
        {"video_id": "park", "video_path": "C:\\data\\sub\\park.mp4", "conversations": [
            {"question": "What color is the background?", "choices": color, "answer": 2, "end_time": "0:03", "task": "color"},
            {"question": "Describe the whole video.", "answer": "Colored backgrounds and a moving white square.",
             "end_time": 30, "task": "describe"},
        ]},
        {"video_id": "gone", "video_path": "/remote/nowhere.mp4", "conversations": [
            {"question": "Anything?", "choices": ["Yes.", "No."], "answer": "Yes.", "end_time": 1, "task": "motion"},
        ]},
    ]
    path = root / "mini.json"
    path.write_text(json.dumps(annotations))
    return path, videos


def sampled_times(path: Path, fps: float) -> list[float]:
    with open_source(str(path), fps) as source:
        return [f.timestamp for f in source]


def test_streaming_asks_after_exactly_the_frames_up_to_end_time(bench, tiny_qwen):
    from hermes_cli.engine.session import Session, SessionConfig
    from policies import make_policy

    ann_path, videos = bench
    aset = load_annotations(ann_path)
    questions = select_questions(aset)
    sessions = []

    def factory():
        sessions.append(Session(tiny_qwen, make_policy("hermes"), SessionConfig(budget=BUDGET, chunk_frames=CHUNK, fps=FPS, history=False)))
        return sessions[-1]

    settings = EvalSettings(model="tiny", budget=BUDGET, fps=FPS, chunk=CHUNK, protocol="streaming", max_new_tokens=3)
    records, report = run_eval(aset, questions, settings, factory, finder=VideoFinder(videos, ann_path.parent))
    assert len(sessions) == 2  # street.mp4 streamed once for both of its entries; park once
    assert report.missing_questions == 1 and report.missing_videos == ["/remote/nowhere.mp4"]
    assert [r["qid"] for r in records] == ["street-1/0", "street-1/1", "street-1/2", "street-2/0", "park/0", "park/1"]
    times = {"street.mp4": sampled_times(videos / "street.mp4", FPS), "park.mp4": sampled_times(videos / "sub" / "park.mp4", FPS)}
    for r in records:
        ts = times[Path(r["video_path"]).name]
        before = [t for t in ts if t <= r["end_time_s"]]
        assert r["frames_seen"] == len(before), r["qid"]  # every frame up to end_time, none after
        assert r["stream_time_s"] == pytest.approx(before[-1])
        assert r["asked_at_s"] == r["end_time_s"]
    by_id = {r["qid"]: r for r in records}
    assert by_id["street-1/1"]["end_time_s"] == 6.0 and 6.0 in times["street.mp4"]  # a frame exactly at end_time is seen
    assert by_id["park/1"]["frames_seen"] == len(times["park.mp4"])  # due after the end: the whole video
    assert by_id["park/0"]["answer_letter"] == "C" and by_id["street-1/1"]["answer_letter"] == "B"
    for r in records:
        if r["kind"] == "multiple_choice":
            assert r["correct"] == (r["parsed_letter"] == r["answer_letter"]) and r["lenient_match"] is None
        else:
            assert 0.0 <= r["lenient_match"] <= 1.0 and r["choices"] is None
        assert r["ttft_ms"] > 0 and r["answer_tokens"] <= 3
        assert max(r["cache"]["stream_tokens_per_layer"]) <= BUDGET  # asked of the memory under its budget
    assert sessions[0].compressions > 0  # the budget was binding: answers came from a compressed memory


def test_offline_asks_after_the_whole_video(bench, tiny_qwen):
    from hermes_cli.engine.session import Session, SessionConfig
    from policies import make_policy

    ann_path, videos = bench
    aset = load_annotations(ann_path)
    settings = EvalSettings(model="tiny", policy="full", fps=1.0, chunk=CHUNK, reindex="eager", protocol="offline", max_new_tokens=2)
    factory = lambda: Session(tiny_qwen, make_policy("full"), SessionConfig(budget=None, chunk_frames=CHUNK, fps=1.0, history=False))  # noqa: E731
    records, _ = run_eval(aset, select_questions(aset, ["color"]), settings, factory, finder=VideoFinder(videos, ann_path.parent))
    street = len(sampled_times(videos / "street.mp4", 1.0))
    assert [r["qid"] for r in records] == ["street-1/0", "street-1/1", "park/0"]
    assert records[0]["frames_seen"] == records[1]["frames_seen"] == street and records[0]["asked_at_s"] is None


@pytest.fixture(autouse=True)
def one_tiny_model(monkeypatch, tiny_qwen):
    """`--model tiny` reuses the session's tiny model instead of building one per command run."""
    import hermes_cli.models.loading

    real = hermes_cli.models.loading.load_model
    monkeypatch.setattr(hermes_cli.models.loading, "load_model",
                        lambda name=None, **kw: tiny_qwen if name == "tiny" else real(name, **kw))


def invoke(*args: str):
    return runner.invoke(app, ["eval", *args])


def test_cli_resume_skips_finished_questions_and_gives_the_same_summary(bench, tmp_path):
    ann_path, videos = bench
    common = [str(ann_path), "--videos-dir", str(videos), "--model", "tiny", "--chunk", str(CHUNK), "--fps", "1",
              "--policy", "fifo", "--budget", "40", "--max-new-tokens", "3"]
    whole = tmp_path / "whole.jsonl"
    first = invoke(*common, "-o", str(whole))
    assert first.exit_code == 0, first.output
    assert "accuracy" in first.output and "lenient match" in first.output and "1 without video" in first.output
    summary = json.loads((tmp_path / "whole.summary.json").read_text())
    assert summary["questions"]["answered"] == 6 and summary["questions"]["missing_video"] == 1
    assert set(summary["multiple_choice"]["per_task"]) == {"color", "motion"}

    parts = tmp_path / "parts.jsonl"
    assert invoke(*common, "--limit", "2", "-o", str(parts)).exit_code == 0
    assert len(parts.read_text().splitlines()) == 2
    with parts.open("a") as f:
        f.write('{"qid": "torn')  # a run killed while writing
    resumed = invoke(*common, "-o", str(parts))
    assert resumed.exit_code == 0, resumed.output
    assert "4 now, 2 from an earlier run" in resumed.output
    again = json.loads((tmp_path / "parts.summary.json").read_text())
    for key in ("multiple_choice", "open_ended", "questions"):
        assert again[key] == summary[key]
    whole_preds = {r["qid"]: r["prediction"] for r in map(json.loads, whole.read_text().splitlines())}
    lines = parts.read_text().splitlines()
    assert lines[2] == '{"qid": "torn' and len(lines) == 7  # the torn line stays, ignored; records follow it
    part_preds = {r["qid"]: r["prediction"] for r in map(json.loads, lines[:2] + lines[3:])}
    assert part_preds.items() <= whole_preds.items()

    done = invoke(*common, "-o", str(whole), "--json")  # nothing left: the model is not even loaded
    assert done.exit_code == 0
    assert json.loads(done.stdout.strip().splitlines()[-1]) == json.loads((tmp_path / "whole.summary.json").read_text())
    assert json.loads((tmp_path / "whole.summary.json").read_text()) == summary

    other = invoke(*common[:-4], "--budget", "80", "--max-new-tokens", "3", "-o", str(whole))
    assert isinstance(other.exception, HermesError) and "other settings" in str(other.exception)


def test_dry_run_with_missing_videos_counts_per_task(tmp_path):
    result = invoke(str(DATA / "streamingbench_real.json"), "--videos-dir", str(tmp_path), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["questions"] == 3 and data["videos"] == 2 and data["missing_videos"] == 2
    assert data["protocol"] == "streaming"
    assert data["per_task"]["Attribute Recognition"] == {"questions": 1, "multiple_choice": 1, "missing_video": 1}
    forced = invoke(str(DATA / "streamingbench_real.json"), "--dry-run", "--json", "--offline", "--limit", "2")
    assert json.loads(forced.stdout.strip().splitlines()[-1])["protocol"] == "offline"
    assert json.loads(forced.stdout.strip().splitlines()[-1])["questions"] == 2
    table = invoke(str(DATA / "videomme.json"), "--dry-run", "--tasks", "counting problem,Action Reasoning")
    assert table.exit_code == 0 and "Counting Problem" in table.output and "offline" in table.output
    assert "Information Synopsis" not in table.output
    quirks = invoke(str(DATA / "quirks.json"), "--dry-run")
    assert quirks.exit_code == 0 and "annotation problem" in quirks.output
    bad = invoke(str(DATA / "videomme.json"), "--dry-run", "--tasks", "Nonsense")
    assert isinstance(bad.exception, HermesError) and "Counting Problem" in str(bad.exception)


class _FakeJudge(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        reply = {"choices": [{"message": {"content": "{'pred': 'yes', 'score': 4}"}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_judge_url_on_a_local_fake_server(bench, tmp_path):
    ann_path, videos = bench
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "oe.jsonl"
        result = invoke(str(ann_path), "--videos-dir", str(videos), "--model", "tiny", "--chunk", "4", "--fps", "1",
                        "--policy", "full", "--tasks", "describe", "--max-new-tokens", "2", "-o", str(out),
                        "--judge-url", f"http://127.0.0.1:{server.server_address[1]}/v1", "--judge-model", "fake")
    finally:
        server.shutdown()
        server.server_close()
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(r["judge"] == {"pred": "yes", "score": 4.0, "model": "fake"} for r in records)
    assert len(_FakeJudge.seen) == 2 and _FakeJudge.seen[0]["model"] == "fake"
    summary = json.loads((tmp_path / "oe.summary.json").read_text())
    assert summary["open_ended"]["judge"]["accuracy"] == 100.0


def test_unreadable_video_is_counted_as_failed_not_fatal(tmp_path):
    from tests.media import random_bytes

    (tmp_path / "v").mkdir()
    random_bytes(tmp_path / "v" / "broken.mp4")
    ann = tmp_path / "a.json"
    ann.write_text(json.dumps([{"video_id": "b", "video_path": "x/broken.mp4", "conversations": [
        {"question": "q?", "choices": ["x", "y"], "answer": "x", "end_time": 1}]}]))
    result = invoke(str(ann), "-d", str(tmp_path / "v"), "--model", "tiny", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["questions"]["failed"] == 1 and summary["questions"]["answered"] == 0
    assert summary["videos"]["failed"][0]["video_id"] == "b" and "broken.mp4" in summary["videos"]["failed"][0]["error"]
