"""The first hour, round two (issue 26): an install that gives what it promises, output scripts
can trust, and the tools people expect around a model (pull, logs).

Subprocesses run ``python -m hermes_cli`` from this worktree where start-up matters; the rest
uses typer's runner.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hermes_cli.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("HERMES_MODEL", "HF_HUB_OFFLINE", "HERMES_CONFIG")}
    return {**base, "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": "/nonexistent-hermes-config",
            "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def hermes(*args: str, input: str | None = None, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermes_cli", *args], capture_output=True, text=True, input=input,
                          timeout=timeout, env=env(**extra), cwd=ROOT)


# -- 1. a torchvision that does not match torch ----------------------------------------------------------
@pytest.mark.slow
def test_a_mismatched_torchvision_is_one_line_naming_both_versions_and_the_fix(tmp_path, video):
    """A torchvision whose import raises what a build for another torch raises: one line, exit 2."""
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    pythonpath = f"{fake.parent}{os.pathsep}{ROOT}"
    for args in (["watch", video, "--model", "tiny", "--ask", "hi"], ["bench", "--model", "tiny", "--frames", "4"]):
        done = hermes(*args, PYTHONPATH=pythonpath)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        import torch

        line = lines[0]
        assert f"torchvision {metadata.version('torchvision')}" in line and f"torch {torch.__version__}" in line
        assert "operator torchvision::nms does not exist" in line
        assert f"pip install --force-reinstall torch=={torch.__version__.split('+')[0]} torchvision" in line
        assert "AttentionInterface" not in done.stderr


def test_the_fix_for_a_cpu_torch_names_the_cpu_index():
    from hermes_cli.cli.torch_stack import CPU_INDEX, fix_command

    assert fix_command("2.13.0+cpu", None) == f"pip install --force-reinstall torch==2.13.0 torchvision --index-url {CPU_INDEX}"
    assert fix_command("2.14.1+cu130", "13.0") == "pip install --force-reinstall torch==2.14.1 torchvision"


def test_a_matching_pair_passes():
    from hermes_cli.cli.torch_stack import torch_stack_problem

    assert torch_stack_problem() is None


# -- 2. -q / -v after the command; `hermes -q bench` is quiet -------------------------------------------
TINY_BENCH = ["--model", "tiny", "--frames", "4", "--chunk", "4", "--policies", "hermes,infinipot", "--repeats", "1",
              "--warmup", "0", "--max-new-tokens", "2", "--size", "56x56"]


@pytest.mark.parametrize("command", ["models", "policies"])
def test_quiet_and_verbose_after_models_and_policies(command):
    for flag in ("-q", "--quiet", "-v", "--verbose"):
        result = runner.invoke(app, [command, flag])
        assert result.exit_code == 0, (flag, result.output)
    quiet = runner.invoke(app, [command, "-q"]).stdout
    assert "--policy-opt KEY=VALUE" not in quiet and "default here" not in quiet  # results only


@pytest.mark.parametrize("args", [["-q", "bench", *TINY_BENCH], ["bench", *TINY_BENCH, "-q"]])
def test_quiet_bench_prints_the_results_and_no_notes(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stderr == "", result.stderr
    assert "hermes bench — tiny" in result.stdout and "TTFT(4)/TTFT(4)" in result.stdout


def test_verbose_after_bench_is_accepted():
    result = runner.invoke(app, ["bench", *TINY_BENCH, "-v"])
    assert result.exit_code == 0, result.output
    assert "model: tiny" in result.stderr and "note:" in result.stderr


# -- 3. the bench table and summary at 80 columns ----------------------------------------------------------
def run_in_pty(args: list[str], columns: int, timeout: float = 120) -> str:
    """The CLI with stdout and stderr on a pseudo-terminal of ``columns`` columns; what it wrote, no escapes."""
    import fcntl
    import pty
    import re
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "hermes_cli", *args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env(COLUMNS=str(columns), TERM="xterm"), cwd=ROOT)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=10)
    os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    return re.sub(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][A-Z0-9]|[=>])", "", text).replace("\r", "")


@pytest.mark.slow
def test_the_bench_table_and_summary_read_whole_at_80_columns():
    text = run_in_pty(["bench", *TINY_BENCH], 80)
    table = text[text.index("hermes bench — tiny"):]
    lines = table.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in table
    for header in ("policy", "frames", "TTFT ms", "TPOT ms", "cache tok", "KV MiB", "peak MiB", "stream tok"):
        assert header in table, header
    for words in ("ms/frame", "ms/chunk", "prefill", "infinipot"):
        assert words in table
    # the summary wraps between words: joined again, each policy's line reads whole
    summary = " ".join(line.strip() for line in lines if not line.startswith(("┏", "┃", "┡", "│", "└", " ")))
    for policy in ("hermes", "infinipot"):
        assert f"{policy}: TTFT(4)/TTFT(4) = " in summary
    assert "compress_fraction " in summary and "real time at 1 fps" in summary


# -- 4. --json at a terminal: stdout holds JSON only, and no prompt -------------------------------------
@pytest.mark.slow
def test_json_at_a_terminal_keeps_stdout_json_only_and_shows_no_prompt(video):
    """stdin and stderr a terminal, stdout a pipe: /stats goes to stderr, no '? ' prompt anywhere."""
    import pty
    import select
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hermes_cli", "watch", video, "--model", "tiny", "--chunk", "4",
                             "--max-new-tokens", "2", "--json"], stdin=slave, stderr=slave, stdout=subprocess.PIPE,
                            env=env(TERM="xterm"), cwd=ROOT)
    os.close(slave)
    os.write(master, b"/stats\nWhat is it?\n/help\n")
    seen = b""
    deadline = time.monotonic() + 90
    sent_eof = False
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                seen += os.read(master, 65536)
            except OSError:
                break
        if not sent_eof and (b"/quit" in seen or time.monotonic() > deadline - 30):
            os.write(master, b"\x04")  # /help's text came (everything before it was answered), or time is up
            sent_eof = True
    try:
        stdout = proc.communicate(timeout=30)[0].decode()
    finally:
        proc.kill()
        os.close(master)
    stderr = seen.decode("utf-8", "replace").replace("\r", "")
    assert proc.returncode == 0, stderr
    records = [json.loads(line) for line in stdout.splitlines()]  # every stdout line is JSON
    assert [r["question"] for r in records] == ["What is it?"]
    assert "stream" in stderr and "cache" in stderr and "tokens/layer" in stderr  # /stats, on stderr
    assert not any(line.startswith("?") for line in stderr.splitlines()), stderr


# -- 5. a source that fails before its first frame prints no answer -----------------------------------
@pytest.mark.slow
def test_a_source_that_fails_before_any_frame_prints_no_answer_record(tmp_path):
    """A faststart mp4 cut after its index: it opens, then no frame decodes. One error line, nothing on stdout."""
    from tests.media import make_video

    whole = tmp_path / "whole.mp4"
    make_video(whole, seconds=4, fps=4, faststart=True)
    data = whole.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[:data.index(b"mdat") + 8])
    done = hermes("watch", str(cut), "--model", "tiny", "--ask", "hi", "--json", "--max-new-tokens", "2")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no video frame could be decoded" in lines[0], done.stderr


# -- 6. eval warns about questions timed after the video's end ---------------------------------------------
def late_annotations(folder: Path) -> Path:
    from tests.media import make_video

    make_video(folder / "v.mp4", seconds=4, fps=4, size=(96, 64))
    ann = folder / "ann.json"
    ann.write_text(json.dumps([{"video_id": "v", "video_path": "v.mp4", "conversations": [
        {"question": "early?", "choices": ["a", "b"], "answer": "a", "end_time": 2},
        {"question": "late?", "choices": ["a", "b"], "answer": "b", "end_time": 157}]}]))
    return ann


def test_eval_dry_run_warns_about_questions_after_the_end_of_the_video(tmp_path):
    ann = late_annotations(tmp_path)
    result = runner.invoke(app, ["eval", str(ann), "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["after_end"] == 1
    (line,) = [line for line in result.stderr.splitlines() if "warning:" in line]
    assert "1 question is timed after the end of its video" in line and "'late?' at 157s of v.mp4 (4." in line
    text = runner.invoke(app, ["eval", str(ann), "--dry-run"])
    assert "(after the video's end: 1)" in text.stdout


def test_eval_run_warns_about_questions_after_the_end_of_the_video(tmp_path):
    ann = late_annotations(tmp_path)
    result = runner.invoke(app, ["eval", str(ann), "--model", "tiny", "--chunk", "2", "--max-new-tokens", "2",
                                 "--json", "-o", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 0, result.output
    assert "1 question is timed after the end of its video, e.g. 'late?' at 157s" in result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["questions"]["answered"] == 2


# -- 7. eval with every video missing ---------------------------------------------------------------------
def test_eval_with_every_video_missing_exits_2_with_one_line(tmp_path):
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps([
        {"video_id": f"gone{i}", "video_path": f"/remote/gone{i}.mp4", "conversations": [
            {"question": "q?", "choices": ["a", "b"], "answer": "a", "end_time": 1}]} for i in range(2)]))
    result = hermes("eval", str(ann), "--model", "tiny", "--videos-dir", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"none of the 2 videos of ann.json was found under --videos-dir {tmp_path}" in lines[0]
    assert "/remote/gone0.mp4" in lines[0] and "None" not in lines[0]


# -- hermes logs: every answer in a local SQLite log ----------------------------------------------------------
@pytest.mark.slow
def test_logs_round_trip_two_runs_then_no_log(tmp_path):
    from tests.media import make_video

    clip = tmp_path / "clip.mp4"
    make_video(clip, seconds=4, fps=4, size=(64, 48))
    state = {"HERMES_LOGS": str(tmp_path / "state" / "logs.db")}
    tiny = ["--model", "tiny", "--chunk", "2", "--max-new-tokens", "2"]
    first = hermes("watch", str(clip), *tiny, "--ask-at", "2s=What comes first?", "--json", **state)
    assert first.returncode == 0, first.stderr
    second = hermes("watch", str(clip), *tiny, "--realtime", input="And then?\n", **state)  # piped lines, paced
    assert second.returncode == 0, second.stderr
    unlogged = hermes("watch", str(clip), *tiny, "--ask", "Not this one?", "--json", "--no-log", **state)
    assert unlogged.returncode == 0, unlogged.stderr

    done = hermes("logs", "-n", "2", "--json", **state)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["question"] for r in rows] == ["What comes first?", "And then?"]
    answered = json.loads(first.stdout)
    assert rows[0]["stream_time_s"] == answered["stream_time_s"] and rows[0]["asked_at_s"] == 2.0
    assert rows[0]["answer"] == answered["answer"] and rows[0]["ttft_ms"] == answered["ttft_ms"]
    assert rows[1]["stream_time_s"] is not None and rows[1]["answer"] in second.stdout
    for r in rows:
        assert r["source"] == str(clip.resolve()) and r["model"] == "tiny" and r["policy"] == "hermes"
        assert r["command"] == "watch" and r["tpot_ms"] is not None and r["frames_seen"] > 0
    assert len(json.loads(hermes("logs", "-n", "0", "--json", **state).stdout)) == 2  # --no-log: no row

    found = hermes("logs", "--search", "COMES", **state)  # case-insensitive, in questions and answers
    assert "Q: What comes first?" in found.stdout and "And then?" not in found.stdout
    assert "policy hermes" in found.stdout and "@ " in found.stdout


def test_logs_off_and_on(tmp_path, monkeypatch):
    from hermes_cli import answer_log
    from hermes_cli.engine.records import Answer

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("HERMES_LOGS", raising=False)
    answer_log.begin("watch", "clip.mp4")
    off = runner.invoke(app, ["logs", "off"])
    assert off.exit_code == 0 and "answer log off" in off.stdout
    answer_log.log_answer(Answer("while off?", "no", stream_time_s=1.0), model="tiny", policy="fifo")
    assert answer_log.count() == 0
    assert runner.invoke(app, ["logs", "on"]).exit_code == 0
    answer_log.log_answer(Answer("while on?", "yes", stream_time_s=2.0), model="tiny", policy="fifo")
    assert [r["question"] for r in answer_log.recent()] == ["while on?"]
    assert runner.invoke(app, ["logs", "path"]).stdout.strip() == str(tmp_path / "hermes-video" / "logs.db")


def test_an_old_schema_log_is_migrated_not_lost(tmp_path, monkeypatch):
    """A file of the first layout (version 1) keeps its rows, gains the new columns, takes new answers."""
    import sqlite3

    from hermes_cli import answer_log
    from hermes_cli.engine.records import Answer

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(answer_log._V1)
        db.execute("INSERT INTO answers (datetime_utc, source, model, policy, question, answer, stream_time_s, ttft_ms) "
                   "VALUES ('2026-01-02T03:04:05+00:00', '/v/old.mp4', 'tiny', 'hermes', 'old question?', 'old answer', 7.5, 12.0)")
        db.execute("PRAGMA user_version = 1")
    db.close()
    monkeypatch.setenv("HERMES_LOGS", str(path))
    listed = runner.invoke(app, ["logs", "--json"])
    assert listed.exit_code == 0, listed.output
    (old,) = json.loads(listed.stdout)
    assert old["question"] == "old question?" and old["stream_time_s"] == 7.5 and old["ttft_ms"] == 12.0
    assert old["tpot_ms"] is None and old["command"] is None  # columns the first layout did not have
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == answer_log.SCHEMA_VERSION
    db.close()
    answer_log.begin("chat", None)
    answer_log.log_answer(Answer("new?", "new", stream_time_s=1.0, tpot_ms=3.0), model="tiny", policy="fifo")
    assert [(r["question"], r["tpot_ms"]) for r in answer_log.recent()] == [("old question?", None), ("new?", 3.0)]


def test_a_log_from_a_newer_hermes_is_refused_in_one_line(tmp_path, monkeypatch):
    import sqlite3

    path = tmp_path / "new.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE answers (id INTEGER PRIMARY KEY)")
        db.execute("PRAGMA user_version = 99")
    db.close()
    done = hermes("logs", HERMES_LOGS=str(path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "schema version 99" in done.stderr and "upgrade hermes-video" in done.stderr


# -- hermes pull: into the hub cache, with progress, resumable; then `hermes models` lists it -----------------
def closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_pull_with_the_hub_unreachable_fails_in_one_line_within_two_seconds(tmp_path):
    import time

    cmd = [sys.executable, "-m", "hermes_cli", "pull", "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"]
    environment = env(HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HOME=str(tmp_path))
    del environment["HF_HUB_OFFLINE"]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=environment, cwd=ROOT)
    elapsed = time.monotonic() - start
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "unreachable (connection refused)" in lines[0] and "HF_ENDPOINT" in lines[0]
    # the probe itself is bounded by 2 s; the rest is Python starting (measured: the whole command)
    assert elapsed < 2 + startup_seconds(), f"took {elapsed:.1f}s"
    offline = hermes("pull", "llava-hf/llava-onevision-qwen2-0.5b-ov-hf", HF_HOME=str(tmp_path))
    assert offline.returncode == 2 and "HF_HUB_OFFLINE is set" in offline.stderr
    assert len(offline.stderr.strip().splitlines()) == 1
    for name, why in (("tiny", "built in"), (str(tmp_path), "local directory"), ("no-slash", "not a hub id")):
        done = hermes("pull", name, HF_HOME=str(tmp_path))
        assert done.returncode == 2 and why in done.stderr, done.stderr


def startup_seconds() -> float:
    """How long `hermes --version` takes here: the part of a command's time that is Python starting."""
    import time

    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "hermes_cli", "--version"], capture_output=True, env=env(), cwd=ROOT,
                   timeout=60, check=True)
    return time.monotonic() - start


