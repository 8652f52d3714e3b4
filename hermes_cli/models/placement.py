"""``--device auto``: one model spread over every visible GPU, then CPU memory, then disk.

accelerate's ``infer_auto_device_map`` assigns whole blocks (decoder layers, vision blocks: the
model's ``_no_split_modules``) to devices in order, within ``max_memory`` per device; what does
not fit goes to the CPU and then to disk (weights loaded block by block as they run). Hooks move
each block's inputs to its device, so the adapter drives the model as on one device; the cache
keeps each layer's keys and values where that layer runs (``StreamLayer`` allocates on the
device of the keys it is given), and policies and re-indexing work on each layer's own tensors.

``max_memory`` maps a device (GPU index, ``"cpu"``) to a size (``"70GiB"`` or bytes); the
environment variable ``HERMES_MAX_MEMORY`` gives it as ``0=70GiB,1=70GiB,cpu=200GiB``. Without it
accelerate balances the model over the GPUs and leaves room for activations.
"""

from __future__ import annotations

import os
import tempfile

import torch

MAX_MEMORY_ENV = "HERMES_MAX_MEMORY"


def parse_max_memory(text: str | None) -> dict | None:
    """``"0=70GiB,cpu=200GiB"`` → ``{0: "70GiB", "cpu": "200GiB"}`` (None for empty)."""
    if not text:
        return None
    budget: dict = {}
    for part in text.split(","):
        device, _, size = part.strip().partition("=")
        if not size:
            raise ValueError(f"{MAX_MEMORY_ENV}: expected DEVICE=SIZE, got {part!r}")
        key = int(device) if device.strip().isdigit() else device.strip()
        budget[key] = int(size) if size.strip().isdigit() else size.strip()
    return budget


def max_memory_from_env() -> dict | None:
    return parse_max_memory(os.environ.get(MAX_MEMORY_ENV))


def main_device(device_map: dict) -> torch.device:
    """Where inputs start: the first GPU the map uses, else the CPU (disk blocks run there)."""
    gpus = sorted(d for d in device_map.values() if isinstance(d, int))
    if gpus:
        return torch.device("cuda", gpus[0])
    named = [d for d in device_map.values() if isinstance(d, str) and d not in ("cpu", "disk")]
    return torch.device(named[0]) if named else torch.device("cpu")


def auto_device_map(model: torch.nn.Module, max_memory: dict | None = None) -> dict:
    """The block → device map accelerate infers for ``model`` within ``max_memory``."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    no_split = list(getattr(model, "_no_split_modules", None) or [])
    if max_memory is None:
        max_memory = get_balanced_memory(model, no_split_module_classes=no_split)
    return infer_auto_device_map(model, max_memory=max_memory, no_split_module_classes=no_split)


def dispatch(model: torch.nn.Module, max_memory: dict | None = None, offload_dir: str | None = None):
    """Spread an already built ``model`` over devices. Returns (model, device map, input device).

    Blocks mapped to ``"disk"`` are written to ``offload_dir`` (a fresh temporary folder if None).
    """
    from accelerate import dispatch_model

    device_map = auto_device_map(model, max_memory)
    if "disk" in device_map.values() and offload_dir is None:
        offload_dir = tempfile.mkdtemp(prefix="hermes-offload-")
    start = main_device(device_map)
    model = dispatch_model(model, device_map=device_map, main_device=start, offload_dir=offload_dir)
    return model, device_map, start


def pretrained_kwargs(max_memory: dict | None = None, offload_dir: str | None = None) -> dict:
    """``from_pretrained`` arguments that place a hub model the same way while loading it."""
    kwargs: dict = {"device_map": "auto"}
    if max_memory is not None:
        kwargs["max_memory"] = max_memory
    kwargs["offload_folder"] = offload_dir or tempfile.mkdtemp(prefix="hermes-offload-")
    return kwargs


def devices_used(device_map: dict) -> list[str]:
    """The distinct devices of a map, in first-use order (for reports)."""
    seen: list[str] = []
    for d in device_map.values():
        name = f"cuda:{d}" if isinstance(d, int) else str(d)
        if name not in seen:
            seen.append(name)
    return seen
