"""``--notify`` end to end on the tiny model: JSON notification objects with every field, the
``--on-notify`` command run with the event, and one-line refusals before anything loads (issue 23)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"notification", "stream_time_s", "frames_seen", "p_yes", "text", "latency_ms"}


def hermes(*args, timeout=180):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "hermes_cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_watch_notify_json_prints_every_field_and_runs_the_command(video, tmp_path):
    out = tmp_path / "event.json"
    script = f"import sys, os, json; open({str(out)!r}, 'w').write(json.dumps([sys.stdin.read(), os.environ['HERMES_NOTIFICATION']]))"
    result = hermes("watch", video, "--model", "tiny", "--chunk", "4", "--fps", "1", "--max-new-tokens", "2",
                    "--notify", "a person enters", "--notify-threshold", "0", "--json", "--ask", "What?",
                    "--on-notify", f"{sys.executable} -c \"{script}\"")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    notes = [r for r in records if "notification" in r]
    answers = [r for r in records if "question" in r]
    assert len(notes) == 1 and len(answers) == 1  # threshold 0: fires at the first probe, once
    note = notes[0]
    assert set(note) == FIELDS and note["notification"] == "a person enters"
    assert note["frames_seen"] == 4 and 0.0 <= note["p_yes"] <= 1.0 and note["latency_ms"] > 0
    stdin, variable = json.loads(out.read_text())
    assert json.loads(stdin) == note and variable == "a person enters"


def test_notify_options_are_checked_before_the_model_loads(video):
    for args, words in ((["--on-notify", "echo hi"], "--notify CONDITION"),
                        (["--notify", "x", "--on-notify", "no-such-program-here"], "--on-notify"),
                        (["--notify", "x", "--notify-threshold", "2"], "--notify-threshold")):
        result = hermes("watch", video, "--model", "tiny", "--ask", "q", *args, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert words in result.stderr and "Traceback" not in result.stderr
