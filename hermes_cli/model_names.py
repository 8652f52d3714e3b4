"""Telling what a ``--model`` name refers to, before anything heavy is imported.

Importing torch and transformers takes seconds; a name that cannot work should fail before that.
"""

from __future__ import annotations

import os
from pathlib import Path

TINY_NAMES = ("tiny", "tiny-qwen2.5-vl", "tiny-llava-onevision", "tiny-qwen3-vl", "tiny-qwen3-vl-moe")
WAY_OUT = "pass a local directory with --model PATH, or try --model tiny"


class ModelLoadError(Exception):
    """A model could not be loaded; the message is one line that names the way out."""


def model_from_env() -> str | None:
    """The model named by ``HERMES_MODEL``, if set."""
    return os.environ.get("HERMES_MODEL") or None


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def in_hub_cache(model_id: str) -> bool:
    """Whether the local Hugging Face cache holds this model's config."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:
        return False


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def check_model_name(name: str) -> None:
    """Raise ModelLoadError now for a name that cannot load: a missing directory, or a hub id
    that is not cached while the hub is off (HF_HUB_OFFLINE)."""
    if name in TINY_NAMES:
        return
    path = Path(name).expanduser()
    if path.is_dir():
        return
    if looks_like_path(name):
        raise ModelLoadError(f"no model directory at {name} — pass an existing directory or a hub id")
    if hub_offline() and not in_hub_cache(name):
        raise ModelLoadError(f"cannot load model {name!r}: not in the local cache and HF_HUB_OFFLINE is set — {WAY_OUT}")