def test_pull_from_a_local_hub_downloads_with_progress_resumes_and_models_lists_it(tmp_path):
    from tests.fake_hub import serve_hub

    repo = "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"
    weights = os.urandom(21 * 2**20)  # past huggingface_hub's 10 MiB read size, so a cut-off download has a part
    files = {"config.json": json.dumps({"model_type": "llava_onevision"}).encode(), "model.safetensors": weights,
             "pytorch_model.bin": b"\0" * 1000, "tokenizer/tokenizer.json": b"{}"}
    hub = serve_hub({repo: files}, drop_once={"model.safetensors"})
    try:
        environment = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")}
        done = subprocess.run([sys.executable, "-m", "hermes_cli", "pull", repo], capture_output=True, text=True,
                              timeout=120, cwd=ROOT, env={k: v for k, v in env(**environment).items()
                                                          if k != "HF_HUB_OFFLINE"})
        assert done.returncode == 0, done.stderr
        assert f"pulling {repo}: 3 files, 22.0 MB to download" in done.stderr  # .bin skipped beside safetensors
        assert "Fetching 3 files: 100%" in done.stderr  # the hub's progress bar
        snapshot = tmp_path / "hf" / "hub" / "models--llava-hf--llava-onevision-qwen2-0.5b-ov-hf" / "snapshots"
        (folder,) = snapshot.iterdir()
        assert (folder / "model.safetensors").read_bytes() == weights
        assert (folder / "tokenizer" / "tokenizer.json").exists() and not (folder / "pytorch_model.bin").exists()
        assert hub.ranges and hub.ranges[0][0] == "model.safetensors"  # the cut-off file continued, not restarted
        assert int(hub.ranges[0][1].split("=")[1].rstrip("-")) > 0
        assert f"{repo}: 22.0 MB on disk" in done.stdout

        models = subprocess.run([sys.executable, "-m", "hermes_cli", "models", "--json"], capture_output=True,
                                text=True, timeout=60, cwd=ROOT, env=env(**environment))
        (row,) = [r for r in json.loads(models.stdout)["models"] if r["model"] == repo]
        assert row["present"] and row["size_on_disk_bytes"] == sum(len(files[f]) for f in
                                                                   ("config.json", "model.safetensors",
                                                                    "tokenizer/tokenizer.json"))
        text = subprocess.run([sys.executable, "-m", "hermes_cli", "models"], capture_output=True, text=True,
                              timeout=60, cwd=ROOT, env=env(**environment)).stdout
        assert "yes · 22.0 MB" in text

        again = subprocess.run([sys.executable, "-m", "hermes_cli", "pull", repo], capture_output=True, text=True,
                               timeout=120, cwd=ROOT, env={k: v for k, v in env(**environment).items()
                                                           if k != "HF_HUB_OFFLINE"})
        assert again.returncode == 0 and "0 bytes to download (3 already here)" in again.stderr, again.stderr
        missing = subprocess.run([sys.executable, "-m", "hermes_cli", "pull", "org/missing"], capture_output=True,
                                 text=True, timeout=60, cwd=ROOT, env={k: v for k, v in env(**environment).items()
                                                                       if k != "HF_HUB_OFFLINE"})
        assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
        assert f"org/missing is not on the model hub at {hub.url}" in missing.stderr
    finally:
        hub.stop()


