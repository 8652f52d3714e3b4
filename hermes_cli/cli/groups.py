"""Option groups: commands take a few dataclasses of related options instead of dozens of parameters.

A group is a dataclass whose fields are annotated with their typer option (``options.py``).
``with_option_groups`` turns a command whose parameters are groups into the flat signature typer
reads — every field becomes an option, in order — and hands the command one instance per group.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, get_type_hints

from .. import defaults
from .factory import AnswerSettings, MemorySettings, ModelSettings, SessionSettings
from .options import (
    AcceptPolicyOpt,
    AutosaveEveryOpt,
    AutosaveOpt,
    BudgetOpt,
    ChunkOpt,
    ConvertMemoryOpt,
    DebugOpt,
    DeviceOpt,
    DtypeOpt,
    FpsOpt,
    HistoryTokensOpt,
    JsonOpt,
    KvBitsOpt,
    MaxNewTokensOpt,
    MaxPixelsOpt,
    MemoryOpt,
    ModelOpt,
    PenalisePromptOpt,
    PolicyOpt,
    PolicyOptsOpt,
    PseudoQueryHistoryOpt,
    PseudoQueryOpt,
    QuietOpt,
    ReindexOpt,
    ReindexSpacingOpt,
    SaveMemoryOpt,
    SystemOpt,
    VerboseOpt,
)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ModelOptions:
    """--model, --device, --dtype, --max-pixels."""

    model: ModelOpt = None
    device: DeviceOpt = None
    dtype: DtypeOpt = None
    max_pixels: MaxPixelsOpt = None

    def settings(self) -> ModelSettings:
        return ModelSettings(self.model, self.device, self.dtype, self.max_pixels)


@dataclass(frozen=True)
class MemoryOptions:
    """The memory policy and how the stream fills the memory."""

    policy: PolicyOpt = defaults.POLICY
    budget: BudgetOpt = defaults.BUDGET
    policy_opt: PolicyOptsOpt = None
    fps: FpsOpt = defaults.FPS
    chunk: ChunkOpt = defaults.CHUNK_FRAMES
    reindex: ReindexOpt = defaults.REINDEX
    reindex_spacing: ReindexSpacingOpt = defaults.REINDEX_SPACING
    pseudo_query: PseudoQueryOpt = defaults.PSEUDO_QUERY
    pseudo_query_history: PseudoQueryHistoryOpt = True
    kv_bits: KvBitsOpt = defaults.KV_BITS

    def settings(self) -> MemorySettings:
        return MemorySettings(self.policy, self.budget, tuple(self.policy_opt or ()), self.fps, self.chunk,
                              self.reindex, self.pseudo_query, self.reindex_spacing, self.pseudo_query_history,
                              self.kv_bits)


@dataclass(frozen=True)
class AnswerOptions:
    """--max-new-tokens, --history-tokens, --system, --penalise-prompt."""

    max_new_tokens: MaxNewTokensOpt = defaults.MAX_NEW_TOKENS
    history_tokens: HistoryTokensOpt = defaults.HISTORY_TOKENS
    system: SystemOpt = None
    penalise_prompt: PenalisePromptOpt = False


@dataclass(frozen=True)
class SnapshotOptions:
    """Loading, saving and autosaving the memory (docs/snapshots.md)."""

    memory: MemoryOpt = None
    save_memory: SaveMemoryOpt = None
    autosave: AutosaveOpt = None
    autosave_every: AutosaveEveryOpt = "60s"
    accept_policy: AcceptPolicyOpt = False
    convert_memory: ConvertMemoryOpt = False


@dataclass(frozen=True)
class OutputOptions:
    """--json, -q, -v, --debug."""

    json_out: JsonOpt = False
    quiet_: QuietOpt = False
    verbose_: VerboseOpt = False
    debug: DebugOpt = False


def session_settings(model: ModelOptions, memory: MemoryOptions, answers: AnswerOptions, *,
                     history: bool = True) -> SessionSettings:
    """What a session is built from, from its option groups."""
    return SessionSettings(model.settings(), memory.settings(),
                           AnswerSettings(answers.max_new_tokens, history, answers.system, answers.history_tokens,
                                          answers.penalise_prompt))


def with_option_groups(command: F) -> F:
    """Expand every parameter of ``command`` whose annotation is an option group into the
    group's fields (as typer options, in field order); call ``command`` with the groups built."""
    hints = get_type_hints(command, include_extras=True)
    flat: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for param in inspect.signature(command).parameters.values():
        annotation = hints.get(param.name, param.annotation)
        if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
            field_hints = get_type_hints(annotation, include_extras=True)
            names = []
            for f in dataclasses.fields(annotation):
                flat.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                              annotation=field_hints[f.name]))
                names.append(f.name)
            groups[param.name] = (annotation, names)
        else:  # typer passes every value by name
            flat.append(param.replace(annotation=annotation, kind=inspect.Parameter.KEYWORD_ONLY))
    seen = [p.name for p in flat]
    duplicates = {n for n in seen if seen.count(n) > 1}
    if duplicates:
        raise TypeError(f"{command.__name__}: option names used twice: {', '.join(sorted(duplicates))}")

    @functools.wraps(command)
    def run(**kwargs: Any) -> Any:
        for name, (group, names) in groups.items():
            kwargs[name] = group(**{n: kwargs.pop(n) for n in names})
        return command(**kwargs)

    del run.__wrapped__  # typer must read the flat signature below, not the command's
    run.__signature__ = inspect.Signature(flat)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in flat}
    return run  # type: ignore[return-value]
