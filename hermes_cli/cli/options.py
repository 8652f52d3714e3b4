"""Command-line options generated from the settings schema (``hermes_cli/settings.py``; light to import).

``option(setting, command)`` is the typer annotation of one setting as ``command`` takes it:
its flags, value placeholder, help and default come from the schema, ``--policy`` completes
policy names. ``cli/groups.py`` builds the option groups from these.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..settings import Setting


def policy_names(incomplete: str = "") -> list[str]:
    """Shell completion of ``--policy``: the policies whose names start with ``incomplete``."""
    from .catalog import load

    return [p["name"] for p in load() if p["name"].startswith(incomplete)]


def policy_list_names(incomplete: str = "") -> list[str]:
    """Shell completion of a comma-separated list of policies (``--policies``): the last name."""
    head, _, last = incomplete.rpartition(",")
    return [f"{head},{name}" if head else name for name in policy_names(last)]


COMPLETIONS = {"policy": policy_names, "policies": policy_list_names}


def option(s: Setting, command: str | None = None) -> Any:
    """The typer annotation of setting ``s`` as ``command`` takes it."""
    kind: Any = list[str] if s.kind is list else s.kind
    if s.default_for(command) is None:
        kind = kind | None
    extra: dict[str, Any] = {}
    if s.complete:
        extra["autocompletion"] = COMPLETIONS[s.complete]
    if s.kind is not bool:
        extra["metavar"] = s.metavar or s.name.upper()
    return Annotated[kind, typer.Option(*s.flags, help=s.help_for(command), **extra)]
