"""The interactive assistant: a background thread ingests the stream while a prompt answers.

One ``SessionWorker`` thread owns the session; everything else sends it requests. ``Ingestor``
runs in its own thread and only reads frames from the source (pacing a file at real time when
asked) and submits them to the worker, so a question waits for at most the chunk in flight; the
prompt (prompt-toolkit) asks the worker, streams answers token by token and shows live readouts
in its bottom toolbar. Errors in the thread become messages; the prompt stays usable and
questions keep working on the memory as it is.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import HTML
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.patch_stdout import patch_stdout

from ..answer_log import log_answer
from ..engine.cache import KIND_VIDEO
from ..engine.records import SessionStats
from ..engine.session import Session
from ..engine.worker import SessionWorker, WorkerStopped
from ..frames import FrameSource, as_source

HELP = """\
Ask anything about the stream; answers come from the memory as it is now.
  /stats         readouts in full
  /memory        what each layer group still holds
  /pause         stop ingesting
  /resume        continue ingesting
  /policy        the memory policy
  /clear         forget the conversation (keep the video)
  /save [FILE]   write the memory to FILE (default: --save-memory or --autosave), to resume it later
  /help          this text
  /quit          leave (also Ctrl-D, or Ctrl-C at an empty prompt)
Alt-Enter (or Esc Enter) starts a new line; Ctrl-C cancels an answer in progress."""


def fit(text: str, width: int | None) -> str:
    """``text`` with each line longer than ``width`` wrapped between words, never inside one; a
    wrapped line continues under its text, past a label column (``/stats   …``, ``cache   …``)."""
    import re
    import textwrap

    if width is None or width < 20:
        return text
    lines = []
    for line in text.split("\n"):
        if len(line) <= width:
            lines.append(line)
            continue
        label = re.match(r"^(\s*\S+(?: \[\w+\])?\s{2,})", line)
        indent = len(label.group(1)) if label and len(label.group(1)) < width // 2 else len(line) - len(line.lstrip())
        lines.extend(textwrap.wrap(line, width, subsequent_indent=" " * indent, break_long_words=False,
                                   break_on_hyphens=False) or [line])
    return "\n".join(lines)


RATE_WINDOW_S = 10.0  # "× real time" is measured over this much recent wall time


class Ingestor:
    """Reads frames from a source on a background thread and submits them to the session worker.

    Never dies silently. Its thread writes only ``error``, ``frames_read``, ``last_read_s``,
    ``frames_refused`` and the rate window; the readouts (``snapshot``, ``paused``) are published
    by the worker. Exactness: every frame read is taken by the worker (then in the memory or
    pending in a partial chunk, flushed at the end of the stream or for a question on a live
    source) or refused because the worker stopped: ``frames_read ==
    worker.counts().frames_taken + frames_refused`` when this is the worker's only source.

    ``pace``: deliver a file at real time here (``--realtime`` in the interactive prompt), on a
    clock that stops while paused, so ``/resume`` continues where the stream was, without a
    backlog.
    """

    def __init__(self, session: Session | SessionWorker, frames: FrameSource | Iterable, notify: Callable[[str], None], *,
                 pace: bool = False) -> None:
        self.worker = session if isinstance(session, SessionWorker) else SessionWorker(session)
        self.session = self.worker.session  # its settings only: the worker owns its state
        self.frames = as_source(frames)
        self.notify = notify
        self.pace = pace
        self.stopping = threading.Event()
        self.finished = threading.Event()
        self.error: str | None = None
        self.frames_read = 0
        self.frames_refused = 0
        self.last_read_s = 0.0  # stream time of the newest frame read
        self._warned = 0
        self.started = time.monotonic()
        self._rate: deque[tuple[float, float]] = deque()  # (wall, stream time) of recent frames
        self._origin: float | None = None  # pacing: wall time of stream time 0
        self._paused_total = 0.0
        self._pause_started: float | None = None
        self.thread = threading.Thread(target=self._run, name="hermes-ingest", daemon=True)

    @property
    def snapshot(self) -> SessionStats:
        """The session's stats as the worker last published them."""
        return self.worker.stats()

    @property
    def paused(self) -> threading.Event:
        """Set while the worker is paused (read-only: use ``pause``/``resume``)."""
        return self.worker.paused

    @property
    def live(self) -> bool:
        """Frames arrive at real time (a live source, or a paced file)."""
        return self.pace or self.frames.is_live

    def pause(self) -> None:
        """Stop ingesting (and the pacing clock); returns once no chunk is in flight."""
        self.worker.pause()
        if self._pause_started is None:
            self._pause_started = time.monotonic()

    def resume(self) -> None:
        if self._pause_started is not None:
            self._paused_total += time.monotonic() - self._pause_started
            self._pause_started = None
        self._rate.clear()  # a rate across a pause means nothing
        self.worker.resume()

    def start(self) -> Ingestor:
        """Start the worker and the thread (once; later calls do nothing)."""
        self.worker.start()
        if self.thread.ident is None:
            self.started = time.monotonic()
            self.thread.start()
        return self

    def _run(self) -> None:
        try:
            for frame in self.frames:
                if self.pace:
                    self._wait_until_due(frame.timestamp)
                if self.stopping.is_set():
                    return
                self.frames_read += 1
                self.last_read_s = frame.timestamp
                try:
                    self.worker.ingest([frame.image], [frame.timestamp])
                except WorkerStopped as stopped:
                    self.frames_refused += 1 - stopped.frames_taken
                    return
                self._rate.append((time.monotonic(), frame.timestamp))
                self._say_new_warnings()
            if self.stopping.is_set():  # left by the user: the stream did not end
                return
            self.worker.flush()
            s = self.worker.stats()
            self.notify(f"end of stream: {s.frames_seen} frames, {s.stream_time_s:.1f}s — "
                        "questions keep working on the final memory")
        except WorkerStopped:
            return
        except Exception as exc:  # the prompt must hear about it, and stay usable
            if self.stopping.is_set():
                return
            self.error = f"{type(exc).__name__}: {exc}"
            self.notify(f"ingestion stopped: {exc} — questions still work on the memory so far")
        finally:
            self.finished.set()

    def _paused_for(self) -> float:
        ongoing = 0.0 if self._pause_started is None else time.monotonic() - self._pause_started
        return self._paused_total + ongoing

    def _wait_until_due(self, timestamp: float) -> None:
        """Pacing: wait until the frame's stream time on a clock that stands still while paused."""
        if self._origin is None:
            self._origin = time.monotonic() - timestamp - self._paused_for()
            return
        while not self.stopping.is_set():
            delay = self._origin + self._paused_for() + timestamp - time.monotonic()
            if delay <= 0 and not self.paused.is_set():
                return
            self.stopping.wait(min(max(delay, 0.05), 0.1))

    def flush_for_question(self) -> None:
        """Live sources: prefill the frames of the partial chunk, so an answer covers them."""
        if self.live:
            self.worker.flush()

    def _say_new_warnings(self) -> None:
        warnings = self.worker.warnings
        while self._warned < len(warnings):
            self.notify(f"warning: {warnings[self._warned]}")
            self._warned += 1

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop ingesting and the worker (the chunk in flight finishes), release the source, join."""
        self.stopping.set()
        self.frames.close()
        self.worker.stop(timeout_s)
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
        return "paused" if self.paused.is_set() else "live"


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
    session = ingestor.session
    cache, mem = s.cache, s.memory
    counters = ingestor.frames.stats
    dropped = counters.frames_dropped
    state = ingestor.state
    t = max(s.stream_time_s, ingestor.last_read_s)
    budget = cache.budget if cache.budget is not None else "∞"
    chunk = s.prefill_ms_last_chunk
    answer = session.last_answer
    seen = max(s.frames_seen, ingestor.frames_read)
    speed = ingestor.speed if state == "live" else None
    lag = ingestor.lag_s
    parts = [  # (priority: lower stays longer, text), in display order
        (0, f"{state} {int(t // 60):02d}:{t % 60:04.1f}"),
        (1, f"{seen} frames, {frames_kept(s, session.adapter.frames_per_unit)} kept"
            + (f", {dropped} dropped" if dropped else "")
            + (f", {counters.gaps} gaps ({counters.gap_s:.0f}s)" if counters.gaps else "")
            + (" · reconnecting" if counters.reconnecting else "")),
        (2, f"cache {cache.stream_tokens}/{budget} tok"),
        (7, f"KV {_mib(cache.kv_bytes)}"),
        (4, f"chunk {chunk:.0f} ms" if chunk is not None else ""),
        (5, f"{speed:.1f}× real time" if speed is not None else ""),
        (5, f"lag {lag:.1f}s" if lag is not None else ""),
        (3, f"TTFT {answer.ttft_ms:.0f} ms · TPOT {answer.tpot_ms or 0:.0f} ms"
            if answer is not None and answer.ttft_ms is not None else ""),
        (8, f"RSS {_mib(mem.rss_bytes)}" + (f" · GPU peak {_mib(mem.gpu_peak_bytes)}" if mem.gpu_peak_bytes else "")),
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


def held_shares(session: Session) -> list[dict[int, float]]:
    """Per layer: unit -> share of that unit's tokens the layer still holds (units with none left out)."""
    per_unit = max(1, session.tokens_per_unit or 1)
    shares = []
    for layer in range(session.cache.num_layers):
        meta = session.cache.meta(layer)
        units = meta.frame[meta.kind == KIND_VIDEO].tolist()  # over all heads, where a layer keeps a set per head
        counts: dict[int, int] = {}
        for u in units:
            counts[u] = counts.get(u, 0) + 1
        shares.append({u: min(1.0, n / (per_unit * meta.heads)) for u, n in counts.items()})
    return shares


