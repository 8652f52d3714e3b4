"""Loading models: a hub id, a local directory, or a built-in tiny random-weight model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..model_names import TINY_NAMES, WAY_OUT, ModelLoadError, check_model_name, in_hub_cache, model_from_env
from .base import EncodedChunk, ModelAdapter, VideoClock
from .llava_onevision import LlavaOneVisionAdapter
from .placement import dispatch, main_device, max_memory_from_env, pretrained_kwargs
from .qwen3_vl import Qwen3VLAdapter
from .qwen_vl import QwenVLAdapter
from .tiny import tiny_llava_onevision, tiny_qwen, tiny_qwen3_vl

ADAPTERS: dict[str, type[ModelAdapter]] = {
    "qwen2_5_vl": QwenVLAdapter,
    "qwen2_vl": QwenVLAdapter,
    "llava_onevision": LlavaOneVisionAdapter,
    "qwen3_vl": Qwen3VLAdapter,
    "qwen3_vl_moe": Qwen3VLAdapter,
}


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    examples: tuple[str, ...]


FAMILIES = (
    Family("qwen2.5-vl", ("qwen2_5_vl", "qwen2_vl"),
           ("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2-VL-7B-Instruct")),
    Family("llava-onevision", ("llava_onevision",),
           ("llava-hf/llava-onevision-qwen2-7b-ov-hf", "llava-hf/llava-onevision-qwen2-0.5b-ov-hf")),
    Family("qwen3-vl", ("qwen3_vl", "qwen3_vl_moe"),
           ("Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen3-VL-30B-A3B-Instruct")),
)


# (GiB free on the GPU, models that fit in bf16 with room for the cache, preferred first)
GPU_TIERS = (
    (24, ("Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct")),
    (12, ("Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct")),
    (7, ("Qwen/Qwen3-VL-2B-Instruct",)),
)


def default_model() -> tuple[str, str]:
    """(model id, why): ``HERMES_MODEL`` if set, else a real model that fits this machine."""
    if env := model_from_env():
        return env, "from HERMES_MODEL"
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        gib = free / 2**30
        for need, candidates in GPU_TIERS:
            if gib >= need:  # Qwen3-VL first (the paper's best); weights already here win
                chosen = next((m for m in candidates if locally_present(m)), candidates[0])
                return chosen, f"GPU with {gib:.0f} GiB free"
        return "llava-hf/llava-onevision-qwen2-0.5b-ov-hf", f"GPU with only {gib:.0f} GiB free"
    return "llava-hf/llava-onevision-qwen2-0.5b-ov-hf", "no GPU"


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


def locally_present(model_id: str) -> bool:
    """Whether weights for a hub id are in the local Hugging Face cache (or it is a directory)."""
    return Path(model_id).is_dir() or in_hub_cache(model_id)


def load_model(name: str | None = None, *, device: str | None = None, dtype: str | None = None,
               num_layers: int | None = None, max_positions: int | None = None,
               max_pixels: int | None = None, max_memory: dict | None = None) -> ModelAdapter:
    """Load ``name`` (hub id, local directory, or a tiny built-in) behind its adapter.

    ``max_pixels`` caps each frame's area for Qwen-VL (fewer tokens per frame); LLaVA-OneVision
    always resizes frames to its tower's input. Raises ModelLoadError with one actionable line.
    """
    name = name or default_model()[0]
    check_model_name(name)
    spread = device == "auto"  # across GPUs / CPU / disk (placement.py); max_memory or HERMES_MAX_MEMORY
    max_memory = max_memory or (max_memory_from_env() if spread else None)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    if name in TINY_NAMES:
        extra = {k: v for k, v in (("num_layers", num_layers), ("max_positions", max_positions)) if v}
        build, cls = (tiny_llava_onevision, LlavaOneVisionAdapter) if "llava" in name else (tiny_qwen, QwenVLAdapter)
        if "qwen3" in name:
            build, cls = (lambda **kw: tiny_qwen3_vl(moe=name.endswith("-moe"), **kw)), Qwen3VLAdapter
        model, processor = build(**extra)
        if dev.type == "cpu":
            torch.set_num_threads(1)  # tiny matrices: more threads only add synchronisation
        if spread:
            return _spread(cls(model.to(dtype=dt), processor, name=name, random_weights=True, max_pixels=max_pixels),
                           max_memory)
        return cls(model.to(dev, dt), processor, name=name, random_weights=True, max_pixels=max_pixels)
    return _load_pretrained(name, dev, dt, max_pixels, max_memory if spread else None, spread)


def _spread(adapter: ModelAdapter, max_memory: dict | None) -> ModelAdapter:
    """Dispatch a built adapter's model over devices; the adapter feeds inputs to the first one."""
    adapter.model, adapter.device_map, adapter.input_device = dispatch(adapter.model, max_memory)
    return adapter


def _load_pretrained(name: str, device: torch.device, dtype: torch.dtype, max_pixels: int | None,
                     max_memory: dict | None = None, spread: bool = False) -> ModelAdapter:
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor

    try:
        config = AutoConfig.from_pretrained(str(Path(name).expanduser()) if Path(name).expanduser().is_dir() else name)
    except Exception as exc:  # hub errors come in many classes; the message is what matters
        raise ModelLoadError(
            f"cannot load model {name!r}: not found locally and not downloadable ({type(exc).__name__}) — {WAY_OUT}"
        ) from exc
    adapter_cls = ADAPTERS.get(config.model_type)
    if adapter_cls is None:
        supported = ", ".join(sorted(ADAPTERS))
        raise ModelLoadError(f"{name} is a {config.model_type!r} model; supported types: {supported}")
    try:
        processor = AutoProcessor.from_pretrained(name)
        if spread:
            model = AutoModelForImageTextToText.from_pretrained(name, dtype=dtype, **pretrained_kwargs(max_memory))
        else:
            model = AutoModelForImageTextToText.from_pretrained(name, dtype=dtype).to(device)
    except Exception as exc:
        raise ModelLoadError(f"cannot load weights of {name!r}: {exc}".splitlines()[0]) from exc
    adapter = adapter_cls(model, processor, name=name, max_pixels=max_pixels)
    if spread:
        adapter.device_map = dict(model.hf_device_map)
        adapter.input_device = main_device(adapter.device_map)
    return adapter


__all__ = [
    "ADAPTERS", "FAMILIES", "EncodedChunk", "ModelAdapter", "ModelLoadError", "VideoClock",
    "default_model", "load_model", "locally_present", "pick_device", "pick_dtype",
]
