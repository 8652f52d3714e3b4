"""The interactive assistant: a background thread ingests the stream while a prompt answers.

One ``SessionWorker`` thread owns the session; everything else sends it requests. ``Ingestor``
runs in its own thread and only reads frames from the source and submits them to the worker (a
question waits for at most the chunk in flight); the prompt (prompt-toolkit) asks the worker,
streams answers token by token and shows live readouts in its bottom toolbar. Errors in the
thread become messages; the prompt stays usable and questions keep working on the memory as it is.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import HTML
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings
from prompt_toolkit.patch_stdout import patch_stdout

from ..engine.records import SessionStats
from ..engine.session import Session
from ..engine.worker import SessionWorker, WorkerStopped

HELP = """\
Ask anything about the stream; answers come from the memory as it is now.
  /stats    readouts in full            /memory   what each layer group still holds
  /pause    stop ingesting              /resume   continue ingesting
  /policy   the memory policy           /clear    forget the conversation (keep the video)
  /help     this text                   /quit     leave (also Ctrl-D, or Ctrl-C at an empty prompt)
Alt-Enter (or Esc Enter) starts a new line; Ctrl-C cancels an answer in progress."""


class Ingestor:
    """Reads frames from a source on a background thread and submits them to the session worker.

    Never dies silently. Its thread writes only ``error``, ``frames_read`` and
    ``frames_refused``; the readouts (``snapshot``, ``paused``) are published by the worker.
    Pausing holds the thread on the worker's queue (no polling). Exactness: every frame read is
    taken by the worker (then in the memory or pending in a partial chunk — flushed at the end of
    the stream) or refused because the worker stopped: ``frames_read ==
    worker.counts().frames_taken + frames_refused`` when this is the worker's only source.
    """

    def __init__(self, session: Session | SessionWorker, frames: Iterable, notify: Callable[[str], None]) -> None:
        self.worker = session if isinstance(session, SessionWorker) else SessionWorker(session)
        self.session = self.worker.session  # its settings only: the worker owns its state
        self.frames = frames
        self.notify = notify
        self.stopping = threading.Event()
        self.finished = threading.Event()
        self.error: str | None = None
        self.frames_read = 0
        self.frames_refused = 0
        self._warned = 0
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="hermes-ingest", daemon=True)

    @property
    def snapshot(self) -> SessionStats:
        """The session's stats as the worker last published them."""
        return self.worker.stats()

    @property
    def paused(self) -> threading.Event:
        """Set while the worker is paused (read-only: use ``pause``/``resume``)."""
        return self.worker.paused

    def pause(self) -> None:
        """Stop ingesting; returns once no chunk is in flight."""
        self.worker.pause()

    def resume(self) -> None:
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
                self.frames_read += 1
                try:
                    self.worker.ingest([frame.image], [frame.timestamp])
                except WorkerStopped as stopped:
                    self.frames_refused += 1 - stopped.frames_taken
                    return
                self._say_new_warnings()
            if self.stopping.is_set():
                return
            self.worker.flush()
            s = self.worker.stats()
            self.notify(f"end of stream: {s.frames_seen} frames, {s.stream_time_s:.1f}s — "
                        "questions keep working on the final memory")
        except WorkerStopped:
            return
        except Exception as exc:  # the prompt must hear about it, and stay usable
            self.error = f"{type(exc).__name__}: {exc}"
            self.notify(f"ingestion stopped: {exc} — questions still work on the memory so far")
        finally:
            self.finished.set()

    def _say_new_warnings(self) -> None:
        warnings = self.worker.warnings
        while self._warned < len(warnings):
            self.notify(f"warning: {warnings[self._warned]}")
            self._warned += 1

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop ingesting and the worker (the chunk in flight finishes), release the source, join."""
        self.stopping.set()
        close = getattr(self.frames, "close", None)
        if close is not None:
            close()
        self.worker.stop(timeout_s)
        if self.thread.ident is not None:
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
        self.worker = SessionWorker(session)  # the one thread that drives the session
        self.ingestor = Ingestor(self.worker, frames, self._notify)
        bindings = KeyBindings()

        @bindings.add("escape", "enter")
        def _newline(event):
            event.current_buffer.insert_text("\n")

        history: History = InMemoryHistory()
        if history_file is not None:
            try:
                history_file.parent.mkdir(parents=True, exist_ok=True)
                history = FileHistory(str(history_file))
            except OSError:
                pass
        self.prompt: PromptSession[str] = PromptSession(
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
        stream = None
        try:
            stream = self.worker.ask(question)
            for piece in stream:
                self.write(piece)
            self.write("\n")
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
            self.print(stats_text(self.worker.call(Session.stats), self.ingestor))
        elif name == "/memory":
            self.print(self.worker.call(memory_timeline))
        elif name == "/pause":
            self.ingestor.pause()
            self.print("paused: no frames are ingested until /resume")
        elif name == "/resume":
            self.ingestor.resume()
            self.print("resumed")
        elif name == "/policy":
            p = self.session.policy
            params = ", ".join(f"{f.name}={getattr(p, f.name)!r}" for f in p.parameters())
            self.print(f"{p.name} (budget {self.session.config.budget}): {p.description}" + (f"\n  {params}" if params else ""))
        elif name == "/clear":
            self.worker.call(lambda session: session.history.clear())
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
