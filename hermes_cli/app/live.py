"""The interactive assistant: a background thread ingests the stream while a prompt answers.

The engine's thread owns the stream's memory; this module only sends it requests through the
stream's client. ``Ingestor`` runs in its own thread and only reads frames from the source
(pacing a file at real time when asked) and submits them, so a question waits for at most the
chunk in flight; the prompt (prompt-toolkit) asks the stream, streams answers token by token
and shows live readouts in its bottom toolbar. Errors in the thread become messages; the prompt stays usable and
questions keep working on the memory as it is.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import HTML
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.patch_stdout import patch_stdout

from ..engine.readouts import MemoryMap
from ..engine.records import SessionStats
from ..frames import FrameSource, as_source
from .feed import Pacer
from .notifications import NotificationWatcher, notification_line

HELP = """\
Ask anything about the stream; answers come from the memory as it is now.
  /stats    readouts in full            /memory   what each layer group still holds
  /pause    stop ingesting              /resume   continue ingesting
  /policy   the memory policy           /clear    forget the conversation (keep the video)
  /save [FILE]  write the memory to FILE (default: --save-memory or --autosave) to resume it later
  /help     this text                   /quit     leave (also Ctrl-D, or Ctrl-C at an empty prompt)
Alt-Enter (or Esc Enter) starts a new line; Ctrl-C cancels an answer in progress."""


RATE_WINDOW_S = 10.0  # "× real time" is measured over this much recent wall time


class Ingestor:
    """Reads frames from a source on a background thread and submits them to an engine stream.

    Never dies silently. Its thread writes only ``error``, ``frames_read``, ``last_read_s``,
    ``frames_refused`` and the rate window; the readouts (``snapshot``, ``paused``) are the
    engine's. Exactness: every frame read is submitted (then in the memory, pending in a
    partial chunk, queued, or — on a live source the engine fell behind — dropped and counted) or
    refused because the stream or the engine stopped: ``frames_read ==
    stream.counts().frames_submitted + frames_refused`` when this is the stream's only source.

    ``pace``: deliver a file at real time here (``--realtime`` in the interactive prompt), on a
    clock that stops while paused (``feed.Pacer``), so ``/resume`` continues where the stream
    was, without a backlog.
    """

    def __init__(self, stream, frames: FrameSource | Iterable, notify: Callable[[str], None], *,
                 pace: bool = False) -> None:
        self.stream = stream
        self.frames = as_source(frames)
        self.notify = notify
        self.pace = pace
        self.pacer = Pacer() if pace else None
        self.stopping = threading.Event()
        self.finished = threading.Event()
        self.error: str | None = None
        self.frames_read = 0
        self.frames_refused = 0
        self.last_read_s = 0.0  # stream time of the newest frame read
        self._warned = 0
        self.started = time.monotonic()
        self._rate: deque[tuple[float, float]] = deque()  # (wall, stream time) of recent frames
        self.thread = threading.Thread(target=self._run, name="hermes-ingest", daemon=True)
        self.notifications: NotificationWatcher | None = None  # --notify's, for the toolbar's mark

    @property
    def snapshot(self) -> SessionStats:
        """The stream's stats as the engine last published them."""
        return self.stream.stats()

    @property
    def paused(self) -> bool:
        return self.stream.paused

    @property
    def live(self) -> bool:
        """Frames arrive at real time (a live source, or a paced file)."""
        return self.pace or self.frames.is_live

    def pause(self) -> None:
        """Stop ingesting (and the pacing clock); returns once no chunk is in flight."""
        self.stream.pause()
        if self.pacer is not None:
            self.pacer.pause()

    def resume(self) -> None:
        if self.pacer is not None:
            self.pacer.resume()
        self._rate.clear()  # a rate across a pause means nothing
        self.stream.resume()

    def start(self) -> Ingestor:
        """Start the thread (once; later calls do nothing)."""
        if self.thread.ident is None:
            self.started = time.monotonic()
            self.thread.start()
        return self

    def _run(self) -> None:
        from ..engine.client import EngineStopped, StreamFailed
        from .feed import feed

        def read(frame) -> None:
            self.frames_read += 1
            self.last_read_s = frame.timestamp

        def submitted(frame) -> None:
            self._rate.append((time.monotonic(), frame.timestamp))
            self._say_new_warnings()

        try:
            lost = feed(self.stream, self.frames, pacer=self.pacer, stopping=self.stopping, before=read,
                        on_frame=submitted)
            if self.stopping.is_set():  # left by the user: the stream did not end
                return
            if lost is not None:
                raise lost
            self.stream.flush()
            s = self.stream.stats()
            self.notify(f"end of stream: {s.frames_seen} frames, {s.stream_time_s:.1f}s — "
                        "questions keep working on the final memory")
        except (EngineStopped, StreamFailed) as stopped:
            self.frames_refused = self.frames_read - self.stream.counts().frames_submitted
            if not self.stopping.is_set() and isinstance(stopped, StreamFailed):
                self.error = str(stopped)
                self.notify(f"ingestion stopped: {stopped}")
        except Exception as exc:  # the prompt must hear about it, and stay usable
            if self.stopping.is_set():
                return
            self.error = f"{type(exc).__name__}: {exc}"
            self.notify(f"ingestion stopped: {exc} — questions still work on the memory so far")
        finally:
            self._say_new_warnings()
            self.finished.set()

    def _say_new_warnings(self) -> None:
        warnings = self.stream.warnings
        while self._warned < len(warnings):
            self.notify(f"warning: {warnings[self._warned]}")
            self._warned += 1

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop reading (the chunk in flight finishes), release the source, join. The stream
        stays open: its memory can still be saved and asked."""
        self.stopping.set()
        self.frames.close()
        if self.thread.ident is not None:
            self.thread.join(timeout_s)

    @property
    def lag_s(self) -> float | None:
        """How far a live source's ingested stream time trails the wall clock (None for files)."""
        if not self.frames.is_live or not self.snapshot.frames_seen:
            return None
        return max(0.0, time.monotonic() - self.started - self.snapshot.stream_time_s)

    @property
    def speed(self) -> float | None:
        """Stream seconds read per wall-clock second over the last ``RATE_WINDOW_S`` (None: too
        little to tell). Up to now: a stall lowers it."""
        now = time.monotonic()
        while len(self._rate) > 2 and now - self._rate[0][0] > RATE_WINDOW_S:
            self._rate.popleft()
        if len(self._rate) < 2:
            return None
        (t0, s0), (_, s1) = self._rate[0], self._rate[-1]
        wall = now - t0
        return (s1 - s0) / wall if wall >= 0.5 else None

    @property
    def state(self) -> str:
        """error, done, paused or live."""
        if self.error:
            return "error"
        if self.finished.is_set():
            return "done"
        return "paused" if self.paused else "live"


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def frames_kept(s: SessionStats, frames_per_unit: int) -> int:
    """Frames whose tokens some layer still holds (a Qwen-VL unit is 2 frames)."""
    return min(s.frames_seen, s.units_kept * frames_per_unit)


