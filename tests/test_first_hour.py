"""The first hour of a new user, through the real command line (issue 13).

Subprocesses run `python -m hermes_cli` from this worktree, with stdin, stdout or both on a
pseudo-terminal where the terminal matters; fast checks use typer's runner.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hermes_cli.cli.main import app
from tests.media import json_lines, make_video

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][A-Z0-9]|[=>])")


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("HERMES_MODEL", "HF_HUB_OFFLINE", "HERMES_CONFIG")}
    return {**base, "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": "/nonexistent-hermes-config",
            "OMP_NUM_THREADS": "1", **extra}


def hermes(*args: str, input: str | None = None, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermes_cli", *args], capture_output=True, text=True, input=input,
                          timeout=timeout, env=env(HF_HUB_OFFLINE="1", **extra), cwd=ROOT)


# -- 1. the default model with no hub ------------------------------------------------------------
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_hub_fails_within_five_seconds_with_one_line(video):
    """No --model, nothing cached, the hub endpoint a closed local port: one line naming the ways out."""
    cmd = [sys.executable, "-m", "hermes_cli", "watch", video, "--ask", "hi"]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env(HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HOME="/nonexistent-hf-home"))
    elapsed = time.monotonic() - start
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "unreachable" in lines[0] and "--model PATH" in lines[0] and "--model tiny" in lines[0]
    assert "network" in lines[0] and "Retry" not in done.stderr
    assert elapsed < 5, f"took {elapsed:.1f}s"


def test_hub_probe_honours_hf_endpoint(monkeypatch):
    from hermes_cli.cli.hub import hub_endpoint, probe_hub

    port = closed_port()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}/")
    assert hub_endpoint() == f"http://127.0.0.1:{port}"
    start = time.monotonic()
    assert probe_hub() == "connection refused"
    assert time.monotonic() - start < 2.5


# -- 2. questions piped on stdin ---------------------------------------------------------------------
@pytest.mark.slow
def test_piped_questions_are_answered_in_order_at_the_end_of_a_file(video):
    done = hermes("watch", video, "--model", "tiny", "--chunk", "4", "--max-new-tokens", "2", "--json",
                  input="What is this?\n\nAnd then?\n")
    assert done.returncode == 0, done.stderr
    records = json_lines(done.stdout)
    assert [r["question"] for r in records] == ["What is this?", "And then?"]
    assert all(r["frames_seen"] == 12 for r in records)
    text = hermes("watch", video, "--model", "tiny", "--chunk", "4", "--max-new-tokens", "2", input="First?\n")
    assert text.returncode == 0 and text.stdout.startswith("Q (11.0s, 12 frames): First?\nA: ")
    assert "\x1b" not in text.stdout


# -- 3. interactive with stdout piped; the full prompt at 80 and 200 columns ----------------------------
def read_until(fd: int, needle: str, timeout: float) -> str:
    """Read a pty until the text without escape codes holds ``needle`` (or the time is up)."""
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            for _ in range(chunk.count(b"\x1b[6n")):  # answer cursor position requests, as a terminal does
                os.write(fd, b"\x1b[5;1R")
            data += chunk
            if needle in ANSI.sub("", data.decode("utf-8", "replace")):
                break
    return data.decode("utf-8", "replace")


@pytest.mark.slow
def test_stdout_piped_with_a_terminal_on_stdin_writes_no_escape_codes(video):
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "hermes_cli", "watch", video, "--model", "tiny", "--chunk", "4",
                             "--max-new-tokens", "3"], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env(HF_HUB_OFFLINE="1"), cwd=ROOT)
    os.close(slave)
    try:
        os.write(master, b"What happens?\n/stats\n")
        time.sleep(0.5)
        os.write(master, b"\x04")  # Ctrl-D: end of input
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        os.close(master)
    assert proc.returncode == 0, stderr
    text = stdout.decode()
    assert "\x1b" not in text and "\r" not in text
    assert "stream " in text and "cache " in text  # /stats went to stdout, plainly
    assert "one question per line" in stderr.decode()


def run_prompt(video: str, columns: int) -> str:
    """The full-screen prompt on a pseudo-terminal of ``columns``: ask once, then leave with /quit."""
    import fcntl
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: hermes on the terminal
        os.execve(sys.executable, [sys.executable, "-m", "hermes_cli", "watch", video, "--model", "tiny", "--chunk", "4",
                                   "--max-new-tokens", "2"],
                  env(HF_HUB_OFFLINE="1", COLUMNS=str(columns), LINES="24", TERM="xterm",
                      XDG_STATE_HOME="/tmp/hermes-test-state"))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    try:
        screen = read_until(fd, "end of stream", 120)
        os.write(fd, b"What is there?\r")
        screen += read_until(fd, "TTFT", 60)
        time.sleep(0.5)
        screen += read_until(fd, "\x00", 1)  # a toolbar refresh
        os.write(fd, b"/quit\r")
        screen += read_until(fd, "\x00", 10)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    return ANSI.sub("", screen)


@pytest.mark.slow
@pytest.mark.parametrize("columns", [80, 200])
def test_the_toolbar_fits_the_terminal(video, columns):
    screen = run_prompt(video, columns)
    assert "hermes · tiny · policy hermes" in screen
    assert "12 frames, 12 kept" in screen and "cache " in screen
    assert "TTFT" in screen  # the answer's latency is shown even at 80 columns
    if columns == 200:
        assert "RSS" in screen and "chunk" in screen


def test_the_toolbar_leaves_out_whole_readouts_to_fit(tiny_llava):
    from hermes_cli.app.live import Ingestor, toolbar_text
    from hermes_cli.engine.session import SessionConfig
    from tests.conftest import moving_square_frames, on_engine

    with on_engine(tiny_llava, "full", SessionConfig(chunk_frames=2, budget=None, max_new_tokens=2)) as stream:
        stream.ingest(moving_square_frames(4), [0.0, 1.0, 2.0, 3.0])
        stream.answer("what?")
        ingestor = Ingestor(stream, [], lambda message: None)
        wide, narrow = toolbar_text(ingestor, 200), toolbar_text(ingestor, 80)
    assert len(narrow) <= 80 and "TTFT" in narrow and "frames" in narrow and "cache" in narrow
    assert set(narrow.split(" │ ")) < set(wide.split(" │ "))  # whole readouts left out, none cut
    assert "RSS" in wide and "RSS" not in narrow


# -- 4. Ctrl-C in batch mode -------------------------------------------------------------------------
@pytest.mark.slow
def test_ctrl_c_in_batch_watch_exits_130_with_a_word(video):
    proc = subprocess.Popen([sys.executable, "-m", "hermes_cli", "watch", video, "--model", "tiny", "--realtime",
                             "--ask", "What?"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(HF_HUB_OFFLINE="1"), cwd=ROOT)
    time.sleep(0.2)
    deadline = time.monotonic() + 60
    line = ""
    while "random weights" not in line and time.monotonic() < deadline:  # the model is loaded
        line = proc.stderr.readline()
    time.sleep(2)  # a couple of seconds of the real-time stream
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130
    last = stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"interrupted at \d+\.\d+s of the stream \(\d+ frames read\); 0 of 1 questions answered", last)


@pytest.mark.slow
def test_ctrl_c_in_eval_says_how_many_results_are_saved(tmp_path):
    make_video(tmp_path / "v.mp4", seconds=30, fps=4, size=(96, 64))
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps([{"video_id": "v", "video_path": "v.mp4", "conversations": [
        {"question": f"q{i}?", "choices": ["a", "b"], "answer": "a", "end_time": 2 + i} for i in range(20)]}]))
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "hermes_cli", "eval", str(ann), "--model", "tiny", "--chunk", "2",
                             "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env(HF_HUB_OFFLINE="1"), cwd=ROOT)
    deadline = time.monotonic() + 90
    while (not out.exists() or not out.read_text().count("\n")) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130
    saved = len(out.read_text().splitlines())
    assert 1 <= saved < 20
    assert stderr.strip().splitlines()[-1] == (
        f"interrupted: {saved} results saved in {out} — rerun the same command to resume")


# -- 5. options checked before anything loads ----------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["--budget", "-5"], "--budget must be a positive number of tokens, got -5"),
    (["--policy", "nosuch"], "unknown policy 'nosuch'; choose one of: full, fifo, sink, uniform, infinipot, hermes"),
    (["--chunk", "0"], "--chunk must be at least 1 frame, got 0"),
    (["--chunk", "3", "--model", "tiny"], "--chunk must be a multiple of 2 for tiny"),
    (["--chunk", "3", "--model", "Qwen/Qwen2.5-VL-3B-Instruct"], "--chunk must be a multiple of 2"),
    (["--chunk", "3", "--model", "tiny-qwen3-vl"], "--chunk must be a multiple of 2 for tiny-qwen3-vl"),
    (["--chunk", "3", "--model", "Qwen/Qwen3-VL-2B-Instruct"], "--chunk must be a multiple of 2"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
    (["--max-pixels", "10"], "--max-pixels must be at least 784"),
    (["--fps", "0"], "--fps must be a positive number"),
    (["--device", "gpu"], "--device must be cpu, cuda, cuda:N, mps or auto"),
    (["--policy", "infinipot", "--policy-opt", "alpha=high"], "infinipot.alpha expects a number, got 'high'"),
    (["--policy-opt", "nope=1"], "policy 'hermes' has no parameter 'nope'"),
])
def test_bad_options_fail_before_loading_with_the_option_named(args, message):
    start = time.monotonic()
    result = runner.invoke(app, ["watch", "/no/such/file.mp4", "--ask", "hi", "--model", "tiny", *args])
    assert result.exit_code != 0
    assert message in str(result.exception)
    assert "chunk_frames" not in str(result.exception) and "pseudo_query" not in str(result.exception)
    assert time.monotonic() - start < 2  # nothing was loaded (the missing file is not even opened)


def test_a_folder_that_is_not_a_model_names_the_cause(tmp_path, video):
    result = runner.invoke(app, ["watch", video, "--model", str(tmp_path), "--ask", "hi"])
    assert f"{tmp_path} is a folder but not a model: it has no config.json" in str(result.exception)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    result = runner.invoke(app, ["watch", video, "--model", str(tmp_path), "--ask", "hi"])
    assert "holds a 'bert' model; supported types:" in str(result.exception)


def test_device_cuda_without_a_gpu_names_the_cause(video):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = runner.invoke(app, ["watch", video, "--model", "tiny", "--device", "cuda", "--ask", "hi"])
    message = str(result.exception)
    assert message.startswith("--device cuda: ") and "pass --device cpu" in message
    assert "internal error" not in result.output


def test_ask_at_past_the_end_and_fps_above_the_source_warn(video):
    result = runner.invoke(app, ["watch", video, "--model", "tiny", "--chunk", "4", "--max-new-tokens", "1",
                                 "--ask-at", "99:99=late?", "--fps", "100", "--json"])
    assert result.exit_code == 0, result.output
    assert "warning: --ask-at 6039s is after the end of clip.mp4 (12.0s): 'late?' is answered at the end" in result.stderr
    assert "note: clip.mp4: --fps 100 exceeds the video's 8 fps; every frame is used once, so it gives 8 fps" in result.stderr
    (record,) = json_lines(result.stdout)
    assert record["frames_seen"] == 96  # 12 s at the source's own 8 fps


# -- 6. conventions -----------------------------------------------------------------------------------
def test_short_help_usage_lines_and_completion():
    for command in ("watch", "chat", "eval", "bench", "models", "policies"):
        result = runner.invoke(app, [command, "-h"], prog_name="hermes")
        assert result.exit_code == 0 and result.stdout.startswith(f"Usage: hermes {command} ")
        usage = result.stdout.splitlines()[0]
        assert "{" not in usage and "[[" not in usage
    assert runner.invoke(app, ["watch", "-h"], prog_name="hermes").stdout.splitlines()[0] == \
        "Usage: hermes watch [OPTIONS] SOURCE"
    assert runner.invoke(app, ["chat", "-h"], prog_name="hermes").stdout.splitlines()[0] == \
        "Usage: hermes chat [OPTIONS] [SOURCE]"
    top = runner.invoke(app, ["-h"], prog_name="hermes").stdout
    assert "--install-completion" in top and "--quiet" in top and "--verbose" in top
    watch_help = runner.invoke(app, ["watch", "-h"], env={"COLUMNS": "200"}).stdout
    for option in ("-q, --quiet", "-v, --verbose", "--no-progress", "--json"):
        assert option in watch_help
    assert "--json" in runner.invoke(app, ["chat", "-h"], env={"COLUMNS": "200"}).stdout


def test_quiet_drops_notes(video):
    loud = runner.invoke(app, ["watch", video, "--model", "tiny", "--ask", "hi", "--max-new-tokens", "1"])
    quiet = runner.invoke(app, ["watch", video, "--model", "tiny", "--ask", "hi", "--max-new-tokens", "1", "-q"])
    assert "random weights" in loud.stderr and quiet.stderr == ""
    from hermes_cli.cli.console import VERBOSITY

    VERBOSITY["level"] = 0


def test_config_file_sets_defaults_and_the_command_line_wins(tmp_path, video, monkeypatch):
    config = tmp_path / "hermes-video" / "config.toml"
    config.parent.mkdir()
    config.write_text('model = "tiny"\nbudget = 77\npolicy = "fifo"\n\n[watch]\nchunk = 4\nmax-new-tokens = 1\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("HERMES_MODEL", raising=False)
    result = runner.invoke(app, ["watch", video, "--ask", "hi", "--json"])
    assert result.exit_code == 0, result.output
    (record,) = json_lines(result.stdout)
    assert record["model"] == "tiny" and record["cache"]["budget"] == 77 and record["policy"] == "fifo"
    assert record["answer_tokens"] <= 1
    (record,) = json_lines(runner.invoke(app, ["watch", video, "--ask", "hi", "--json", "--budget", "50"]).stdout)
    assert record["cache"]["budget"] == 50
    config.write_text("budgett = 4\n")
    bad = runner.invoke(app, ["watch", video, "--ask", "hi"])
    assert f"{config}: unknown setting 'budgett'" in str(bad.exception)
    config.write_text('budget = "lots"\n')
    assert "budget must be an integer" in str(runner.invoke(app, ["watch", video]).exception)


def test_config_path_honours_xdg_and_hermes_config(monkeypatch, tmp_path):
    from hermes_cli.cli.config import config_path, default_map

    monkeypatch.delenv("HERMES_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config_path() == tmp_path / "hermes-video" / "config.toml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert config_path() == Path.home() / ".config" / "hermes-video" / "config.toml"
    monkeypatch.setenv("HERMES_CONFIG", str(tmp_path / "x.toml"))
    assert config_path() == tmp_path / "x.toml"
    monkeypatch.setenv("HERMES_MODEL", "tiny-llava-onevision")
    maps = default_map({"model": "tiny", "budget": 5, "bench": {"frames": "64"}})
    assert "model" not in maps["watch"] and maps["eval"]["budget"] == 5 and "budget" not in maps["bench"]


def cli_in_fresh_python(arg_lists: list[list[str]], catch: str = "SystemExit") -> subprocess.CompletedProcess:
    """Run the CLI once per argument list in a new Python (``catch``: the exceptions printed to
    stderr instead of failing the run), then print ``TORCH True/False`` on stderr: whether torch
    got imported. The run itself must succeed."""
    code = ("import sys; from hermes_cli.cli.main import app\n"
            f"for args in {arg_lists!r}:\n"
            "    try: app(args, standalone_mode=False)\n"
            f"    except {catch} as exc: print(type(exc).__name__, exc, file=sys.stderr)\n"
            "print('TORCH', 'torch' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done


def test_models_and_policies_do_not_import_torch():
    done = cli_in_fresh_python([["models"], ["models", "--json"], ["policies"], ["policies", "--json"]])
    assert "TORCH False" in done.stderr
    assert "hermes" in done.stdout and "llava-hf/llava-onevision-qwen2-0.5b-ov-hf" in done.stdout


def test_bench_option_errors_come_before_torch_is_imported():
    """A mistyped `hermes bench` option is refused at once: nothing heavy is imported first."""
    bad = [["--frames", "abc"], ["--policies", "hermes,lru"], ["--budget", "0"], ["--policy-opt-typo"],
           ["--arch", "llava-onevision-0.5b"]]
    done = cli_in_fresh_python([["bench", *args] for args in bad], catch="BaseException")
    assert "TORCH False" in done.stderr, done.stderr
    for needle in ("--frames expects a number", "unknown policy 'lru'", "--budget must be a positive",
                   "No such option", "add --random-weights"):
        assert needle in done.stderr, (needle, done.stderr)


def test_the_policy_catalogue_matches_the_policies():
    """`hermes policies` reads a generated catalogue (no torch); it must say what the policies say."""
    from hermes_cli.cli.catalog import CATALOG, build

    text = json.dumps(build(), indent=1, ensure_ascii=False) + "\n"
    if os.environ.get("UPDATE_DOCS"):
        CATALOG.write_text(text, encoding="utf-8")
    assert CATALOG.read_text(encoding="utf-8") == text, "stale: UPDATE_DOCS=1 pytest tests/test_first_hour.py"


def test_models_table_folds_long_names_at_80_columns():
    result = runner.invoke(app, ["models"], env={"COLUMNS": "80"})
    assert "llava-hf/llava-onevision-qwen2-7b-ov-hf" in result.stdout.replace("│", "").replace(" ", "").replace(
        "\n", "") or "…" not in result.stdout
    assert "…" not in result.stdout


def test_a_url_whose_server_cannot_seek_is_explained(tmp_path, video):
    import http.server
    import threading

    from hermes_cli.cli.urls import explain_source_error
    from tests.media import serve_http

    damaged = "clip.mp4: no video frame could be decoded — the file is empty or damaged"
    handler = type("NoRanges", (http.server.SimpleHTTPRequestHandler,), {
        "__init__": lambda self, *a, **k: http.server.SimpleHTTPRequestHandler.__init__(
            self, *a, directory=str(Path(video).parent), **k),
        "log_message": lambda self, *a: None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/clip.mp4"
        message = explain_source_error(url, damaged)
        assert message.startswith(f"cannot read {url}: the server does not support HTTP range requests")
    finally:
        server.shutdown()
    url, stop = serve_http(video)  # a server that honours ranges: the file's own problem stays
    try:
        assert explain_source_error(url, damaged) == damaged
    finally:
        stop()
    assert explain_source_error("/local/clip.mp4", damaged) == damaged


# -- eval: a default results file, and a summary that counts each question once -------------------------
@pytest.fixture
def reuse_tiny(monkeypatch, tiny_qwen):
    import hermes_cli.models.loading

    real = hermes_cli.models.loading.load_model
    monkeypatch.setattr(hermes_cli.models.loading, "load_model",
                        lambda name=None, **kw: tiny_qwen if name == "tiny" else real(name, **kw))


def test_eval_without_output_saves_next_to_the_annotations_and_counts_once(tmp_path, reuse_tiny):
    make_video(tmp_path / "v.mp4", seconds=4, fps=4, size=(96, 64))
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps([
        {"video_id": "v", "video_path": "v.mp4", "conversations": [
            {"question": "q?", "choices": ["a", "b"], "answer": "a", "end_time": 2}]},
        {"video_id": "gone", "video_path": "gone.mp4", "conversations": [
            {"question": "q2?", "choices": ["a", "b"], "answer": "b", "end_time": 1}]},
    ]))
    args = ["eval", str(ann), "--model", "tiny", "--chunk", "2", "--max-new-tokens", "2"]
    first = runner.invoke(app, [*args, "--json"])
    assert first.exit_code == 0, first.output
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    assert summary["questions"]["answered"] == 1 and summary["questions"]["missing_video"] == 1
    assert summary["questions"]["pending"] == 0  # the missing-video question is not pending too
    (results,) = tmp_path.glob("ann.results-*.jsonl")
    assert len(results.read_text().splitlines()) == 1
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "0 now, 1 from an earlier run" in again.stdout and f"records: {results}" in again.stdout
    other = runner.invoke(app, [*args, "--budget", "99", "--json"])  # other settings: another file
    assert other.exit_code == 0 and len(list(tmp_path.glob("ann.results-*.jsonl"))) == 2


def test_eval_summary_counts_unparsed_replies_among_the_scored_only():
    from hermes_cli.evaluation.runner import eval_summary

    def record(correct, letter):
        return {"kind": "multiple_choice", "correct": correct, "parsed_letter": letter, "task": "t",
                "duration_bucket": "short", "ttft_ms": 1.0, "tpot_ms": 1.0}

    mc = eval_summary([record(None, None), record(False, None), record(True, "A")], selected=3)["multiple_choice"]
    assert mc["n"] == 2 and mc["unparsed"] == 1 and mc["unscored"] == 1


@pytest.mark.slow
def test_batch_answers_print_above_the_progress_bar_on_a_terminal(video):
    """stdout and stderr on one terminal: every answer starts its own line (the bar steps aside)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(sys.executable, [sys.executable, "-m", "hermes_cli", "watch", video, "--model", "tiny", "--chunk", "4",
                                   "--max-new-tokens", "2", "--realtime", "--ask-at", "2s=first?",
                                   "--ask-at", "5s=second?"],
                  env(HF_HUB_OFFLINE="1", COLUMNS="100", TERM="xterm"))
    try:
        screen = read_until(fd, "\x00", 90)  # until the program ends
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    lines = re.split(r"[\r\n]+", ANSI.sub("", screen))
    questions = [line for line in lines if "Q (" in line]
    assert [line.split(": ", 1)[1] for line in questions] == ["first?", "second?"]
    assert all(line.startswith("Q (") for line in questions), questions  # not glued to the bar
    assert any("streaming" in line for line in lines)  # the bar was there
    assert questions[0].startswith("Q (2.0s, 3 frames)") and questions[1].startswith("Q (5.0s, 6 frames)")
    # the bar counts the frames read, as the answer headers do
    assert any(re.search(r"\b5\.0s · 6 frames\b", line) for line in lines)


@pytest.mark.slow
def test_chat_json_answers_a_piped_question_from_the_frames_seen_so_far():
    """A live stream with stdin piped: the question waits for the first frames, flushes the partial
    chunk (16 frames would take 16 s to fill) and is answered; end of input ends the session."""
    from tests.media import serve_mpegts_tcp

    url, thread = serve_mpegts_tcp(seconds=6, fps=10, size=(96, 64), speed=1.0)
    result = runner.invoke(app, ["chat", url, "--model", "tiny-llava-onevision", "--max-new-tokens", "2", "--json"],
                           input="What is live?\n")
    thread.join(30)
    assert result.exit_code == 0, result.output
    (record,) = json_lines(result.stdout)
    assert record["question"] == "What is live?" and not record["no_frames"]
    assert 1 <= record["frames_seen"] < 16 and record["asked_at_s"] == record["stream_time_s"]
