"""What the command line can learn about the machine and a model name without importing torch.

``hermes models`` and option checks run in a fraction of a second: the GPU is asked through
``nvidia-smi`` (if present) and a model's family is read from its name or its ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..models.registry import (
    BUILTIN,
    FAMILIES,
    family_of_name,
    family_of_type,
    supported_types,
)


def model_type_of_dir(path: Path) -> str | None:
    """The ``model_type`` in a model directory's config.json (None: no readable config)."""
    try:
        return str(json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type") or "") or None
    except (OSError, ValueError, AttributeError):
        return None


def family_of(name: str) -> str | None:
    """The family a model name refers to, when it can be told without loading (else None): a
    built-in, a directory's config.json, else the name (``registry.family_of_name``)."""
    path = Path(name).expanduser()
    if name not in BUILTIN and path.is_dir():
        family = family_of_type(model_type_of_dir(path) or "")
    else:
        family = family_of_name(name)
    return family.name if family else None


def frames_per_unit(family: str | None) -> int:
    """Frames the family encodes together (Qwen-VL: 2 per temporal patch); 1 when unknown."""
    return next((f.frames_per_unit for f in FAMILIES if f.name == family), 1)


def not_a_model_dir(name: str) -> str | None:
    """Why an existing directory cannot be a model (one line), or None if it looks like one."""
    path = Path(name).expanduser()
    if not path.is_dir():
        return None
    if not (path / "config.json").is_file():
        return (f"{name} is a folder but not a model: it has no config.json — pass a folder saved by "
                "save_pretrained or downloaded from the hub, a hub id, or --model tiny")
    model_type = model_type_of_dir(path)
    if model_type is None:
        return f"{name}/config.json cannot be read as a model configuration (no model_type) — check the folder"
    if family_of_type(model_type) is None:
        return f"{name} holds a {model_type!r} model; supported types: {supported_types()}"
    return None