# -- 8. the smaller findings ------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [60, 80])
def test_help_stats_and_policy_wrap_between_words(tiny_llava, width):
    from hermes_cli.app.live import HELP, Assistant, fit, stats_text
    from hermes_cli.engine.session import SessionConfig
    from tests.conftest import moving_square_frames, on_engine

    with on_engine(tiny_llava, "hermes", SessionConfig(chunk_frames=2, max_new_tokens=2)) as stream:
        stream.ingest(moving_square_frames(2), [0.0, 1.0])
        for text in (HELP, stats_text(stream.fresh_stats())):
            fitted = fit(text, width)
            assert all(len(line) <= width for line in fitted.splitlines()), fitted
            assert fitted.split() == text.split()  # the same words, none cut
        written: list[str] = []
        assistant = Assistant(stream, [], write=written.append)
        assistant._columns = lambda: width  # type: ignore[method-assign]  # what the terminal reports
        assistant.ingestor.start()
        try:
            for command in ("/help", "/policy", "/stats"):
                written.clear()
                assistant.command(command)
                assert written and all(len(line) < width for line in "".join(written).splitlines()), (command, written)
        finally:
            assistant.ingestor.stop()


def test_a_narrow_toolbar_keeps_the_cache_before_the_timings(tiny_llava):
    from hermes_cli.app.live import Ingestor, toolbar_text
    from hermes_cli.engine.session import SessionConfig
    from tests.conftest import moving_square_frames, on_engine

    with on_engine(tiny_llava, "hermes", SessionConfig(chunk_frames=2, max_new_tokens=2)) as stream:
        stream.ingest(moving_square_frames(4), [0.0, 1.0, 2.0, 3.0])
        stream.answer("what?")
        bar = toolbar_text(Ingestor(stream, [], lambda message: None), 60)
    assert len(bar) <= 60 and "cache" in bar and "frames" in bar


