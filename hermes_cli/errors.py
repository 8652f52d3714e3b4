"""The one error base: every failure the tool reports to a person is a ``HermesError``.

``str()`` of one is a single line that says what went wrong and what to do; ``exit_code`` is the
process's exit status when it ends a command. ``hermes_cli/cli/main.py`` is the one place that
turns them into that line on stderr and that code, so a library error (a source that cannot be
read, a model that cannot load, a snapshot from another setup) needs no conversion on its way up.
No imports: every layer may raise these.
"""

from __future__ import annotations

__all__ = ["EXIT_BUG", "EXIT_INTERRUPTED", "EXIT_USER", "HermesError"]

EXIT_USER = 2  # a problem the user can fix: a bad option, a missing file, a model that cannot load
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C (128 + SIGINT), after saying how far it got
EXIT_BUG = 1  # the program's own fault (also any exception that is not a HermesError)


class HermesError(Exception):
    """A failure reported as one line (``str()``) and ended with ``exit_code``."""

    exit_code: int = EXIT_USER
