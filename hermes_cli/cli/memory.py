"""Memory snapshots on the command line: ``--memory``, ``--save-memory``, ``--autosave``.

``MemoryRun`` is what ``watch`` and ``chat`` call: it reads a snapshot before the model loads
(a damaged file fails at once), fills the settings the user did not give from it, restores it
into the new session, makes the source continue the stream, autosaves between frames and
saves at the end. Every problem is a one-line ``HermesError`` (a ``UserError``, or the engine's
``SnapshotError``; exit code 2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..frames import FrameSource, IterableSource, SourceStats
from ..settings import INHERITED, MEMORY, with_role
from .console import UserError, counted, note
from .factory import SessionSettings

if TYPE_CHECKING:
    from ..app.live import SaveTarget
    from ..engine.snapshot import Autosaver
    from .groups import SnapshotOptions

DTYPE_FLAGS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def given_options(ctx) -> set[str]:
    """Parameters of the running command set on the command line or from the environment."""
    # By name: typer ships its own copy of click, with its own ParameterSource enum.
    return {name for name in ctx.params
            if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}


def source_id(spec: str, webcam: bool = False) -> str:
    """How a snapshot names its stream: a file's absolute path, else the spec as given."""
    if webcam:
        return f"webcam:{spec}"
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec


def _option_text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else repr(value) if isinstance(value, float) else str(value)


@dataclass
class MemoryRun:
    """The snapshot options of one command."""

    load: str | None = None
    save: str | None = None
    autosave: str | None = None
    autosave_every: str = "60s"
    accept_policy: bool = False
    convert: bool = False
    quiet: bool = False

    @classmethod
    def from_options(cls, options: SnapshotOptions, *, quiet: bool = False) -> MemoryRun:
        return cls(options.memory, options.save_memory, options.autosave, options.autosave_every,
                   options.accept_policy, options.convert_memory, quiet=quiet)

    def __post_init__(self) -> None:
        from ..app.streaming import parse_time

        try:
            self.every_s = parse_time(self.autosave_every)
        except ValueError as exc:
            raise UserError(f"--autosave-every: {exc}") from None
        for option, path in (("--save-memory", self.save), ("--autosave", self.autosave)):
            if path is not None and not Path(path).expanduser().parent.is_dir():
                raise UserError(f"{option} {path}: folder {Path(path).expanduser().parent} does not exist")
        self.snapshot = None
        self.autosaver: Autosaver | None = None
        self.stream = None
        self.source: str | None = None
        self.save_to: SaveTarget | None = None
        if self.load is not None:
            from ..engine.snapshot import read

            self.snapshot = read(Path(self.load).expanduser())

    def settings(self, settings: SessionSettings, given: set[str]) -> SessionSettings:
        """``settings`` with those the snapshot passes on (schema roles MEMORY and INHERITED) taken
        from it where not ``given``: the model, its dtype, the policy with its parameters (those
        given on top), the memory-shaping settings and the system prompt. A system prompt given
        that differs is refused: its tokens are in the memory."""
        snap = self.snapshot
        if snap is None:
            return settings
        saved = saved_settings(snap)
        current = settings.values()
        changes: dict = {}
        for s in (*with_role(MEMORY), *with_role(INHERITED)):
            if s.name not in saved or s.name not in current:
                continue
            if s.name not in given:
                if saved[s.name] is not None or s.snapshot == INHERITED:
                    changes[s.name] = saved[s.name]
            elif s.snapshot == INHERITED and s.field and current[s.name] != saved[s.name]:
                raise UserError(f"{s.flag} differs from the snapshot's {s.help.rstrip('.').lower()}, which is "
                                f"part of its memory: leave {s.flag} out to keep it")
        if "policy" in given:  # the parameters belong to the snapshot's policy, not to the one given
            changes.pop("policy_opt", None)
        else:  # those given (or from the config file) apply on top of the snapshot's
            changes["policy_opt"] = (*saved["policy_opt"], *current["policy_opt"])
        settings = settings.replace(**changes)
        from ..engine.snapshot import check_model

        # another model given: refused now, not after it has loaded (a download, for a hub model)
        check_model(snap, settings.model.name())
        return settings

    def attach(self, stream, frames, source: str | None):
        """Restore the snapshot into ``stream`` (an engine stream's client) and return the frames
        to stream: a file the snapshot came from resumes after its last frame; another source
        continues the stream time (after the snapshot's queued frames are flushed: its stream
        ended). With --autosave the engine saves the stream after its chunks."""
        from ..app.live import SaveTarget

        self.stream, self.source = stream, source
        snap = self.snapshot
        if snap is not None:
            stream.restore(snap, accept_policy=self.accept_policy, convert_dtype=self.convert)
            if not self.quiet:
                s = stream.fresh_stats()
                note(f"memory from {snap.path}: {counted(s.frames_seen, 'frame')} ({s.stream_time_s:.1f}s), "
                     f"{s.cache.tokens} tokens/layer, {counted(len(stream.history()), 'turn')}")
        target = self.save or self.autosave
        self.save_to = SaveTarget(None if target is None else Path(target).expanduser(), source)
        if self.autosave is not None:
            self.autosaver = stream.autosave(Path(self.autosave).expanduser(), self.every_s, source=source)
        if frames is None:
            return no_frames()
        skip, offset = None, 0.0
        consumed = None if snap is None else snap.consumed_until_s
        if consumed is not None:
            if snap is not None and source is not None and source == snap.source and not frames.is_live:
                skip = consumed
            else:  # another stream: the snapshot's ended, so its queued frames go in now
                stream.flush()
                offset = consumed + 1.0 / stream.config.fps
        if skip is None and not offset:
            return frames
        return ContinuedFrames(frames, skip_until_s=skip, offset_s=offset)

    def finish(self) -> None:
        """At the end of the stream (or when the prompt closes): --save-memory, and a last autosave."""

        if self.stream is None:
            return
        for path in dict.fromkeys(p for p in (self.save, self.autosave) if p is not None):
            report = self.stream.save(Path(path).expanduser(), source=self.source)
            if not self.quiet:
                note(f"memory saved to {report.path} ({report.bytes / 2**20:.1f} MiB)")


