"""Every setting of a session and of the commands that run one, declared once (no heavy imports).

A ``Setting`` names its type, default, help, command-line flags, option group, config-file key
and its role for memory snapshots. Everything else is generated from ``SETTINGS``: the typer
options and option groups (``cli/options.py``, ``cli/groups.py``), the settings a session is
built from (``cli/factory.py``), the config-file keys (``cli/config.py``), what a snapshot
passes on to a resumed session and checks (``cli/memory.py``, ``engine/snapshot.MEMORY_SETTINGS``),
the benchmark scripts' argparse options, eval's results fingerprint, ``defaults.py`` and the
settings table of docs/cli.md. Adding a setting is one ``Setting(...)`` here and, for an option of
``watch``, its row in the README's options table; a new engine setting also needs its field in
``engine/config.py`` (the engine's own change). ``tests/test_settings.py`` walks the schema.

Snapshot roles:

- ``MEMORY``: shapes what the memory holds. A resumed session takes the snapshot's value unless
  the option is given; a given value that differs is refused (``--accept-policy`` overrides).
- ``INHERITED``: taken from the snapshot unless given (the model, its dtype, the policy and
  its parameters, the system prompt); each is checked by its own rule.
- ``COMMAND``: belongs to the command that runs; a snapshot neither passes it on nor checks it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

MEMORY, INHERITED, COMMAND = "memory", "inherited", "command"
ROLES = (MEMORY, INHERITED, COMMAND)
COMMANDS = ("watch", "chat", "eval", "bench")
GROUPS = ("model", "memory", "answers", "snapshot", "source", "output")
KINDS = (str, int, float, bool, list)  # list: of strings (a repeatable option)

SYSTEM_PROMPT = "You are a helpful assistant."
REINDEX_MODES = ("lazy", "eager", "off")
PSEUDO_QUERY_MODES = ("forward", "approx")
REINDEX_SPACINGS = ("rank", "interval")
DTYPES = ("auto", "fp32", "float32", "bf16", "bfloat16", "fp16", "float16")


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class Use:
    """How one command takes a setting, where it differs from the declaration."""

    default: Any = UNSET
    help: str | None = None


LIVE = {"watch": Use(), "chat": Use()}  # the commands that stream and answer


@dataclass(frozen=True)
class Setting:
    """One setting. ``name`` is the command's parameter, the option group's field and the
    config-file key (``-`` may stand for ``_`` in the file)."""

    name: str
    kind: type  # one of KINDS
    default: Any
    help: str
    group: str  # one of GROUPS ("engine" when no command takes it)
    flags: tuple[str, ...] = ()  # e.g. ("--budget", "-b"); a switch pair as "--x/--no-x"
    metavar: str | None = None  # the value's placeholder in --help (switches have none)
    snapshot: str = COMMAND  # one of ROLES
    field: str | None = None  # the engine's SessionConfig field (None: not an engine setting)
    choices: tuple[str, ...] = ()
    config: bool = True  # settable from the config file
    commands: Mapping[str, Use] = dataclasses.field(default_factory=lambda: dict(LIVE))  # {}: the engine's only
    complete: str | None = None  # "policy": the shell completes policy names
    or_default: bool = False  # an empty value means the engine's default
    fingerprint: bool = True  # part of what an eval result depends on (model, memory and answer settings)
    minimum: int | None = None  # the least value a command accepts (None: the engine checks the range, or none)

    @property
    def flag(self) -> str:
        """The long flag, as messages name it (``--chunk``)."""
        return self.flags[0].split("/")[0] if self.flags else self.name

    def default_for(self, command: str | None = None) -> Any:
        use = self.commands.get(command) if command else None
        return self.default if use is None or use.default is UNSET else use.default

    def help_for(self, command: str | None = None) -> str:
        use = self.commands.get(command) if command else None
        return self.help if use is None or use.help is None else use.help


def _s(name: str, kind: type, default: Any, help: str, group: str, *flags: str, **more: Any) -> Setting:
    return Setting(name, kind, default, help, group, flags, **more)


SETTINGS: tuple[Setting, ...] = (
    # -- the model ------------------------------------------------------------------------------------
    _s("model", str, None, "Hub id, local directory, or 'tiny' / 'tiny-llava-onevision' (random weights). "
       "Default: HERMES_MODEL, else a real model that fits this machine (see `hermes models`).",
       "model", "--model", "-m", metavar="NAME|PATH", snapshot=INHERITED,
       commands={**LIVE, "eval": Use(), "bench": Use(
           default="tiny", help="Hub id, local directory, or 'tiny' / 'tiny-llava-onevision' (random weights).")}),
    _s("device", str, None, "cpu, cuda, cuda:1 …, or auto: spread over GPUs, CPU, disk (default: GPU if present).",
       "model", "--device", metavar="DEVICE", fingerprint=False, commands={**LIVE, "eval": Use(), "bench": Use()}),
    _s("dtype", str, None, "auto, fp32, bf16, fp16 (default: bf16 on GPU, fp32 on CPU).", "model", "--dtype",
       metavar="DTYPE", snapshot=INHERITED, choices=DTYPES, fingerprint=False,
       commands={**LIVE, "eval": Use(), "bench": Use()}),
    _s("max_pixels", int, None, "Qwen-VL: cap each frame's area (fewer tokens per frame), e.g. 200704 (448×448). "
       "Default: the model's own setting. LLaVA-OneVision ignores it.", "model", "--max-pixels", metavar="PIXELS",
       commands={**LIVE, "eval": Use()}),
    # -- the memory -----------------------------------------------------------------------------------
    _s("policy", str, "hermes", "Memory policy (see `hermes policies`).", "memory", "--policy", "-p",
       metavar="NAME", snapshot=INHERITED, complete="policy", commands={**LIVE, "eval": Use()}),
    _s("budget", int, 6000, "Stream tokens kept per layer (the memory cap).", "memory", "--budget", "-b",
       metavar="TOKENS", snapshot=MEMORY, field="budget",
       commands={**LIVE, "eval": Use(4000, "Stream tokens kept per layer (papers: 4000; 6000 for RVS)."),
                 "bench": Use(None, "Stream tokens kept per layer. Default: a quarter of what the longest step "
                              "streams (at least two chunks), so every policy reaches its budget early; the "
                              "choice is printed.")}),
    _s("policy_opt", list, None, "Policy parameter KEY=VALUE (repeatable), e.g. alpha=0.4.", "memory",
       "--policy-opt", metavar="KEY=VALUE", snapshot=INHERITED, commands={**LIVE, "eval": Use()}),
    _s("fps", float, 1.0, "Frames sampled per second of video.", "memory", "--fps", metavar="FPS",
       snapshot=MEMORY, field="fps",
       commands={**LIVE, "eval": Use(help="Frames sampled per second of video (papers: 0.5 for LLaVA-OV, 0.5-1 "
                                     "for Qwen2.5-VL)."), "bench": Use()}),
    _s("chunk", int, 16, "Frames per prefill chunk (even for Qwen-VL).", "memory", "--chunk", metavar="FRAMES",
       snapshot=MEMORY, field="chunk_frames",
       commands={**LIVE, "eval": Use(help="Frames per prefill chunk (papers: 16; even for Qwen-VL)."),
                 "bench": Use()}),
    _s("reindex", str, "lazy", "Position re-indexing: lazy (near the limit), eager (every compression), off.",
       "memory", "--reindex", metavar="MODE", snapshot=MEMORY, field="reindex", choices=REINDEX_MODES,
       commands={**LIVE, "eval": Use(None, "lazy, eager or off. Default: lazy when streaming, eager offline "
                                     "(as in the paper).")}),
    _s("reindex_spacing", str, "rank", "How re-indexing compacts positions: rank (the paper's Eq. 11: dense rank "
       "on every axis) or interval (ours: M-RoPE keeps its temporal spacing).", "memory", "--reindex-spacing",
       metavar="SPACING", snapshot=MEMORY, field="reindex_spacing", choices=REINDEX_SPACINGS,
       commands={**LIVE, "eval": Use()}),
    _s("reindex_margin", int, None, "Lazy re-indexing compacts when the next position passes the model's limit "
       "minus this many positions (default: 1024, or a quarter of the limit for small models).", "memory",
       "--reindex-margin", metavar="POSITIONS", snapshot=MEMORY, field="reindex_margin", minimum=0),
    _s("pseudo_query", str, "approx", "How attention-scored policies (hermes) read attention: approx (the paper's "
       "method: raw embeddings through each layer's norm and projections) or forward (a real forward of the "
       "pseudo-query on the cache).", "memory", "--pseudo-query", metavar="MODE", snapshot=MEMORY,
       field="pseudo_query", choices=PSEUDO_QUERY_MODES, commands={**LIVE, "eval": Use(), "bench": Use()}),
    _s("pseudo_query_history", bool, True, "Pseudo-queries follow the last question and answer even when the prompt "
       "carries no history (the official code's protocol).", "memory",
       "--pseudo-query-history/--no-pseudo-query-history", field="pseudo_query_history",
       commands={**LIVE, "eval": Use()}),
    # -- answering ------------------------------------------------------------------------------------
    _s("max_new_tokens", int, 128, "Longest answer in tokens.", "answers", "--max-new-tokens", metavar="N",
       field="max_new_tokens",
       commands={**LIVE, "eval": Use(None, "Longest answer (default: 16 for multiple choice, 128 open-ended)."),
                 "bench": Use(16, "Tokens per answer (end-of-sequence is ignored, so TPOT is always measured).")}),
    _s("history", bool, True, "Carry earlier questions and answers into each question's prompt (--no-history: "
       "answer each question on its own).", "answers", "--history/--no-history", field="history",
       commands={**LIVE, "eval": Use(False, "Keep earlier questions and answers of a stream in the prompt "
                                     "(default: each question alone, as the benchmarks score them).")}),
    _s("history_tokens", int, 512, "Earlier questions and answers carried in each question's prompt, newest first, "
       "up to N tokens (0: none); keeps the time to first token bounded.", "answers", "--history-tokens",
       metavar="N", field="history_tokens",
       commands={**LIVE, "bench": Use(help="With --questions: earlier turns carried per question, up to N tokens.")}),
    _s("system", str, None, "System prompt.", "answers", "--system", metavar="TEXT", snapshot=INHERITED,
       field="system_prompt", or_default=True),
    _s("penalise_prompt", bool, False, "Repetition penalty over the prompt's tokens too (ours); by default only over "
       "the answer's own tokens, as in the official code.", "answers", "--penalise-prompt", field="penalise_prompt",
       commands={**LIVE, "eval": Use()}),
    _s("repetition_penalty", float, 1.1, "Repetition penalty of the answers.", "answers", field="repetition_penalty",
       commands={}),
    _s("history_kv", bool, True, "Carry earlier turns as kept keys and values, not re-encoded text.", "answers",
       field="history_kv", commands={}),
    # -- snapshots (docs/snapshots.md) ---------------------------------------------------------------------
    _s("memory", str, None, "Start from a saved memory (see --save-memory) and answer from it at once; a source "
       "keeps streaming on top of it (the same file resumes after its last frame). The model and memory settings "
       "not given default to the snapshot's.", "snapshot", "--memory", metavar="FILE", config=False),
    _s("save_memory", str, None, "Write the memory to FILE (safetensors) when the stream ends, or when the prompt "
       "closes; /save [FILE] writes it any time.", "snapshot", "--save-memory", metavar="FILE", config=False),
    _s("autosave", str, None, "Save the memory to FILE every --autosave-every while streaming (atomically: a crash "
       "leaves the last complete snapshot; resume with --memory FILE).", "snapshot", "--autosave", metavar="FILE",
       config=False),
    _s("autosave_every", str, "60s", "Wall-clock interval of --autosave (30s, 5m).", "snapshot", "--autosave-every",
       metavar="TIME", config=False),
    _s("accept_policy", bool, False, "Load a --memory made under another policy, policy parameters or memory "
       "settings, and continue under the ones given here.", "snapshot", "--accept-policy", config=False),
    _s("convert_memory", bool, False, "Convert a --memory saved in another dtype (e.g. bf16 on a GPU) to the "
       "model's dtype instead of refusing it.", "snapshot", "--convert-memory", config=False),
    # -- the source ---------------------------------------------------------------------------------------
    _s("reconnect", str, None, "Live streams and cameras: after a drop, keep reconnecting this long (e.g. 30s, 2m; "
       "0 turns it off). Default: 30s.", "source", "--reconnect", metavar="DURATION", config=False),
    # -- output -------------------------------------------------------------------------------------------
    _s("json_out", bool, False, "Print one JSON object per answer (for scripts).", "output", "--json", config=False,
       commands={**LIVE, "eval": Use(help="Print the summary as JSON on stdout."),
                 "bench": Use(help="Print one JSON record per policy × stream length (details go to stderr).")}),
    _s("no_progress", bool, False, "No progress bar (it is shown on a terminal only).", "output", "--no-progress",
       commands={"watch": Use(), "eval": Use()}),
    _s("quiet_", bool, False, "Only answers and errors: no notes, warnings or progress.", "output", "--quiet", "-q",
       config=False, commands={**LIVE, "eval": Use()}),
    _s("verbose_", bool, False, "Also say what is loaded and from where, with the libraries' own messages.",
       "output", "--verbose", "-v", config=False, commands={**LIVE, "eval": Use()}),
    _s("debug", bool, False, "Show tracebacks instead of one-line errors.", "output", "--debug", config=False,
       commands={**LIVE, "eval": Use(), "bench": Use()}),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
BY_FIELD: dict[str, Setting] = {s.field: s for s in SETTINGS if s.field}


def setting(name: str) -> Setting:
    return BY_NAME[name]


def default(name: str, command: str | None = None) -> Any:
    """The default of ``name`` (as ``command`` takes it)."""
    return BY_NAME[name].default_for(command)


def in_group(group: str, command: str | None = None) -> list[Setting]:
    """The settings of ``group`` (those ``command`` takes, when given), in declaration order."""
    return [s for s in SETTINGS if s.group == group and (command is None or command in s.commands)]


def taken_by(command: str) -> list[Setting]:
    return [s for s in SETTINGS if command in s.commands]


def with_role(role: str) -> list[Setting]:
    return [s for s in SETTINGS if s.snapshot == role]


def fingerprinted(command: str) -> list[Setting]:
    """The settings of ``command`` that its results depend on (a results file records them)."""
    return [s for s in taken_by(command) if s.group in ("model", "memory", "answers") and s.fingerprint]


def memory_fields() -> tuple[str, ...]:
    """The engine fields that shape the memory: a snapshot continues only under the same ones."""
    return tuple(s.field for s in with_role(MEMORY) if s.field)


def check_value(s: Setting, value: Any) -> None:
    """ValueError naming the option when ``value`` is not one of ``s.choices`` or below ``s.minimum``."""
    if s.choices and value is not None and value not in s.choices:
        raise ValueError(f"{s.flag} must be one of {', '.join(s.choices)}, got {value!r}")
    if s.minimum is not None and value is not None and value < s.minimum:
        raise ValueError(f"{s.flag} must be at least {s.minimum}, got {value}")


def reference() -> str:
    """The schema as a Markdown table (docs/cli.md): option, config-file key, snapshot role, commands."""
    rows = ["| setting | option | config-file key | snapshot | engine field | commands |", "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        option = " ".join(f"`{f}`" for f in s.flags) or "—"
        key = f"`{s.name.replace('_', '-')}`" if s.config and s.commands else "—"
        commands = ", ".join(s.commands) or "none (engine only)"
        rows.append(f"| {s.name} | {option} | {key} | {s.snapshot} | {s.field or '—'} | {commands} |")
    return "\n".join(rows)


def add_arguments(parser, defaults: Mapping[str, Any], helps: Mapping[str, str] | None = None) -> None:
    """Add the settings named in ``defaults`` to an ``argparse`` parser, at those defaults, with
    their flags, type and help from the schema (``helps`` overrides a help). For scripts such as
    the soak benchmark; a switch pair becomes ``--x/--no-x``, a list a repeatable option."""
    import argparse

    for name, value in defaults.items():
        s = BY_NAME[name]
        help = (helps or {}).get(name, s.help).replace("%", "%%")
        if s.kind is bool and "/" in s.flags[0]:
            parser.add_argument(s.flags[0].split("/")[0], dest=name, default=value, help=help,
                                action=argparse.BooleanOptionalAction)
        elif s.kind is bool:
            parser.add_argument(*s.flags, dest=name, default=value, help=help, action="store_true")
        else:
            parser.add_argument(*s.flags, dest=name, default=value, help=help, metavar=s.metavar,
                                type=str if s.kind is list else s.kind, action="append" if s.kind is list else None)


# -- groups of settings as plain frozen dataclasses --------------------------------------------------------
class SettingsGroup:
    """Base of a dataclass whose fields are generated from the schema (see ``settings_group``)."""

    GROUP: ClassVar[str] = ""
    COMMAND: ClassVar[str | None] = None

    if TYPE_CHECKING:  # the fields come from the schema
        def __init__(self, **values: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...

    def values(self) -> dict[str, Any]:
        """Field name → value."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def of(cls: type[G], values: Mapping[str, Any]) -> G:
        """An instance from the values it has a field for (the others keep their defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in values.items() if k in names})


G = TypeVar("G", bound=SettingsGroup)


def settings_group(group: str, command: str | None = None, *, annotate=None,
                   settings: Iterable[Setting] | None = None, own_first: bool = False):
    """Class decorator: the frozen dataclass of ``group``'s settings (those ``command`` takes,
    when given), then the class's own annotated fields, if any (``own_first``: those first).
    ``annotate(setting, command)`` gives each field's annotation (default: its plain type). A
    list setting holds a tuple."""

    def build(cls: type[G]) -> type[G]:
        import inspect
        from typing import get_type_hints

        declared = inspect.get_annotations(cls)  # the class's own fields, not its bases'
        own = {k: v for k, v in get_type_hints(cls, include_extras=True).items() if k in declared}
        chosen = list(settings) if settings is not None else in_group(group, command)
        annotations: dict[str, Any] = {}
        for s in chosen:
            annotations[s.name] = annotate(s, command) if annotate else plain_type(s, command)
            setattr(cls, s.name, s.default_for(command))
        cls.__annotations__ = {**own, **annotations} if own_first else {**annotations, **own}
        cls.GROUP, cls.COMMAND = group, command
        lists = [s.name for s in chosen if s.kind is list]
        if annotate is None and lists:  # before dataclass(): its __init__ calls __post_init__ if present
            then = cls.__dict__.get("__post_init__")

            def __post_init__(self) -> None:
                for name in lists:
                    object.__setattr__(self, name, tuple(getattr(self, name) or ()))
                if then is not None:
                    then(self)

            cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
        made = dataclass(frozen=True)(cls)
        return made

    return build


def plain_type(s: Setting, command: str | None = None) -> Any:
    kind: Any = tuple[str, ...] if s.kind is list else s.kind
    return kind | None if s.default_for(command) is None else kind
