"""The ``hermes`` command line."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from . import __version__

app = typer.Typer(
    name="hermes",
    help=(
        "Ask questions about a video while it streams. The model's KV cache is the memory: "
        "frames are prefilled chunk by chunk, a memory policy keeps the cache under a budget, "
        "and questions are answered from the cache as it is."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
err = Console(stderr=True, highlight=False)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)  # whole tables in files and pipes

DEBUG = {"on": False}


class UserError(Exception):
    """A problem the user can fix; printed as one line, exit code 2."""


from .options import (  # noqa: E402
    BudgetOpt, ChunkOpt, DebugOpt, DeviceOpt, DtypeOpt, FpsOpt, JsonOpt, MaxNewTokensOpt, MaxPixelsOpt, ModelOpt,
    PolicyOpt, PolicyOptsOpt, PseudoQueryOpt, ReconnectOpt, ReindexOpt, SystemOpt,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"hermes-video {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False,
) -> None:
    pass


def _default_model_name() -> str:
    from .model_names import model_from_env

    if env := model_from_env():  # known without importing torch
        return env
    from .models import default_model

    return default_model()[0]


def build_session(model, policy, budget, policy_opts, fps, chunk, device, dtype, reindex, *,
                  max_new_tokens=128, history=True, system_prompt=None, quiet=False, pseudo_query="forward",
                  max_pixels=None):
    """Load the model and policy (one-line errors) and open a session."""
    from .model_names import ModelLoadError, check_model_name

    try:  # before torch is imported: a name that cannot load fails in well under a second
        check_model_name(model or _default_model_name())
    except ModelLoadError as exc:
        raise UserError(str(exc)) from exc

    from policies import make_policy, parse_option

    from .models import load_model
    from .session import DEFAULT_SYSTEM_PROMPT, Session, SessionConfig

    try:
        options = dict(parse_option(policy, o) for o in policy_opts or [])
        pol = make_policy(policy, **options)
        config = SessionConfig(
            budget=budget, chunk_frames=chunk, fps=fps, reindex=reindex, max_new_tokens=max_new_tokens,
            history=history, system_prompt=system_prompt or DEFAULT_SYSTEM_PROMPT, pseudo_query=pseudo_query,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    try:
        adapter = load_model(model, device=device, dtype=dtype, max_pixels=max_pixels)
    except ModelLoadError as exc:
        raise UserError(str(exc)) from exc
    if adapter.random_weights and not quiet:
        err.print(f"[yellow]note:[/] {adapter.name} has random weights: answers are noise (for smoke runs and benchmarks)", soft_wrap=True)
    try:
        return Session(adapter, pol, config)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


# -- watch ------------------------------------------------------------------------------------
@app.command()
def watch(
    source: Annotated[str, typer.Argument(metavar="SOURCE", help="Video file or URL (http/https/HLS, rtsp, rtmp, tcp, udp).")],
    ask: Annotated[Optional[list[str]], typer.Option("--ask", "-a", metavar="QUESTION", help="Question answered at the end of the stream (repeatable).")] = None,
    ask_at: Annotated[Optional[list[str]], typer.Option("--ask-at", metavar="TIME=QUESTION", help="TIME=QUESTION: ask when the stream reaches TIME (30s, 1:05).")] = None,
    model: ModelOpt = None,
    policy: PolicyOpt = "hermes",
    budget: BudgetOpt = 6000,
    policy_opt: PolicyOptsOpt = None,
    fps: FpsOpt = 1.0,
    chunk: ChunkOpt = 16,
    reindex: ReindexOpt = "lazy",
    max_new_tokens: MaxNewTokensOpt = 128,
    realtime: Annotated[bool, typer.Option("--realtime", help="Pace a file at real time instead of as fast as the model allows.")] = False,
    reconnect: ReconnectOpt = None,
    no_history: Annotated[bool, typer.Option("--no-history", help="Answer each question on its own (no earlier turns).")] = False,
    system: SystemOpt = None,
    pseudo_query: PseudoQueryOpt = "forward",
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
    DEBUG["on"] = debug
    from .streaming import TimedQuestion

    try:
        questions = [TimedQuestion(q) for q in ask or []] + [TimedQuestion.parse(q) for q in ask_at or []]
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    frames = _open_source(source, fps, realtime=realtime, reconnect=reconnect)
    session = build_session(model, policy, budget, policy_opt, fps, chunk, device, dtype, reindex,
                            max_new_tokens=max_new_tokens, history=not no_history, system_prompt=system,
                            quiet=json_out, pseudo_query=pseudo_query, max_pixels=max_pixels)
    if not questions and sys.stdin.isatty():
        from .live import run_interactive

        run_interactive(session, frames)
        return
    _run_batch(session, frames, questions, json_out)


@app.command()
def chat(
    source: Annotated[Optional[str], typer.Argument(metavar="[SOURCE]", help="A live URL (rtsp, rtmp, tcp, udp, http) — or, with --webcam, a camera device.")] = None,
    webcam: Annotated[bool, typer.Option("--webcam", help="Watch a camera (default: this platform's first camera).")] = False,
    list_devices: Annotated[bool, typer.Option("--list-devices", help="List the cameras found and exit.")] = False,
    model: ModelOpt = None,
    policy: PolicyOpt = "hermes",
    budget: BudgetOpt = 6000,
    policy_opt: PolicyOptsOpt = None,
    fps: FpsOpt = 1.0,
    chunk: ChunkOpt = 16,
    reindex: ReindexOpt = "lazy",
    max_new_tokens: MaxNewTokensOpt = 128,
    system: SystemOpt = None,
    pseudo_query: PseudoQueryOpt = "forward",
    max_pixels: MaxPixelsOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    reconnect: ReconnectOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Talk about a live camera or stream while it runs: an interactive prompt with live readouts.

    \b
    Examples:
      hermes chat --webcam                  (Linux: /dev/video0; macOS: camera 0)
      hermes chat --webcam /dev/video2 --model Qwen/Qwen2.5-VL-3B-Instruct
      hermes chat rtsp://camera.local/stream
    """
    DEBUG["on"] = debug
    from .sources import default_camera, devices_hint
    from .sources import list_devices as find_cameras

    if list_devices:
        cameras = find_cameras()
        for camera in cameras:
            out.print(camera)
        if not cameras:
            err.print(f"no cameras found — {devices_hint()}", soft_wrap=True)
        return
    if not webcam and not source:
        raise UserError("nothing to watch: pass --webcam [DEVICE] or a live URL (see hermes chat --help)")
    spec = (source or default_camera()) if webcam else source
    frames = _open_source(spec, fps, webcam=webcam, reconnect=reconnect)
    session = build_session(model, policy, budget, policy_opt, fps, chunk, device, dtype, reindex,
                            max_new_tokens=max_new_tokens, system_prompt=system, pseudo_query=pseudo_query,
                            max_pixels=max_pixels)
    from .live import run_interactive

    run_interactive(session, frames)


