"""End to end: ``hermes watch`` under each profile keeps every layer within the budget, and
``hermes policies`` lists the profiles and every new parameter with its default."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hermes_cli.cli.main import app
from tests.media import make_video

runner = CliRunner()


@pytest.fixture(scope="module")
def twenty_seconds(tmp_path_factory):
    path = tmp_path_factory.mktemp("media") / "twenty-seconds.mp4"
    make_video(path, seconds=20, fps=2, size=(160, 120), scene_change_at=10)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny", "tiny-llava-onevision"])
@pytest.mark.parametrize("policy, options", [
    ("hermes", ["profile=paper"]),
    ("hermes", ["profile=reference"]),
    ("hermes", ["smooth_by_identity=true", "fold_old_summary=true", "summary_position_per_axis=true"]),
    ("infinipot", ["profile=paper", "van_pool=true"]),
    ("infinipot", ["profile=reference", "van_pool=true"]),
])
def test_watch_keeps_every_layer_within_the_budget_under_each_profile(twenty_seconds, model, policy, options):
    budget = 40
    args = ["watch", twenty_seconds, "--model", model, "--policy", policy, "--budget", str(budget), "--chunk", "4",
            "--ask", "What changed?", "--max-new-tokens", "2", "--json"]
    for option in options:
        args += ["--policy-opt", option]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    record = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    cache = record["cache"]
    assert record["frames_seen"] == 20  # 1 fps
    assert cache["budget"] == budget and cache["compressions"] >= 3
    assert len(set(cache["tokens_per_layer"])) == 1
    assert max(cache["stream_tokens_per_layer"]) <= budget
    assert max(cache["video_tokens_per_layer"]) <= budget


def test_policies_lists_the_profiles_and_every_new_parameter_with_its_default():
    result = runner.invoke(app, ["policies"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for line in (
        "profile = 'paper' paper: the paper's method",
        "family = 'auto'",
        "smooth_by_identity = False ours:",
        "fold_old_summary = False ours:",
        "summary_position_per_axis = False ours:",
        "rewrite_choices = True",
        "per_head = False every key-value head keeps its own tokens",
    ):
        assert line in text, line
    assert text.count("profile = 'paper'") == 2  # hermes and infinipot
    assert "reference" in text


def test_the_session_switches_are_command_line_options():
    """--reindex-spacing, --pseudo-query-history and --penalise-prompt reach the session's config
    (watch, chat and eval), and a bad spacing is refused before anything loads."""
    from hermes_cli.cli.groups import AnswerOptions, MemoryOptions, ModelOptions, session_settings

    config = session_settings(ModelOptions(), MemoryOptions(reindex_spacing="interval", pseudo_query_history=False),
                              AnswerOptions(penalise_prompt=True)).config()
    assert (config.reindex_spacing, config.pseudo_query_history, config.penalise_prompt) == ("interval", False, True)
    defaults = session_settings(ModelOptions(), MemoryOptions(), AnswerOptions()).config()
    assert (defaults.reindex_spacing, defaults.pseudo_query_history, defaults.penalise_prompt) == ("rank", True, False)
    for command in ("watch", "chat", "eval"):
        text = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        for flag in ("--reindex-spacing", "--pseudo-query-history", "--penalise-prompt"):
            assert flag in text, (command, flag)
    result = runner.invoke(app, ["watch", "clip.mp4", "--model", "tiny", "--reindex-spacing", "wide"])
    assert result.exit_code != 0
    assert "--reindex-spacing must be one of rank, interval" in str(result.exception) + result.output
