"""Option groups: a command declares a few dataclasses; typer sees every field as an option."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from hermes_cli.cli.groups import ModelOptions, OutputOptions, with_option_groups


@dataclass(frozen=True)
class Pace:
    fps: Annotated[float, typer.Option("--fps")] = 1.0
    chunk: Annotated[int, typer.Option("--chunk")] = 16


def test_groups_become_options_and_come_back_as_instances():
    seen = {}

    @with_option_groups
    def command(name: Annotated[str, typer.Argument()], pace: Pace = Pace(), model: ModelOptions = ModelOptions(),
                output: OutputOptions = OutputOptions()) -> None:
        seen.update(name=name, pace=pace, model=model, output=output)

    app = typer.Typer()
    app.command()(command)
    app.command("other")(lambda: None)  # two commands: typer keeps the command name in the usage
    result = CliRunner().invoke(app, ["command", "clip.mp4", "--chunk", "4", "-m", "tiny", "--json"])
    assert result.exit_code == 0, result.output
    assert seen == {"name": "clip.mp4", "pace": Pace(1.0, 4), "model": ModelOptions(model="tiny"),
                    "output": OutputOptions(json_out=True)}
    help_text = CliRunner().invoke(app, ["command", "--help"]).output
    assert help_text.index("--fps") < help_text.index("--chunk") < help_text.index("--model") < help_text.index("--json")


@dataclass(frozen=True)
class Clash:
    json_out: Annotated[bool, typer.Option("--json")] = False


def test_an_option_name_used_twice_is_refused():
    with pytest.raises(TypeError, match="used twice: json_out"):
        @with_option_groups
        def command(clash: Clash = Clash(), output: OutputOptions = OutputOptions()) -> None:
            pass
