"""The memory policies' names, descriptions and parameters, readable without importing torch.

``policies`` imports torch (seconds); ``hermes policies`` and the option checks only need the
catalogue, which is generated from the policies into ``policy_catalog.json`` and kept in step by
``tests/test_first_hour.py`` (regenerate with ``UPDATE_DOCS=1 pytest tests/test_first_hour.py -k catalogue``).
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


BOOLEANS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def parse_options(name: str, options: tuple[str, ...] | list[str]) -> dict[str, object]:
    """``--policy-opt KEY=VALUE`` texts for policy ``name`` as typed parameter values — the one
    parser of these texts (types from the catalogue; an integer given for a number becomes a float).

    A one-line ``UserError`` for an unknown policy, parameter, or a value of the wrong kind; range
    checks (e.g. a share between 0 and 1) stay with the policy itself.
    """
    entries = {p["name"]: p for p in load()}
    if name not in entries:
        raise UserError(f"unknown policy {name!r}; choose one of: {', '.join(entries)} (see `hermes policies`)")
    params = {p["name"]: p for p in entries[name]["parameters"]}
    values: dict[str, object] = {}
    for text in options:
        if "=" not in text:
            raise UserError(f"--policy-opt expects KEY=VALUE, got {text!r}")
        key, raw = (s.strip() for s in text.split("=", 1))
        if key not in params:
            raise UserError(f"policy {name!r} has no parameter {key!r} (parameters: {', '.join(params) or 'none'})")
        kind = params[key]["type"]
        try:
            values[key] = BOOLEANS[raw.lower()] if kind == "bool" else {"int": int, "float": float}.get(kind, str)(raw)
        except (KeyError, ValueError):
            raise UserError(f"{name}.{key} expects {KINDS.get(kind, kind)}, got {raw!r}") from None
    return values
