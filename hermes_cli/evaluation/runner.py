"""Running a benchmark: the streaming and offline protocols, as a client of the engine.

Each video file is one stream of the engine (``engine.client``), opened with the settings it
needs (its answer length) and fed by ``run_stream``; several videos can stream at once on one
engine (``streams``: one client thread per stream, the engine interleaves their chunks and
decodes their answers together). Records are written in the same order whatever ``streams`` is.

Streaming protocol (sets whose questions carry end times: StreamingBench, OVO-Bench, RVS): each
video file is streamed once, from its clip start (``clip_start_time``) when the annotation gives
one; a question is asked once every sampled frame up to its ``end_time`` was ingested and before
any later frame (``run_stream``), answered from the memory as it is at that moment, and then
removed from the cache (the engine rolls an answer back). The stream stops after the last
question it still owes.

StreamingBench's proactive questions are not asked at a moment: the video's stream is opened with
a ``--notify`` condition per question (``engine.notify.Condition``: the benchmark's polling
question, polled after each chunk from the question's time to 4 s past its ground truth,
answered on a fire by the question itself), and the stream's ``notification`` events become
their records (``forward.ProactiveTask``); the stream runs to the last window's end.

Offline protocol (VideoMME, MVBench, EgoSchema): the whole video (or clip) is streamed, then every
question is asked of the final memory; eager re-indexing by default, as in the HERMES paper.

Every answer becomes one JSON record, appended to the results file as soon as it exists, so a run
that stops can be resumed: questions already in the file are skipped (the file must have been
written with the same settings). ``eval_summary`` aggregates records: multiple-choice accuracy
overall, per task and per video-duration bucket; for open-ended sets the lenient match (and the
judge's verdicts when one was asked).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from ..errors import HermesError
from ..frames import Frame, FrameSource, SourceStats
from ..settings import SettingsGroup, fingerprinted, settings_group
from .annotations import AnnotationSet, Question, Video
from .answers import LENIENT_THRESHOLD, format_question, lenient_match, parse_letter
from .forward import (
    OVO_REC,
    OVO_YES_NO,
    SB_PROACTIVE,
    ProactiveTask,
    summarize_forward,
    summarize_proactive,
    yes_baseline,
)
from .forward import score as score_probe

PROTOCOLS = ("streaming", "offline")
MC_MAX_NEW_TOKENS = 16
OPEN_MAX_NEW_TOKENS = 128

if TYPE_CHECKING:
    from ..engine.client import StreamClient
    from ..engine.notify import Notifier, NotifySettings


class StreamFactory(Protocol):
    """Answer length (and a proactive video's ``--notify`` conditions) → a fresh stream on the engine;
    ``notifier`` is passed only when the video has proactive questions."""

    def __call__(self, max_new_tokens: int, *, notifier: Notifier | None = None) -> StreamClient: ...


class EvalError(HermesError):
    """A problem with the run's inputs the user can fix (one line)."""


@settings_group("results", "eval", settings=fingerprinted("eval"))
class EvalSettings(SettingsGroup):
    """What a result depends on; records carry it, and resuming requires the same. The model,
    memory and answer settings of ``hermes eval`` come from the schema (``hermes_cli/settings.py``),
    at eval's defaults; ``reindex`` None: lazy when streaming, eager offline."""

    protocol: str = "streaming"
    npy_fps: float = 1.0  # frame rate of videos stored as .npy frame arrays
    # the --notify firing rule of proactive questions (NotifySettings' fields as (name, value)
    # pairs); None when the annotations hold none, and then not in the fingerprint
    notify: tuple[tuple[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        if self.reindex is None:
            object.__setattr__(self, "reindex", default_reindex(self.protocol))
        if isinstance(self.notify, dict):
            object.__setattr__(self, "notify", tuple(sorted(self.notify.items())))

    def fingerprint(self) -> dict:
        d = self.values()
        d["policy_opts"] = sorted(d.pop("policy_opt"))  # the key results files have always used
        notify = d.pop("notify")
        if notify is not None:  # only sets with proactive questions: other results files keep their keys
            d["notify"] = dict(notify)
        return d

    def notify_settings(self) -> NotifySettings:
        """The firing rule proactive questions run under (the engine's defaults when not given)."""
        from ..engine.notify import NotifySettings

        return NotifySettings(**dict(self.notify or ()))

    def session_values(self) -> dict:
        """The settings a session of this run is built from (setting name → value)."""
        return self.values()


def default_protocol(aset: AnnotationSet) -> str:
    """Streaming when the questions carry end times, offline otherwise."""
    return "streaming" if aset.timed else "offline"


def default_reindex(protocol: str) -> str:
    return "lazy" if protocol == "streaming" else "eager"


def duration_bucket(category: str | None, seconds: float | None) -> str | None:
    """VideoMME's own category when given; else short (< 4 min), medium (< 20 min), long."""
    if category:
        return category
    if seconds is None:
        return None
    return "short" if seconds < 240 else "medium" if seconds < 1200 else "long"


# -- selecting and finding ------------------------------------------------------------------------
def select_questions(aset: AnnotationSet, tasks: Iterable[str] | None = None, limit: int | None = None) -> list[Question]:
    """Questions of the chosen tasks (case-insensitive; all when none given), the first ``limit``."""
    wanted = {t.strip().lower() for t in tasks or [] if t.strip()}
    known = {t.lower() for t in aset.tasks()}
    unknown = wanted - known
    if unknown:
        raise EvalError(
            f"no task called {', '.join(sorted(unknown))} in {aset.path.name} — "
            f"tasks there: {', '.join(sorted(aset.tasks())) or 'none'}"
        )
    chosen = [q for q in aset.questions if not wanted or q.task.lower() in wanted]
    return chosen[:limit] if limit is not None else chosen


class VideoFinder:
    """Where an annotation's video_path is on this machine.

    With ``videos_dir`` the path is remapped by file name under that folder (searched recursively
    once; when several files share the name, the one whose parent folders match the annotation's
    path best wins). Without it the path is used as given, relative to the annotation file.
    """

    def __init__(self, videos_dir: str | Path | None, base_dir: str | Path):
        self.videos_dir = Path(videos_dir).expanduser() if videos_dir else None
        self.base_dir = Path(base_dir)
        self._index: dict[str, list[Path]] | None = None

    def find(self, video_path: str) -> Path | None:
        pure = PurePath(video_path.replace("\\", "/"))
        if self.videos_dir is None:
            path = Path(video_path).expanduser()
            path = path if path.is_absolute() else self.base_dir / path
            return path if path.is_file() else None
        direct = self.videos_dir / pure.name
        if direct.is_file():
            return direct
        candidates = self._by_name().get(pure.name, [])
        if not candidates:
            return None
        parents = pure.parts[:-1]

        def overlap(path: Path) -> int:
            n, theirs = 0, path.parts[:-1]
            while n < min(len(parents), len(theirs)) and parents[-1 - n] == theirs[-1 - n]:
                n += 1
            return n

        return max(candidates, key=overlap)

    def _by_name(self) -> dict[str, list[Path]]:
        if self._index is None:
            self._index = {}
            if self.videos_dir is not None and self.videos_dir.is_dir():
                for path in sorted(self.videos_dir.rglob("*")):
                    if path.is_file():
                        self._index.setdefault(path.name, []).append(path)
        return self._index


# -- results file ---------------------------------------------------------------------------------
def read_results(path: str | Path | None) -> list[dict]:
    """Records of a results JSONL file ([] when absent); a torn last line (a killed run) is ignored."""
    if path is None or not Path(path).exists():
        return []
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "qid" in record:
            records.append(record)
    return records


def write_results(path: Path, records: list[dict]) -> None:
    """Rewrite a results file atomically (used after judging)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, path)


def check_resumable(records: list[dict], settings: EvalSettings, output: Path | None) -> None:
    mine = settings.fingerprint()
    for r in records:
        theirs = r.get("settings") or {}
        if theirs != mine:
            diff = ", ".join(
                f"{k}={theirs.get(k)!r} (now {v!r})" for k, v in mine.items() if not isinstance(theirs, dict) or theirs.get(k) != v
            )
            raise EvalError(
                f"{output} holds results of other settings ({diff or 'unknown settings'}) — "
                "use another --output, or delete the file to start over"
            )


# -- frames -----------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class NpyFrames:
    """Frames stored as a (T, H, W, 3) uint8 .npy array (ReKV's RVS-Movie videos), at ``npy_fps``.

    When the array is no longer than the annotation's clip, it holds only the clip and its first
    frame is at ``clip_start``; otherwise frame i is at i / npy_fps.
    """

    def __init__(self, path: Path, fps: float, npy_fps: float, start_s: float, end_s: float | None,
                 clip_start_s: float | None, clip_end_s: float | None):
        import numpy as np

        from ..sources import SourceError

        try:
            self.array = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise SourceError(f"{path.name}: not a readable .npy frame array ({exc})") from None
        if self.array.ndim != 4 or self.array.shape[-1] != 3:
            raise SourceError(f"{path.name}: expected frames of shape (T, H, W, 3), got {tuple(self.array.shape)}")
        self.fps, self.npy_fps, self.start_s, self.end_s = fps, npy_fps, start_s, end_s
        n = self.array.shape[0]
        self.offset = 0.0
        if clip_start_s is not None and clip_end_s is not None and n / npy_fps <= clip_end_s - clip_start_s + 2 / npy_fps:
            self.offset = clip_start_s
        self.duration_s = self.offset + n / npy_fps
        self.name = path.name
        self.is_live = False
        self.stats = SourceStats()

    def __iter__(self) -> Iterator[Frame]:
        import numpy as np

        from ..sources import TimestampSampler

        sampler = TimestampSampler(self.fps, self.start_s)
        k = 0
        for i in range(self.array.shape[0]):
            t = self.offset + i / self.npy_fps
            if self.end_s is not None and t > self.end_s + 1e-6:
                return
            if t + 1e-6 < self.start_s or not sampler.take(t):
                continue
            yield Frame(np.ascontiguousarray(self.array[i], dtype=np.uint8), t, k)
            k += 1

    def close(self) -> None:
        pass  # the memory map is released with the array

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def open_question_video(path: Path, video: Video, settings: EvalSettings, end_s: float | None) -> FrameSource:
    """An iterable of frames (``image``, ``timestamp``) for a video, from its clip start to ``end_s``."""
    start = video.clip_start_s or 0.0
    if path.suffix.lower() == ".npy":
        return NpyFrames(path, settings.fps, settings.npy_fps, start, end_s, video.clip_start_s, video.clip_end_s)
    from ..sources import open_source

    return open_source(str(path), settings.fps, start_s=start, end_s=end_s)


# -- running ----------------------------------------------------------------------------------------
@dataclass
class RunReport:
    """What one invocation did (not part of the summary, which depends on the records only)."""

    answered: int = 0
    skipped_done: int = 0
    missing_videos: list[str] = field(default_factory=list)
    missing_questions: int = 0
    failed_videos: list[dict] = field(default_factory=list)
    failed_questions: int = 0
    warnings: list[str] = field(default_factory=list)
    proactive_not_run: int = 0  # StreamingBench proactive questions without a ground-truth time (not scorable)


@dataclass
class Job:
    """One stream: a video file (None: missing) and clip window, the questions asked of it, and the
    end times of every question the annotations hold for it (selected or not, done or not)."""

    path: Path | None
    videos: list[Video]
    questions: list[Question]
    flush_times: list[float] = field(default_factory=list)


def plan_jobs(aset: AnnotationSet, questions: list[Question], finder: VideoFinder) -> list[Job]:
    """Group questions by the video file they need (one stream per file and clip window), in file order."""
    found = {v.index: finder.find(v.video_path) for v in aset.videos}

    def key(video: Video) -> tuple:
        path = found[video.index]
        return (str(path) if path else f"missing:{video.video_path}", video.clip_start_s, video.clip_end_s)

    videos = {v.index: v for v in aset.videos}
    jobs: dict[tuple, Job] = {}
    for q in questions:
        video = videos[q.video_index]
        job = jobs.setdefault(key(video), Job(found[video.index], [], []))
        if video not in job.videos:
            job.videos.append(video)
        job.questions.append(q)
    for video in aset.videos:
        if (owner := jobs.get(key(video))) is not None:
            owner.flush_times.extend(q.end_s for q in video.questions if q.end_s is not None)
    for job in jobs.values():
        job.flush_times = sorted(set(job.flush_times))
    return list(jobs.values())


def flushed_at(frames: Iterable, stream, times: list[float]) -> Iterator:
    """Frames, with the stream's partial chunk flushed wherever a question of the annotations falls.

    ``run_stream`` flushes before each question it asks, which sets the chunk boundaries and so the
    memory. Flushing at every annotated question time — asked now, asked in an earlier run, or left
    out by --tasks/--limit — makes the memory at a given time the same whichever questions a run
    asks: a resumed or filtered run answers exactly as a complete one.
    """
    i = 0
    for frame in frames:
        while i < len(times) and frame.timestamp > times[i]:
            stream.flush()
            i += 1
        yield frame


def run_eval(
    aset: AnnotationSet,
    questions: list[Question],
    settings: EvalSettings,
    open_stream: StreamFactory,
    *,
    finder: VideoFinder,
    output: Path | None = None,
    records: list[dict] | None = None,
    on_progress: Callable[[int, str], None] | None = None,
    on_record: Callable[[dict], None] | None = None,
    streams: int = 1,
) -> tuple[list[dict], RunReport]:
    """Answer every selected question not yet in ``records`` (those of ``output`` when resuming).

    Returns all records of the selected questions (earlier and new) and a report of this run.
    ``open_stream(max_new_tokens)`` opens a fresh stream on the engine per video (it is not called
    when nothing is left; each stream is closed when its video is done). ``streams``: videos
    streamed at once, each by its own client thread. Records reach ``output`` and ``on_record``
    in video order whatever ``streams`` is (a video's records wait for the videos before it).
    Ctrl-C (``KeyboardInterrupt`` in the calling thread) closes the open streams, saves every
    record already made, and is raised again.
    """
    if settings.protocol not in PROTOCOLS:
        raise EvalError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {settings.protocol!r}")
    if streams < 1:
        raise EvalError(f"--streams must be at least 1, got {streams}")
    selected = {q.qid for q in questions}
    previous = records if records is not None else read_results(output)
    previous = [r for r in previous if r["qid"] in selected]
    check_resumable(previous, settings, output)
    done = {r["qid"] for r in previous}
    all_records = list(previous)
    report = RunReport(skipped_done=len(done))
    unscorable = [q for q in questions if q.scoring == SB_PROACTIVE and q.extras.get("ground_truth_time_s") is None]
    if unscorable:  # without the ground-truth moment there is no window to poll in, nor a score
        report.proactive_not_run = len(unscorable)
        report.warnings.append(f"{len(unscorable)} proactive questions not run: they have no ground_truth_time_stamp")
        left_out = {q.qid for q in unscorable}
        questions = [q for q in questions if q.qid not in left_out]
    progress = on_progress or (lambda n, info: None)
    videos = {v.index: v for v in aset.videos}
    work = [(job, pending) for job in plan_jobs(aset, questions, finder)
            if (pending := [q for q in job.questions if q.qid not in done])]
    with ResultsFile(output) as sink:
        def keep(record: dict) -> None:
            all_records.append(record)
            report.answered += 1
            sink.write(record)
            if on_record:
                on_record(record)

        reports = _run_jobs(work, videos, settings, open_stream, _InOrder(len(work), keep), progress, streams)
    for part in reports:
        report.missing_videos += part.missing_videos
        report.missing_questions += part.missing_questions
        report.failed_videos += part.failed_videos
        report.failed_questions += part.failed_questions
        report.warnings += part.warnings
    order_of = {q.qid: i for i, q in enumerate(questions)}
    all_records.sort(key=lambda r: order_of.get(r["qid"], len(order_of)))
    return all_records, report


class _InOrder:
    """Records of job i pass to ``keep`` once jobs 0 … i-1 are finished (held until then), so the
    order does not depend on which stream finishes first. Safe from any thread."""

    def __init__(self, jobs: int, keep: Callable[[dict], None]) -> None:
        self.keep = keep
        self.held: list[list[dict]] = [[] for _ in range(jobs)]
        self.finished = [False] * jobs
        self.head = 0  # the first job not finished: its records pass at once
        self.lock = threading.Lock()

    def record(self, job: int, record: dict) -> None:
        with self.lock:
            if job == self.head:
                self.keep(record)
            else:
                self.held[job].append(record)

    def finish(self, job: int) -> None:
        with self.lock:
            self.finished[job] = True
            while self.head < len(self.finished) and self.finished[self.head]:
                self.head += 1
                if self.head < len(self.held):
                    for record in self.held[self.head]:
                        self.keep(record)
                    self.held[self.head] = []

    def flush_held(self) -> None:
        """Interrupted: pass on what is held (out of order), so resuming skips those questions."""
        with self.lock:
            for rows in self.held:
                for record in rows:
                    self.keep(record)
                rows.clear()


def _run_jobs(work: list[tuple[Job, list[Question]]], videos: dict[int, Video], settings: EvalSettings,
              open_stream: StreamFactory, sink: _InOrder, progress: Callable[[int, str], None],
              streams: int) -> list[RunReport]:
    """Run the jobs on ``streams`` client threads; one report per job, in job order."""
    reports = [RunReport() for _ in work]
    stopping = threading.Event()
    open_now: dict[int, StreamClient] = {}
    guard = threading.Lock()

    def opened(index: int, stream: StreamClient | None) -> None:
        with guard:
            if stream is None:
                open_now.pop(index, None)
            else:
                open_now[index] = stream
        if stream is not None and stopping.is_set():
            stream.close()

    def one(index: int) -> None:
        if stopping.is_set():
            return
        job, pending = work[index]
        try:
            run_job(job, pending, videos, settings, open_stream, lambda r: sink.record(index, r), reports[index],
                    progress, stopping=stopping, opened=lambda s: opened(index, s))
        finally:
            sink.finish(index)

    pool = ThreadPoolExecutor(max_workers=streams, thread_name_prefix="eval-stream")
    futures = [pool.submit(one, i) for i in range(len(work))]
    try:
        for future in futures:
            future.result()
    except BaseException:  # Ctrl-C (or a bug): close the open streams, keep what is made, re-raise
        stopping.set()
        with guard:
            streams_open = list(open_now.values())
        for stream in streams_open:
            with contextlib.suppress(Exception):
                stream.close()
        pool.shutdown(wait=True, cancel_futures=True)
        sink.flush_held()
        raise
    pool.shutdown(wait=True)
    return reports


class ResultsFile:
    """The results JSONL opened for appending (nothing when ``path`` is None); one line per record,
    flushed at once. A line torn by a killed run is ended first, so the next record starts clean."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.file: TextIO | None = None

    def __enter__(self) -> ResultsFile:
        if self.path is not None:
            path = self.path
            torn = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
            self.file = path.open("a", encoding="utf-8")
            if torn:
                self.file.write("\n")
        return self

    def write(self, record: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.file.flush()

    def __exit__(self, *exc_info: object) -> None:
        if self.file is not None:
            self.file.close()


def run_job(job: Job, pending: list[Question], videos: dict[int, Video], settings: EvalSettings,
            open_stream: StreamFactory, keep: Callable[[dict], None], report: RunReport,
            progress: Callable[[int, str], None], *, stopping: threading.Event | None = None,
            opened: Callable[[StreamClient | None], None] | None = None) -> None:
    """Stream one video on a fresh stream of the engine and answer its pending questions; ``keep``
    each record as it comes. The stream is closed at the end.

    A missing video or a failing stream is counted in ``report`` with the questions it costs;
    a stream closed because ``stopping`` is set (Ctrl-C) is not a failure.
    """
    from ..app.streaming import TimedQuestion, run_stream
    from ..engine.client import EngineStopped, PositionLimitError, StreamFailed
    from ..sources import SourceError

    path, vids = job.path, job.videos
    names = ", ".join(v.video_id for v in vids)
    if path is None:
        report.missing_videos.append(vids[0].video_path)
        report.missing_questions += len(pending)
        progress(len(pending), f"missing video {PurePath(vids[0].video_path).name}")
        return
    video = vids[0]
    proactive = [q for q in pending if q.scoring == SB_PROACTIVE]
    pending = [q for q in pending if q.scoring != SB_PROACTIVE]
    tasks = [ProactiveTask.of(q) for q in proactive]
    if settings.protocol == "streaming":
        timed = sorted((q for q in pending if q.end_s is not None), key=lambda q: q.end_s or 0.0)
        order = timed + [q for q in pending if q.end_s is None]
        # stop after the last question owed (and the last proactive window); untimed questions
        # wait for the clip's end
        ends = [q.end_s or 0.0 for q in timed] + [t.stop_s for t in tasks]
        end = max(ends) if len(timed) == len(pending) else video.clip_end_s
        asks = [TimedQuestion(format_question(q.question, q.choices), q.end_s) for q in order]
    else:
        order, end = pending, video.clip_end_s
        asks = [TimedQuestion(format_question(q.question, q.choices)) for q in order]
    max_new_tokens = settings.max_new_tokens or (
        MC_MAX_NEW_TOKENS if all(q.multiple_choice for q in order) else OPEN_MAX_NEW_TOKENS)
    asked = 0
    stream = None
    events = None
    try:
        frames = open_question_video(path, video, settings, end)
        notifier = proactive_notifier(tasks, settings) if tasks else None
        stream = open_stream(max_new_tokens, notifier=notifier) if notifier is not None else open_stream(max_new_tokens)
        if opened is not None:
            opened(stream)
        events = stream.subscribe() if tasks else None  # before the first frame: every event is seen
        source_duration = frames.duration_s

        def on_answer(result) -> None:
            nonlocal asked
            q = order[asked]
            asked += 1
            record = make_record(q, videos[q.video_index], path, result, settings, source_duration)
            if q.scoring == OVO_YES_NO:  # the --notify probe's p(yes) of the same question, to tune it
                from ..engine.measure import yes_probability_of

                # read on the engine thread, from the memory the answer saw
                record["p_yes"] = round(stream.engine.call(stream.id, yes_probability_of(q.question, verbatim=True)), 6)
            keep(record)
            progress(1, f"{names} @ {result.answer.stream_time_s:.0f}s")

        with frames:
            feed = flushed_at(frames, stream, job.flush_times) if settings.protocol == "streaming" else frames
            run_stream(stream, feed, asks, on_answer=on_answer)
        report.warnings.extend(frames.stats.warnings)
        if events is not None:  # every chunk is in (run_stream ends with a flush): so is every event
            stopped = [w for w in stream.warnings if w.startswith("--notify stopped")]
            if stopped:  # the probes failed: not firing would be the engine's failure, not the model's
                raise ValueError(stopped[0])
            for record in proactive_records(tasks, proactive, videos, path, settings, source_duration,
                                            drain(events), stream.stats()):
                keep(record)
                progress(1, f"{names} proactive {record['qid']}")
            proactive = []
    except (StreamFailed, EngineStopped) as exc:
        if stopping is not None and stopping.is_set():
            return  # interrupted: the questions left are pending, not failed
        _failed(report, names, path, exc.__cause__ or exc, len(order) - asked + len(proactive), progress)
    except (SourceError, PositionLimitError, ValueError, OSError) as exc:
        _failed(report, names, path, exc, len(order) - asked + len(proactive), progress)
    finally:
        if stream is not None:
            if opened is not None:
                opened(None)
            if events is not None:
                with contextlib.suppress(Exception):
                    stream.unsubscribe(events)
            with contextlib.suppress(Exception):  # the engine has stopped: nothing left to free
                stream.close()


def proactive_notifier(tasks: list[ProactiveTask], settings: EvalSettings) -> Notifier:
    """The stream's ``--notify`` conditions: one per proactive task (its polling question, its
    window, answered by its question). Tasks with the same condition text share one condition
    (one state machine), polled over the union of their windows."""
    from ..engine.notify import Condition, Notifier

    specs: dict[str, Condition] = {}
    for t in tasks:
        had = specs.get(t.condition)
        start, stop = (t.start_s, t.stop_s) if had is None else (min(had.start_s or 0.0, t.start_s),
                                                                  max(had.stop_s or 0.0, t.stop_s))
        specs[t.condition] = Condition(t.condition, question=t.question, start_s=start, stop_s=stop)
    return Notifier(specs.values(), settings.notify_settings())


def drain(events) -> list:
    """Every event waiting on a subscription queue, in order."""
    import queue

    out = []
    while True:
        try:
            out.append(events.get_nowait())
        except queue.Empty:
            return out


def proactive_records(tasks: list[ProactiveTask], questions: list[Question], videos: dict[int, Video], path: Path,
                      settings: EvalSettings, source_duration: float | None, events: list, stats) -> list[dict]:
    """The records of a video's proactive questions from its stream's events: each task's first
    ``notification`` within its window (its fired time, p(yes) and text), the p(yes) of every
    poll in its window (the chunk events' ``p_yes``: how many, and the highest); none: not fired."""
    out = []
    for task, q in zip(tasks, questions, strict=True):
        polls: list[float] = []
        fired: dict | None = None
        for event in events:
            data = event.data
            t = data.get("stream_time_s")
            if t is None or not task.start_s - 1e-6 <= t <= task.stop_s + 1e-6:
                continue
            if event.kind == "chunk" and task.condition in data.get("p_yes", {}):
                polls.append(data["p_yes"][task.condition])
            elif event.kind == "notification" and data.get("notification") == task.condition and fired is None:
                fired = data
        video = videos[q.video_index]
        duration = video.duration_s if video.duration_s is not None else source_duration
        base = {
            "qid": q.qid, "video_id": video.video_id, "video_path": str(path), "task": q.task,
            "question": q.question, "choices": None, "answer": q.answer, "answer_letter": None,
            "parsed_letter": None, "lenient_match": None, "start_time_s": q.start_s, "end_time_s": q.end_s,
            "asked_at_s": task.start_s, "condition": task.condition, "notification": fired,
            "frames_seen": fired["frames_seen"] if fired else None,
            "stream_time_s": fired["stream_time_s"] if fired else None,
            "latency_ms": fired["latency_ms"] if fired else None,
            "polls": len(polls), "p_yes_max": round(max(polls), 6) if polls else None,
            "duration_s": duration, "duration_bucket": duration_bucket(video.duration_category, duration),
            "cache": asdict(stats.cache), "positions": asdict(stats.positions), "memory": asdict(stats.memory),
            "protocol": settings.protocol, "settings": settings.fingerprint(),
        }
        if q.extras:
            base["extras"] = q.extras
        record = task.record(base, fired["text"] if fired else None, fired["stream_time_s"] if fired else None,
                             fired["p_yes"] if fired else None)
        out.append(record)
    return out


def _failed(report: RunReport, names: str, path: Path, exc: BaseException, left: int,
            progress: Callable[[int, str], None]) -> None:
    report.failed_videos.append({"video_id": names, "path": str(path), "error": str(exc), "questions_lost": left})
    report.failed_questions += left
    progress(left, f"failed: {names}")


def make_record(q: Question, video: Video, path: Path, result, settings: EvalSettings, source_duration: float | None) -> dict:
    """The JSON record of one answered question."""
    a, stats = result.answer, result.stats
    prediction = a.text
    record = {
        "qid": q.qid,
        "video_id": video.video_id,
        "video_path": str(path),
        "task": q.task,
        "kind": "multiple_choice" if q.multiple_choice else "open_ended",
        "question": q.question,
        "choices": q.choices,
        "answer": q.answer,
        "answer_letter": q.answer_letter,
        "prediction": prediction,
        "parsed_letter": None,
        "correct": None,
        "lenient_match": None,
        "start_time_s": q.start_s,
        "end_time_s": q.end_s,
        "asked_at_s": result.asked_at_s,
        **a.record(),
        "duration_s": video.duration_s if video.duration_s is not None else source_duration,
        "duration_bucket": duration_bucket(video.duration_category, video.duration_s if video.duration_s is not None else source_duration),
        "cache": asdict(stats.cache),
        "positions": asdict(stats.positions),
        "memory": asdict(stats.memory),
        "protocol": settings.protocol,
        "settings": settings.fingerprint(),
    }
    if q.extras:
        record["extras"] = q.extras
    if q.scoring in (OVO_REC, OVO_YES_NO):  # a forward probe, scored as its benchmark does
        record.update(kind="forward", scoring=q.scoring, correct=score_probe(q.scoring, prediction, q.answer or ""),
                      yes_baseline=yes_baseline(q.scoring, q.answer or ""))
    elif q.multiple_choice:
        record["parsed_letter"] = parse_letter(prediction, q.choices or [])
        if q.answer_letter is not None:
            record["correct"] = record["parsed_letter"] == q.answer_letter
    elif q.answer:
        score = lenient_match(prediction, q.answer)
        record["lenient_match"] = score
        record["correct"] = None  # open-ended correctness is the judge's call
    return record


# -- judging --------------------------------------------------------------------------------------
def judge_records(records: list[dict], judge: Callable[[str, str, str], dict], output: Path | None,
                  on_progress: Callable[[int, str], None] | None = None) -> int:
    """Ask ``judge`` about open-ended records that have no verdict yet; rewrite ``output``. Returns how many."""
    todo = [r for r in records if r["kind"] == "open_ended" and r.get("answer") and "judge" not in r]
    for r in todo:
        try:
            r["judge"] = judge(r["question"], r["answer"], r["prediction"])
        except Exception as exc:
            r["judge_error"] = str(exc)[:200]
        if on_progress:
            on_progress(1, "judging")
    if todo and output is not None:
        by_qid = {r["qid"]: r for r in records}
        merged = [by_qid.get(r["qid"], r) for r in read_results(output)]
        write_results(output, merged)
    return sum("judge" in r for r in todo)


# -- aggregating ------------------------------------------------------------------------------------
def _accuracy(rows: list[dict]) -> dict:
    scored = [r for r in rows if r.get("correct") is not None]
    right = sum(bool(r["correct"]) for r in scored)
    return {"n": len(scored), "correct": right, "accuracy": round(100 * right / len(scored), 2) if scored else None}


def _groups(rows: list[dict], key: str) -> dict:
    out: dict[str, list[dict]] = {}
    for r in rows:
        if r.get(key) is not None:
            out.setdefault(str(r[key]), []).append(r)
    return {k: _accuracy(v) for k, v in sorted(out.items())}


def eval_summary(records: list[dict], *, selected: int | None = None) -> dict:
    """Aggregate records; depends on the records only, so a resumed run summarises the same.

    Accuracies are percentages (as the papers print them). ``lenient_match`` is this tool's
    judge-free open-ended score (share of the reference's content words in the answer, and the
    share of answers holding at least half of them) — not comparable to the papers' GPT judge.
    """
    mc = [r for r in records if r["kind"] == "multiple_choice"]
    oe = [r for r in records if r["kind"] == "open_ended"]
    summary: dict = {
        "questions": {"selected": selected, "answered": len(records), "multiple_choice": len(mc), "open_ended": len(oe)},
    }
    if records:
        summary["settings"] = records[0].get("settings")
    if mc:
        summary["multiple_choice"] = {
            **_accuracy(mc),
            "unparsed": sum(r["parsed_letter"] is None and r["correct"] is not None for r in mc),  # of the scored
            "unscored": sum(r["correct"] is None for r in mc),
            "per_task": _groups(mc, "task"),
            "per_duration": _groups(mc, "duration_bucket"),
        }
    if oe:
        scored = [r for r in oe if r.get("lenient_match") is not None]
        lenient = {
            "n": len(scored),
            "mean_score": round(statistics.fmean(r["lenient_match"] for r in scored), 4) if scored else None,
            "accuracy": round(100 * sum(r["lenient_match"] >= LENIENT_THRESHOLD for r in scored) / len(scored), 2) if scored else None,
            "threshold": LENIENT_THRESHOLD,
            "note": "built-in judge-free match; the papers report a GPT judge's accuracy and score",
        }
        block: dict = {"lenient_match": lenient, "per_task_lenient_accuracy": {}}
        for task in sorted({r["task"] for r in scored}):
            rows = [r for r in scored if r["task"] == task]
            block["per_task_lenient_accuracy"][task] = round(100 * sum(r["lenient_match"] >= LENIENT_THRESHOLD for r in rows) / len(rows), 2)
        judged = [r for r in oe if isinstance(r.get("judge"), dict)]
        if judged:
            yes = [r for r in judged if r["judge"].get("pred") == "yes"]
            scores = [r["judge"]["score"] for r in judged if isinstance(r["judge"].get("score"), (int, float))]
            block["judge"] = {
                "n": len(judged),
                "accuracy": round(100 * len(yes) / len(judged), 2),
                "mean_score": round(statistics.fmean(scores), 3) if scores else None,
                "model": judged[0]["judge"].get("model"),
            }
        summary["open_ended"] = block
    for name, extra in (("forward", summarize_forward(records)), ("proactive", summarize_proactive(records))):
        if extra is not None:
            summary[name] = extra
            summary["questions"][name] = extra["n"]
    ttft = [r["ttft_ms"] for r in records if r.get("ttft_ms") is not None]
    tpot = [r["tpot_ms"] for r in records if r.get("tpot_ms") is not None]
    summary["timing"] = {
        "ttft_ms_mean": round(statistics.fmean(ttft), 3) if ttft else None,
        "ttft_ms_median": round(statistics.median(ttft), 3) if ttft else None,
        "tpot_ms_mean": round(statistics.fmean(tpot), 3) if tpot else None,
    }
    return summary