def toolbar_text(ingestor: Ingestor, width: int | None = None) -> str:
    """The one-line live readout. With ``width``, readouts that do not fit are left out whole,
    least important first (RSS, KV MiB, speed, lag, chunk latency), never cut in the middle."""
    s = ingestor.snapshot
    stream = ingestor.stream
    cache, mem = s.cache, s.memory
    counters = ingestor.frames.stats
    dropped = counters.frames_dropped + stream.counts().frames_dropped
    state = ingestor.state
    t = max(s.stream_time_s, ingestor.last_read_s)
    budget = cache.budget if cache.budget is not None else "∞"
    chunk = s.prefill_ms_last_chunk
    answer = stream.last_answer
    seen = max(s.frames_seen, ingestor.frames_read)
    speed = ingestor.speed if state == "live" else None
    lag = ingestor.lag_s
    notified = ingestor.notifications.count if ingestor.notifications is not None else 0
    parts = [  # (priority: lower stays longer, text), in display order
        (0, f"{state} {int(t // 60):02d}:{t % 60:04.1f}"),
        (1, f"{seen} frames, {frames_kept(s, stream.frames_per_unit)} kept"
            + (f", {dropped} dropped" if dropped else "")
            + (f", {counters.gaps} gaps ({counters.gap_s:.0f}s)" if counters.gaps else "")
            + (" · reconnecting" if counters.reconnecting else "")),
        (3, f"cache {cache.stream_tokens}/{budget} tok"),
        (7, f"KV {_mib(cache.kv_bytes)}"),
        (4, f"chunk {chunk:.0f} ms" if chunk is not None else ""),
        (5, f"{speed:.1f}× real time" if speed is not None else ""),
        (5, f"lag {lag:.1f}s" if lag is not None else ""),
        (2, f"TTFT {answer.ttft_ms:.0f} ms · TPOT {answer.tpot_ms or 0:.0f} ms"
            if answer is not None and answer.ttft_ms is not None else ""),
        (8, f"RSS {_mib(mem.rss_bytes)}" + (f" · GPU peak {_mib(mem.gpu_peak_bytes)}" if mem.gpu_peak_bytes else "")),
        (1, f"🔔 {notified}" if notified else ""),
    ]
    parts = [(p, text) for p, text in parts if text]
    while width is not None and len(parts) > 1 and len(" │ ".join(t for _, t in parts)) > width:
        worst = max(range(len(parts)), key=lambda i: (parts[i][0], i))
        parts.pop(worst)
    return " │ ".join(text for _, text in parts)


