"""The interactive assistant: a background thread ingests the stream while a prompt answers.

``Ingestor`` runs in its own thread and feeds frames to the session; the session's lock makes a
question wait for at most the chunk in flight. The prompt (prompt-toolkit) streams answers
token by token and shows live readouts in its bottom toolbar. Errors in the thread become
messages; the prompt stays usable and questions keep working on the memory as it is.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import HTML
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.patch_stdout import patch_stdout

from ..engine.records import SessionStats
from ..engine.session import Session

HELP = """\
Ask anything about the stream; answers come from the memory as it is now.
  /stats    readouts in full            /memory   what each layer group still holds
  /pause    stop ingesting              /resume   continue ingesting
  /policy   the memory policy           /clear    forget the conversation (keep the video)
  /save [FILE]  write the memory to FILE (default: --save-memory or --autosave) to resume it later
  /help     this text                   /quit     leave (also Ctrl-D, or Ctrl-C at an empty prompt)
Alt-Enter (or Esc Enter) starts a new line; Ctrl-C cancels an answer in progress."""


class Ingestor:
    """Feeds frames to a session from a background thread; never dies silently."""

    def __init__(self, session: Session, frames: Iterable, notify: Callable[[str], None]) -> None:
        self.session = session
        self.frames = frames
        self.notify = notify
        self.paused = threading.Event()
        self.stopping = threading.Event()
        self.finished = threading.Event()
        self.error: str | None = None
        self._warned = 0
        self.started = time.monotonic()
        self.snapshot: SessionStats = session.stats()
        self.thread = threading.Thread(target=self._run, name="hermes-ingest", daemon=True)

    def start(self) -> Ingestor:
        """Start the thread (once; later calls do nothing)."""
        if self.thread.ident is None:
            self.started = time.monotonic()
            self.thread.start()
        return self

    def _run(self) -> None:
        try:
            for frame in self.frames:
                while self.paused.is_set() and not self.stopping.is_set():
                    time.sleep(0.05)
                if self.stopping.is_set():
                    return
                if self.session.ingest([frame.image], [frame.timestamp]):
                    self.snapshot = self.session.stats()
                    self._say_new_warnings()
            self.session.flush()
            self.snapshot = self.session.stats()
            s = self.snapshot
            self.notify(f"end of stream: {s.frames_seen} frames, {s.stream_time_s:.1f}s — "
                        "questions keep working on the final memory")
        except Exception as exc:  # the prompt must hear about it, and stay usable
            self.error = f"{type(exc).__name__}: {exc}"
            self.notify(f"ingestion stopped: {exc} — questions still work on the memory so far")
        finally:
            self.finished.set()

    def _say_new_warnings(self) -> None:
        while self._warned < len(self.session.warnings):
            self.notify(f"warning: {self.session.warnings[self._warned]}")
            self._warned += 1

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop ingesting, release the source, and join the thread."""
        self.stopping.set()
        self.paused.clear()
        close = getattr(self.frames, "close", None)
        if close is not None:
            close()
        self.thread.join(timeout_s)

    @property
    def lag_s(self) -> float | None:
        """How far a live source's ingested stream time trails the wall clock (None for files)."""
        if not getattr(self.frames, "is_live", False) or not self.snapshot.frames_seen:
            return None
        return max(0.0, time.monotonic() - self.started - self.snapshot.stream_time_s)

    @property
    def speed(self) -> float | None:
        """Stream seconds ingested per wall-clock second."""
        wall = time.monotonic() - self.started
        return self.snapshot.stream_time_s / wall if wall > 0.5 else None


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def toolbar_text(ingestor: Ingestor) -> str:
    """The one-line live readout."""
    s = ingestor.snapshot
    session = ingestor.session
    cache, mem = s.cache, s.memory
    stats = getattr(ingestor.frames, "stats", None)
    dropped = getattr(stats, "frames_dropped", 0)
    state = "error" if ingestor.error else "done" if ingestor.finished.is_set() else (
        "paused" if ingestor.paused.is_set() else "live")
    t = s.stream_time_s
    budget = cache.budget if cache.budget is not None else "∞"
    chunk = s.prefill_ms_last_chunk
    speed = ingestor.speed
    answer = session.last_answer
    parts = [
        f"{state} {int(t // 60):02d}:{t % 60:04.1f}",
        f"frames {s.frames_seen} seen · {s.units_kept} units kept"
        + (f" · {dropped} dropped" if dropped else ""),
        f"cache {cache.stream_tokens}/{budget} tok · {_mib(cache.kv_bytes)}",
        f"RSS {_mib(mem.rss_bytes)}" + (f" · GPU peak {_mib(mem.gpu_peak_bytes)}" if mem.gpu_peak_bytes else ""),
        f"chunk {chunk:.0f} ms" if chunk is not None else "chunk —",
        f"{speed:.1f}× real time" if speed else "",
        f"lag {ingestor.lag_s:.1f}s" if ingestor.lag_s is not None else "",
    ]
    if answer is not None and answer.ttft_ms is not None:
        parts.append(f"TTFT {answer.ttft_ms:.0f} ms · TPOT {answer.tpot_ms or 0:.0f} ms")
    return " │ ".join(p for p in parts if p)