@pytest.mark.parametrize(("args", "message"), [
    (["--ask", ""], '--ask "" is an empty question'),
    (["--ask", "  "], '--ask "" is an empty question'),
    (["--ask-at", "1:75=hi"], "minutes and seconds after a colon run from 0 to 59"),
    (["--ask-at", "1:61:00=hi"], "minutes and seconds after a colon run from 0 to 59"),
    (["--model", "tiny-foo"], "'tiny-foo' is not a built-in model name; built in: tiny,"),
])
def test_bad_questions_and_names_are_refused_before_loading(video, args, message):
    result = runner.invoke(app, ["watch", video, *(["--ask", "hi"] if "--ask" not in args else []), *args])
    assert result.exit_code != 0 and message in str(result.exception), result.exception


def test_clock_times_still_read():
    from hermes_cli.app.streaming import parse_time

    assert parse_time("1:05") == 65 and parse_time("1:02:03") == 3723 and parse_time("0:59.5") == 59.5


def test_eval_on_a_video_or_an_empty_list_says_what_the_file_is(tmp_path, video):
    result = runner.invoke(app, ["eval", video])
    assert "is not an annotation file: it is not text" in str(result.exception) and "codec" not in str(result.exception)
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    result = runner.invoke(app, ["eval", str(empty)])
    assert "holds no entries" in str(result.exception) and "problems above" not in str(result.exception)


