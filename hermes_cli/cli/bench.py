"""``hermes bench``: time to first token and memory against stream length, per memory policy.

Registered in cli/main.py as ``app.command("bench")(bench)``. Imports stay light here: torch and
transformers load inside the command.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from .. import defaults
from ..models.registry import ARCHS
from .console import UserError, err, out, quiet, set_debug, set_verbosity
from .groups import OptionGroup, option_group, with_option_groups
from .options import policy_list_names
from .torch_stack import check_torch_stack


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


@dataclass(frozen=True)
class BenchEngineOptions:
    """Many streams on one engine: ingest side by side, answers decoded together."""

    streams: Annotated[str | None, typer.Option(
        "--streams", metavar="N,M",
        help="Instead: for each count, that many streams on one engine, each fed the longest step's frames "
        "at once by its own thread (first policy only); report the aggregate ingest_frames_per_s and the "
        "memory each stream adds against its kv_bytes. E.g. 1,4.",
    )] = None
    concurrent_questions: Annotated[str | None, typer.Option(
        "--concurrent-questions", metavar="B,C",
        help="Instead: for each count B, B streams of the longest step's frames, then a question on each at "
        "once, decoded together in one batch (first policy only); report decode_tokens_per_s. E.g. 1,8.",
    )] = None
    notify: Annotated[int, typer.Option(
        "--notify", metavar="N", min=0,
        help="Probe N --notify conditions after every chunk (none fires); each record gets notify_ms_per_chunk "
        "and notify_fraction (probe time / prefill time).",
    )] = 0


@option_group("output", "bench")
class BenchOutputOptions(OptionGroup):
    """What is printed and written."""

    plot: Annotated[str | None, typer.Option(
        "--plot", metavar="FILE",
        help="Write a PNG of TTFT and memory against frames, one line per policy (needs matplotlib).",
    )] = None
    profile: Annotated[bool, typer.Option(
        "--profile", help="Split a chunk's time per policy: decode, vision encoding, prefill, pseudo-query, selection; "
        "each record also gets prefill_vs_bare and tpot_vs_bare (ours over the bare model on the same cache).",
    )] = False


@with_option_groups
def bench(
    stream: BenchStreamOptions = BenchStreamOptions(),
    model: BenchModelOptions = BenchModelOptions(),
    answers: BenchAnswerOptions = BenchAnswerOptions(),
    engine: BenchEngineOptions = BenchEngineOptions(),
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

    One engine, many streams: --streams 1,4 feeds that many streams at once (one record per
    count: streams, ingest_frames_per_s, rss_bytes, kv_bytes_per_stream,
    rss_growth_per_stream_vs_kv); --concurrent-questions 1,8 asks one question on each of B
    streams at once (one record per count: batch, decode_tokens_per_s). --notify N probes N
    conditions after every chunk: each record gets notify_ms_per_chunk and notify_fraction.

    \b
    Examples:
      hermes bench --model tiny --frames 16,64,256 --policies hermes,full \\
          --budget 200 --json
      hermes bench --arch llava-onevision-0.5b --random-weights \\
          --synthetic-vision --frames 8,16,32,48 --chunk 4 --budget 1024 \\
          --plot bench.png
      hermes bench --arch llava-onevision-0.5b --random-weights \\
          --synthetic-vision --frames 32 --chunk 16 --streams 1,4 --json
    """
    set_debug(output.debug)
    set_verbosity(output.quiet_, output.verbose_)
    steps, names, frame_size = _check_options(stream, model, answers, output)
    counts = _check_engine_options(engine, answers)
    s, a, o = stream, answers, output
    frame_source = _frame_source(s.video, s.fps, frame_size, steps[-1])  # a short or bad video fails before loading
    adapter = _load(model.model, model.arch, model.device, model.dtype)
    budget = s.budget

    if budget is None:
        from ..bench.runner import default_budget

        budget, streamed = default_budget(adapter, steps, s.chunk, frame_size)
        _say(f"defaults: budget {budget} tokens/layer = a quarter of the {streamed} tokens {steps[-1]} frames "
             f"stream ({streamed // max(steps[-1], 1)} per frame at {frame_size[0]}x{frame_size[1]}) — "
             "set --budget to choose")
    info = _describe(adapter, s.synthetic_vision, names, steps, budget, s.chunk)
    for line in info:
        _say(line)

    if counts is not None:
        _engine_mode(adapter, engine, counts, names[0], steps[-1], budget, s, a, o, frame_source)
        return

    if a.questions:
        _questions(adapter, a.questions, steps[-1], names[0], budget, s.chunk, s.fps, frame_source, a.max_new_tokens,
                   a.history_tokens, not a.history_text, a.question, s.synthetic_vision, o.json_out)
        return

    from ..bench.runner import BenchInterrupted

    interrupted = False
    try:
        records = _run(adapter, names, steps, budget, s.chunk, s.fps, a.repeats, a.warmup, a.max_new_tokens,
                       a.question, frame_source, s.synthetic_vision, json_out=o.json_out, console=err,
                       pseudo_query=s.pseudo_query, kv_bits=s.kv_bits, profile=o.profile, notify=engine.notify)
    except BenchInterrupted as exc:
        records, interrupted = exc.records, True
        _say(f"[yellow]interrupted[/]: {len(records)} step(s) measured — reporting those")
        if not records:
            raise typer.Exit(130) from None

    from ..bench.runner import policy_summaries, ttft_versus

    if not o.json_out:  # (with --json each record was printed as soon as it was measured)
        for table in _tables(records, adapter, out.width):
            out.print(table)
    summary_console = err if o.json_out else out
    if o.json_out and quiet():
        return  # the records are the results; the summary lines on stderr are details
    for p in policy_summaries(records):
        _summary(summary_console,
            f"[bold]{p.policy}[/]: TTFT({p.frames_most})/TTFT({p.frames_fewest}) = {p.ttft_ratio:.2f} · "
            f"peak memory ×{p.memory_ratio:.2f} · KV cache ×{p.kv_ratio:.2f} · "
            f"compress_fraction {100 * p.compress_fraction:.1f}% · peak {p.peak_memory_bytes / 2**20:.0f} MiB · "
            f"ingest ×{p.realtime:.1f} real time at {s.fps:g} fps · KV {p.kv_bytes / 2**20:.2f} MiB · "
            + ("budget reached" if p.budget_reached else "[yellow]budget never reached[/]"),
        )
    if o.profile:
        _print_profile(records, summary_console)
    for bounded in ("hermes", "infinipot"):
        if bounded in names and "fifo" in names:
            ratio = ttft_versus(records, bounded, "fifo")
            if ratio is not None:
                summary_console.print(f"TTFT {bounded}/fifo at {_common_longest(records, bounded, 'fifo')} frames, "
                                      f"the longest stream both were measured at: {ratio:.2f}")
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
    from .catalog import parse_options

    try:
        steps = parse_steps(s.frames)
        names = policy_names(s.policies)
        frame_size = _parse_size(s.size)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    for name in names:
        parse_options(name, ())
    if s.budget is not None and s.budget < 1:
        raise UserError("--budget must be a positive number of tokens")
    if a.questions < 0 or a.history_tokens < 0:
        raise UserError("--questions and --history-tokens cannot be negative")
    if s.chunk < 1:
        raise UserError("--chunk must be at least 1")
    if s.kv_bits not in defaults.KV_BITS_CHOICES:
        raise UserError(f"--kv-bits must be one of {', '.join(map(str, defaults.KV_BITS_CHOICES))}, got {s.kv_bits}")
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