def _open_source(spec: str, fps: float, reconnect: str | None = None, **kwargs):
    from .sources import SourceError, open_source
    from .streaming import parse_time

    try:
        reconnect_s = None if reconnect is None else parse_time(reconnect)
        source = open_source(spec, fps, reconnect_s=reconnect_s, **kwargs)
        if source.rate_note:
            err.print(f"[yellow]note:[/] {escape(source.rate_note)}", soft_wrap=True)
        return source
    except SourceError as exc:
        raise UserError(str(exc)) from exc
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def answer_record(result) -> dict:
    """The JSON object printed for one answer."""
    a, stats = result.answer, result.stats
    return {
        "question": a.question,
        "answer": a.text,
        "asked_at_s": result.asked_at_s,
        **a.record(),
        "no_frames": a.no_frames,
        **{k: v for k, v in stats.items() if k not in ("stream_time_s", "frames_seen")},
    }


def _run_batch(session, frames, questions, json_out: bool) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .session import PositionLimitError
    from .sources import SourceError
    from .streaming import run_stream

    def on_answer(result):
        if json_out:
            print(json.dumps(answer_record(result)), flush=True)
        else:
            a = result.answer
            when = f"{a.stream_time_s:.1f}s"
            out.print(f"[bold]Q[/] ({when}, {a.frames_seen} frames): {a.question}")
            out.print(f"[bold]A[/]: {a.text}")
            if a.ttft_ms is not None:
                out.print(f"[dim]  ttft {a.ttft_ms:.0f} ms · tpot {a.tpot_ms or 0:.1f} ms · "
                          f"cache {max(result.stats['cache']['tokens_per_layer'])} tokens/layer[/]")

    show_progress = not json_out and err.is_terminal
    progress = Progress(TextColumn("[bold]streaming[/]"), BarColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), console=err, disable=not show_progress, transient=True)
    duration = getattr(frames, "duration_s", None)
    try:
        with progress, frames:
            task = progress.add_task("stream", total=duration, info="")

            def on_frame(frame):  # every frame: plain counters, not a stats() snapshot
                progress.update(task, completed=frame.timestamp,
                                info=f"{frame.timestamp:6.1f}s · {session.frames_seen} frames · "
                                     f"{session.cache.length} tokens/layer")

            run_stream(session, frames, questions, on_answer=on_answer, on_frame=on_frame if show_progress else None)
    except (SourceError, PositionLimitError) as exc:
        raise UserError(str(exc)) from exc
    for warning in [*(getattr(getattr(frames, "stats", None), "warnings", []) or []), *session.warnings]:
        err.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    if not questions and not json_out:
        s = session.stats()
        out.print(f"streamed {s['frames_seen']} frames ({s['stream_time_s']:.1f}s); "
                  f"cache {max(s['cache']['tokens_per_layer'])} tokens/layer, {s['cache']['kv_bytes'] / 2**20:.1f} MiB")