MEMORY_LABEL_COLUMNS = 42  # "  middle (layers 1–6, 10 of 10 units)" beside each /memory row
SHADES = " ░▒▓█"  # by the share of a moment's tokens still held


def _shade(share: float | None) -> str:
    if share is None:
        return " "
    if share <= 0:
        return "·"
    if share >= 1 - 1e-9:
        return "█"
    return SHADES[1 + min(2, int(share * 3))]


def memory_timeline(memory: MemoryMap, width: int = 48) -> str:
    """Per layer group, which moments of the stream it still holds (from the engine's
    ``MemoryMap``): every cell a unit covers is marked (a Qwen-VL unit spans 2 frames); █ all of
    its tokens held, ▓▒░ part, · none."""
    if not memory.units:
        return "nothing streamed yet"
    spans = memory.units
    end = max(spans[-1][1], 1e-6)
    shares = memory.shares
    lines = [f"0s {'─' * (width - 2)} {end:.0f}s"]
    for role, layers in memory.groups.items():
        if not layers:
            continue
        cells = []
        for c in range(width):
            lo, hi = c * end / width, (c + 1) * end / width
            weight = held = 0.0
            for u, (a, b) in enumerate(spans):
                overlap = min(b, hi) - max(a, lo)
                if overlap > 0:
                    weight += overlap
                    held += overlap * sum(shares[i].get(u, 0.0) for i in layers) / len(layers)
            cells.append(_shade(held / weight if weight else None))
        kept = set().union(*(shares[i] for i in layers))
        lines.append(f"{''.join(cells)}  {role} (layers {layers[0]}–{layers[-1]}, {len(kept)} of {len(spans)} units)")
    lines.append("█ held · ▓▒░ partly held · · forgotten" + (
        f" · a unit is {memory.frames_per_unit} frames" if memory.frames_per_unit > 1 else ""))
    return "\n".join(lines)


@dataclass
class SaveTarget:
    """Where ``/save`` without a file name writes (the command line's --save-memory or
    --autosave), and the stream's source name recorded in the snapshot."""

    path: Path | None = None
    source: str | None = None

    def command(self, stream, text: str) -> str:
        """Run ``/save [FILE]``; the message to show (errors included)."""
        from ..engine.snapshot import SnapshotError

        parts = text.split(maxsplit=1)
        target = Path(parts[1]).expanduser() if len(parts) > 1 else self.path
        if target is None:
            return "/save needs a file name (or start with --save-memory FILE or --autosave FILE)"
        try:
            report = stream.save(target, source=self.source)
        except (SnapshotError, RuntimeError, OSError) as exc:
            return f"could not save: {exc}"
        return f"memory saved to {report.path} ({report.bytes / 2**20:.1f} MiB)"


