"""When a ``--notify`` condition fires, what its event says, and running ``--on-notify``.

Pure (no torch, no model): the engine feeds each condition's p(yes) after every chunk (from
``engine.probe.yes_probability``) and this module decides, per condition, whether it fires.

The rule (``ConditionState.update``), for the probe of one chunk with probability ``p``:

- **hot** when ``p >= threshold`` and, once the condition has a baseline, ``p - baseline >=
  margin``. The baseline is an exponential moving average of the condition's own earlier p(yes)
  (span ``baseline`` probes, weight ``2 / (span + 1)`` for the newest; it starts at the first
  probe's p), taken *before* this probe joins it. So a model that says "Yes" to everything
  (p ≈ 0.9 always) fires at most once, at the start, and afterwards only when p rises ``margin``
  above its usual 0.9. The first probe has no baseline: a condition already true when the
  stream starts is announced.
- **fires** when it has been hot for ``consecutive`` probes in a row, it is *armed*, and no
  cooldown runs. Firing disarms it and starts a cooldown of ``cooldown`` probes (those cannot
  fire; the one after can).
- **re-armed** by the first probe with ``p < off_threshold`` (default ``0.8 × threshold``): one
  rising edge, one event — a condition that stays true does not repeat itself.

At the boundary ``threshold = 0`` every probe is hot and the margin is not applied (p ≥ 0 always
holds, and a margin over the baseline would only delay the check): with ``consecutive = 1``
(the default) the condition fires at its first probe, and, since p < 0 never happens, only
once. That is how scripts check the whole path.

A condition may be a plain text or a ``Condition``: a text with the question a fire is described
by (instead of ``probe.describe_question``) and a polling window in stream time — probed only
after chunks whose stream time is within ``[start_s, stop_s]``, so its state machine starts at
``start_s`` (``hermes eval`` polls a StreamingBench proactive question so, from the moment it
is posed to 4 s past its ground truth).

``NotifyEvent`` is the record an event becomes (``--json``, SSE, ``--on-notify``);
``run_on_notify`` runs a command with it, never through a shell unless asked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from .. import defaults
from ..errors import HermesError

__all__ = [
    "Condition",
    "ConditionState",
    "Notifier",
    "NotifyCommand",
    "NotifyCommandError",
    "NotifyEvent",
    "NotifySettings",
    "run_on_notify",
]


@dataclass(frozen=True)
class NotifySettings:
    """The firing rule's knobs (see the module docstring); the CLI flag of each is in its comment."""

    threshold: float = defaults.NOTIFY_THRESHOLD  # --notify-threshold: on-threshold on p(yes), 0-1
    off_threshold: float | None = None  # --notify-off-threshold: re-arm below this (None: 0.8 × threshold)
    consecutive: int = defaults.NOTIFY_CONSECUTIVE  # --notify-consecutive: hot probes in a row to fire
    cooldown: int = defaults.NOTIFY_COOLDOWN  # --notify-cooldown: probes after a fire that cannot fire
    margin: float = defaults.NOTIFY_MARGIN  # --notify-margin: rise over the baseline needed, 0-1
    baseline: int = defaults.NOTIFY_BASELINE  # --notify-baseline: the baseline average's span in probes

    @property
    def off(self) -> float:
        """The re-arm threshold in effect."""
        return self.threshold * defaults.NOTIFY_OFF_RATIO if self.off_threshold is None else self.off_threshold

    def check(self) -> NotifySettings:
        """Raise ``ValueError`` with one line naming the flag when a value is out of range."""
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"--notify-threshold must be between 0 and 1, got {self.threshold}")
        if self.off_threshold is not None and not 0.0 <= self.off_threshold <= self.threshold:
            raise ValueError(f"--notify-off-threshold must be between 0 and --notify-threshold ({self.threshold}), "
                             f"got {self.off_threshold}")
        if self.consecutive < 1:
            raise ValueError(f"--notify-consecutive must be at least 1, got {self.consecutive}")
        if self.cooldown < 0:
            raise ValueError(f"--notify-cooldown must be 0 or more chunks, got {self.cooldown}")
        if not 0.0 <= self.margin <= 1.0:
            raise ValueError(f"--notify-margin must be between 0 and 1, got {self.margin}")
        if self.baseline < 1:
            raise ValueError(f"--notify-baseline must be at least 1 probe, got {self.baseline}")
        return self