def _check_engine_options(e: BenchEngineOptions, a: BenchAnswerOptions) -> list[int] | None:
    """The counts of --streams or --concurrent-questions (None: neither), checked before loading."""
    from ..bench.plan import parse_counts

    if e.streams is not None and e.concurrent_questions is not None:
        raise UserError("--streams and --concurrent-questions are two runs: pass one of them")
    if (e.streams is not None or e.concurrent_questions is not None) and a.questions:
        raise UserError("--questions is a run of its own: drop it, or drop --streams/--concurrent-questions")
    try:
        if e.streams is not None:
            return parse_counts(e.streams, "--streams")
        if e.concurrent_questions is not None:
            return parse_counts(e.concurrent_questions, "--concurrent-questions")
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    return None


def _engine_mode(adapter, e: BenchEngineOptions, counts: list[int], policy: str, frames: int, budget,
                 s: BenchStreamOptions, a: BenchAnswerOptions, o: BenchOutputOptions, frame_source) -> None:
    """``--streams`` or ``--concurrent-questions``: one record per count, then a summary line."""
    from ..bench.runner import BenchInterrupted, run_concurrent, run_streams
    from ..engine.client import PositionLimitError
    from ..sources import SourceError

    console = err if o.json_out else out

    def on_event(event: dict) -> None:
        if event["phase"] != "measured":
            return
        r = event["record"]
        if o.json_out:
            print(json.dumps(r.to_json()), flush=True)
        elif e.streams is not None:
            console.print(f"  {r.streams:>3} streams · {r.frames} frames each · ingest {r.ingest_frames_per_s:.2f} "
                          f"frames/s · memory {r.rss_bytes / 2**20:.0f} MiB · KV {r.kv_bytes_per_stream / 2**20:.1f} "
                          f"MiB per stream · growth per stream {r.rss_growth_per_stream_vs_kv:.2f}× KV "
                          f"(over {r.growth_reference})", soft_wrap=True)
        else:
            console.print(f"  batch {r.batch:>3} · {r.decode_tokens} tokens in {r.decode_s:.2f} s · "
                          f"{r.decode_tokens_per_s:.1f} tokens/s · TPOT {r.tpot_ms_mean:.1f} ms · "
                          f"×{r.speedup:.2f} of batch {counts[0]}", soft_wrap=True)

    video = s.video
    make = (lambda k: frame_source()) if video else None  # every stream reads the same file
    interrupted = False
    records: list = []
    what = "streams" if e.streams is not None else "concurrent questions"
    err.print(f"{what} {', '.join(map(str, counts))} · {frames} frames per stream under {policy}", soft_wrap=True)
    try:
        if e.streams is not None:
            run_streams(adapter, counts, frames=frames, policy=policy, budget=budget, chunk=s.chunk, fps=s.fps,
                        make_frames=make, synthetic_vision=s.synthetic_vision, warmup=a.warmup,
                        pseudo_query=s.pseudo_query, progress=on_event, records=records)
        else:
            run_concurrent(adapter, counts, frames=frames, policy=policy, budget=budget, chunk=s.chunk, fps=s.fps,
                           max_new_tokens=a.max_new_tokens, question=a.question, make_frames=make,
                           synthetic_vision=s.synthetic_vision, warmup=a.warmup, pseudo_query=s.pseudo_query,
                           progress=on_event, records=records)
    except BenchInterrupted:
        interrupted = True
        err.print(f"[yellow]interrupted[/]: {len(records)} count(s) measured — reporting those")
    except (ValueError, SourceError, PositionLimitError) as exc:
        raise UserError(str(exc).splitlines()[0]) from exc
    if len(records) > 1:
        first, last = records[0], records[-1]
        summary = err if o.json_out else out
        if e.streams is not None:
            summary.print(f"{last.streams} streams: ingest ×{last.ingest_frames_per_s / first.ingest_frames_per_s:.2f} "
                          f"of {first.streams} · memory growth per stream {last.rss_growth_per_stream_vs_kv:.2f}× "
                          "its kv_bytes", soft_wrap=True)
        else:
            summary.print(f"batch {last.batch}: decode ×{last.speedup:.2f} the tokens/s of batch {first.batch}",
                          soft_wrap=True)
    if interrupted:
        raise typer.Exit(130)