class Assistant:
    """The interactive prompt over a running ``Ingestor``."""

    def __init__(self, stream, frames: FrameSource | Iterable, *, input=None, output=None,
                 history_file: Path | None = None, write: Callable[[str], None] | None = None,
                 pace: bool = False, save_to: SaveTarget | None = None, notify_command=None) -> None:
        self.stream = stream  # an engine stream's client (in-process, or over HTTP)
        self.write = write or _write_stdout
        self.save_to = save_to or SaveTarget()
        self.notify_command = notify_command
        self.notifications: NotificationWatcher | None = None
        self.ingestor = Ingestor(stream, frames, self._notify, pace=pace)
        self._input, self._output, self._history_file = input, output, history_file
        self.prompt: PromptSession | None = None

    def _make_prompt(self) -> PromptSession:
        bindings = KeyBindings()

        @bindings.add("escape", "enter")
        def _newline(event):
            event.current_buffer.insert_text("\n")

        history: History = InMemoryHistory()
        if self._history_file is not None:
            try:
                self._history_file.parent.mkdir(parents=True, exist_ok=True)
                history = FileHistory(str(self._history_file))
            except OSError:
                pass
        return PromptSession(
            history=history, key_bindings=bindings, bottom_toolbar=self._toolbar,
            refresh_interval=0.25, input=self._input, output=self._output,
        )

    def print(self, text: str) -> None:
        self.write(text + "\n")

    def _notify(self, message: str) -> None:
        self.print(f"» {message}")

    def _show_notification(self, record: dict) -> None:
        """A --notify notification: a line at the prompt (and a mark in the toolbar)."""
        self._notify(record["error"] if "error" in record else notification_line(record))

    def _follow_notifications(self) -> None:
        self.notifications = NotificationWatcher(self.stream, self._show_notification, self.notify_command).start()
        self.ingestor.notifications = self.notifications

    def _stop_following(self) -> None:
        if self.notifications is not None:
            self.notifications.stop()

    def _columns(self) -> int | None:
        """The terminal's width (None: not known, e.g. a dummy output)."""
        try:
            return self.prompt.app.output.get_size().columns if self.prompt else None
        except Exception:
            return None

    def _toolbar(self):
        columns = self._columns()
        return HTML("<b>{}</b>").format(toolbar_text(self.ingestor, None if columns is None else columns - 1))

    def run(self) -> None:
        """Prompt until /quit, Ctrl-D or Ctrl-C at an empty prompt; then stop the worker."""
        self.prompt = self._make_prompt()
        self._follow_notifications()
        self.ingestor.start()
        self.print(f"hermes · {self.stream.model} · policy {self.stream.policy.name} — /help for commands")
        try:
            with patch_stdout(raw=True):
                while True:
                    try:
                        text = self.prompt.prompt("? ")
                    except (EOFError, KeyboardInterrupt):
                        break
                    text = text.strip()
                    if not text:
                        continue
                    if text.startswith("/"):
                        if not self.command(text):
                            break
                        continue
                    self.answer(text)
        finally:
            self.ingestor.stop()
            self._stop_following()

    def answer(self, question: str) -> None:
        handle = None
        try:
            handle = self.stream.ask(question, flush=self.ingestor.live)
            for piece in handle:
                self.write(piece)
            self.write("\n")
        except KeyboardInterrupt:
            if handle is not None:
                handle.close()  # returns once the question has left the memory
            self.write(" [cancelled]\n")
        except Exception as exc:  # a failing answer must not end the session
            self._notify(f"could not answer: {type(exc).__name__}: {exc}")

    def command(self, text: str) -> bool:
        """Run a slash command; False means quit."""
        name = text.split()[0].lower()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/help":
            self.print(HELP)
        elif name == "/stats":
            stats = self.stream.fresh_stats()
            text = stats_text(stats, self.ingestor)
            waiting = self.ingestor.frames_read - stats.frames_seen
            if waiting > 0:
                text += f"\nwaiting     {waiting} frames read, prefilled with the next chunk (or the next question)"
            self.print(text)
        elif name == "/memory":
            columns = self._columns()
            width = 48 if columns is None else max(16, min(64, columns - MEMORY_LABEL_COLUMNS))
            self.print(memory_timeline(self.stream.memory_map(), width))
        elif name == "/pause":
            self.ingestor.pause()
            self.print("paused: the stream clock stops until /resume" if self.ingestor.pace else
                       "paused: no frames are ingested until /resume"
                       + (" (a live source's frames meanwhile are dropped)" if self.ingestor.live else ""))
        elif name == "/resume":
            self.ingestor.resume()
            self.print("resumed")
        elif name == "/policy":
            p = self.stream.policy
            params = ", ".join(f"{f.name}={getattr(p, f.name)!r}" for f in p.parameters())
            self.print(f"{p.name} (budget {self.stream.config.budget}): {p.description}" + (f"\n  {params}" if params else ""))
        elif name == "/save":
            self.print(self.save_to.command(self.stream, text))
        elif name == "/clear":
            self.stream.clear_history()
            self.print("conversation forgotten; the video memory is unchanged")
        else:
            self.print(f"unknown command {name} — /help lists them")
        return True


