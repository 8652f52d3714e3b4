"""Turning command-line settings into a source and a session: used by every command.

Settings are checked here, before anything heavy is imported or loaded, so a bad option fails
in well under a second with one line that names the option.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..settings import DTYPES, SettingsGroup, check_value, setting, settings_group
from .console import UserError, err, info, note, quiet, status, verbose
from .torch_stack import check_torch_stack

_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")


@settings_group("model")
class ModelSettings(SettingsGroup):
    """Which model, where, and how large its frames are (model None: HERMES_MODEL, else this machine's default)."""

    def check(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise UserError(f"--dtype must be one of auto, fp32, bf16, fp16; got {self.dtype!r}")
        if self.max_pixels is not None and self.max_pixels < 28 * 28:
            raise UserError(f"--max-pixels must be at least {28 * 28} (one 28×28 patch), got {self.max_pixels}")
        if self.device is not None and not _DEVICE.match(self.device):
            raise UserError(f"--device must be cpu, cuda, cuda:N, mps or auto; got {self.device!r}")

    def name(self) -> str:
        """The model to load: the one given, else HERMES_MODEL, else this machine's default —
        told without importing torch, so checks before loading see the same name."""
        if self.model:
            return self.model
        from ..models.registry import default_model

        return default_model()[0]


@settings_group("memory")
class MemorySettings(SettingsGroup):
    """The memory policy and how the stream fills the memory."""

    def policy_options(self) -> dict:
        from .catalog import parse_options

        return parse_options(self.policy, self.policy_opt)

    def make_policy(self):
        from policies import make_policy

        try:
            return make_policy(self.policy, **self.policy_options())
        except ValueError as exc:
            raise UserError(str(exc)) from exc


@settings_group("answers")
class AnswerSettings(SettingsGroup):
    """How questions are answered."""


GROUPS = {"model": ModelSettings, "memory": MemorySettings, "answers": AnswerSettings}


@dataclass(frozen=True)
class SessionSettings:
    """Everything a session is built from: the settings of the schema's model, memory and answers groups."""

    model: ModelSettings = field(default_factory=ModelSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    answers: AnswerSettings = field(default_factory=AnswerSettings)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> SessionSettings:
        """From setting name → value (names of other groups are ignored; missing ones take their defaults)."""
        return cls(ModelSettings.of(values), MemorySettings.of(values), AnswerSettings.of(values))

    def values(self) -> dict[str, Any]:
        """Setting name → value, for every setting of the three groups."""
        return {**self.model.values(), **self.memory.values(), **self.answers.values()}

    def replace(self, **changes: Any) -> SessionSettings:
        """These settings with ``changes`` (by setting name)."""
        unknown = set(changes) - set(self.values())
        if unknown:
            raise TypeError(f"not session settings: {', '.join(sorted(unknown))}")
        return SessionSettings.of({**self.values(), **changes})

    def config(self):
        """The engine's ``SessionConfig``; a bad value is a one-line ``UserError``."""
        from ..engine.config import SessionConfig

        fields = {}
        try:
            for name, value in self.values().items():
                s = setting(name)
                check_value(s, value)
                if s.field and not (s.or_default and not value):
                    fields[s.field] = value
            return SessionConfig(**fields)
        except ValueError as exc:
            raise UserError(str(exc)) from exc

    def check(self) -> None:
        """Every option that can be checked without loading anything; messages name the option."""
        self.model.check()
        m = self.memory
        self.config()  # budget, chunk, fps, answer length, modes: the engine's own checks
        from .machine import family_of, frames_per_unit

        name = self.model.name()
        per = frames_per_unit(family_of(name))
        if m.chunk % per:
            raise UserError(f"--chunk must be a multiple of {per} for {name} (Qwen-VL encodes frames in pairs), "
                            f"got {m.chunk} — try --chunk {m.chunk + per - m.chunk % per}")
        from .catalog import parse_options

        parse_options(m.policy, m.policy_opt)


def check_model(name: str) -> None:
    """A model name that cannot load fails now (``ModelLoadError``), before torch is imported."""
    from ..models.registry import TINY_NAMES, check_model_name

    if name.startswith("tiny") and name not in TINY_NAMES and "/" not in name:  # a built-in, mistyped
        raise UserError(f"{name!r} is not a built-in model name; built in: {', '.join(TINY_NAMES)}")
    check_model_name(name)


def load_adapter(settings: ModelSettings, *, quiet: bool = False, prepared: bool = False):
    """The model behind its adapter, or a one-line ``UserError`` / ``ModelLoadError``.

    Before anything is downloaded: a folder that is not a model, a GPU that is not there, and an
    unreachable hub (one quick probe) each fail with one line that names the cause (``prepared``:
    the caller ran ``prepare_model`` already, so the hub is not probed twice).
    """
    if not prepared:
        prepare_model(settings)
    name = settings.name()
    check_torch_stack()  # a torchvision built for another torch: one line, not an error deep in transformers
    _check_device(settings.device)
    from ..models.loading import load_model

    with _loading(name):
        adapter = load_model(name, device=settings.device, dtype=settings.dtype, max_pixels=settings.max_pixels)
    info(f"loaded {adapter.name} on {adapter.device}")
    if adapter.random_weights and not quiet:
        note(f"{adapter.name} has random weights: answers are noise (for smoke runs and benchmarks)")
    return adapter


def _loading(name: str):
    """A spinner while a model loads; before a first download, a plain line instead, so that the
    hub's own download bars show (a spinner would swallow them)."""
    import contextlib

    from ..models.registry import TINY_NAMES, hub_offline, in_hub_cache

    if name in TINY_NAMES or Path(name).expanduser().is_dir() or hub_offline() or in_hub_cache(name):
        return status(f"loading {name}…")
    if not quiet():
        from huggingface_hub import constants

        err.print(f"downloading {name} into {constants.HF_HUB_CACHE} (first use only; `hermes models` lists "
                  "what is cached)", soft_wrap=True, highlight=False)
    return contextlib.nullcontext()


def prepare_model(settings: ModelSettings) -> None:
    """Everything about the model that can fail before torch is imported: the name, a folder that
    is not a model, and an unreachable hub (one quick probe) for a model that is not cached."""
    from .hub import probe_hub, quiet_hub_logs, unreachable_message
    from .machine import not_a_model_dir

    name = settings.name()
    check_model(name)
    if why := not_a_model_dir(name):
        raise UserError(why)
    quiet_hub_logs(verbose())
    from ..models.registry import TINY_NAMES, hub_offline, in_hub_cache

    if name in TINY_NAMES or Path(name).expanduser().is_dir() or hub_offline():
        return
    why = probe_hub()
    if why is None:
        return
    if not in_hub_cache(name):
        raise UserError(unreachable_message(name, why))
    os.environ["HF_HUB_OFFLINE"] = "1"  # the cached copy, without retries against a dead hub
    info(f"the model hub is unreachable ({why}): using the cached copy of {name}")


def _check_device(device: str | None) -> None:
    """``--device cuda`` (or mps) on a machine that cannot use it: one line with the cause."""
    if device is None or device in ("auto", "cpu"):
        return
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            cause = ("this PyTorch build has no CUDA support (a CPU-only install)" if torch.version.cuda is None
                     else "no NVIDIA GPU or driver is visible")
            raise UserError(f"--device {device}: {cause} — drop --device (the CPU is used) or pass --device cpu")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise UserError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s) "
                            f"(cuda:0 … cuda:{torch.cuda.device_count() - 1})")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UserError("--device mps: Apple's Metal backend is not available here — drop --device or pass --device cpu")


def start_engine(adapter):
    """The engine core on a loaded model, its thread started (stop it with ``engine.stop()``)."""
    from ..engine.core import Engine

    return Engine(adapter).start()


def open_stream(engine, settings: SessionSettings, *, live: bool = False, name: str | None = None, notifier=None):
    """A new stream on ``engine`` under ``settings``' memory and answer settings: its client
    (``notifier``: --notify's conditions, probed after each chunk)."""
    from ..engine.client import open_stream as open_on

    try:
        return open_on(engine, settings.memory.make_policy(), settings.config(), live=live, name=name,
                       notifier=notifier)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def build_engine(settings: SessionSettings, *, quiet: bool = False, prepared: bool = False):
    """Load the model and start the engine core on it, for ``settings`` already checked
    (``SessionSettings.check``: each command does it once, before it opens anything;
    ``prepared``: see ``load_adapter``)."""
    settings.memory.make_policy()  # value ranges, before the model is loaded
    return start_engine(load_adapter(settings.model, quiet=quiet, prepared=prepared))


def open_frames(spec: str, fps: float, reconnect: str | None = None, **kwargs):
    """Open a frame source (``reconnect``: how long a live source retries after a drop, e.g. 30s),
    or a one-line ``UserError``; notes what the source changes about the request."""
    from ..app.streaming import parse_time
    from ..sources import SourceError, open_source

    try:
        reconnect_s = None if reconnect is None else parse_time(reconnect)
        source = open_source(spec, fps, reconnect_s=reconnect_s, **kwargs)
    except (SourceError, ValueError) as exc:
        from .urls import explain_source_error

        raise UserError(explain_source_error(spec, str(exc))) from exc
    if source.rate_note:
        note(source.rate_note)
    return source
