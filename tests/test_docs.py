"""docs/cli.md is the `--help` of every command, kept in step with the code.

Regenerate after changing an option: ``UPDATE_DOCS=1 pytest tests/test_docs.py``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from typer.testing import CliRunner

from hermes_cli.cli.main import app
from hermes_cli.settings import reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
COMMANDS = ["watch", "chat", "bench", "eval", "serve", "models", "policies", "logs", "pull"]
HEADER = """# Command-line reference

Generated from `hermes COMMAND --help` (regenerate with `UPDATE_DOCS=1 pytest tests/test_docs.py`).
"""


SETTINGS_INTRO = """Every setting as `hermes_cli/settings.py` declares it. The config-file key is also
written with `_`; top-level keys apply to `watch`, `chat` and `eval`, a `[COMMAND]` table to that
command. Snapshot roles: `memory` shapes the memory (taken from a `--memory` snapshot unless given;
a different value is refused without `--accept-policy`), `inherited` is taken from the snapshot
unless given, `command` belongs to the command that runs."""


def render() -> str:
    runner = CliRunner()
    parts = [HEADER]
    for args in ([], *([c] for c in COMMANDS)):
        result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "100", "TERM": "dumb"}, prog_name="hermes")
        assert result.exit_code == 0, result.output
        title = " ".join(["hermes", *args])
        parts.append(f"## `{title}`\n\n```text\n{result.stdout.rstrip()}\n```\n")
    parts.append(f"## Settings\n\n{SETTINGS_INTRO}\n\n{reference()}\n")
    return "\n".join(parts)


def test_cli_reference_is_up_to_date():
    text = render()
    if os.environ.get("UPDATE_DOCS"):
        DOC.write_text(text)
    assert DOC.exists(), "docs/cli.md is missing: UPDATE_DOCS=1 pytest tests/test_docs.py"
    assert DOC.read_text() == text, "docs/cli.md is stale: UPDATE_DOCS=1 pytest tests/test_docs.py"


def test_readme_mentions_every_command_and_watch_option():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for command in COMMANDS:
        assert f"hermes {command}" in readme
    help_text = CliRunner().invoke(app, ["watch", "--help"], env={"COLUMNS": "200"}).stdout
    for option in set(re.findall(r"(--[a-z][a-z-]+)", help_text)) - {"--help", "--no-history"}:
        assert option in readme, f"README does not mention watch's {option}"
