"""``hermes eval``: run a benchmark annotation file through a model and memory policy.

Registered in ``cli/main.py`` as ``app.command("eval")(evaluate)``. Light at import: the model, torch
and PyAV are loaded only when a run needs them.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from .. import defaults
from .console import Interrupted, UserError, counted, err, out, quiet, set_debug, set_verbosity, warn
from .factory import SessionSettings, build_engine, open_stream, prepare_model
from .groups import OptionGroup, option_group, session_settings, with_option_groups
from .notify import NotifyRuleOptions

TasksOpt = Annotated[
    list[str] | None,
    typer.Option("--tasks", "-t", metavar="TASK", help="Only these tasks (repeatable or comma-separated, case-insensitive); see --dry-run for the names."),
]


@option_group("model", "eval")
class EvalModelOptions(OptionGroup):
    """--model, --device, --dtype, --max-pixels."""


@option_group("memory", "eval")
class EvalMemoryOptions(OptionGroup):
    """The memory policy and how the stream fills the memory, at the papers' defaults."""


@option_group("answers", "eval")
class EvalAnswerOptions(OptionGroup):
    """--max-new-tokens, --history/--no-history, --penalise-prompt."""


@option_group("output", "eval")
class EvalOutputOptions(OptionGroup):
    """--json, --no-progress, -q, -v, --debug."""


@dataclass(frozen=True)
class JudgeOptions:
    """The judge of open-ended answers (an OpenAI-compatible endpoint)."""

    judge_url: Annotated[str | None, typer.Option("--judge-url", metavar="URL", help="OpenAI-compatible endpoint (e.g. http://localhost:8000/v1) to judge open-ended answers.")] = None
    judge_model: Annotated[str, typer.Option("--judge-model", metavar="NAME", help="Model name sent to the judge.")] = "gpt-3.5-turbo"
    judge_key_env: Annotated[str, typer.Option("--judge-key-env", metavar="VARIABLE", help="Environment variable holding the judge's API key.")] = "OPENAI_API_KEY"