class LineAssistant(Assistant):
    """The assistant without a full-screen prompt: when stdin or stdout is not a terminal.

    Each line read is a question (or a /command), answered at the moment it is read from the
    memory as it is then (a live source's partial chunk flushed first); a question read before
    anything is in memory waits for the first frames. Answers and command output go to
    ``write`` (stdout), notices to ``notice`` (stderr); ``emit`` replaces the streamed text of
    an answer (``--json``). End of input (or /quit) stops the stream and returns.
    """

    def __init__(self, stream, frames: FrameSource | Iterable, *, write: Callable[[str], None] | None = None,
                 notice: Callable[[str], None] | None = None, prompt: Callable[[], None] | None = None,
                 emit: Callable[[object], None] | None = None, pace: bool = False,
                 save_to: SaveTarget | None = None, notify_command=None) -> None:
        super().__init__(stream, frames, write=write, pace=pace, save_to=save_to, notify_command=notify_command)
        self.notice = notice or (lambda text: sys.stderr.write(text + "\n"))
        self.show_prompt = prompt
        self.emit = emit

    def _notify(self, message: str) -> None:
        self.notice(f"» {message}")

    def _show_notification(self, record: dict) -> None:
        if self.emit is not None and "error" not in record:  # --json: one object per line on stdout
            self.write(json.dumps(record) + "\n")
        else:
            super()._show_notification(record)

    def run(self, lines: Iterable[str] | None = None) -> None:
        """Answer ``lines`` (default: stdin) until they end."""
        self._follow_notifications()
        self.ingestor.start()
        try:
            if self.show_prompt:
                self.show_prompt()
            for raw in lines if lines is not None else sys.stdin:
                text = raw.strip()
                if text.startswith("/"):
                    if not self.command(text):
                        break
                elif text:
                    self.answer(text)
                if self.show_prompt:
                    self.show_prompt()
        finally:
            self.ingestor.stop()
            self._stop_following()

    def _wait_for_frames(self, timeout_s: float = 3600.0) -> None:
        """Until something is in memory (a live source: until a frame arrived), or the stream ended."""
        ing = self.ingestor
        deadline = time.monotonic() + timeout_s
        while not ing.finished.is_set() and time.monotonic() < deadline:
            if (ing.frames_read if ing.live else ing.snapshot.units_seen) > 0:
                return
            time.sleep(0.02)

    def answer(self, question: str) -> None:
        self._wait_for_frames()
        if self.emit is None:
            super().answer(question)
            return
        from .streaming import AskedAnswer

        answer = self.stream.answer(question, flush=self.ingestor.live)
        self.emit(AskedAnswer(answer, answer.stream_time_s, self.stream.fresh_stats()))


def stats_text(s: SessionStats, ingestor: Ingestor | None = None) -> str:
    """The full readout of ``/stats``."""
    cache, pos, mem = s.cache, s.positions, s.memory
    lines = [
        f"stream      {s.stream_time_s:.1f}s · {s.frames_seen} frames · {s.units_seen} units",
        f"cache       {cache.tokens} tokens/layer ({cache.prefix_tokens} prefix) · "
        f"budget {'none (keeps everything)' if cache.budget is None else f'{cache.budget} tokens/layer'} · "
        f"{_mib(cache.kv_bytes)} · {cache.compressions} compressions",
        f"positions   next {pos.next} of {pos.limit} · re-index {pos.reindex} ({pos.reindex_count} done)",
        f"memory      RSS {_mib(mem.rss_bytes)} · GPU peak {_mib(mem.gpu_peak_bytes)}",
        f"last chunk  prefill {_ms(s.prefill_ms_last_chunk)} · compress {_ms(s.compress_ms_last_chunk)}",
        f"model       {s.model}{' (random weights)' if s.random_weights else ''} · policy {s.policy}",
    ]
    if ingestor is not None and ingestor.error:
        lines.append(f"error       {ingestor.error}")
    return "\n".join(lines)


def history_path() -> Path:
    """The prompt's history file: $XDG_STATE_HOME/hermes-video/history (default ~/.local/state)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hermes-video" / "history"


def run_interactive(stream, frames, **kwargs) -> None:
    """The full-screen prompt (stdin and stdout are terminals)."""
    Assistant(stream, frames, history_file=kwargs.pop("history_file", history_path()), **kwargs).run()


def run_lines(stream, frames, lines: Iterable[str] | None = None, **kwargs) -> None:
    """Questions line by line, without a full-screen prompt (see ``LineAssistant``)."""
    LineAssistant(stream, frames, **kwargs).run(lines)
