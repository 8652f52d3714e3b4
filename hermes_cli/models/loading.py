"""Loading models: a hub id, a local directory, or a built-in tiny random-weight model, behind
the adapter its family record names (``families.py``)."""

from __future__ import annotations

from pathlib import Path

import torch

from .base import ModelAdapter
from .placement import dispatch, main_device, max_memory_from_env, pretrained_kwargs
from .registry import (
    BUILTIN,
    WAY_OUT,
    ModelLoadError,
    check_model_name,
    default_model,
    family_named,
    family_of_type,
    supported_types,
)
from .tiny import build_tiny


def pick_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
                "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}: use auto, fp32, bf16 or fp16") from None


def load_model(name: str | None = None, *, device: str | None = None, dtype: str | None = None,
               num_layers: int | None = None, max_positions: int | None = None,
               max_pixels: int | None = None, max_memory: dict | None = None) -> ModelAdapter:
    """Load ``name`` (hub id, local directory, or a tiny built-in) behind its adapter.

    ``max_pixels`` caps each frame's area for Qwen-VL (fewer tokens per frame); LLaVA-OneVision
    always resizes frames to its tower's input. ``device="auto"`` spreads the model over GPUs,
    CPU and disk within ``max_memory`` (or ``HERMES_MAX_MEMORY``; see ``placement``). Raises
    ModelLoadError with one actionable line.
    """
    name = name or default_model()[0]
    check_model_name(name)
    spread = device == "auto"
    if spread:
        max_memory = max_memory or max_memory_from_env()
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    if name in BUILTIN:
        sizes = {k: v for k, v in (("num_layers", num_layers), ("max_positions", max_positions)) if v}
        model, processor = build_tiny(name, **sizes)
        cls = family_named(BUILTIN[name]).adapter_class()
        if dev.type == "cpu":
            torch.set_num_threads(1)  # tiny matrices: more threads only add synchronisation
        if spread:
            adapter = cls(model.to(dtype=dt), processor, name=name, random_weights=True, max_pixels=max_pixels)
            adapter.model, adapter.device_map, adapter.input_device = dispatch(adapter.model, max_memory)
            return adapter
        return cls(model.to(dev, dt), processor, name=name, random_weights=True, max_pixels=max_pixels)
    return _load_pretrained(name, dev, dt, max_pixels, max_memory if spread else None, spread)


def _load_pretrained(name: str, device: torch.device, dtype: torch.dtype, max_pixels: int | None,
                     max_memory: dict | None = None, spread: bool = False) -> ModelAdapter:
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    try:
        config = AutoConfig.from_pretrained(str(Path(name).expanduser()) if Path(name).expanduser().is_dir() else name)
    except Exception as exc:  # hub errors come in many classes; the message is what matters
        raise ModelLoadError(
            f"cannot load model {name!r}: not found locally and not downloadable ({type(exc).__name__}) — {WAY_OUT}"
        ) from exc
    family = family_of_type(config.model_type)
    if family is None:
        raise ModelLoadError(f"{name} is a {config.model_type!r} model; supported types: {supported_types()}")
    try:
        processor = AutoProcessor.from_pretrained(name)
        if spread:
            model = AutoModelForImageTextToText.from_pretrained(name, dtype=dtype, **pretrained_kwargs(max_memory))
        else:
            model = AutoModelForImageTextToText.from_pretrained(name, dtype=dtype)
            model = model.to(device)  # type: ignore[arg-type]  # transformers types .to() too narrowly
    except Exception as exc:
        raise ModelLoadError(f"cannot load weights of {name!r}: {exc}".splitlines()[0]) from exc
    adapter = family.adapter_class()(model, processor, name=name, max_pixels=max_pixels)
    if spread:
        adapter.device_map = dict(getattr(model, "hf_device_map", {}))
        adapter.input_device = main_device(adapter.device_map)
    return adapter