def _print_profile(records, console) -> None:
    from ..bench.runner import profile

    for p in profile(records):
        folded = f" · {p['folded_chunks']} of {p['chunks']} chunks folded their pseudo-queries into prefill" \
            if p["folded_chunks"] else ""
        _summary(
            console, f"[bold]{p['policy']}[/] per chunk: decode {p['decode_ms']:.1f} ms · vision {p['encode_ms']:.1f} ms · "
            f"prefill {p['prefill_ms']:.1f} ms · pseudo-query {p['pseudo_query_ms']:.1f} ms · "
            f"selection {p['select_ms']:.1f} ms{folded}"
            + (f" · prefill_vs_bare {p['prefill_vs_bare']:.3f}" if p["prefill_vs_bare"] is not None else "")
            + (f" · tpot_vs_bare {p['tpot_vs_bare']:.3f}" if p["tpot_vs_bare"] is not None else ""),
        )


def _questions(adapter, count, frames_before, policy, budget, chunk, fps, frame_source, max_new_tokens,
               history_tokens, history_kv, question, synthetic_vision, json_out) -> None:
    """``--questions N``: TTFT of N questions in a row on one stream, first against last."""
    import statistics

    from ..bench.runner import BenchInterrupted, run_questions

    mode = "kept keys and values" if history_kv else "re-encoded text"
    _say(f"{frames_before} frames under {policy}, then {count} questions with history on "
         f"(up to {history_tokens} tokens of earlier turns, {mode})")

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
        _summary(
            console, f"question 1: TTFT {first.ttft_ms:.1f} ms (context {first.context_tokens} tokens) · "
            f"question {last.index}: TTFT {last.ttft_ms:.1f} ms (context {last.context_tokens} tokens, "
            f"{last.prompt_tokens} prefilled) · ratio {last.ttft_ms / first.ttft_ms:.2f} · "
            f"median of the last {window} / first {window}: {tail / head:.2f}",
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
    check_torch_stack()
    from ..models.loading import load_model

    if arch:
        from ..models.archs import load_random_arch

        return load_random_arch(arch, device=device, dtype=dtype)
    return load_model(model, device=device, dtype=dtype)


def _frame_source(video, fps, frame_size, frames_needed: int):
    """A maker of fresh (frame, time) iterators; a video is checked now: readable, and long enough
    to give ``frames_needed`` frames at ``fps`` (when its duration is known)."""
    from ..bench.runner import video_frames
    from ..models.synthetic import synthetic_frames

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
         synthetic_vision, *, json_out, console, pseudo_query, kv_bits=defaults.KV_BITS, profile=False, notify=0):
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
            elif not quiet():
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
                             pseudo_query=pseudo_query, kv_bits=kv_bits, profile=profile, notify=notify)
    except ValueError as exc:
        raise UserError(str(exc).splitlines()[0]) from exc


