"""One record per model family (hermes_cli/models/families.py): what derives from it, and that
nothing else in the package lists the families."""

from __future__ import annotations

import ast
import json
from importlib import resources
from pathlib import Path

import pytest

from hermes_cli.cli.machine import family_of, frames_per_unit
from hermes_cli.models.families import FAMILIES
from hermes_cli.models.registry import (
    ARCHS,
    BUILTIN,
    TINY_NAMES,
    ModelLoadError,
    family_of_name,
    family_of_type,
    resolve_arch,
)

ROOT = Path(__file__).resolve().parents[1]
FAMILY_MODULES = {f"hermes_cli.models.{family.module}" for family in FAMILIES}


def test_the_registry_lists_are_the_records():
    assert {name: f.name for f in FAMILIES for name in f.builtin} == BUILTIN
    assert tuple(BUILTIN) == TINY_NAMES and "tiny" in TINY_NAMES
    assert sorted(ARCHS) == sorted(arch.name for f in FAMILIES for arch in f.archs)
    for family in FAMILIES:
        for model_type in family.model_types:
            assert family_of_type(model_type) is family
    assert family_of_type("gpt2") is None


def test_every_architecture_has_its_shipped_config_and_only_those_ship():
    shipped = {path.name for path in resources.files("hermes_cli.models.configs").iterdir() if path.name.endswith(".json")}
    assert shipped == {f"{family.name}.json" for family in FAMILIES if family.archs}
    for family in FAMILIES:
        configs = json.loads(resources.files("hermes_cli.models.configs").joinpath(f"{family.name}.json").read_text())
        assert sorted(configs) == sorted(arch.name for arch in family.archs)
        for arch in family.archs:
            assert configs[arch.name]["model_type"] in family.model_types
            assert arch.hub_id in configs[arch.name]["_about"]
            for alias in (arch.name, arch.hub_id, arch.hub_id.upper(), *arch.aliases):
                assert resolve_arch(alias) == arch.name
    with pytest.raises(ModelLoadError, match="choose one of: .*qwen3-vl-8b"):
        resolve_arch("qwen9-vl")


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_names_tell_their_family_without_loading(family):
    for name in (*family.examples, *family.builtin, *(arch.hub_id for arch in family.archs)):
        assert family_of_name(name) is family, name
        assert family_of(name) == family.name
    assert frames_per_unit(family.name) == family.frames_per_unit


def test_the_longest_name_pattern_wins():
    assert family_of("someone/Qwen3-VL-finetune").startswith("qwen3-vl")
    assert family_of("someone/qwen2-vl-finetune") == "qwen2.5-vl"
    assert family_of("someone/llava-onevision-qwen2-72b") == "llava-onevision"
    assert family_of("gpt2") is None and frames_per_unit(None) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", TINY_NAMES)
def test_each_builtin_loads_behind_its_familys_adapter(name):
    """The record's adapter, builder and frames per unit agree with the model it builds."""
    from hermes_cli.models.loading import load_model

    family = family_of_name(name)
    adapter = load_model(name, device="cpu", dtype="fp32", num_layers=2)
    assert isinstance(adapter, family.adapter_class())
    assert adapter.family.startswith(family.name) and adapter.random_weights
    assert adapter.frames_per_unit == family.frames_per_unit
    assert adapter.model.config.model_type in family.model_types


def test_only_the_records_name_the_family_modules():
    """Adding a family is its module, its record and its configs file: no other module of the
    package imports a family's module (a family module may reuse another's helpers)."""
    importers = []
    for path in sorted((ROOT / "hermes_cli").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module in FAMILY_MODULES:
            continue
        package = module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
                target = ".".join([*base, node.module] if node.module else base)
                names = {target, *(f"{target}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                names = {alias.name for alias in node.names}
            else:
                continue
            if names & FAMILY_MODULES:
                importers.append(module)
    assert importers == []


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_each_architecture_builds_its_familys_model(arch):
    """The record's full-size builder makes the real model class from the shipped configuration
    (on the meta device: no memory), and the family's adapter serves its model type."""
    import torch

    family = ARCHS[arch]
    cfg = family.arch_config(arch)
    config, processor, cls = family.build_full_size(cfg)
    with torch.device("meta"):
        model = cls(config)
    assert model.config.model_type in family.model_types
    assert model.config.text_config.num_hidden_layers == cfg["text_config"]["num_hidden_layers"]
    assert processor.tokenizer.convert_tokens_to_ids("<|im_end|>") is not None