@with_option_groups
def evaluate(
    annotations: Annotated[Path, typer.Argument(metavar="ANNOTATIONS", help="Benchmark annotation JSON (HERMES / ReKV format).", show_default=False)],
    videos_dir: Annotated[Path | None, typer.Option("--videos-dir", "-d", metavar="FOLDER", help="Folder holding the videos; annotation paths are remapped by file name (searched recursively).")] = None,
    model_options: EvalModelOptions = EvalModelOptions(),
    memory_options: EvalMemoryOptions = EvalMemoryOptions(),
    offline: Annotated[bool | None, typer.Option("--offline/--streaming", help="Protocol. Default: streaming when the questions carry end times, else offline.", show_default=False)] = None,
    tasks: TasksOpt = None,
    limit: Annotated[int | None, typer.Option("--limit", "-n", metavar="N", help="Only the first N questions (after --tasks).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", metavar="FILE", help="Results JSONL, one record per question. Rerunning with the same file resumes: finished questions are skipped. Default: ANNOTATIONS.results-SETTINGS.jsonl next to the annotations (one file per model, policy and settings).")] = None,
    summary_path: Annotated[Path | None, typer.Option("--summary", metavar="FILE", help="Summary JSON (default: next to --output, as NAME.summary.json).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only validate the annotations and count questions per task and missing videos.")] = False,
    answer_options: EvalAnswerOptions = EvalAnswerOptions(),
    npy_fps: Annotated[float, typer.Option("--npy-fps", metavar="FPS", help="Frame rate of videos stored as .npy frame arrays (RVS-Movie).")] = 1.0,
    judge: JudgeOptions = JudgeOptions(),
    notify_options: NotifyRuleOptions = NotifyRuleOptions(),
    streams: Annotated[int, typer.Option("--streams", metavar="N", help="Videos streamed at once on one engine (one model in memory; their chunks take turns and their answers are decoded together). Results are the same, in the same order, as with 1.")] = 1,
    output_options: EvalOutputOptions = EvalOutputOptions(),
) -> None:
    """Measure accuracy on a streaming or offline video benchmark, with any model, policy and budget.

    ANNOTATIONS is a JSON list of videos in the format HERMES and ReKV use (StreamingBench,
    OVO-Bench, RVS-Ego/-Movie, VideoMME, MVBench, EgoSchema): video_id, video_path and
    conversations (question, answer, choices, end_time …). Entries that do not fit are reported
    in one summary and skipped; missing videos are counted and skipped.

    Streaming protocol (sets with end times): each video streams once and each question is asked
    when the stream reaches its end_time, answered from the memory at that moment, then removed
    from the cache. Offline protocol (--offline; VideoMME, MVBench, EgoSchema): the whole video,
    then the questions.

    Multiple choice: options are shown as letters and the answer letter is read from the reply;
    accuracy is reported overall, per task and per video length. Open-ended: predictions are
    written for a judge (--judge-url), with a built-in "lenient match" that is not the papers' metric.

    StreamingBench Proactive Output: each question is polled with the --notify probe after every
    chunk from its time_stamp on, fires by the --notify-* rule (docs/notify.md) and is right when
    the output contains ground_truth_output within ±2 s of ground_truth_time_stamp.

    \b
    Examples:
      hermes eval sb_real.json --videos-dir ~/data/streamingbench --dry-run
      hermes eval sb_real.json -d ~/data/sb -m Qwen/Qwen2.5-VL-7B-Instruct \\
          --budget 4000 -o sb.jsonl
      hermes eval videomme.json -d ~/data/videomme --offline \\
          --tasks "Counting Problem" --limit 50 -o vm.jsonl
    """
    from ..evaluation.runner import EvalSettings, VideoFinder, default_protocol, default_reindex, plan_jobs

    o = output_options
    set_debug(o.debug)
    set_verbosity(o.quiet_, o.verbose_)
    json_out = o.json_out
    m, a = memory_options, answer_options
    max_new_tokens, reindex = a.max_new_tokens, m.reindex
    session_settings(model_options, memory_options, answer_options).replace(
        reindex=reindex or defaults.REINDEX, max_new_tokens=max_new_tokens or defaults.MAX_NEW_TOKENS).check()
    model_settings = model_options.settings().model
    for name, value, ok in (("--limit", limit, limit is None or limit >= 1), ("--npy-fps", npy_fps, npy_fps > 0),
                            ("--streams", streams, streams >= 1),
                            ("--max-new-tokens", max_new_tokens, max_new_tokens is None or max_new_tokens >= 1)):
        if not ok:
            raise UserError(f"{name} must be positive, got {value}")
    if videos_dir is not None and not videos_dir.is_dir():
        raise UserError(f"--videos-dir {videos_dir} is not a folder — pass the folder that holds the videos")
    aset, questions = _load_questions(annotations, tasks, limit)
    notify = notify_options.values()  # checked before anything loads, used where the set has proactive questions
    finder = VideoFinder(videos_dir, annotations.resolve().parent)
    protocol = ("offline" if offline else "streaming") if offline is not None else default_protocol(aset)

    jobs = plan_jobs(aset, questions, finder)
    late = _timed_after_end(jobs, questions, m.fps, npy_fps) if protocol == "streaming" else []
    if late:
        warn(_late_warning(late))
    if dry_run:
        _print_dry_run(aset, questions, jobs, protocol, json_out, out, after_end=len(late))
        return
    _check_some_video_found(jobs, annotations, videos_dir)

    prepare_model(model_settings)  # a dead hub or a bad model folder fails now, not after the first video
    model_name = model_settings.name()
    settings = EvalSettings.of({**model_options.values(), **m.values(), **a.values(), "model": model_name,
                                "reindex": reindex or default_reindex(protocol), "protocol": protocol,
                                "npy_fps": npy_fps, "notify": notify if _has_proactive(aset) else None})
    factory = EvalStreams(settings, model_settings.device, model_settings.dtype, quiet=json_out)
    if output is None:
        output = default_output(annotations, settings)
    if output is not None:
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create the folder for --output {output}: {exc.strerror}") from exc

    try:
        records, report = _run(aset, questions, settings, factory, finder, output, judge, streams=streams,
                               show_progress=not (json_out or o.no_progress or quiet()))
    finally:
        factory.close()
    summary = _summary(records, report, questions, aset, annotations, protocol)
    summary["settings"] = summary.get("settings") or settings.fingerprint()  # no record yet: this run's
    if summary_path is None and output is not None:
        summary_path = output.with_name(output.stem + ".summary.json")
    if summary_path is not None:
        summary_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    for warning in report.warnings:
        err.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    if report.missing_videos:
        first = report.missing_videos[0]
        err.print(f"[yellow]missing:[/] {counted(len(report.missing_videos), 'video')} "
                  f"({counted(report.missing_questions, 'question')}) "
                  f"not found{' under ' + str(videos_dir) if videos_dir else ''}, e.g. {first}", soft_wrap=True)
    for failure in report.failed_videos[:5]:
        err.print(f"[yellow]failed:[/] {failure['video_id']}: {failure['error']}", soft_wrap=True)
    if json_out:
        print(json.dumps(summary, ensure_ascii=False))
        return
    _print_summary(summary, report, out)
    if output is not None:
        out.print(f"records: {output}" + (f" · summary: {summary_path}" if summary_path else ""))


