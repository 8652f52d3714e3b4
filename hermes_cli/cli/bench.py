"""``hermes bench``: time to first token and memory against stream length, per memory policy.

Registered in cli/main.py as ``app.command("bench")(bench)``. Imports stay light here: torch and
transformers load inside the command.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from .. import defaults
from ..models.registry import ARCHS
from .console import UserError, err, out, set_debug
from .groups import OptionGroup, option_group, with_option_groups
from .options import policy_list_names


@option_group("model", "bench")
class BenchModelOptions(OptionGroup):
    """The model measured: a real one, the built-in, or a full-size architecture with random weights."""

    arch: Annotated[str | None, typer.Option(
        "--arch", metavar="ARCH",
        help=f"Full-size architecture built with random weights (needs --random-weights): {', '.join(ARCHS)}.",
    )] = None
    random_weights: Annotated[bool, typer.Option(
        "--random-weights", help="With --arch: build the model with random weights (no download).",
    )] = False


@option_group("memory", "bench", own_first=True)
class BenchStreamOptions(OptionGroup):
    """What streams through each policy, and how the memory is kept."""

    frames: Annotated[str, typer.Option(
        "--frames", "-f", metavar="FRAMES|STEPS",
        help="Longest stream in frames (steps: 16, 64, 256 … up to it), or explicit steps like 16,64,256.",
    )] = defaults.BENCH_FRAMES
    policies: Annotated[str, typer.Option(
        "--policies", metavar="NAMES", autocompletion=policy_list_names,
        help="Comma-separated memory policies to compare (see `hermes policies`).",
    )] = defaults.BENCH_POLICIES
    synthetic_vision: Annotated[bool, typer.Option(
        "--synthetic-vision",
        help="Skip the vision tower: random visual embeddings with the real token layout "
        "(measures the language model and the memory policy only).",
    )] = False
    video: Annotated[str | None, typer.Option(
        "--video", metavar="FILE", help="Stream this video file instead of synthetic frames (it must be long enough).",
    )] = None
    size: Annotated[str, typer.Option(
        "--size", metavar="HxW", help="HxW of the synthetic frames (sets tokens per frame for Qwen-VL).",
    )] = "360x640"


@option_group("answers", "bench", own_first=True)
class BenchAnswerOptions(OptionGroup):
    """How each step is measured: answers per step, their length, and the many-questions mode."""

    repeats: Annotated[int, typer.Option("--repeats", metavar="N", help="Measured answers per step (the median is reported).")] = 3
    warmup: Annotated[int, typer.Option("--warmup", metavar="N", help="Unmeasured answers before those, per step; if any, one unmeasured chunk is also streamed before the first policy, so it does not pay the model's first-run costs.")] = 1
    question: Annotated[str, typer.Option("--question", metavar="TEXT", help="The question asked at each step.")] = defaults.BENCH_QUESTION
    questions: Annotated[int, typer.Option(
        "--questions", metavar="N",
        help="Instead: stream the longest step, then ask the question N times in a row with history on "
        "(first policy only); report TTFT per question, first vs last.",
    )] = 0
    history_text: Annotated[bool, typer.Option(
        "--history-text", help="With --questions: re-encode earlier turns as text instead of keeping their keys and values.",
    )] = False


@option_group("output", "bench")
class BenchOutputOptions(OptionGroup):
    """What is printed and written."""

    plot: Annotated[str | None, typer.Option(
        "--plot", metavar="FILE",
        help="Write a PNG of TTFT and memory against frames, one line per policy (needs matplotlib).",
    )] = None
    profile: Annotated[bool, typer.Option(
        "--profile", help="Split a chunk's time per policy: decode, vision encoding, prefill, pseudo-query, selection.",
    )] = False


@with_option_groups
def bench(
    stream: BenchStreamOptions = BenchStreamOptions(),
    model: BenchModelOptions = BenchModelOptions(),
    answers: BenchAnswerOptions = BenchAnswerOptions(),
    output: BenchOutputOptions = BenchOutputOptions(),
) -> None:
    """Measure how answering and memory scale with stream length, per memory policy.

    For each policy, one stream is fed frame by frame and paused at each step (16, 64, 256,
    512 frames by default) to answer the same question: --warmup answers first, then
    --repeats measured ones (medians). Answering leaves the memory as it was, so the stream
    simply continues to the next step.

    Per policy and step it reports TTFT (question in → first token out), TPOT (per further
    token), peak memory (GPU: max allocated; CPU: the process's peak resident set, weights
    included), the KV-cache bytes and tokens per layer, ingest time per frame, and the
    compression time per chunk with its share of the prefill time. A line per policy gives
    TTFT(most frames)/TTFT(fewest) and the same ratio for memory: a bounded policy keeps both
    near 1, `full` grows.

    Real model sizes without weights: --arch NAME --random-weights builds a full-size model
    (parameters and dtype are printed) — add --synthetic-vision to skip the vision tower.

    Examples:

      hermes bench --model tiny --frames 16,64,256 --policies hermes,full --budget 200 --json

      hermes bench --arch llava-onevision-0.5b --random-weights --synthetic-vision
      --frames 8,16,32,48 --chunk 4 --budget 1024 --plot bench.png
    """
    set_debug(output.debug)
    steps, names, frame_size = _check_options(stream, model, answers, output)
    s, a, o = stream, answers, output
    frame_source = _frame_source(s.video, s.fps, frame_size, steps[-1])  # a short or bad video fails before loading
    adapter = _load(model.model, model.arch, model.device, model.dtype)
    budget = s.budget

    if budget is None:
        from ..bench.runner import default_budget

        budget, streamed = default_budget(adapter, steps, s.chunk, frame_size)
        err.print(f"defaults: budget {budget} tokens/layer = a quarter of the {streamed} tokens {steps[-1]} frames "
                  f"stream ({streamed // max(steps[-1], 1)} per frame at {frame_size[0]}x{frame_size[1]}) — "
                  "set --budget to choose", soft_wrap=True)
    info = _describe(adapter, s.synthetic_vision, names, steps, budget, s.chunk)
    for line in info:
        err.print(line, soft_wrap=True)

    if a.questions:
        _questions(adapter, a.questions, steps[-1], names[0], budget, s.chunk, s.fps, frame_source, a.max_new_tokens,
                   a.history_tokens, not a.history_text, a.question, s.synthetic_vision, o.json_out)
        return

    from ..bench.runner import BenchInterrupted

    interrupted = False
    try:
        records = _run(adapter, names, steps, budget, s.chunk, s.fps, a.repeats, a.warmup, a.max_new_tokens,
                       a.question, frame_source, s.synthetic_vision, json_out=o.json_out, console=err,
                       pseudo_query=s.pseudo_query)
    except BenchInterrupted as exc:
        records, interrupted = exc.records, True
        err.print(f"[yellow]interrupted[/]: {len(records)} step(s) measured — reporting those")
        if not records:
            raise typer.Exit(130) from None

    from ..bench.runner import policy_summaries, ttft_versus

    if not o.json_out:  # (with --json each record was printed as soon as it was measured)
        out.print(_table(records, adapter))
    summary_console = err if o.json_out else out
    for p in policy_summaries(records):
        summary_console.print(
            f"[bold]{p.policy}[/]: TTFT({p.frames_most})/TTFT({p.frames_fewest}) = {p.ttft_ratio:.2f} · "
            f"peak memory ×{p.memory_ratio:.2f} · KV cache ×{p.kv_ratio:.2f} · "
            f"compress_fraction {100 * p.compress_fraction:.1f}% · peak {p.peak_memory_bytes / 2**20:.0f} MiB · "
            f"ingest ×{p.realtime:.1f} real time at {s.fps:g} fps · KV {p.kv_bytes / 2**20:.2f} MiB · "
            + ("budget reached" if p.budget_reached else "[yellow]budget never reached[/]"),
            soft_wrap=True,  # one line per policy, whatever the width: scripts read these
        )
    if o.profile:
        _print_profile(records, summary_console)
    for bounded in ("hermes", "infinipot"):
        if bounded in names and "fifo" in names:
            ratio = ttft_versus(records, bounded, "fifo")
            if ratio is not None:
                summary_console.print(f"TTFT {bounded}/fifo at the longest stream: {ratio:.2f}")
    if o.plot:
        from ..bench.runner import plot_records

        title = f"{adapter.name} · budget {budget} · chunk {s.chunk}" + (" · synthetic vision" if s.synthetic_vision else "")
        try:
            plot_records(records, o.plot, title)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot write the plot to {o.plot}: {exc}") from exc
        summary_console.print(f"plot written to {o.plot}")
    if interrupted:
        raise typer.Exit(130)


def _check_options(s: BenchStreamOptions, m: BenchModelOptions, a: BenchAnswerOptions,
                   o: BenchOutputOptions) -> tuple[list[int], list[str], tuple[int, int]]:
    """(steps, policy names, frame size) — every option that can be checked before anything loads."""
    from ..bench.plan import parse_steps, policy_names
    from .catalog import check_policy

    try:
        steps = parse_steps(s.frames)
        names = policy_names(s.policies)
        frame_size = _parse_size(s.size)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    for name in names:
        check_policy(name, ())
    if s.budget is not None and s.budget < 1:
        raise UserError("--budget must be a positive number of tokens")
    if a.questions < 0 or a.history_tokens < 0:
        raise UserError("--questions and --history-tokens cannot be negative")
    if s.chunk < 1:
        raise UserError("--chunk must be at least 1")
    if s.fps <= 0:
        raise UserError("--fps must be positive")
    if a.repeats < 1 or a.warmup < 0 or a.max_new_tokens < 1:
        raise UserError("--repeats and --max-new-tokens must be at least 1, --warmup at least 0")
    if m.arch and not m.random_weights:
        raise UserError("--arch builds a model without weights: add --random-weights (or load real weights with --model)")
    if m.random_weights and not m.arch:
        raise UserError("--random-weights needs --arch NAME (e.g. --arch llava-onevision-0.5b)")
    from ..models.registry import check_model_name, resolve_arch

    if m.arch:  # a name that cannot load fails before torch is imported
        resolve_arch(m.arch)
    else:
        check_model_name(m.model)
    if s.video and s.synthetic_vision:
        raise UserError("--synthetic-vision does not look at frames: drop --video, or drop --synthetic-vision")
    if o.plot:
        from ..bench.runner import matplotlib_available

        if not matplotlib_available():
            raise UserError("--plot needs matplotlib: pip install 'hermes-video[plot]'")
        folder = Path(o.plot).expanduser().resolve().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise UserError(f"--plot {o.plot}: cannot write in {folder} — pass a path in an existing, writable folder")
    return steps, names, frame_size


def _print_profile(records, console) -> None:
    from ..bench.runner import profile

    for p in profile(records):
        folded = f" · {p['folded_chunks']} of {p['chunks']} chunks folded their pseudo-queries into prefill" \
            if p["folded_chunks"] else ""
        console.print(
            f"[bold]{p['policy']}[/] per chunk: decode {p['decode_ms']:.1f} ms · vision {p['encode_ms']:.1f} ms · "
            f"prefill {p['prefill_ms']:.1f} ms · pseudo-query {p['pseudo_query_ms']:.1f} ms · "
            f"selection {p['select_ms']:.1f} ms{folded}",
            soft_wrap=True,
        )


def _questions(adapter, count, frames_before, policy, budget, chunk, fps, frame_source, max_new_tokens,
               history_tokens, history_kv, question, synthetic_vision, json_out) -> None:
    """``--questions N``: TTFT of N questions in a row on one stream, first against last."""
    import statistics

    from ..bench.runner import BenchInterrupted, run_questions

    mode = "kept keys and values" if history_kv else "re-encoded text"
    err.print(f"{frames_before} frames under {policy}, then {count} questions with history on "
              f"(up to {history_tokens} tokens of earlier turns, {mode})", soft_wrap=True)

    def on_event(event):
        if event["phase"] == "measured" and json_out:
            print(json.dumps(event["record"].to_json()), flush=True)

    interrupted = False
    try:
        records = run_questions(adapter, count, frames_before=frames_before, policy=policy, budget=budget,
                                chunk=chunk, fps=fps, frames=frame_source(), max_new_tokens=max_new_tokens,
                                history_tokens=history_tokens, history_kv=history_kv, question=question,
                                synthetic_vision=synthetic_vision, progress=on_event)
    except BenchInterrupted as exc:
        records, interrupted = exc.records, True
    if records:
        console = err if json_out else out
        first, last = records[0], records[-1]
        window = min(10, len(records))
        head = statistics.median(r.ttft_ms for r in records[:window])
        tail = statistics.median(r.ttft_ms for r in records[-window:])
        console.print(
            f"question 1: TTFT {first.ttft_ms:.1f} ms (context {first.context_tokens} tokens) · "
            f"question {last.index}: TTFT {last.ttft_ms:.1f} ms (context {last.context_tokens} tokens, "
            f"{last.prompt_tokens} prefilled) · ratio {last.ttft_ms / first.ttft_ms:.2f} · "
            f"median of the last {window} / first {window}: {tail / head:.2f}", soft_wrap=True,
        )
    if interrupted:
        raise typer.Exit(130)


def _parse_size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size expects HxW such as 360x640, got {text!r}") from None
    if h < 28 or w < 28:
        raise ValueError("--size must be at least 28x28")
    return h, w


def _load(model, arch, device, dtype):
    from ..models.loading import load_model

    if arch:
        from ..models.archs import load_random_arch

        return load_random_arch(arch, device=device, dtype=dtype)
    return load_model(model, device=device, dtype=dtype)


def _frame_source(video, fps, frame_size, frames_needed: int):
    """A maker of fresh (frame, time) iterators; a video is checked now: readable, and long enough
    to give ``frames_needed`` frames at ``fps`` (when its duration is known)."""
    from ..bench.runner import synthetic_frames, video_frames

    if not video:
        return lambda: synthetic_frames(frame_size, fps)
    from ..sources import open_source

    try:  # open once now so a bad file is a one-line error (SourceError) before any work
        source = open_source(video, fps)
        duration, rate = source.duration_s, source.effective_fps
        source.close()
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    if duration is not None and int(duration * rate) + 1 < frames_needed:
        raise UserError(f"{video} is {duration:.1f}s: at {rate:g} fps that is about {int(duration * rate) + 1} frames, "
                        f"fewer than --frames {frames_needed} — ask for fewer frames or a higher --fps")
    return lambda: video_frames(video, fps)


def _describe(adapter, synthetic_vision, names, steps, budget, chunk) -> list[str]:
    params = adapter.parameter_count()
    dtype = str(adapter.dtype).replace("torch.", "")
    lines = [
        f"model: [bold]{adapter.name}[/] · {params / 1e9:.3f} B parameters ({params:,}) · {dtype} · {adapter.device}",
    ]
    if adapter.random_weights:
        lines.append("[yellow]note:[/] random weights: speed and memory are real, answers are noise")
    if synthetic_vision:
        lines.append("[yellow]note:[/] synthetic vision: random visual embeddings with the real token layout; "
                     "the vision tower does not run (language-model and policy figures only)")
    lines.append(f"policies {', '.join(names)} · steps {', '.join(map(str, steps))} frames · "
                 f"budget {budget} tokens/layer · chunk {chunk} frames · {adapter.num_layers} layers")
    return lines


def _run(adapter, names, steps, budget, chunk, fps, repeats, warmup, max_new_tokens, question, frame_source,
         synthetic_vision, *, json_out, console, pseudo_query):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..bench.runner import run_bench

    total = len(names) * steps[-1]
    progress = Progress(
        TextColumn("[bold]bench[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal,
        redirect_stdout=False,  # JSON records stay on stdout
    )
    done = {"policies": 0}

    def on_event(event: dict) -> None:
        base = done["policies"] * steps[-1]
        if event["phase"] == "ingest":
            progress.update(task, completed=base + event["frames"],
                            info=f"{event['policy']}: streaming to {event['step']} frames")
        elif event["phase"] == "answer":
            progress.update(task, info=f"{event['policy']}: answering at {event['frames']} frames")
        elif event["phase"] == "measured":
            r = event["record"]
            if json_out:
                d = r.to_json()
                d.pop("ttft_samples_ms", None)
                print(json.dumps(d), flush=True)
            else:
                console.print(f"  {r.policy:>10} · {r.frames:>5} frames · TTFT {r.ttft_ms:8.1f} ms · "
                              f"cache {r.cache_tokens} tokens · KV {r.kv_bytes / 2**20:.1f} MiB")
            if event["step"] == steps[-1]:
                done["policies"] += 1

    try:
        with progress:
            task = progress.add_task("bench", total=total, info="")
            return run_bench(adapter, names, steps, budget=budget, chunk=chunk, fps=fps, repeats=repeats,
                             warmup=warmup, max_new_tokens=max_new_tokens, frames=frame_source,
                             synthetic_vision=synthetic_vision, question=question, progress=on_event,
                             pseudo_query=pseudo_query)
    except ValueError as exc:
        raise UserError(str(exc).splitlines()[0]) from exc


def _table(records, adapter):
    from rich.table import Table

    table = Table(title=f"hermes bench — {adapter.name}")
    for col in ("policy", "frames", "stream tok", "cache tok", "KV MiB", "peak MiB", "TTFT ms", "TPOT ms",
                "ingest ms/frame", "compress ms/chunk", "compress/prefill"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in records:
        table.add_row(
            r.policy, str(r.frames), str(r.stream_tokens), str(r.cache_tokens), f"{r.kv_bytes / 2**20:.1f}",
            f"{r.peak_memory_bytes / 2**20:.0f}", f"{r.ttft_ms:.1f}", "-" if r.tpot_ms is None else f"{r.tpot_ms:.1f}",
            f"{r.ingest_ms_per_frame:.1f}", f"{r.compress_ms_per_chunk:.1f}", f"{100 * r.compress_fraction:.1f}%",
        )
    return table
