"""The ``hermes`` application: its commands, and one-line errors with the right exit codes."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from rich.markup import escape

from .. import __version__
from ..errors import EXIT_BUG, EXIT_INTERRUPTED, HermesError
from .bench import bench
from .console import DEBUG, err, out, set_verbosity
from .eval import evaluate
from .info import list_models, list_policies
from .logs import logs
from .pull import pull
from .serve import cluster_argv, serve
from .watch import chat, watch

app = typer.Typer(
    name="hermes",
    help=(
        "Ask questions about a video while it streams. The model's KV cache is the memory: "
        "frames are prefilled chunk by chunk, a memory policy keeps the cache under a budget, "
        "and questions are answered from the cache as it is."
    ),
    no_args_is_help=True,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"hermes-video {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only answers and errors (for every command).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Say more about what is loaded (for every command).")] = False,
) -> None:
    """Defaults come from the config file (README: Configuration); options on the line win."""
    set_verbosity(quiet, verbose, reset=True)
    from .config import default_map, load_config

    ctx.default_map = {**default_map(load_config()), **(ctx.default_map or {})}


class _Command(typer.core.TyperCommand):
    """Usage lines as people write them: ``SOURCE`` when required, ``[SOURCE]`` when optional; in
    --help an argument is its metavar alone."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if param.param_type_name == "argument":  # its metavar names it: no `<str>` after it in --help
                param.display_type_rich = lambda ctx: None  # type: ignore[attr-defined]
        return params

    def collect_usage_pieces(self, ctx):
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = (param.metavar or param.name or "").upper()
                pieces.append(name if param.required else f"[{name}]")
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


for _name, _function in (("watch", watch), ("chat", chat), ("models", list_models), ("policies", list_policies),
                         ("bench", bench), ("eval", evaluate), ("serve", serve), ("logs", logs),
                         ("pull", pull)):
    app.command(_name, cls=_Command)(_function)


def main() -> None:
    """Entry point: run the app. The one place errors become exit codes: a ``HermesError`` (from any
    layer) is its one line on stderr and its ``exit_code`` (2 for what the user can fix, 130 after
    Ctrl-C); any other exception is a bug: one line naming it, exit code 1."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from .web import optional_port

    sys.argv[1:] = optional_port(sys.argv[1:])  # `watch --web` with no port
    try:
        sys.argv[1:] = cluster_argv(sys.argv[1:])
        app()
    except HermesError as exc:
        if exc.exit_code == EXIT_INTERRUPTED:
            err.print(escape(str(exc)), soft_wrap=True)
        elif DEBUG["on"]:
            raise
        else:
            err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # a bug: still one line, with the way to the details
        if DEBUG["on"]:
            raise
        from .torch_stack import torch_stack_problem

        if problem := torch_stack_problem():  # the usual cause of errors deep in transformers
            err.print(f"[red]error:[/] {escape(problem)}", soft_wrap=True)
            sys.exit(2)
        err.print(f"[red]internal error:[/] {type(exc).__name__}: {escape(str(exc))} — rerun with --debug "
                  "for the traceback and please report it", soft_wrap=True)
        sys.exit(EXIT_BUG)


if __name__ == "__main__":
    main()