def _load_questions(annotations: Path, tasks: list[str] | None, limit: int | None):
    """(annotation set, selected questions); annotation problems are reported, none usable is an error."""
    from ..evaluation.annotations import load_annotations, problems_summary
    from ..evaluation.runner import select_questions

    aset = load_annotations(annotations)
    for line in problems_summary(aset.problems):
        err.print(f"[yellow]annotation problem:[/] {line}", soft_wrap=True)
    if not aset.questions:
        if not aset.entries:
            raise UserError(f"{annotations} holds no entries — an annotation file is a JSON list of videos with "
                            "their conversations (docs/evaluation.md)")
        why = "see the problems above" if aset.problems else "their entries hold no conversations"
        raise UserError(f"{annotations} holds no usable question ({counted(aset.entries, 'entry', 'entries')}) — {why}")
    task_list = [t for item in tasks or [] for t in item.split(",")]
    return aset, select_questions(aset, task_list, limit)


def _run(aset, questions, settings, factory, finder, output: Path | None, judge: JudgeOptions, *,
         streams: int = 1, show_progress: bool):
    """Answer what is not yet in ``output`` (with a progress bar), then judge; (records, report).

    Ctrl-C says how many results are saved and that rerunning resumes.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from ..evaluation.runner import read_results, run_eval

    progress = Progress(
        TextColumn("[bold]eval[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"),
        TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
        console=err, disable=not show_progress or not err.is_terminal, transient=True,
    )
    try:
        with progress:
            task = progress.add_task("questions", total=len(questions), info="")

            def on_progress(n: int, info: str) -> None:
                progress.update(task, advance=n, info=info)

            previous = read_results(output)
            done = {r["qid"] for r in previous} & {q.qid for q in questions}
            progress.update(task, completed=len(done))
            records, report = run_eval(aset, questions, settings, factory, finder=finder, output=output,
                                       records=previous, on_progress=on_progress, streams=streams)
        if judge.judge_url:
            _judge(records, output, judge.judge_url, judge)
    except KeyboardInterrupt:
        saved = len(read_results(output)) if output is not None and output.exists() else 0
        raise Interrupted(f"interrupted: {saved} results saved in {output} — rerun the same command to resume"
                          if output is not None else "interrupted: no results saved (no --output)") from None
    return records, report


def _judge(records: list[dict], output: Path | None, url: str, judge: JudgeOptions) -> None:
    """Have the open-ended answers judged (records and ``output`` gain the verdicts)."""
    from ..evaluation.judge import Judge
    from ..evaluation.runner import judge_records

    judged = judge_records(records, Judge(url, judge.judge_model, os.environ.get(judge.judge_key_env)),
                           output, on_progress=None)
    errors = [r["judge_error"] for r in records if "judge_error" in r and "judge" not in r]
    if errors:
        err.print(f"[yellow]warning:[/] the judge failed on {len(errors)} answers (first: {errors[0]})", soft_wrap=True)
    elif judged:
        err.print(f"judged {judged} open-ended answers with {judge.judge_model}")


def _summary(records, report, questions, aset, annotations: Path, protocol: str) -> dict:
    """The summary JSON: accuracy from the records, plus what this run could not answer."""
    from ..evaluation.runner import eval_summary

    summary = eval_summary(records, selected=len(questions))
    summary["annotations"] = str(annotations)
    summary["protocol"] = protocol
    summary["questions"].update(
        missing_video=report.missing_questions, failed=report.failed_questions,
        pending=max(0, len(questions) - len(records) - report.missing_questions - report.failed_questions),
    )
    summary["videos"] = {"missing": len(report.missing_videos), "failed": report.failed_videos}
    summary["annotation_problems"] = len(aset.problems)
    return summary


def default_output(annotations: Path, settings) -> Path | None:
    """Results next to the annotations, one file per settings (so rerunning resumes, and other
    settings never mix); None, with a warning, when that folder cannot be written."""
    import hashlib

    key = hashlib.sha1(json.dumps(settings.fingerprint(), sort_keys=True, default=str).encode()).hexdigest()[:8]
    folder = annotations.resolve().parent
    path = folder / f"{annotations.stem}.results-{key}.jsonl"
    if not os.access(folder, os.W_OK):
        warn(f"results are not saved: {folder} is not writable — pass --output FILE")
        return None
    return path


class EvalStreams:
    """Streams on one engine: ``factory(max_new_tokens)`` opens a fresh stream with that answer
    length. The model is loaded and the engine started on the first call (never, when nothing is
    left to answer); safe from several client threads. ``close()`` stops the engine."""

    def __init__(self, settings, device, dtype, *, quiet: bool) -> None:
        values = settings.session_values()
        self.settings = SessionSettings.of({**values, "device": device, "dtype": dtype,
                                            "max_new_tokens": values["max_new_tokens"] or defaults.MAX_NEW_TOKENS})
        self.settings.check()
        self.quiet = quiet
        self.engine = None
        self._lock = threading.Lock()

    def __call__(self, max_new_tokens: int, *, notifier=None):
        with self._lock:
            if self.engine is None:
                self.engine = build_engine(self.settings, quiet=self.quiet, prepared=True)  # by `eval` itself
        return open_stream(self.engine, self.settings.replace(max_new_tokens=max_new_tokens), notifier=notifier)

    def close(self) -> None:
        with self._lock:
            if self.engine is not None:
                self.engine.stop()


def _has_proactive(aset) -> bool:
    """Whether the annotations hold StreamingBench proactive questions (their results depend on
    the --notify-* rule, so the results fingerprint carries it then)."""
    from ..evaluation.forward import SB_PROACTIVE

    return any(q.scoring == SB_PROACTIVE for q in aset.questions)


def _check_some_video_found(jobs, annotations: Path, videos_dir: Path | None) -> None:
    """Every video missing: one line and exit 2, before a model is loaded (nothing could be answered)."""
    if not jobs or any(job.path is not None for job in jobs):
        return
    first = jobs[0].videos[0].video_path
    where = f"under --videos-dir {videos_dir}" if videos_dir else f"next to {annotations.name} (no --videos-dir)"
    raise UserError(f"none of the {len(jobs)} videos of {annotations.name} was found {where}, e.g. {first} — "
                    "pass --videos-dir with the folder that holds them (names are matched recursively)")


def _timed_after_end(jobs, questions, fps: float, npy_fps: float) -> list[tuple]:
    """(question, video name, duration) for each selected question timed after its video's end.

    Durations come from the files' headers (a .npy array: its frames at ``npy_fps``); a file that
    cannot be opened is left to the run, which reports it.
    """
    from types import SimpleNamespace

    from ..evaluation.runner import open_question_video
    from ..sources import SourceError

    selected = {q.qid for q in questions}
    late: list[tuple] = []
    rates: Any = SimpleNamespace(fps=fps, npy_fps=npy_fps)  # what open_frames reads of the settings
    for job in jobs:
        timed = [q for q in job.questions if q.qid in selected and q.end_s is not None]
        if job.path is None or not timed:
            continue
        try:
            with open_question_video(job.path, job.videos[0], rates, None) as frames:
                duration = frames.duration_s
        except (SourceError, OSError, ValueError):
            continue
        if duration is None:
            continue
        late.extend((q, job.path.name, duration) for q in timed if q.end_s > duration + 1.0 / fps)
    return late


def _late_warning(late: list[tuple]) -> str:
    q, name, duration = late[0]
    count = f"{len(late)} question{'s' if len(late) != 1 else ''} {'are' if len(late) != 1 else 'is'}"
    return (f"{count} timed after the end of {'their' if len(late) != 1 else 'its'} video, e.g. {q.question!r} "
            f"at {q.end_s:g}s of {name} ({duration:.1f}s): answered at the end of the stream, from all of it")


def _print_dry_run(aset, questions, jobs, protocol, json_out, out, *, after_end: int = 0) -> None:
    from collections import Counter

    selected = {q.qid for q in questions}
    missing_q: Counter[str] = Counter()
    missing_videos = 0
    for job in jobs:
        if job.path is None:
            missing_videos += 1
            missing_q.update(q.task for q in job.questions if q.qid in selected)
    per_task = Counter(q.task for q in questions)
    mc = Counter(q.task for q in questions if q.multiple_choice)
    data = {
        "annotations": str(aset.path), "protocol": protocol, "videos": len(jobs), "missing_videos": missing_videos,
        "questions": len(questions), "multiple_choice": sum(mc.values()), "open_ended": len(questions) - sum(mc.values()),
        "timed": sum(q.end_s is not None for q in questions), "unscorable": sum(not q.scorable for q in questions),
        "problems": len(aset.problems), "after_end": after_end,
        "per_task": {t: {"questions": n, "multiple_choice": mc[t], "missing_video": missing_q[t]} for t, n in sorted(per_task.items())},
    }
    probes = _probes(questions)
    if probes:
        data["probes"] = probes
    if json_out:
        print(json.dumps(data, ensure_ascii=False))
        return
    from rich.table import Table

    if probes:  # forward / proactive sets: every probe with the time it is asked at
        listing = Table(title=f"{counted(len(probes), 'probe')}")
        polled = any(p.get("poll_until_s") is not None for p in probes)  # proactive: polled from time s to this
        for col in ("time s", *(("until s",) if polled else ()), "task", "probe", "about", "expected"):
            listing.add_column(col, justify="right" if col.endswith(" s") else "left")
        for p in probes:
            truth = p["expected"] + (f" at {p['ground_truth_time_s']:g} s" if p.get("ground_truth_time_s") is not None else "")
            until = (_fmt(p.get("poll_until_s")),) if polled else ()
            listing.add_row(_fmt(p["time_s"]), *until, p["task"], p["qid"], p["about"][:60], truth)
        out.print(listing)
    table = Table(title=f"{aset.path.name}: {counted(data['questions'], 'question')}, "
                        f"{counted(data['videos'], 'video')} ({protocol} protocol)")
    for col in ("task", "questions", "multiple choice", "missing video"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for t, row in data["per_task"].items():
        table.add_row(t, str(row["questions"]), str(row["multiple_choice"]), str(row["missing_video"]))
    out.print(table)
    out.print(f"videos found: {data['videos'] - missing_videos} of {data['videos']} · questions with end times: "
              f"{data['timed']} (after the video's end: {after_end}) · unscorable: {data['unscorable']} · "
              f"annotation problems: {data['problems']}")


def _probes(questions) -> list[dict]:
    """The forward / proactive probes among ``questions``, by time: what --dry-run lists."""
    rows = [{"qid": q.qid, "task": q.task, "time_s": q.end_s, "about": str(q.extras.get("probe", q.question)),
             "expected": q.answer or "", "scoring": q.scoring,
             **_window(q)}
            for q in questions if q.scoring]
    return sorted(rows, key=lambda r: (r["time_s"] is None, r["time_s"] or 0.0))


def _window(q) -> dict:
    """A proactive question's ground-truth moment and the end of its polling window (--dry-run)."""
    from ..evaluation.forward import SB_PROACTIVE, ProactiveTask

    if "ground_truth_time_s" not in q.extras:
        return {}
    row = {"ground_truth_time_s": q.extras.get("ground_truth_time_s")}
    if q.scoring == SB_PROACTIVE and row["ground_truth_time_s"] is not None:
        row["poll_until_s"] = ProactiveTask.of(q).stop_s
    return row


