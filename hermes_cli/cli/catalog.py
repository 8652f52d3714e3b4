"""The memory policies' names, descriptions and parameters, readable without importing torch.

``policies`` imports torch (seconds); ``hermes policies`` and the option checks only need the
catalogue, which is generated from the policies into ``policy_catalog.json`` and kept in step by
``tests/test_docs.py`` (regenerate with ``UPDATE_DOCS=1 pytest tests/test_docs.py``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from .console import UserError

CATALOG = Path(__file__).with_name("policy_catalog.json")
KINDS = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}


def build() -> list[dict]:
    """The catalogue from the policies themselves (imports torch)."""
    from policies import POLICIES

    return [
        {
            "name": name,
            "keeps": cls.description,
            "parameters": [
                {"name": f.name, "default": f.default, "type": type(f.default).__name__,
                 "help": f.metadata.get("help", "")}
                for f in cls.parameters()
            ],
        }
        for name, cls in POLICIES.items()
    ]


@cache
def load() -> list[dict]:
    """The generated catalogue (light)."""
    return json.loads(CATALOG.read_text(encoding="utf-8"))


def check_policy(name: str, options: tuple[str, ...] | list[str]) -> None:
    """A one-line ``UserError`` for an unknown policy, parameter, or a value of the wrong kind.

    Range checks (e.g. a share between 0 and 1) stay with the policy itself.
    """
    entries = {p["name"]: p for p in load()}
    if name not in entries:
        raise UserError(f"unknown policy {name!r}; choose one of: {', '.join(entries)} (see `hermes policies`)")
    params = {p["name"]: p for p in entries[name]["parameters"]}
    for text in options:
        if "=" not in text:
            raise UserError(f"--policy-opt expects KEY=VALUE, got {text!r}")
        key, raw = (s.strip() for s in text.split("=", 1))
        if key not in params:
            raise UserError(f"policy {name!r} has no parameter {key!r} (parameters: {', '.join(params) or 'none'})")
        kind = params[key]["type"]
        if not _fits(kind, raw):
            raise UserError(f"{name}.{key} expects {KINDS.get(kind, kind)}, got {raw!r}")


def _fits(kind: str, raw: str) -> bool:
    if kind == "bool":
        return raw.lower() in {"true", "false", "1", "0", "yes", "no", "on", "off"}
    try:
        {"int": int, "float": float}.get(kind, str)(raw)
    except ValueError:
        return False
    return True
