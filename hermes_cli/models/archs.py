"""Full-size random-weight models of real architectures, for benchmarks without weights.

``--arch NAME --random-weights`` builds the real model class from the shipped configuration of a
published model (``hermes_cli/models/configs/<family>.json``: sizes, layers, heads, vocabulary,
rotary and vision-tower facts; no weights; the family's ``full_size_model`` makes the model
class and processor) and fills every weight with seeded random numbers. Speed and memory are
those of the real model; answers are noise. The tokenizer is made on the spot (a
small byte-level BPE with the model's special tokens, whole words for the built-in texts, so the
pseudo-queries have their real length); the model keeps its real vocabulary size, so the
embedding table and the output head have their real cost.
"""

from __future__ import annotations

import torch

from .registry import ARCHS, ModelLoadError, resolve_arch
from .tiny import SEED


def arch_config(name: str) -> dict:
    """The shipped configuration (a dict as in the model's config.json) of an architecture."""
    key = resolve_arch(name)
    return ARCHS[key].arch_config(key)


def build_random_model(name: str, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, processor) of a full-size random-weight model of architecture ``name``.

    Construction skips the library's weight initialisation (slow for billions of weights) and
    then fills every parameter with seeded random numbers in ``dtype`` on ``device``: weights
    N(0, 0.02), norm scales 1, biases 0 — the usual initialisation, done in place and fast.
    """
    from transformers.initialization import no_init_weights

    key = resolve_arch(name)
    cfg = arch_config(key)
    family = ARCHS[key]
    config, processor, cls = family.build_full_size(cfg)
    device = torch.device(device)
    previous = torch.get_default_dtype()
    try:
        with torch.no_grad(), no_init_weights(), torch.device(device):
            torch.set_default_dtype(dtype)
            model = cls(config)
    except torch.OutOfMemoryError as exc:
        raise ModelLoadError(f"{key} does not fit on {device} in {dtype}: {exc}".splitlines()[0]) from exc
    finally:
        torch.set_default_dtype(previous)
    model = model.to(dtype=dtype)
    model.tie_weights()  # skipped with the initialisation: the output head shares the embeddings where tied
    _fill_random(model, SEED)
    model.eval()
    return model, processor


@torch.no_grad()
def _fill_random(model: torch.nn.Module, seed: int) -> None:
    """Seeded in-place initialisation: matrices N(0, 0.02), norm weights 1, other vectors 0."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    norm_types = (torch.nn.LayerNorm,)
    done: set[int] = set()  # tied parameters are filled once
    for module in model.modules():
        is_norm = isinstance(module, norm_types) or "norm" in type(module).__name__.lower()
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in done:
                continue
            done.add(id(p))
            if p.dim() >= 2 and p.device.type == "cpu":
                p.normal_(0.0, 0.02, generator=gen)
            elif p.dim() >= 2:
                # draw on the CPU in float32 chunks (same numbers as on a CPU), then copy
                flat = p.view(-1)
                step = 1 << 24
                for start in range(0, flat.numel(), step):
                    part = torch.empty(min(step, flat.numel() - start), dtype=torch.float32)
                    part.normal_(0.0, 0.02, generator=gen)
                    flat[start : start + part.numel()].copy_(part)
            elif is_norm and pname == "weight":
                p.fill_(1.0)
            else:
                p.zero_()


def load_random_arch(name: str, *, device: str | None = None, dtype: str | None = None):
    """A full-size random-weight model behind its adapter (``random_weights=True``)."""
    from .loading import pick_device, pick_dtype

    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    key = resolve_arch(name)
    family = ARCHS[key]
    hub_id = next(arch.hub_id for arch in family.archs if arch.name == key)
    model, processor = build_random_model(key, device=dev, dtype=dt)
    return family.adapter_class()(model, processor, name=f"{key} (random weights, {hub_id} architecture)",
                                  random_weights=True)