def _fmt(value, suffix: str = "") -> str:
    return "—" if value is None else f"{value:.2f}{suffix}" if isinstance(value, float) else f"{value}{suffix}"


def _print_summary(summary: dict, report, out) -> None:
    from rich.table import Table

    s = summary.get("settings") or {}
    title = (f"{Path(summary['annotations']).name} · {s.get('model')} · {s.get('policy')} budget {s.get('budget')} · "
             f"{summary['protocol']} · {s.get('fps')} fps")
    q = summary["questions"]
    mc = summary.get("multiple_choice")
    out.print(f"[bold]{title}[/]", soft_wrap=True)  # a line of its own: a table title would wrap at the table's width
    if mc:
        table = Table()
        for col in ("group", "questions", "correct", "accuracy %"):
            table.add_column(col, justify="left" if col == "group" else "right")
        table.add_row("[bold]overall[/]", str(mc["n"]), str(mc["correct"]), f"[bold]{_fmt(mc['accuracy'])}[/]")
        for task, row in mc["per_task"].items():
            table.add_row(f"task: {task}", str(row["n"]), str(row["correct"]), _fmt(row["accuracy"]))
        for bucket, row in mc["per_duration"].items():
            table.add_row(f"duration: {bucket}", str(row["n"]), str(row["correct"]), _fmt(row["accuracy"]))
        out.print(table)
        if mc["unparsed"]:
            out.print(f"{mc['unparsed']} of {mc['n']} scored replies named no option (counted wrong)")
        if mc.get("unscored"):
            out.print(f"{mc['unscored']} replies not scored (their questions have no answer key)")
    oe = summary.get("open_ended")
    if oe:
        table = Table()
        for col in ("open-ended", "answers", "score"):
            table.add_column(col, justify="left" if col == "open-ended" else "right")
        lm = oe["lenient_match"]
        table.add_row("lenient match accuracy % (built in, not the papers' metric)", str(lm["n"]), _fmt(lm["accuracy"]))
        table.add_row("lenient match mean share of reference words", str(lm["n"]), _fmt(lm["mean_score"]))
        if "judge" in oe:
            j = oe["judge"]
            table.add_row(f"judge accuracy % ({j['model']})", str(j["n"]), _fmt(j["accuracy"]))
            table.add_row("judge mean score (0-5)", str(j["n"]), _fmt(j["mean_score"]))
        out.print(table)
    fw = summary.get("forward")
    if fw:
        table = Table()
        for col in ("forward active responding", "probes", "correct", "accuracy %", 'always "Yes" %', "p(yes) ≥ 0.5 %"):
            table.add_column(col, justify="left" if col.startswith("forward") else "right")
        table.add_row("[bold]overall[/]", str(fw["n"]), str(fw["correct"]), f"[bold]{_fmt(fw['accuracy'])}[/]",
                      _fmt(fw["yes_baseline"]), _fmt(fw["probe_accuracy"]))
        for task, row in fw["per_task"].items():
            table.add_row(f"task: {task}", str(row["n"]), str(row["correct"]), _fmt(row["accuracy"]),
                          _fmt(row["yes_baseline"]), _fmt(row["probe_accuracy"]))
        out.print(table)
    pro = summary.get("proactive")
    if pro:
        table = Table()
        for col in ("proactive output", "questions", "fired", "on time %", "answer %", 'always "Yes" on time %',
                    "mean offset s"):
            table.add_column(col, justify="left" if col.startswith("proactive") else "right")
        table.add_row("[bold]overall[/]", str(pro["n"]), str(pro["fired"]), _fmt(pro["time_accuracy"]),
                      f"[bold]{_fmt(pro['answer_accuracy'])}[/]", _fmt(pro["yes_baseline"]), _fmt(pro["mean_offset_s"]))
        out.print(table)
    t = summary["timing"]
    out.print(f"answered {q['answered']} of {q['selected']} questions ({report.answered} now, {report.skipped_done} from an earlier run; "
              f"{q['missing_video']} without video, {q['failed']} failed) · TTFT mean {_fmt(t['ttft_ms_mean'], ' ms')}, "
              f"TPOT mean {_fmt(t['tpot_ms_mean'], ' ms')}")