class ContinuedFrames:
    """A frame source seen through a restored stream: frames up to ``skip_until_s`` are dropped
    (they are in the memory already), the rest shifted by ``offset_s``."""

    def __init__(self, frames: FrameSource, *, skip_until_s: float | None = None, offset_s: float = 0.0):
        self._frames = frames
        self.skip_until_s = skip_until_s
        self.offset_s = offset_s


    def __iter__(self):
        for frame in self._frames:
            if self.skip_until_s is not None and frame.timestamp <= self.skip_until_s + 1e-9:
                continue
            yield dataclasses.replace(frame, timestamp=frame.timestamp + self.offset_s) if self.offset_s else frame

    @property
    def name(self) -> str:
        return self._frames.name

    @property
    def is_live(self) -> bool:
        return self._frames.is_live

    @property
    def duration_s(self) -> float | None:
        return self._frames.duration_s

    @property
    def stats(self) -> SourceStats:
        return self._frames.stats

    def close(self) -> None:
        self._frames.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def no_frames() -> FrameSource:
    """No stream at all: the prompt works on the loaded memory alone."""
    return IterableSource((), name="memory")


def saved_settings(snap) -> dict:
    """Setting name → the value a snapshot holds, for every setting it passes on: the engine's
    fields from its config, and the model, dtype and policy from where the snapshot keeps them."""
    config, policy = snap.state["config"], snap.state["policy"]
    values = {s.name: config.get(s.field) for s in (*with_role(MEMORY), *with_role(INHERITED))
              if s.field and s.field in config}
    values.update(model=snap.model_name, dtype=DTYPE_FLAGS.get(snap.dtype, snap.dtype), policy=policy["name"],
                  policy_opt=tuple(f"{k}={_option_text(v)}" for k, v in policy["parameters"].items()))
    return values