def test_quiet_watch_prints_the_answers_alone(video):
    result = runner.invoke(app, ["watch", video, "--model", "tiny", "--chunk", "4", "--max-new-tokens", "2",
                                 "--ask", "hi", "--ask", "again", "-q"])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2 and "Q (" not in result.stdout and "ttft" not in result.stdout
    assert result.stderr == ""


def test_counts_of_one_are_singular():
    from hermes_cli.cli.console import counted

    assert counted(1, "frame") == "1 frame" and counted(2, "frame") == "2 frames"
    assert counted(1, "entry", "entries") == "1 entry" and counted(0, "entry", "entries") == "0 entries"


def test_bench_help_examples_are_kept_whole_at_80_columns():
    text = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "80"}).stdout
    examples = text[text.index("Examples:"):text.index("Options")]
    assert "hermes bench --model tiny --frames 16,64,256 --policies hermes,full \\\n" in examples
    assert all(len(line) <= 80 for line in examples.splitlines())


def test_chat_takes_no_history():
    result = runner.invoke(app, ["chat", "--help"], env={"COLUMNS": "200"})
    assert "--no-history" in result.stdout and "--no-log" in result.stdout


@pytest.mark.slow
def test_plain_lines_keep_the_questions_in_stdout_and_notices_off_the_prompt(video):
    """`hermes watch clip | tee log` at a terminal: the log holds each question before its answer;
    the end-of-stream notice starts a line of its own instead of running on after the prompt."""
    import pty
    import select
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hermes_cli", "watch", video, "--model", "tiny", "--chunk", "4",
                             "--max-new-tokens", "2"], stdin=slave, stderr=slave, stdout=subprocess.PIPE,
                            env=env(TERM="xterm"), cwd=ROOT)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and b"end of stream" not in seen:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            seen += os.read(master, 65536)
    time.sleep(0.3)
    os.write(master, b"What happens?\n")
    time.sleep(0.5)
    os.write(master, b"\x04")
    try:
        stdout = proc.communicate(timeout=60)[0].decode()
        while select.select([master], [], [], 0.2)[0]:
            try:
                seen += os.read(master, 65536)
            except OSError:
                break
    finally:
        proc.kill()
        os.close(master)
    terminal = seen.decode("utf-8", "replace").replace("\r", "")
    assert proc.returncode == 0, terminal
    lines = stdout.splitlines()
    assert lines[0] == "? What happens?" and len(lines) == 2, stdout
    assert "? » end of stream" not in terminal and "\n» end of stream" in terminal, terminal


