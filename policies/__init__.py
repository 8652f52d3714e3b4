"""Memory policies: which stream tokens each decoder layer keeps under a budget."""

from __future__ import annotations

import dataclasses

from .base import LayerChoice, LayerTokens, Policy, StreamState, Summary
from .full import FullPolicy

POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (FullPolicy,)}


def make_policy(name: str, **options) -> Policy:
    """Build a policy by name with parameter overrides; unknown names or options raise ValueError."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}") from None
    known = {f.name: f for f in cls.parameters()}
    for key in options:
        if key not in known:
            hint = ", ".join(known) or "none"
            raise ValueError(f"policy {name!r} has no parameter {key!r} (parameters: {hint})")
    return cls(**options)


def parse_option(policy: str, text: str) -> tuple[str, object]:
    """Parse ``KEY=VALUE`` for ``policy``, converting VALUE to the parameter's type."""
    if "=" not in text:
        raise ValueError(f"--policy-opt expects KEY=VALUE, got {text!r}")
    key, raw = (s.strip() for s in text.split("=", 1))
    cls = POLICIES.get(policy)
    if cls is None:
        raise ValueError(f"unknown policy {policy!r}; choose one of: {', '.join(POLICIES)}")
    fields = {f.name: f for f in cls.parameters()}
    if key not in fields:
        raise ValueError(f"policy {policy!r} has no parameter {key!r} (parameters: {', '.join(fields) or 'none'})")
    default = fields[key].default
    try:
        if isinstance(default, bool):
            if raw.lower() not in {"true", "false", "1", "0", "yes", "no", "on", "off"}:
                raise ValueError
            value: object = raw.lower() in {"true", "1", "yes", "on"}
        elif isinstance(default, int):
            value = int(raw)
        elif isinstance(default, float):
            value = float(raw)
        else:
            value = raw
    except ValueError:
        raise ValueError(f"{policy}.{key} expects a {type(default).__name__}, got {raw!r}") from None
    return key, value


__all__ = [
    "POLICIES", "LayerChoice", "LayerTokens", "Policy", "StreamState", "Summary",
    "make_policy", "parse_option", "dataclasses",
]
