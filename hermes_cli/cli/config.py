"""Defaults from a config file: ``$XDG_CONFIG_HOME/hermes-video/config.toml`` (``~/.config/…``).

Top-level keys set defaults of ``watch``, ``chat`` and ``eval``; a table named after a command
(``[watch]``, ``[chat]``, ``[eval]``, ``[bench]``) sets that command's own. Options on the command
line win over the file, and ``HERMES_MODEL`` wins over its ``model``. ``HERMES_CONFIG`` names
another file. Example::

    model = "Qwen/Qwen2.5-VL-3B-Instruct"
    policy = "hermes"
    budget = 4000

    [watch]
    fps = 0.5
"""

from __future__ import annotations

import os
from pathlib import Path

from ..settings import BY_NAME, COMMANDS, SETTINGS
from .console import UserError

SHARED = ("watch", "chat", "eval")  # top-level keys apply to these
TOML_TYPES: dict[type, type | tuple[type, ...]] = {str: str, int: int, float: (int, float), bool: bool, list: list}


def keys(commands: tuple[str, ...] = COMMANDS) -> dict[str, type | tuple[type, ...]]:
    """Config-file key (a parameter name) → TOML type: the schema's settings that any of
    ``commands`` takes and that the file may set."""
    return {s.name: TOML_TYPES[s.kind] for s in SETTINGS if s.config and any(c in s.commands for c in commands)}



def config_path() -> Path:
    """Where the config file is looked for."""
    if explicit := os.environ.get("HERMES_CONFIG"):
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "hermes-video" / "config.toml"


def _toml_loads(text: str) -> dict:
    try:
        import tomllib  # Python ≥ 3.11
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise UserError("reading config.toml on Python 3.10 needs tomli: pip install tomli") from None
    return tomllib.loads(text)


def load_config(path: Path | None = None) -> dict:
    """The file's settings, checked (empty when there is no file); a bad file is one ``UserError``."""
    path = path or config_path()
    if not path.is_file():
        if os.environ.get("HERMES_CONFIG"):
            raise UserError(f"HERMES_CONFIG names {path}, which is not a file")
        return {}
    try:
        data = _toml_loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the config file {path}: {exc}") from exc
    for key, value in data.items():
        if key in COMMANDS:
            if not isinstance(value, dict):
                raise UserError(f"{path}: [{key}] must be a table of options")
            for sub, subvalue in value.items():
                _check(path, f"{key}.{sub}", sub, subvalue, keys((key,)))
        else:
            _check(path, key, key, value, keys(SHARED))
    return data


def _check(path: Path, where: str, key: str, value: object, known: dict[str, type | tuple[type, ...]]) -> None:
    name = key.replace("-", "_")
    if name not in known:
        raise UserError(f"{path}: unknown setting {where!r}; known: {', '.join(known)}")
    expected = known[name]
    if (isinstance(value, bool) and expected is not bool) or not isinstance(value, expected):
        kind = {str: "a string", int: "an integer", list: "a list of strings", bool: "true or false"}.get(
            expected, "a number") if not isinstance(expected, tuple) else "a number"
        raise UserError(f"{path}: {where} must be {kind}, got {value!r}")


def default_map(data: dict) -> dict[str, dict]:
    """Click's ``default_map`` for each command, from the file's settings."""
    result: dict[str, dict] = {command: {} for command in COMMANDS}
    for key, value in data.items():
        if key not in COMMANDS:
            name = key.replace("-", "_")
            for command in SHARED:
                if name not in BY_NAME or command in BY_NAME[name].commands:
                    result[command][name] = value
    for command in COMMANDS:
        for key, value in (data.get(command) or {}).items():
            result[command][key.replace("-", "_")] = value
    if os.environ.get("HERMES_MODEL"):  # the environment wins over the file
        for command in SHARED:
            result[command].pop("model", None)
    return {command: values for command, values in result.items() if values}
