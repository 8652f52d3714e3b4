"""Every model name the tool knows, and telling what a ``--model`` name refers to — light to import.

Importing torch and transformers takes seconds; a name that cannot work should fail before that.
This is the one registry: families (with the transformers model types each adapter serves),
the built-in random-weight models, and the full-size architectures ``hermes bench`` builds.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Family:
    """A model family: its transformers model types and published checkpoints."""

    name: str
    model_types: tuple[str, ...]
    examples: tuple[str, ...]
    frames_per_unit: int = 1  # frames encoded together (Qwen-VL: 2 per temporal patch)


FAMILIES = (
    Family("qwen2.5-vl", ("qwen2_5_vl", "qwen2_vl"),
           ("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2-VL-7B-Instruct"), 2),
    Family("llava-onevision", ("llava_onevision",),
           ("llava-hf/llava-onevision-qwen2-7b-ov-hf", "llava-hf/llava-onevision-qwen2-0.5b-ov-hf")),
    Family("qwen3-vl", ("qwen3_vl", "qwen3_vl_moe"),
           ("Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen3-VL-2B-Instruct",
            "Qwen/Qwen3-VL-30B-A3B-Instruct"), 2),
)

# the default on a GPU: (GiB free, models that fit in bf16 with room for the cache, preferred first)
GPU_TIERS = (
    (24, ("Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct")),
    (12, ("Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct")),
    (7, ("Qwen/Qwen3-VL-2B-Instruct",)),
)
SMALL_MODEL = "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"  # no GPU, or a small one

# built-in random-weight models: name -> family
BUILTIN: dict[str, str] = {
    "tiny": "qwen2.5-vl", "tiny-qwen2.5-vl": "qwen2.5-vl", "tiny-llava-onevision": "llava-onevision",
    "tiny-qwen3-vl": "qwen3-vl", "tiny-qwen3-vl-moe": "qwen3-vl",
}
TINY_NAMES = tuple(BUILTIN)

# full-size architectures for ``hermes bench --arch``: name -> shipped config file
ARCHS: dict[str, str] = {
    "llava-onevision-0.5b": "llava-onevision-qwen2-0.5b-ov.json",
    "llava-onevision-7b": "llava-onevision-qwen2-7b-ov.json",
    "qwen2.5-vl-3b": "qwen2.5-vl-3b.json",
    "qwen2.5-vl-7b": "qwen2.5-vl-7b.json",
    "qwen3-vl-2b": "qwen3-vl-2b.json",
    "qwen3-vl-4b": "qwen3-vl-4b.json",
    "qwen3-vl-8b": "qwen3-vl-8b.json",
}
ARCH_ALIASES: dict[str, str] = {
    "llava-hf/llava-onevision-qwen2-0.5b-ov-hf": "llava-onevision-0.5b",
    "llava-onevision-qwen2-0.5b-ov": "llava-onevision-0.5b",
    "llava-hf/llava-onevision-qwen2-7b-ov-hf": "llava-onevision-7b",
    "llava-onevision-qwen2-7b-ov": "llava-onevision-7b",
    "qwen/qwen2.5-vl-3b-instruct": "qwen2.5-vl-3b",
    "qwen2.5-vl-3b-instruct": "qwen2.5-vl-3b",
    "qwen/qwen2.5-vl-7b-instruct": "qwen2.5-vl-7b",
    "qwen2.5-vl-7b-instruct": "qwen2.5-vl-7b",
    **{f"{prefix}qwen3-vl-{size}-instruct": f"qwen3-vl-{size}" for prefix in ("", "qwen/") for size in ("2b", "4b", "8b")},
}


def default_for(gpu_free_gib: float | None, present: Callable[[str], bool] | None = None) -> tuple[str, str]:
    """(model id, why): the real model that fits a machine with this much free GPU memory (None: no GPU).

    Within a tier Qwen3-VL comes first (the paper's best); a model whose weights are ``present``
    (default: in the local hub cache) wins over one that would be downloaded.
    """
    if gpu_free_gib is None:
        return SMALL_MODEL, "no GPU"
    present = present or locally_present
    for need, candidates in GPU_TIERS:
        if gpu_free_gib >= need:
            chosen = next((m for m in candidates if present(m)), candidates[0])
            return chosen, f"GPU with {gpu_free_gib:.0f} GiB free"
    return SMALL_MODEL, f"GPU with only {gpu_free_gib:.0f} GiB free"


def locally_present(model_id: str) -> bool:
    """Whether a hub id's weights are in the local Hugging Face cache (or the name is a directory)."""
    return Path(model_id).expanduser().is_dir() or in_hub_cache(model_id)


def family_of_type(model_type: str) -> Family | None:
    """The family whose adapter serves a transformers ``model_type``."""
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def resolve_arch(name: str) -> str:
    """The architecture a name or hub id refers to; ModelLoadError listing the choices otherwise."""
    key = name.strip().lower()
    key = ARCH_ALIASES.get(key, key)
    if key not in ARCHS:
        raise ModelLoadError(f"unknown architecture {name!r}; choose one of: {', '.join(ARCHS)}")
    return key


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
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


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
