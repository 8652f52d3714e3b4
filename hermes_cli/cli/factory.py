"""Turning command-line settings into a source and a session: used by every command.

Settings are checked here, before anything heavy is imported or loaded, so a bad option fails
in well under a second with one line that names the option.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import defaults
from .console import UserError, note


@dataclass(frozen=True)
class ModelSettings:
    """Which model, where, and how large its frames are."""

    model: str | None = None  # None: HERMES_MODEL, else the default for this machine
    device: str | None = None
    dtype: str | None = None
    max_pixels: int | None = None

    def check(self) -> None:
        if self.dtype is not None and self.dtype not in defaults.DTYPES:
            raise UserError(f"--dtype must be one of auto, fp32, bf16, fp16; got {self.dtype!r}")
        if self.max_pixels is not None and self.max_pixels < 28 * 28:
            raise UserError(f"--max-pixels must be at least {28 * 28} (one 28×28 patch), got {self.max_pixels}")

    def name(self) -> str:
        """The model to load: the one given, else HERMES_MODEL, else this machine's default."""
        if self.model:
            return self.model
        from ..models.registry import model_from_env

        if env := model_from_env():  # known without importing torch
            return env
        from ..models.loading import default_model

        return default_model()[0]


@dataclass(frozen=True)
class MemorySettings:
    """The memory policy and how the stream fills the memory."""

    policy: str = defaults.POLICY
    budget: int = defaults.BUDGET
    policy_opts: tuple[str, ...] = ()
    fps: float = defaults.FPS
    chunk: int = defaults.CHUNK_FRAMES
    reindex: str = defaults.REINDEX
    pseudo_query: str = defaults.PSEUDO_QUERY

    def policy_options(self) -> dict:
        from policies import parse_option

        try:
            return dict(parse_option(self.policy, o) for o in self.policy_opts)
        except ValueError as exc:
            raise UserError(str(exc)) from exc

    def make_policy(self):
        from policies import make_policy

        try:
            return make_policy(self.policy, **self.policy_options())
        except ValueError as exc:
            raise UserError(str(exc)) from exc


@dataclass(frozen=True)
class AnswerSettings:
    """How questions are answered."""

    max_new_tokens: int = defaults.MAX_NEW_TOKENS
    history: bool = True
    system: str | None = None
    history_tokens: int = defaults.HISTORY_TOKENS


@dataclass(frozen=True)
class SessionSettings:
    """Everything a session is built from."""

    model: ModelSettings = field(default_factory=ModelSettings)
    memory: MemorySettings = field(default_factory=MemorySettings)
    answers: AnswerSettings = field(default_factory=AnswerSettings)

    def config(self):
        """The engine's ``SessionConfig``; a bad value is a one-line ``UserError``."""
        from ..engine.config import SessionConfig

        m = self.memory
        try:
            return SessionConfig(
                budget=m.budget, chunk_frames=m.chunk, fps=m.fps, reindex=m.reindex, pseudo_query=m.pseudo_query,
                max_new_tokens=self.answers.max_new_tokens, history=self.answers.history,
                history_tokens=self.answers.history_tokens,
                system_prompt=self.answers.system or defaults.SYSTEM_PROMPT,
            )
        except ValueError as exc:
            raise UserError(str(exc)) from exc

    def check(self) -> None:
        """Every option that can be checked without loading anything."""
        self.model.check()
        self.config()
        self.memory.make_policy()


def check_model(name: str) -> None:
    """A model name that cannot load fails now, before torch is imported."""
    from ..models.registry import ModelLoadError, check_model_name

    try:
        check_model_name(name)
    except ModelLoadError as exc:
        raise UserError(str(exc)) from exc


def load_adapter(settings: ModelSettings, *, quiet: bool = False):
    """The model behind its adapter, or a one-line ``UserError``."""
    name = settings.name()
    check_model(name)
    from ..models.loading import load_model
    from ..models.registry import ModelLoadError

    try:
        adapter = load_model(name, device=settings.device, dtype=settings.dtype, max_pixels=settings.max_pixels)
    except ModelLoadError as exc:
        raise UserError(str(exc)) from exc
    if adapter.random_weights and not quiet:
        note(f"{adapter.name} has random weights: answers are noise (for smoke runs and benchmarks)")
    return adapter


def new_session(adapter, settings: SessionSettings):
    """A fresh session on a loaded model."""
    from ..engine.session import Session

    try:
        return Session(adapter, settings.memory.make_policy(), settings.config())
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def build_session(settings: SessionSettings, *, quiet: bool = False):
    """Check the settings, load the model and open a session."""
    settings.check()
    check_model(settings.model.name())
    return new_session(load_adapter(settings.model, quiet=quiet), settings)


def open_frames(spec: str, fps: float, **kwargs):
    """Open a frame source, or a one-line ``UserError``."""
    from ..sources import SourceError, open_source

    try:
        return open_source(spec, fps, **kwargs)
    except (SourceError, ValueError) as exc:
        raise UserError(str(exc)) from exc
