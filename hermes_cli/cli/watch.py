"""``hermes watch`` and ``hermes chat``: stream a source and answer questions about it."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from .. import defaults
from .console import UserError, err, out, set_debug, warn
from .factory import AnswerSettings, MemorySettings, ModelSettings, SessionSettings, build_session, open_frames
from .options import (
    BudgetOpt,
    ChunkOpt,
    DebugOpt,
    DeviceOpt,
    DtypeOpt,
    FpsOpt,
    HistoryTokensOpt,
    JsonOpt,
    MaxNewTokensOpt,
    MaxPixelsOpt,
    ModelOpt,
    PolicyOpt,
    PolicyOptsOpt,
    PseudoQueryOpt,
    ReindexOpt,
    SystemOpt,
)


def watch(
    source: Annotated[str, typer.Argument(metavar="SOURCE", help="Video file or URL (http/https/HLS, rtsp, rtmp, tcp, udp).")],
    ask: Annotated[list[str] | None, typer.Option("--ask", "-a", metavar="QUESTION", help="Question answered at the end of the stream (repeatable).")] = None,
    ask_at: Annotated[list[str] | None, typer.Option("--ask-at", metavar="TIME=QUESTION", help="TIME=QUESTION: ask when the stream reaches TIME (30s, 1:05).")] = None,
    model: ModelOpt = None,
    policy: PolicyOpt = defaults.POLICY,
    budget: BudgetOpt = defaults.BUDGET,
    policy_opt: PolicyOptsOpt = None,
    fps: FpsOpt = defaults.FPS,
    chunk: ChunkOpt = defaults.CHUNK_FRAMES,
    reindex: ReindexOpt = defaults.REINDEX,
    max_new_tokens: MaxNewTokensOpt = defaults.MAX_NEW_TOKENS,
    realtime: Annotated[bool, typer.Option("--realtime", help="Pace a file at real time instead of as fast as the model allows.")] = False,
    no_history: Annotated[bool, typer.Option("--no-history", help="Answer each question on its own (no earlier turns).")] = False,
    history_tokens: HistoryTokensOpt = defaults.HISTORY_TOKENS,
    system: SystemOpt = None,
    pseudo_query: PseudoQueryOpt = defaults.PSEUDO_QUERY,
    max_pixels: MaxPixelsOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    json_out: JsonOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Stream a video through the model and answer questions from its memory.

    With --ask / --ask-at it answers and exits; otherwise it opens an interactive prompt while
    the video streams in the background.

    \b
    Examples:
      hermes watch talk.mp4                      (interactive; the default model)
      hermes watch talk.mp4 --model tiny --ask "What happens?" --json
      hermes watch match.mp4 --policy infinipot --budget 4000 --ask-at 1:05="Who scored?"
    """
    set_debug(debug)
    from ..app.streaming import TimedQuestion

    try:
        questions = [TimedQuestion(q) for q in ask or []] + [TimedQuestion.parse(q) for q in ask_at or []]
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    settings = SessionSettings(
        ModelSettings(model, device, dtype, max_pixels),
        MemorySettings(policy, budget, tuple(policy_opt or ()), fps, chunk, reindex, pseudo_query),
        AnswerSettings(max_new_tokens, not no_history, system, history_tokens),
    )
    settings.check()
    frames = open_frames(source, fps, realtime=realtime)
    session = build_session(settings, quiet=json_out)
    if not questions and sys.stdin.isatty():
        from ..app.live import run_interactive

        run_interactive(session, frames)
        return
    run_batch(session, frames, questions, json_out)