@dataclass
class ConditionState:
    """One condition's firing state machine (see the module docstring for the rule)."""

    settings: NotifySettings = field(default_factory=NotifySettings)
    armed: bool = True
    streak: int = 0  # hot probes in a row, this one included
    cooldown_left: int = 0  # probes that still cannot fire
    baseline: float | None = None  # the moving average of earlier probes (None before the first)
    probes: int = 0

    def hot(self, p: float) -> bool:
        """Whether ``p`` counts towards firing against the baseline as it is now."""
        s = self.settings
        if s.threshold <= 0.0:
            return True
        return p >= s.threshold and (self.baseline is None or p - self.baseline >= s.margin)

    def update(self, p: float) -> bool:
        """Take one probe's p(yes); True when the condition fires on it."""
        s = self.settings
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p(yes) must be a probability, got {p}")
        if not self.armed and p < s.off:
            self.armed = True
        self.streak = self.streak + 1 if self.hot(p) else 0
        fire = self.armed and self.cooldown_left == 0 and self.streak >= s.consecutive
        if fire:
            self.armed, self.streak, self.cooldown_left = False, 0, s.cooldown
        elif self.cooldown_left > 0:
            self.cooldown_left -= 1
        weight = 2.0 / (s.baseline + 1)
        self.baseline = p if self.baseline is None else (1 - weight) * self.baseline + weight * p
        self.probes += 1
        return fire


@dataclass(frozen=True)
class Condition:
    """A condition with its own description question and polling window (see the module docstring).

    ``question``: what a fire generates the event's text from (None: ``probe.describe_question``);
    ``start_s`` / ``stop_s``: probed only after chunks whose stream time is within the window
    (None: unbounded on that side).
    """

    text: str
    question: str | None = None
    start_s: float | None = None
    stop_s: float | None = None

    def due(self, stream_time_s: float) -> bool:
        """Whether the probe after a chunk ending at ``stream_time_s`` polls this condition."""
        eps = 1e-6
        return ((self.start_s is None or stream_time_s >= self.start_s - eps)
                and (self.stop_s is None or stream_time_s <= self.stop_s + eps))


class Notifier:
    """The state machines of a stream's conditions, in the order given (one ``ConditionState`` each).

    ``conditions``: texts or ``Condition`` objects; a text given twice is one condition (the first)."""

    def __init__(self, conditions: Iterable[str | Condition], settings: NotifySettings | None = None) -> None:
        self.settings = (settings or NotifySettings()).check()
        specs: dict[str, Condition] = {}
        for c in conditions:
            spec = Condition(c.strip()) if isinstance(c, str) else dataclasses.replace(c, text=c.text.strip())
            if not spec.text:
                raise ValueError("--notify needs a condition text, e.g. --notify \"a person enters\"")
            if spec.start_s is not None and spec.stop_s is not None and spec.stop_s < spec.start_s:
                raise ValueError(f"condition {spec.text!r}: its window ends ({spec.stop_s}s) before it starts "
                                 f"({spec.start_s}s)")
            specs.setdefault(spec.text, spec)
        self.specs = specs
        self.conditions = list(specs)
        self.states = {c: ConditionState(self.settings) for c in self.conditions}

    def due(self, stream_time_s: float) -> list[str]:
        """The conditions the probe after a chunk ending at ``stream_time_s`` polls, in order."""
        return [c for c in self.conditions if self.specs[c].due(stream_time_s)]

    def question(self, condition: str) -> str | None:
        """The question a fire of ``condition`` is described by (None: the default description)."""
        return self.specs[condition].question

    def update(self, p_yes: Mapping[str, float]) -> list[str]:
        """Feed one chunk's p(yes) per condition polled; the conditions that fire, in order (a
        condition missing from ``p_yes`` was not polled: its state does not move)."""
        return [c for c in self.conditions if c in p_yes and self.states[c].update(p_yes[c])]


