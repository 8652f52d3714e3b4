"""Where the command line writes: answers and tables on stdout, notes and errors on stderr.

``UserError`` is a problem the user can fix: ``main`` prints it as one line, exit code 2.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

err = Console(stderr=True, highlight=False)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)  # whole tables in files and pipes

DEBUG = {"on": False}  # --debug: tracebacks instead of one-line errors


class UserError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


def set_debug(on: bool) -> None:
    DEBUG["on"] = on


def note(text: str) -> None:
    err.print(f"[yellow]note:[/] {escape(text)}", soft_wrap=True)


def warn(text: str) -> None:
    err.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True)