def test_models_lists_every_default_model():
    """Each model `hermes watch` may pick by default is in `hermes models` (Qwen3-VL-2B for 7 GiB)."""
    from hermes_cli.models.registry import FAMILIES, GPU_TIERS, SMALL_MODEL

    listed = {m for f in FAMILIES for m in f.examples}
    assert {m for _, names in GPU_TIERS for m in names} | {SMALL_MODEL} <= listed
    rows = json.loads(runner.invoke(app, ["models", "--json"]).stdout)["models"]
    assert "Qwen/Qwen3-VL-2B-Instruct" in {r["model"] for r in rows}


def test_the_bench_comparison_names_the_stream_length_both_policies_reached():
    """After Ctrl-C, hermes may have reached 512 frames and fifo only 16: the ratio is at 16, and says so."""
    from types import SimpleNamespace

    from hermes_cli.bench.runner import ttft_versus
    from hermes_cli.cli.bench import _common_longest

    records = [SimpleNamespace(policy=p, frames=f, ttft_ms=t) for p, f, t in
               (("hermes", 16, 10.0), ("hermes", 512, 11.0), ("fifo", 16, 20.0))]
    assert _common_longest(records, "hermes", "fifo") == 16
    assert ttft_versus(records, "hermes", "fifo") == 0.5  # hermes at 16 against fifo at 16, not at 512


