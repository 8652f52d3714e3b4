"""Option groups: commands take a few dataclasses of related options instead of dozens of parameters.

A group is a dataclass whose fields are annotated with their typer option. ``option_group``
generates one from the settings schema (``hermes_cli/settings.py``): the settings of a group
that a command takes, each as ``options.option`` makes it, after the class's own annotated fields
(options of that command alone). ``with_option_groups`` turns a command whose parameters are
groups into the flat signature typer reads — every field becomes an option, in order — and
hands the command one instance per group.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, get_type_hints

from ..settings import SettingsGroup, settings_group
from .factory import SessionSettings
from .options import option

F = TypeVar("F", bound=Callable[..., Any])


class OptionGroup(SettingsGroup):
    """A group of command-line options generated from the schema."""

    def settings(self) -> SessionSettings:
        """The session settings these options give (the others at their defaults)."""
        return SessionSettings.of(self.values())


def option_group(group: str, command: str = "watch", *, own_first: bool = False):
    """Class decorator: ``group``'s options as ``command`` takes them (see the module docstring)."""
    return settings_group(group, command, annotate=option, own_first=own_first)


@option_group("model")
class ModelOptions(OptionGroup):
    """--model, --device, --dtype, --max-pixels."""


@option_group("memory")
class MemoryOptions(OptionGroup):
    """The memory policy and how the stream fills the memory."""


@option_group("answers")
class AnswerOptions(OptionGroup):
    """--max-new-tokens, --history/--no-history, --history-tokens, --system, --penalise-prompt."""


@option_group("snapshot")
class SnapshotOptions(OptionGroup):
    """Loading, saving and autosaving the memory (docs/snapshots.md)."""


@option_group("source")
class SourceOptions(OptionGroup):
    """How a live source is kept (--reconnect)."""


@option_group("output")
class OutputOptions(OptionGroup):
    """--json, --no-progress (watch), -q, -v, --debug."""


@option_group("output", "chat")
class ChatOutputOptions(OptionGroup):
    """--json, -q, -v, --debug."""


def session_settings(*groups: SettingsGroup) -> SessionSettings:
    """What a session is built from, from its option groups (later groups win)."""
    values: dict[str, Any] = {}
    for group in groups:
        values.update(group.values())
    return SessionSettings.of(values)


def with_option_groups(command: F) -> F:
    """Expand every parameter of ``command`` whose annotation is an option group into the
    group's fields (as typer options, in field order); call ``command`` with the groups built."""
    hints = get_type_hints(command, include_extras=True)
    flat: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for param in inspect.signature(command).parameters.values():
        annotation = hints.get(param.name, param.annotation)
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            field_hints = get_type_hints(annotation, include_extras=True)
            names = []
            for f in dataclasses.fields(annotation):
                flat.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                              annotation=field_hints[f.name]))
                names.append(f.name)
            groups[param.name] = (annotation, names)
        else:  # typer passes every value by name
            flat.append(param.replace(annotation=annotation, kind=inspect.Parameter.KEYWORD_ONLY))
    seen = [p.name for p in flat]
    duplicates = {n for n in seen if seen.count(n) > 1}
    if duplicates:
        raise TypeError(f"{command.__name__}: option names used twice: {', '.join(sorted(duplicates))}")

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        for name, (group, names) in groups.items():
            kwargs[name] = group(**{n: kwargs.pop(n) for n in names})
        return command(**kwargs)

    del run.__wrapped__  # typer must read the flat signature below, not the command's
    run.__signature__ = inspect.Signature(flat)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in flat}
    return run  # type: ignore[return-value]