def _common_longest(records, policy: str, other: str) -> int:
    """The most frames both policies were measured at (after Ctrl-C, one may have got further)."""
    return max({r.frames for r in records if r.policy == policy} & {r.frames for r in records if r.policy == other})


def _say(text: str) -> None:
    """A line about the run (not a result) on stderr; -q drops it."""
    if not quiet():
        err.print(text, soft_wrap=True)


def _summary(console, text: str) -> None:
    """A summary line: one line in a file or pipe (scripts read these), wrapped between words on a terminal."""
    console.print(text, soft_wrap=not console.is_terminal)


# (header, cell) per column; the first two name the row in each table
_COLUMNS: dict[str, tuple[str, object]] = {
    "policy": ("policy", lambda r: r.policy),
    "frames": ("frames", lambda r: str(r.frames)),
    "stream": ("stream tok", lambda r: str(r.stream_tokens)),
    "cache": ("cache tok", lambda r: str(r.cache_tokens)),
    "kv": ("KV MiB", lambda r: f"{r.kv_bytes / 2**20:.1f}"),
    "peak": ("peak MiB", lambda r: f"{r.peak_memory_bytes / 2**20:.0f}"),
    "ttft": ("TTFT ms", lambda r: f"{r.ttft_ms:.1f}"),
    "tpot": ("TPOT ms", lambda r: "-" if r.tpot_ms is None else f"{r.tpot_ms:.1f}"),
    "ingest": ("ingest ms/frame", lambda r: f"{r.ingest_ms_per_frame:.1f}"),
    "compress": ("compress ms/chunk", lambda r: f"{r.compress_ms_per_chunk:.1f}"),
    "share": ("compress / prefill", lambda r: f"{100 * r.compress_fraction:.1f}%"),
}
_SPLIT = (("answering", ("policy", "frames", "ttft", "tpot", "cache", "kv", "peak")),
          ("ingesting", ("policy", "frames", "stream", "ingest", "compress", "share")))


def _tables(records, adapter, width: int | None = None) -> list:
    """The results as one table, or, where that is wider than ``width``, as two (answering, then
    ingesting), each led by policy and frames; headers wrap between words, never cut."""
    from rich.console import Console
    from rich.table import Table

    def table(title: str, keys) -> Table:
        t = Table(title=title)
        for key in keys:
            t.add_column(_COLUMNS[key][0], justify="left" if key == "policy" else "right", overflow="fold")
        for r in records:
            t.add_row(*(_COLUMNS[key][1](r) for key in keys))  # type: ignore[operator]
        return t

    whole = table(f"hermes bench — {adapter.name}", tuple(_COLUMNS))
    measure = Console(width=10_000)
    if width is None or measure.measure(whole).maximum <= width:
        return [whole]
    return [table(f"hermes bench — {adapter.name} — {title}", keys) for title, keys in _SPLIT]