# -- 8, continued: what a file given as a source or a memory actually is --------------------------------
@pytest.mark.parametrize(("path", "kind"), [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_a_device_as_a_source_says_it_is_a_device_not_an_empty_file(path, kind):
    if not os.path.exists(path):
        pytest.skip(f"{path} does not exist here")
    result = runner.invoke(app, ["watch", path, "--model", "tiny", "--ask", "hi"])
    message = str(result.exception)
    assert result.exit_code != 0 and message == (f"{path} is {kind}, not a regular file — name a video file or a URL"), message
    assert "0 bytes" not in message


def test_a_named_pipe_as_a_source_says_it_is_a_pipe(tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    result = runner.invoke(app, ["watch", str(pipe), "--model", "tiny", "--ask", "hi"])
    assert str(result.exception) == f"{pipe} is a named pipe (FIFO), not a regular file — name a video file or a URL"


def test_a_camera_device_as_a_source_points_to_webcam(tmp_path):
    camera = tmp_path / "video7"
    try:  # a character device node (the numbers of /dev/zero) named like a camera
        os.mknod(camera, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("creating a device node needs root")
    result = runner.invoke(app, ["watch", str(camera), "--model", "tiny", "--ask", "hi"])
    assert str(result.exception) == (f"{camera} is a character device, not a regular file — for a camera, run "
                                     f"`hermes chat --webcam {camera}`")


SNAPSHOT_HINT = "load a file that --save-memory, --autosave or /save wrote"


def test_a_pickle_or_foreign_safetensors_as_memory_says_what_the_file_is(tmp_path, video):
    """Each refusal is the line docs/snapshots.md gives: what the file is, and what to load instead."""
    import pickle

    import torch
    from safetensors.torch import save_file

    pickled = tmp_path / "memory.pkl"
    pickled.write_bytes(pickle.dumps({"layers.0.keys": [1.0, 2.0]}))
    saved = tmp_path / "memory.pt"
    torch.save({"x": torch.zeros(2)}, saved)
    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(2), "y": torch.ones(1)}, str(plain))
    weights = tmp_path / "model.safetensors"
    save_file({"x": torch.zeros(2)}, str(weights), {"format": "pt"})
    expected = {
        pickled: "it is a Python pickle, not a safetensors file",
        saved: "it is a zip archive (torch.save writes these), not a safetensors file",
        Path(video): "it is a video file, not a safetensors file",
        plain: "it is a safetensors file without hermes-video's header (no 'format' entry; 2 tensors)",
        weights: "it is a safetensors file of format 'pt' (1 tensor; model weights)",
    }
    for path, what in expected.items():
        result = runner.invoke(app, ["chat", "--memory", str(path)])
        assert str(result.exception) == f"{path} is not a hermes-video memory snapshot: {what} — {SNAPSHOT_HINT}"
    doc = (ROOT / "docs" / "snapshots.md").read_text()
    for what in expected.values():
        assert what.removeprefix("it is ").split(", not")[0].split(" (")[0] in doc, what  # the table names it
    assert SNAPSHOT_HINT in doc


@pytest.fixture(scope="module")
def tiny_memory(tmp_path_factory, video):
    path = tmp_path_factory.mktemp("memory") / "tiny.safetensors"
    result = runner.invoke(app, ["watch", video, "--model", "tiny", "--chunk", "4", "--max-new-tokens", "2",
                                 "--ask", "hi", "--save-memory", str(path), "-q"])
    assert result.exit_code == 0 and path.is_file(), result.output
    return path


@pytest.mark.parametrize("command", ["chat", "watch"])
def test_a_memory_of_another_model_is_refused_before_that_model_loads(tiny_memory, video, tmp_path, command):
    """A hub model that is not cached, offline: refused for the memory, not for the download it would need."""
    model = "Qwen/Qwen2.5-VL-3B-Instruct"
    source = [video, "--ask", "hi"] if command == "watch" else []
    done = hermes(command, *source, "--memory", str(tiny_memory), "--model", model, "-v",
                  HF_HOME=str(tmp_path / "empty-hub"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {tiny_memory} holds the memory of model 'tiny', not '{model}' — load it with --model tiny"]


def test_a_memory_of_another_built_in_model_is_refused_before_it_loads(tiny_memory):
    result = runner.invoke(app, ["chat", "--memory", str(tiny_memory), "--model", "tiny-llava-onevision", "-v"])
    assert str(result.exception) == (f"{tiny_memory} holds the memory of model 'tiny', not 'tiny-llava-onevision' "
                                     "— load it with --model tiny")
    assert "loaded" not in result.stderr and "loading" not in result.stderr