def memory_timeline(session: Session, width: int = 48) -> str:
    """Per layer group, which moments of the stream it still holds: every cell a unit covers is
    marked (a Qwen-VL unit spans 2 frames); █ all of its tokens held, ▓▒░ part, · none."""
    if not session.units_seen:
        return "nothing streamed yet"
    times = list(session.unit_times)
    step = session.adapter.frames_per_unit / session.config.fps
    spans = [(t, times[i + 1] if i + 1 < len(times) else t + step) for i, t in enumerate(times)]
    end = max(spans[-1][1], 1e-6)
    shares = held_shares(session)
    lines = [f"0s {'─' * (width - 2)} {end:.0f}s"]
    for role, layers in session.policy.layer_groups(len(shares)).items():
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
        f" · a unit is {session.adapter.frames_per_unit} frames" if session.adapter.frames_per_unit > 1 else ""))
    return "\n".join(lines)


class Assistant:
    """The interactive prompt over a running ``Ingestor``."""

    def __init__(self, session: Session, frames: FrameSource | Iterable, *, input=None, output=None,
                 history_file: Path | None = None, write: Callable[[str], None] | None = None,
                 pace: bool = False) -> None:
        self.session = session
        self.write = write or _write_stdout
        self.worker = SessionWorker(session)  # the one thread that drives the session
        self.ingestor = Ingestor(self.worker, frames, self._notify, pace=pace)
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
        columns = self._columns()
        self.write(fit(text, None if columns is None else columns - 1) + "\n")

    def _notify(self, message: str) -> None:
        self.print(f"» {message}")

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
        self.ingestor.start()
        self.print(f"hermes · {self.session.adapter.name} · policy {self.session.policy.name} — /help for commands")
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

    def answer(self, question: str) -> None:
        stream = None
        try:
            self.ingestor.flush_for_question()
            stream = self.worker.ask(question)
            for piece in stream:
                self.write(piece)
            self.write("\n")
            log_answer(stream.answer, model=self.session.adapter.name, policy=self.session.policy.name)
        except KeyboardInterrupt:
            if stream is not None:
                stream.close()  # returns once the question has left the memory
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
            stats = self.worker.call(Session.stats)
            text = stats_text(stats, self.ingestor)
            waiting = self.ingestor.frames_read - stats.frames_seen
            if waiting > 0:
                text += f"\nwaiting     {waiting} frames read, prefilled with the next chunk (or the next question)"
            self.print(text)
        elif name == "/memory":
            columns = self._columns()
            width = 48 if columns is None else max(16, min(64, columns - MEMORY_LABEL_COLUMNS))
            self.print(self.worker.call(lambda session: memory_timeline(session, width)))
        elif name == "/pause":
            self.ingestor.pause()
            self.print("paused: the stream clock stops until /resume" if self.ingestor.pace else
                       "paused: no frames are ingested until /resume"
                       + (" (a live source's frames meanwhile are dropped)" if self.ingestor.live else ""))
        elif name == "/resume":
            self.ingestor.resume()
            self.print("resumed")
        elif name == "/policy":
            p = self.session.policy
            params = ", ".join(f"{f.name}={getattr(p, f.name)!r}" for f in p.parameters())
            self.print(f"{p.name} (budget {self.session.config.budget}): {p.description}" + (f"\n  {params}" if params else ""))
        elif name == "/save":
            from ..engine.snapshot import save_command

            self.print(self.worker.call(lambda session: save_command(session, text)))
        elif name == "/clear":
            self.worker.call(lambda session: session.history.clear())
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

    def __init__(self, session: Session, frames: FrameSource | Iterable, *, write: Callable[[str], None] | None = None,
                 notice: Callable[[str], None] | None = None, prompt: Callable[[], None] | None = None,
                 emit: Callable[[object], None] | None = None, pace: bool = False) -> None:
        super().__init__(session, frames, write=write, pace=pace)
        self.notice = notice or (lambda text: sys.stderr.write(text + "\n"))
        self.show_prompt = prompt
        self.emit = emit
        self._prompted = False  # a prompt is on the terminal, waiting for a line
        self._echo = False  # questions typed at a terminal are written to stdout too (`| tee log` keeps them)

    def _notify(self, message: str) -> None:
        """A notice on a line of its own: after a waiting prompt, a new line first, then the prompt again."""
        self.notice(("\n" if self._prompted else "") + f"» {message}")
        if self._prompted and self.show_prompt:
            self.show_prompt()

    def _prompt(self) -> None:
        if self.show_prompt:
            self.show_prompt()
            self._prompted = True

    def print(self, text: str) -> None:
        """Command output: on stdout, or with ``emit`` (--json) on stderr, so stdout holds JSON only."""
        if self.emit is not None:
            self.notice(text)
        else:
            super().print(text)

    def run(self, lines: Iterable[str] | None = None) -> None:
        """Answer ``lines`` (default: stdin) until they end."""
        self._echo = lines is None and self.emit is None and sys.stdin.isatty()
        self.ingestor.start()
        try:
            self._prompt()
            for raw in lines if lines is not None else sys.stdin:
                self._prompted = False
                text = raw.strip()
                if text.startswith("/"):
                    if not self.command(text):
                        break
                elif text:
                    if self._echo:
                        self.write(f"? {text}\n")
                    self.answer(text)
                self._prompt()
        finally:
            self.ingestor.stop()

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

        self.ingestor.flush_for_question()
        answer = self.worker.answer(question)
        log_answer(answer, model=self.session.adapter.name, policy=self.session.policy.name)
        self.emit(AskedAnswer(answer, answer.stream_time_s, self.worker.call(Session.stats)))


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


def run_interactive(session: Session, frames, **kwargs) -> None:
    """The full-screen prompt (stdin and stdout are terminals)."""
    Assistant(session, frames, history_file=kwargs.pop("history_file", history_path()), **kwargs).run()


def run_lines(session: Session, frames, lines: Iterable[str] | None = None, **kwargs) -> None:
    """Questions line by line, without a full-screen prompt (see ``LineAssistant``)."""
    LineAssistant(session, frames, **kwargs).run(lines)
