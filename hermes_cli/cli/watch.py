"""``hermes watch`` and ``hermes chat``: stream a source and answer questions about it."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.markup import escape

from ..frames import FrameSource
from .console import Interrupted, UserError, err, out, quiet, set_debug, set_verbosity, warn
from .factory import build_engine, open_frames, open_stream
from .groups import (
    AnswerOptions,
    ChatOutputOptions,
    MemoryOptions,
    ModelOptions,
    OutputOptions,
    SnapshotOptions,
    SourceOptions,
    session_settings,
    with_option_groups,
)
from .memory import MemoryRun, given_options, source_id
from .notify import NotifyOptions


@with_option_groups
def watch(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(metavar="SOURCE", help="Video file or URL (http/https/HLS, rtsp, rtmp, tcp, udp).")],
    ask: Annotated[list[str] | None, typer.Option("--ask", "-a", metavar="QUESTION", help="Question answered at the end of the stream (repeatable).")] = None,
    ask_at: Annotated[list[str] | None, typer.Option("--ask-at", metavar="TIME=QUESTION", help="TIME=QUESTION: ask when the stream reaches TIME (30s, 1:05).")] = None,
    model_options: ModelOptions = ModelOptions(),
    memory_options: MemoryOptions = MemoryOptions(),
    answer_options: AnswerOptions = AnswerOptions(),
    realtime: Annotated[bool, typer.Option("--realtime", help="Pace a file at real time instead of as fast as the model allows.")] = False,
    source_options: SourceOptions = SourceOptions(),
    snapshot_options: SnapshotOptions = SnapshotOptions(),
    notify_options: NotifyOptions = NotifyOptions(),
    output: OutputOptions = OutputOptions(),
) -> None:
    """Stream a video through the model and answer questions from its memory.

    With --ask / --ask-at it answers and exits. Otherwise questions come from stdin: on a
    terminal, an interactive prompt while the video streams in the background; piped in, one
    question per line (answered at the end of a file, or when read on a live stream or with
    --realtime). With stdout piped, the prompt is plain lines (no full-screen prompt).

    \b
    Examples:
      hermes watch talk.mp4                      (interactive; the default model)
      hermes watch talk.mp4 --model tiny --ask "What happens?" --json
      hermes watch match.mp4 --policy infinipot --budget 4000 --ask-at 1:05="Who scored?"
      hermes watch lecture.mp4 --autosave lecture.safetensors    (saved every 60 s and at the end)
      hermes watch door.mp4 --notify "a person enters" --json    (a JSON object when it happens)
    """
    set_debug(output.debug)
    set_verbosity(output.quiet_, output.verbose_)
    json_out = output.json_out
    from ..app.streaming import TimedQuestion

    try:
        questions = [TimedQuestion(q) for q in ask or []] + [TimedQuestion.parse(q) for q in ask_at or []]
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    settings = session_settings(model_options, memory_options, answer_options)
    snapshots = MemoryRun.from_options(snapshot_options, quiet=json_out)
    settings = snapshots.settings(settings, given_options(ctx))
    settings.check()
    notify_options.check()
    mode = watch_mode(bool(questions), sys.stdin.isatty(), sys.stdout.isatty(), json_out)
    piped = mode == "batch" and not questions  # questions come from stdin, one per line
    if piped and realtime:
        mode = "lines"  # paced: each piped line is answered when it is read
    frames = open_frames(source, settings.memory.fps, source_options.reconnect)
    check_against_source(frames, questions)
    if piped and (realtime or frames.is_live):
        mode = "lines"  # a live stream: each piped line is answered when it is read
    elif piped:
        questions = [TimedQuestion(line.strip()) for line in sys.stdin if line.strip()]  # at the end of the file
    engine = build_engine(settings, quiet=json_out)
    try:
        stream = open_stream(engine, settings, live=frames.is_live, notifier=notify_options.notifier())
        frames = snapshots.attach(stream, frames, source_id(source))
        run_mode(mode, stream, frames, questions, json_out=json_out, pace=realtime, progress=not output.no_progress,
                 source=source, save_to=snapshots.save_to, notify_command=notify_options.command())
        snapshots.finish()
    finally:
        engine.stop()


def watch_mode(has_questions: bool, stdin_tty: bool, stdout_tty: bool, json_out: bool) -> str:
    """batch (--ask/--ask-at, or questions piped into stdin), prompt (both ends are terminals),
    or lines (a terminal on one end only, or --json: plain question and answer lines)."""
    if has_questions or not stdin_tty:
        return "batch"
    return "prompt" if stdout_tty and not json_out else "lines"


def run_mode(mode: str, stream, frames, questions, *, json_out: bool, pace: bool, progress: bool = True,
             source: str | None = None, save_to=None, notify_command=None) -> None:
    """Drive ``stream`` (an engine stream's client) in ``mode``; ``pace``: a file at real time;
    ``notify_command``: --on-notify's, run for each notification."""
    if mode == "batch":
        from ..app.notifications import NotificationWatcher
        from .notify import show_notification

        watcher = NotificationWatcher(stream, show_notification(json_out), notify_command).start()
        try:
            run_batch(stream, frames, questions, json_out, progress=progress, source=source, pace=pace)
        finally:
            watcher.stop()
    elif mode == "prompt":
        from ..app.live import run_interactive

        run_interactive(stream, frames, pace=pace, save_to=save_to, notify_command=notify_command)
    else:
        from ..app.live import run_lines

        def prompt() -> None:
            if sys.stdin.isatty() and err.is_terminal:
                err.file.write("? ")
                err.file.flush()

        emit = (lambda result: print(json.dumps(answer_record(result, frames)), flush=True)) if json_out else None
        if not json_out and not quiet():
            err.print(f"hermes · {stream.model} · policy {stream.policy.name} — one question per line, "
                      "/help for commands, Ctrl-D to leave", soft_wrap=True)
        run_lines(stream, frames, prompt=prompt, emit=emit, pace=pace, save_to=save_to, notify_command=notify_command)


def check_against_source(frames, questions) -> None:
    """Warn about --ask-at times past the end of a file."""
    duration = frames.duration_s
    for q in questions:
        if q.at_s is not None and duration is not None and q.at_s > duration:
            warn(f"--ask-at {q.at_s:g}s is after the end of {frames.name} ({duration:.1f}s): "
                 f"{q.question!r} is answered at the end of the stream")


@with_option_groups
def chat(
    ctx: typer.Context,
    source: Annotated[str | None, typer.Argument(metavar="SOURCE", help="A live URL (rtsp, rtmp, tcp, udp, http) — or, with --webcam, a camera device.")] = None,
    webcam: Annotated[bool, typer.Option("--webcam", help="Watch a camera (default: this platform's first camera).")] = False,
    list_devices: Annotated[bool, typer.Option("--list-devices", help="List the cameras found and exit.")] = False,
    server: Annotated[str | None, typer.Option("--server", metavar="URL", help="Talk to a stream of a `hermes serve` server instead (with --stream ID).")] = None,
    stream_id: Annotated[str | None, typer.Option("--stream", metavar="ID", help="With --server: the stream to talk about (GET /v1/streams lists them).")] = None,
    api_key: Annotated[str | None, typer.Option("--api-key", metavar="KEY", envvar="HERMES_API_KEY", help="With --server: the server's API key.")] = None,
    model_options: ModelOptions = ModelOptions(),
    memory_options: MemoryOptions = MemoryOptions(),
    answer_options: AnswerOptions = AnswerOptions(),
    source_options: SourceOptions = SourceOptions(),
    snapshot_options: SnapshotOptions = SnapshotOptions(),
    notify_options: NotifyOptions = NotifyOptions(),
    output: ChatOutputOptions = ChatOutputOptions(),
) -> None:
    """Talk about a live camera or stream while it runs: an interactive prompt with live readouts.

    With stdin or stdout not a terminal (or --json), questions are read one per line and each is
    answered when it is read.

    \b
    Examples:
      hermes chat --webcam                  (Linux: /dev/video0; macOS: camera 0)
      hermes chat --webcam /dev/video2 --model Qwen/Qwen2.5-VL-3B-Instruct
      hermes chat rtsp://camera.local/stream
      hermes chat --memory lecture.safetensors   (ask about a saved memory; see watch --save-memory)
      hermes chat --server http://127.0.0.1:8000 --stream s1   (a stream of `hermes serve`)
    """
    set_debug(output.debug)
    set_verbosity(output.quiet_, output.verbose_)
    json_out = output.json_out
    from ..sources import default_camera, devices_hint
    from ..sources import list_devices as find_cameras

    if server is not None or stream_id is not None:
        chat_with_server(server, stream_id, api_key, json_out=json_out,
                         max_new_tokens=answer_options.max_new_tokens if "max_new_tokens" in given_options(ctx) else None)
        return
    if list_devices:
        cameras = find_cameras()
        for camera in cameras:
            out.print(camera)
        if not cameras:
            err.print(f"no cameras found — {devices_hint()}", soft_wrap=True)
        return
    if not webcam and not source and not snapshot_options.memory:
        raise UserError("nothing to watch: pass --webcam [DEVICE], a live URL, or --memory FILE (see hermes chat --help)")
    settings = session_settings(model_options, memory_options, answer_options)
    snapshots = MemoryRun.from_options(snapshot_options, quiet=json_out)
    settings = snapshots.settings(settings, given_options(ctx))
    settings.check()
    notify_options.check()
    spec = (source or default_camera()) if webcam else source
    frames = None if spec is None else open_frames(spec, settings.memory.fps, source_options.reconnect, webcam=webcam)
    engine = build_engine(settings, quiet=json_out)
    try:
        stream = open_stream(engine, settings, live=frames is not None and frames.is_live,
                             notifier=notify_options.notifier())
        frames = snapshots.attach(stream, frames, None if spec is None else source_id(spec, webcam))
        mode = "prompt" if sys.stdin.isatty() and sys.stdout.isatty() and not json_out else "lines"
        run_mode(mode, stream, frames, [], json_out=json_out, pace=False, save_to=snapshots.save_to,
                 notify_command=notify_options.command())
        snapshots.finish()
    finally:
        engine.stop()


def chat_with_server(url: str | None, stream_id: str | None, api_key: str | None, *, json_out: bool,
                     max_new_tokens: int | None = None) -> None:
    """``hermes chat --server URL --stream ID``: the prompt (or plain lines) on a server's stream."""
    if not url or not stream_id:
        raise UserError("--server URL and --stream ID go together (GET URL/v1/streams lists the streams)")
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--server must be an http:// or https:// URL, got {url!r}")
    try:
        from ..serve.client import RemoteStream, ServerError, ServerFrames
    except ImportError:
        raise UserError("hermes chat --server needs httpx2: pip install 'hermes-video[serve]'") from None
    try:
        stream = RemoteStream(url, stream_id, api_key=api_key, max_new_tokens=max_new_tokens)
    except ServerError as exc:
        raise UserError(f"{url}: {exc}") from None
    try:
        mode = "prompt" if sys.stdin.isatty() and sys.stdout.isatty() and not json_out else "lines"
        run_mode(mode, stream, ServerFrames(stream), [], json_out=json_out, pace=False)
    finally:
        stream.close()


def answer_record(result, frames: FrameSource | None = None) -> dict:
    """The JSON object printed for one answer; with ``frames``, the source's counters too
    (frames dropped by a lagging consumer, a live stream's gaps and the samples they cost)."""
    a = result.answer
    stats = result.stats.to_json()
    record = {
        "question": a.question,
        "answer": a.text,
        "asked_at_s": result.asked_at_s,
        **a.record(),
        "no_frames": a.no_frames,
        **{k: v for k, v in stats.items() if k not in ("stream_time_s", "frames_seen")},
    }
    if frames is not None:
        c = frames.stats
        record["source"] = {"frames_dropped": c.frames_dropped, "gaps": c.gaps, "gap_s": round(c.gap_s, 3),
                            "frames_lost": c.frames_lost}
    return record


def run_batch(stream, frames, questions, json_out: bool, *, progress: bool = True, source: str | None = None,
              pace: bool = False) -> None:
    """Stream ``frames`` and answer the timed questions, printing each answer as it comes.

    On a terminal a progress bar runs on stderr; answers are printed above it (the bar steps
    aside for each), and bar and answers count the same frames. Ctrl-C stops with a word on how
    far the stream got (exit code 130).
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..app.streaming import run_stream
    from ..engine.client import PositionLimitError, StreamFailed
    from ..sources import SourceError

    show_progress = progress and not json_out and err.is_terminal and not quiet()
    bar = Progress(TextColumn("[bold]streaming[/]"), BarColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), console=err, disable=not show_progress, transient=True,
                   redirect_stdout=False, redirect_stderr=False)
    read = {"frames": 0, "time": 0.0, "answers": 0}

    def on_answer(result):
        read["answers"] += 1
        if json_out:
            print(json.dumps(answer_record(result, frames)), flush=True)
            return
        if show_progress:
            bar.stop()  # transient: the bar leaves the screen while the answer is printed
        print_answer(result)
        if show_progress:
            bar.start()

    def on_frame(frame):  # every frame: plain counters, not a stats() snapshot
        read["frames"] += 1
        read["time"] = frame.timestamp
        if show_progress:
            bar.update(task, completed=frame.timestamp,
                       info=f"{frame.timestamp:6.1f}s · {read['frames']} frames · "
                            f"{stream.stats().cache.tokens} tokens/layer")

    try:
        with bar, frames:
            task = bar.add_task("stream", total=frames.duration_s, info="")
            run_stream(stream, frames, questions, on_answer=on_answer, on_frame=on_frame, pace=pace)
    except (SourceError, PositionLimitError, StreamFailed) as exc:
        from .urls import explain_source_error

        cause = exc.__cause__ if isinstance(exc, StreamFailed) and exc.__cause__ is not None else exc
        if isinstance(exc, StreamFailed) and not isinstance(cause, (SourceError, PositionLimitError)):
            raise cause from None  # a fault of the program: --debug shows it whole
        raise UserError(explain_source_error(source, str(cause))) from exc
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted at {read['time']:.1f}s of the stream ({read['frames']} frames read); "
                          f"{read['answers']} of {len(questions)} questions answered") from None
    for warning in [*frames.stats.warnings, *stream.warnings]:
        warn(warning)
    if not questions and not json_out:
        s = stream.fresh_stats()
        out.print(f"streamed {s.frames_seen} frames ({s.stream_time_s:.1f}s); "
                  f"cache {s.cache.tokens} tokens/layer, {s.cache.kv_bytes / 2**20:.1f} MiB")


def print_answer(result) -> None:
    """An answer as text: the question with when it was asked, the answer, its timings."""
    a = result.answer
    out.print(f"[bold]Q[/] ({a.stream_time_s:.1f}s, {a.frames_seen} frames): {escape(a.question)}", soft_wrap=True)
    out.print(f"[bold]A[/]: {escape(a.text)}", soft_wrap=True)
    if a.ttft_ms is not None:
        out.print(f"[dim]  ttft {a.ttft_ms:.0f} ms · tpot {a.tpot_ms or 0:.1f} ms · "
                  f"cache {result.stats.cache.tokens} tokens/layer[/]", soft_wrap=True)