def memory_timeline(session: Session, width: int = 48) -> str:
    """Per layer group, which moments of the stream it still holds: █ held, · forgotten."""
    if not session.units_seen:
        return "nothing streamed yet"
    times = session.unit_times
    end = max(session.stream_time_s, 1e-6)
    held = session.held_units()
    lines = [f"0s {'─' * (width - 2)} {end:.0f}s"]
    for role, layers in session.policy.layer_groups(len(held)).items():
        if not layers:
            continue
        units = set().union(*(held[i] for i in layers))
        cells = ["·"] * width
        for u in units:
            if u < len(times):
                cells[min(width - 1, int(times[u] / end * width))] = "█"
        lines.append(f"{''.join(cells)}  {role} (layers {layers[0]}–{layers[-1]}, {len(units)} units)")
    return "\n".join(lines)


class Assistant:
    """The interactive prompt over a running ``Ingestor``."""

    def __init__(self, session: Session, frames: Iterable, *, input=None, output=None,
                 history_file: Path | None = None, write: Callable[[str], None] | None = None) -> None:
        self.session = session
        self.write = write or _write_stdout
        self.ingestor = Ingestor(session, frames, self._notify)
        bindings = KeyBindings()

        @bindings.add("escape", "enter")
        def _newline(event):
            event.current_buffer.insert_text("\n")

        history = InMemoryHistory()
        if history_file is not None:
            try:
                history_file.parent.mkdir(parents=True, exist_ok=True)
                history = FileHistory(str(history_file))
            except OSError:
                pass
        self.prompt = PromptSession(
            history=history, key_bindings=bindings, bottom_toolbar=self._toolbar,
            refresh_interval=0.25, input=input, output=output,
        )

    def print(self, text: str) -> None:
        self.write(text + "\n")

    def _notify(self, message: str) -> None:
        self.print(f"» {message}")

    def _toolbar(self):
        return HTML("<b>{}</b>").format(toolbar_text(self.ingestor))

    def run(self) -> None:
        """Prompt until /quit, Ctrl-D or Ctrl-C at an empty prompt; then stop the worker."""
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
        try:
            for piece in self.session.ask(question):
                self.write(piece)
            self.write("\n")
        except KeyboardInterrupt:
            self.write(" [cancelled]\n")
        except Exception as exc:  # a failing answer must not end the session
            self._notify(f"could not answer: {type(exc).__name__}: {exc}")
        self.ingestor.snapshot = self.session.stats()

    def command(self, text: str) -> bool:
        """Run a slash command; False means quit."""
        name = text.split()[0].lower()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/help":
            self.print(HELP)
        elif name == "/stats":
            self.print(stats_text(self.session.stats(), self.ingestor))
        elif name == "/memory":
            self.print(memory_timeline(self.session))
        elif name == "/pause":
            self.ingestor.paused.set()
            self.print("paused: no frames are ingested until /resume")
        elif name == "/resume":
            self.ingestor.paused.clear()
            self.print("resumed")
        elif name == "/policy":
            p = self.session.policy
            params = ", ".join(f"{f.name}={getattr(p, f.name)!r}" for f in p.parameters())
            self.print(f"{p.name} (budget {self.session.config.budget}): {p.description}" + (f"\n  {params}" if params else ""))
        elif name == "/save":
            from ..engine.snapshot import save_command

            self.print(save_command(self.session, text))
        elif name == "/clear":
            self.session.history.clear()
            self.print("conversation forgotten; the video memory is unchanged")
        else:
            self.print(f"unknown command {name} — /help lists them")
        return True


def stats_text(s: SessionStats, ingestor: Ingestor | None = None) -> str:
    """The full readout of ``/stats``."""
    cache, pos, mem = s.cache, s.positions, s.memory
    lines = [
        f"stream      {s.stream_time_s:.1f}s · {s.frames_seen} frames · {s.units_seen} units",
        f"cache       {cache.tokens} tokens/layer ({cache.prefix_tokens} prefix) · "
        f"budget {cache.budget} · {_mib(cache.kv_bytes)} · {cache.compressions} compressions",
        f"positions   next {pos.next} of {pos.limit} · re-index {pos.reindex} ({pos.reindex_count} done)",
        f"memory      RSS {_mib(mem.rss_bytes)} · GPU peak {_mib(mem.gpu_peak_bytes)}",
        f"last chunk  prefill {s.prefill_ms_last_chunk} ms · compress {s.compress_ms_last_chunk} ms",
        f"model       {s.model}{' (random weights)' if s.random_weights else ''} · policy {s.policy}",
    ]
    if ingestor is not None and ingestor.error:
        lines.append(f"error       {ingestor.error}")
    return "\n".join(lines)


def history_path() -> Path:
    return Path.home() / ".local" / "state" / "hermes-video" / "history"


def run_interactive(session: Session, frames, **kwargs) -> None:
    Assistant(session, frames, history_file=kwargs.pop("history_file", history_path()), **kwargs).run()