def chat(
    source: Annotated[str | None, typer.Argument(metavar="[SOURCE]", help="A live URL (rtsp, rtmp, tcp, udp, http) — or, with --webcam, a camera device.")] = None,
    webcam: Annotated[bool, typer.Option("--webcam", help="Watch a camera (default: this platform's first camera).")] = False,
    list_devices: Annotated[bool, typer.Option("--list-devices", help="List the cameras found and exit.")] = False,
    model: ModelOpt = None,
    policy: PolicyOpt = defaults.POLICY,
    budget: BudgetOpt = defaults.BUDGET,
    policy_opt: PolicyOptsOpt = None,
    fps: FpsOpt = defaults.FPS,
    chunk: ChunkOpt = defaults.CHUNK_FRAMES,
    reindex: ReindexOpt = defaults.REINDEX,
    max_new_tokens: MaxNewTokensOpt = defaults.MAX_NEW_TOKENS,
    history_tokens: HistoryTokensOpt = defaults.HISTORY_TOKENS,
    system: SystemOpt = None,
    pseudo_query: PseudoQueryOpt = defaults.PSEUDO_QUERY,
    max_pixels: MaxPixelsOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Talk about a live camera or stream while it runs: an interactive prompt with live readouts.

    \b
    Examples:
      hermes chat --webcam                  (Linux: /dev/video0; macOS: camera 0)
      hermes chat --webcam /dev/video2 --model Qwen/Qwen2.5-VL-3B-Instruct
      hermes chat rtsp://camera.local/stream
    """
    set_debug(debug)
    from ..sources import default_camera, devices_hint
    from ..sources import list_devices as find_cameras

    if list_devices:
        cameras = find_cameras()
        for camera in cameras:
            out.print(camera)
        if not cameras:
            err.print(f"no cameras found — {devices_hint()}", soft_wrap=True)
        return
    if not webcam and not source:
        raise UserError("nothing to watch: pass --webcam [DEVICE] or a live URL (see hermes chat --help)")
    settings = SessionSettings(
        ModelSettings(model, device, dtype, max_pixels),
        MemorySettings(policy, budget, tuple(policy_opt or ()), fps, chunk, reindex, pseudo_query),
        AnswerSettings(max_new_tokens, True, system, history_tokens),
    )
    settings.check()
    spec = (source or default_camera()) if webcam else source
    assert spec is not None
    frames = open_frames(spec, fps, webcam=webcam)
    session = build_session(settings)
    from ..app.live import run_interactive

    run_interactive(session, frames)


def answer_record(result) -> dict:
    """The JSON object printed for one answer."""
    a = result.answer
    stats = result.stats.to_json()
    return {
        "question": a.question,
        "answer": a.text,
        "asked_at_s": result.asked_at_s,
        **a.record(),
        "no_frames": a.no_frames,
        **{k: v for k, v in stats.items() if k not in ("stream_time_s", "frames_seen")},
    }


def run_batch(session, frames, questions, json_out: bool) -> None:
    """Stream ``frames`` and answer the timed questions, printing each answer as it comes."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..app.streaming import run_stream
    from ..engine.positions import PositionLimitError
    from ..sources import SourceError

    def on_answer(result):
        if json_out:
            print(json.dumps(answer_record(result)), flush=True)
        else:
            a = result.answer
            out.print(f"[bold]Q[/] ({a.stream_time_s:.1f}s, {a.frames_seen} frames): {a.question}")
            out.print(f"[bold]A[/]: {a.text}")
            if a.ttft_ms is not None:
                out.print(f"[dim]  ttft {a.ttft_ms:.0f} ms · tpot {a.tpot_ms or 0:.1f} ms · "
                          f"cache {result.stats.cache.tokens} tokens/layer[/]")

    show_progress = not json_out and err.is_terminal
    progress = Progress(TextColumn("[bold]streaming[/]"), BarColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), console=err, disable=not show_progress, transient=True)
    try:
        with progress, frames:
            task = progress.add_task("stream", total=frames.duration_s, info="")

            def on_frame(frame):  # every frame: plain counters, not a stats() snapshot
                progress.update(task, completed=frame.timestamp,
                                info=f"{frame.timestamp:6.1f}s · {session.frames_seen} frames · "
                                     f"{session.cache.length} tokens/layer")

            run_stream(session, frames, questions, on_answer=on_answer, on_frame=on_frame if show_progress else None,
                       prefetch=session.config.chunk_frames)  # decode the next chunk while this one prefills
    except (SourceError, PositionLimitError) as exc:
        raise UserError(str(exc)) from exc
    for warning in [*frames.stats.warnings, *session.warnings]:
        warn(warning)
    if not questions and not json_out:
        s = session.stats()
        out.print(f"streamed {s.frames_seen} frames ({s.stream_time_s:.1f}s); "
                  f"cache {s.cache.tokens} tokens/layer, {s.cache.kv_bytes / 2**20:.1f} MiB")