# -- models / policies ---------------------------------------------------------------------------
@app.command()
def models(json_out: JsonOpt = False) -> None:
    """List the supported model families, the default on this machine, and local weights."""
    from .models import FAMILIES, default_model, locally_present
    from .model_names import TINY_NAMES

    name, why = default_model()
    rows = [
        {"family": f.name, "model": m, "present": locally_present(m)}
        for f in FAMILIES for m in f.examples
    ]
    if json_out:
        print(json.dumps({"default": name, "default_reason": why, "models": rows,
                          "builtin": list(TINY_NAMES)}))
        return
    from rich.table import Table

    table = Table(title="supported models")
    for col in ("family", "model", "weights here"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["family"], r["model"], "[green]yes[/]" if r["present"] else "no")
    table.add_row("qwen2.5-vl", "tiny", "built in (random weights)")
    table.add_row("llava-onevision", "tiny-llava-onevision", "built in (random weights)")
    out.print(table)
    out.print(f"default here: [bold]{name}[/] ({why}); override with --model or HERMES_MODEL")
    out.print("any local directory holding one of these families works too: --model /path/to/model")


@app.command()
def policies(json_out: JsonOpt = False) -> None:
    """List the memory policies, what each keeps, and their parameters."""
    from policies import POLICIES

    data = [
        {
            "name": name,
            "keeps": cls.description,
            "parameters": [
                {"name": f.name, "default": f.default, "help": f.metadata.get("help", "")}
                for f in cls.parameters()
            ],
        }
        for name, cls in POLICIES.items()
    ]
    if json_out:
        print(json.dumps(data))
        return
    for p in data:
        out.print(f"[bold]{p['name']}[/] — {p['keeps']}")
        for prm in p["parameters"]:
            out.print(f"    {prm['name']} = {prm['default']!r}  [dim]{prm['help']}[/]")
    out.print("set parameters with --policy-opt KEY=VALUE")


from .bench_cmd import bench  # noqa: E402  (light: heavy imports happen inside)
from .eval_cmd import evaluate  # noqa: E402

app.command("bench")(bench)
app.command("eval")(evaluate)


def main() -> None:
    """Entry point: run the app; user errors become one line on stderr and exit code 2."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        app()
    except UserError as exc:
        if DEBUG["on"]:
            raise
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug: still one line, with the way to the details
        if DEBUG["on"]:
            raise
        err.print(f"[red]internal error:[/] {type(exc).__name__}: {escape(str(exc))} — rerun with --debug "
                  "for the traceback and please report it", soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