# -- the event ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NotifyEvent:
    """A fired condition: ``--json`` prints ``to_json()``, ``--on-notify`` gets it too.

    ``stream_time_s``/``frames_seen``: the stream when the probe that fired ran (after its chunk);
    ``text``: the short description generated then; ``latency_ms``: from the end of that chunk's
    prefill and compression to the event (the probes and the description).
    """

    notification: str
    stream_time_s: float
    frames_seen: int
    p_yes: float
    text: str
    latency_ms: float

    def to_json(self) -> dict:
        """The JSON object (these field names are part of the interface)."""
        d = asdict(self)
        d["stream_time_s"] = round(self.stream_time_s, 3)
        d["p_yes"] = round(self.p_yes, 6)
        d["latency_ms"] = round(self.latency_ms, 3)
        return d

    def environment(self) -> dict[str, str]:
        """``HERMES_NOTIFICATION``, ``HERMES_STREAM_TIME_S``, ``HERMES_FRAMES_SEEN``, ``HERMES_P_YES``,
        ``HERMES_TEXT``, ``HERMES_LATENCY_MS`` (one per field) and ``HERMES_EVENT`` (the JSON)."""
        record = self.to_json()
        env = {f"HERMES_{key.upper()}": str(value) for key, value in record.items()}
        env["HERMES_EVENT"] = json.dumps(record, ensure_ascii=False)
        return env


# -- --on-notify ------------------------------------------------------------------------------------
class NotifyCommandError(HermesError, ValueError):
    """An ``--on-notify`` command that cannot run (one line saying why and what to do)."""


def command_argv(cmd: str | Sequence[str], *, shell: bool = False) -> list[str]:
    """The argv an ``--on-notify`` command runs as: ``shlex.split(cmd)``, or ``["sh", "-c", cmd]``
    with ``shell`` (``--on-notify-shell``). Raises ``NotifyCommandError`` for an empty command,
    unbalanced quotes or a program not on PATH."""
    if not isinstance(cmd, str):
        argv = [str(a) for a in cmd]
    elif shell:
        argv = ["sh", "-c", cmd]
    else:
        try:
            argv = shlex.split(cmd)
        except ValueError as exc:
            raise NotifyCommandError(f"--on-notify {cmd!r}: {exc} — quote it as one argument") from None
    if not argv or not argv[0]:
        raise NotifyCommandError("--on-notify needs a command, e.g. --on-notify 'notify-send hermes'")
    if shutil.which(argv[0]) is None:
        raise NotifyCommandError(f"--on-notify: no program {argv[0]!r} found — give its full path or put it on PATH"
                                 + ("" if shell else " (use --on-notify-shell for shell syntax)"))
    return argv


def run_on_notify(cmd: str | Sequence[str], event: NotifyEvent, *, shell: bool = False,
                  env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` for ``event`` and return it (not waited for).

    The command gets the event in its environment (``NotifyEvent.environment``, on top of ``env``,
    default this process's) and as one JSON line on its stdin (closed afterwards; a command that
    does not read it is fine). No shell unless ``shell`` (see ``command_argv``).
    """
    argv = command_argv(cmd, shell=shell)
    child_env = {**(os.environ if env is None else env), **event.environment()}
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, env=child_env)
    assert proc.stdin is not None
    try:
        proc.stdin.write((json.dumps(event.to_json(), ensure_ascii=False) + "\n").encode())
        proc.stdin.close()
    except BrokenPipeError:  # it exited (or closed stdin) without reading: its business
        pass
    return proc


class NotifyCommand:
    """``--on-notify CMD`` for a whole run: checked once, started per event, children reaped.

    ``__call__(event)`` starts the command (``run_on_notify``) and reaps earlier ones that ended;
    ``close(timeout)`` waits for those still running (each at most ``timeout`` s) and returns
    their exit codes (None: still running, left alone).
    """

    def __init__(self, cmd: str | Sequence[str], *, shell: bool = False) -> None:
        self.argv = command_argv(cmd, shell=shell)
        self.running: list[subprocess.Popen] = []
        self.returncodes: list[int] = []

    def __call__(self, event: NotifyEvent) -> subprocess.Popen:
        self._reap()
        proc = run_on_notify(self.argv, event)
        self.running.append(proc)
        return proc

    def _reap(self) -> None:
        still = []
        for proc in self.running:
            code = proc.poll()
            if code is None:
                still.append(proc)
            else:
                self.returncodes.append(code)
        self.running = still

    def close(self, timeout: float = 5.0) -> list[int | None]:
        codes: list[int | None] = []
        for proc in self.running:
            try:
                codes.append(proc.wait(timeout))
            except subprocess.TimeoutExpired:
                codes.append(None)
        self.running = [p for p in self.running if p.returncode is None]
        return codes
