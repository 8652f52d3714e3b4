"""Where the command line writes: answers and tables on stdout, notes and errors on stderr.

``UserError`` is a problem the user can fix found by the command line (a ``HermesError``: ``main``
prints it as one line, exit code 2).
Verbosity (``-q``/``-v``) is process-wide: quiet drops notes, warnings and progress; verbose
adds what is being loaded and the libraries' own messages.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from rich.console import Console
from rich.markup import escape

from ..errors import EXIT_INTERRUPTED, HermesError

err = Console(stderr=True, highlight=False)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)  # whole tables in files and pipes

DEBUG = {"on": False}  # --debug: tracebacks instead of one-line errors
VERBOSITY = {"level": 0}  # -1 quiet, 0 normal, 1 verbose


class UserError(HermesError):
    """A problem the user can fix found by the command line itself; printed as one line, exit code 2."""


class Interrupted(HermesError):
    """Ctrl-C in a batch command: ``main`` prints the message (how far it got) and exits 130."""

    exit_code = EXIT_INTERRUPTED


def set_debug(on: bool) -> None:
    DEBUG["on"] = on


def set_verbosity(quiet: bool = False, verbose: bool = False, *, reset: bool = False) -> None:
    """-q wins over -v; calling without flags keeps what an outer option (``hermes -q …``) set.

    ``reset``: start from the normal level (each invocation of the app does, first).
    """
    if reset:
        VERBOSITY["level"] = 0
    if quiet:
        VERBOSITY["level"] = -1
    elif verbose:
        VERBOSITY["level"] = 1


def quiet() -> bool:
    return VERBOSITY["level"] < 0


def verbose() -> bool:
    return VERBOSITY["level"] > 0


def note(text: str) -> None:
    if not quiet():
        err.print(f"[yellow]note:[/] {escape(text)}", soft_wrap=True)


def warn(text: str) -> None:
    if not quiet():
        err.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True)


def info(text: str) -> None:
    """A line for --verbose only."""
    if verbose():
        err.print(escape(text), soft_wrap=True)


@contextlib.contextmanager
def status(text: str) -> Iterator[None]:
    """A spinner with ``text`` on a terminal (gone when done); a plain line with --verbose otherwise."""
    if err.is_terminal and not quiet():
        with err.status(escape(text), spinner="dots"):
            yield
        return
    info(text)
    yield
