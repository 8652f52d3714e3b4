"""Every model name the tool knows, and telling what a ``--model`` name refers to — light to import.

Importing torch and transformers takes seconds; a name that cannot work should fail before that.
Everything here is derived from the family records (``families.py``): the built-in random-weight
models, the full-size architectures ``hermes bench`` builds and their other names, the family a
model type or a hub id belongs to; plus the default model for a machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import HermesError
from .families import FAMILIES, Family

# the default on a GPU: (GiB free, models that fit in bf16 with room for the cache, preferred first)
GPU_TIERS = (
    (24, ("Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct")),
    (12, ("Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct")),
    (7, ("Qwen/Qwen3-VL-2B-Instruct",)),
)
SMALL_MODEL = "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"  # no GPU, or a small one

# built-in random-weight models: name -> family
BUILTIN: dict[str, str] = {name: f.name for f in FAMILIES for name in f.builtin}
TINY_NAMES = tuple(BUILTIN)

# full-size architectures for ``hermes bench --arch``, by name: name -> family; other names for each
ARCHS: dict[str, Family] = dict(sorted((arch.name, f) for f in FAMILIES for arch in f.archs))
ARCH_ALIASES: dict[str, str] = {alias: arch.name for f in FAMILIES for arch in f.archs for alias in arch.aliases}


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


def gpu_free_gib() -> float | None:
    """Free memory in GiB of the GPU a model would load on (the first visible one), or None when
    there is none: ``nvidia-smi``'s answer (no torch import), honouring ``CUDA_VISIBLE_DEVICES``;
    torch's when there is no ``nvidia-smi`` and torch is already loaded."""
    tool = shutil.which("nvidia-smi")
    if tool is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.mem_get_info()[0] / 2**30
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = visible.split(",")[0].strip() if visible is not None else "0"
    if not first or first == "-1":
        return None
    try:
        done = subprocess.run([tool, f"--id={first}", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=5)
        return float(done.stdout.split()[0]) / 1024 if done.returncode == 0 and done.stdout.strip() else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def default_model() -> tuple[str, str]:
    """(model id, why) when no model is named: ``HERMES_MODEL`` if set, else the real model that
    fits this machine (``default_for`` its ``gpu_free_gib``). The one place this is decided."""
    if env := model_from_env():
        return env, "from HERMES_MODEL"
    return default_for(gpu_free_gib())


def locally_present(model_id: str) -> bool:
    """Whether a hub id's weights are in the local Hugging Face cache (or the name is a directory)."""
    return Path(model_id).expanduser().is_dir() or in_hub_cache(model_id)


def family_named(name: str) -> Family:
    """The family of this name (KeyError for a name that is none)."""
    return {f.name: f for f in FAMILIES}[name]


def family_of_type(model_type: str) -> Family | None:
    """The family whose adapter serves a transformers ``model_type``."""
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def supported_types() -> str:
    """Every transformers model type some family serves, for messages."""
    return ", ".join(sorted(t for f in FAMILIES for t in f.model_types))


def family_of_name(name: str) -> Family | None:
    """The family a built-in name or hub id belongs to, told from the name alone: a built-in, a
    published checkpoint, or else the longest name pattern all of whose parts the name contains
    (so ``qwen3-vl`` wins over ``qwen``+``vl``). None when no family's pattern fits."""
    if name in BUILTIN:
        return family_named(BUILTIN[name])
    lower = name.lower()
    for family in FAMILIES:
        if lower in (m.lower() for m in family.examples):
            return family
    fits = [(sum(map(len, pattern)), f) for f in FAMILIES for pattern in f.name_patterns
            if all(part in lower for part in pattern)]
    return max(fits, key=lambda fit: fit[0])[1] if fits else None


def resolve_arch(name: str) -> str:
    """The architecture a name or hub id refers to; ModelLoadError listing the choices otherwise."""
    key = name.strip().lower()
    key = ARCH_ALIASES.get(key, key)
    if key not in ARCHS:
        raise ModelLoadError(f"unknown architecture {name!r}; choose one of: {', '.join(ARCHS)}")
    return key


WAY_OUT = "pass a local directory with --model PATH, or try --model tiny"


class ModelLoadError(HermesError):
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
