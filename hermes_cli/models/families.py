"""The model families, one record each: everything the tool knows about a family, in one place.

A family's record names its module under ``hermes_cli.models`` — which holds the adapter class,
``tiny_model(name, num_layers, max_positions)`` (the built-in random-weight models) and
``full_size_model(cfg)`` (a full-size architecture from its shipped configuration) — and owns
its transformers model types, published checkpoints, the name patterns that tell a hub id's
family without loading it, its built-in names and its full-size architectures, whose
configurations ship in ``configs/<family>.json`` (one object per architecture).

The registry (``registry.py``), loading, the built-in and full-size builders, the CLI's name
guesses and help texts all read these records. Adding a family is three files: its module, its
record here, and its ``configs/<family>.json``. Light to import (no torch): the module is
imported only when a model of the family is built.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = ["FAMILIES", "Arch", "Family"]


@dataclass(frozen=True)
class Arch:
    """A full-size architecture ``hermes bench --arch NAME --random-weights`` builds: the
    published model it copies. Its hub id (and the id's last part, without ``-hf``) name it too."""

    name: str
    hub_id: str

    @property
    def aliases(self) -> tuple[str, ...]:
        """Other names that mean this architecture, in lower case."""
        last = self.hub_id.rsplit("/", 1)[-1].lower()
        return tuple(dict.fromkeys((self.hub_id.lower(), last, last.removesuffix("-hf"))))


@dataclass(frozen=True)
class Family:
    """A model family and everything that depends on it (see the module docstring)."""

    name: str
    module: str  # hermes_cli.models.<module>: the adapter, tiny_model, full_size_model
    adapter: str  # the adapter class's name in the module
    model_types: tuple[str, ...]  # transformers ``model_type``s the adapter serves
    examples: tuple[str, ...]  # published checkpoints (``hermes models`` lists them)
    name_patterns: tuple[tuple[str, ...], ...]  # a name containing all of a pattern's parts is the family's
    builtin: tuple[str, ...] = ()  # built-in random-weight models (``tiny_model`` builds each)
    archs: tuple[Arch, ...] = ()  # full-size architectures (configs/<name>.json)
    frames_per_unit: int = 1  # frames encoded together (Qwen-VL: 2 per temporal patch)

    def _attr(self, attr: str) -> Any:
        return getattr(importlib.import_module(f"hermes_cli.models.{self.module}"), attr)

    def adapter_class(self) -> type:
        """The adapter class (imports the family's module, and with it torch)."""
        return self._attr(self.adapter)

    def build_tiny(self, name: str, **sizes: int) -> tuple[Any, Any]:
        """(model, processor) of the built-in ``name`` (one of ``builtin``)."""
        assert name in self.builtin, f"{name} is not a built-in {self.name} model"
        return self._attr("tiny_model")(name, **sizes)

    def build_full_size(self, cfg: dict) -> tuple[Any, Any, type]:
        """(config, processor, model class) of a full-size architecture from its ``arch_config``."""
        return self._attr("full_size_model")(cfg)

    def arch_config(self, arch: str) -> dict:
        """The shipped configuration of one of ``archs`` (a dict as in the model's config.json)."""
        text = resources.files("hermes_cli.models.configs").joinpath(f"{self.name}.json").read_text()
        return json.loads(text)[arch]


FAMILIES = (
    Family(
        "qwen2.5-vl", "qwen_vl", "QwenVLAdapter", ("qwen2_5_vl", "qwen2_vl"),
        ("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2-VL-7B-Instruct"),
        name_patterns=(("qwen", "vl"),),
        builtin=("tiny", "tiny-qwen2.5-vl"),
        archs=(Arch("qwen2.5-vl-3b", "Qwen/Qwen2.5-VL-3B-Instruct"), Arch("qwen2.5-vl-7b", "Qwen/Qwen2.5-VL-7B-Instruct")),
        frames_per_unit=2,
    ),
    Family(
        "llava-onevision", "llava_onevision", "LlavaOneVisionAdapter", ("llava_onevision",),
        ("llava-hf/llava-onevision-qwen2-7b-ov-hf", "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"),
        name_patterns=(("llava-onevision",),),
        builtin=("tiny-llava-onevision",),
        archs=(Arch("llava-onevision-0.5b", "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"),
               Arch("llava-onevision-7b", "llava-hf/llava-onevision-qwen2-7b-ov-hf")),
    ),
    Family(
        "qwen3-vl", "qwen3_vl", "Qwen3VLAdapter", ("qwen3_vl", "qwen3_vl_moe"),
        ("Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-4B-Instruct", "Qwen/Qwen3-VL-2B-Instruct",
         "Qwen/Qwen3-VL-30B-A3B-Instruct"),
        name_patterns=(("qwen3", "vl"),),
        builtin=("tiny-qwen3-vl", "tiny-qwen3-vl-moe"),
        archs=tuple(Arch(f"qwen3-vl-{size}", f"Qwen/Qwen3-VL-{size.upper()}-Instruct") for size in ("2b", "4b", "8b")),
        frames_per_unit=2,
    ),
)
