"""Memory policies: which stream tokens each decoder layer keeps under a budget."""

from __future__ import annotations

from typing import Any

from .base import LayerChoice, LayerTokens, Policy, StreamState, Summary
from .fifo import FifoPolicy
from .full import FullPolicy
from .hermes import HermesPolicy
from .infinipot import InfiniPotPolicy
from .sink import SinkPolicy
from .uniform import UniformPolicy

KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}  # by parameter type
POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (FullPolicy, FifoPolicy, SinkPolicy, UniformPolicy, InfiniPotPolicy, HermesPolicy)
}


def make_policy(name: str, **options) -> Policy:
    """Build a policy by name with parameter overrides; unknown names, options or types raise ValueError."""
    cls = policy_class(name)
    known = {f.name: f for f in cls.parameters()}
    values = {}
    for key, value in options.items():
        if key not in known:
            raise ValueError(f"policy {name!r} has no parameter {key!r} (parameters: {', '.join(known) or 'none'})")
        check_type(name, key, known[key].default, value)
        convert: Any = type(known[key].default)
        values[key] = convert(value)  # an int given for a float becomes a float
    return cls(**values)


def policy_class(name: str) -> type[Policy]:
    """The registered policy class called ``name``; ValueError listing the choices otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of: {', '.join(POLICIES)}") from None


def check_type(policy: str, key: str, default: object, value: object) -> None:
    """ValueError unless ``value`` has the type of the parameter's default (an int is a valid float)."""
    expected = type(default)
    if expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise ValueError(f"{policy}.{key} expects {KINDS[expected]}, got {value!r}")


__all__ = [
    "POLICIES", "LayerChoice", "LayerTokens", "Policy", "StreamState", "Summary",
    "make_policy",
]
