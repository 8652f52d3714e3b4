"""``hermes logs``: the questions asked and the answers given, from the local answer log.

The log itself (where it lives, its schema, the one writer) is ``hermes_cli.answer_log``.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape

from .. import answer_log
from .console import UserError, err, out

NoLogOpt = Annotated[bool, typer.Option("--no-log", help="Do not write this run's answers to the answer log (see `hermes logs`).")]
ACTIONS = ("on", "off", "path")


def logs(
    action: Annotated[str | None, typer.Argument(metavar="ACTION", help="on or off: start or stop logging answers; path: print the log's file.", show_default=False)] = None,
    count: Annotated[int, typer.Option("--count", "-n", metavar="N", help="The newest N answers (0: all).")] = 10,
    search: Annotated[str | None, typer.Option("--search", "-s", metavar="WORD", help="Only answers whose question or answer contains WORD (case-insensitive).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the answers as one JSON list (for scripts).")] = False,
) -> None:
    """Show the questions asked and the answers given by `hermes watch` and `hermes chat`.

    Each answer is logged with its source, stream time, model, policy and timings in a local
    SQLite file ($XDG_STATE_HOME/hermes-video/logs.db; HERMES_LOGS names another). `--no-log`
    skips one run; `hermes logs off` stops logging until `hermes logs on`.

    \b
    Examples:
      hermes logs                       (the newest 10, oldest first)
      hermes logs -n 5 --json
      hermes logs --search kitchen
      hermes logs off
    """
    if action is not None:
        if action not in ACTIONS:
            raise UserError(f"hermes logs takes on, off or path, got {action!r} (see hermes logs --help)")
        if action == "path":
            print(answer_log.log_path())
            return
        try:
            answer_log.set_logging(action == "on")
        except OSError as exc:
            raise UserError(f"cannot turn the answer log {action}: {exc}") from exc
        out.print(f"answer log {action}" + ("" if action == "on" else " (hermes logs on turns it back on)")
                  + f": {answer_log.log_path()}", soft_wrap=True)
        return
    if count < 0:
        raise UserError(f"--count must be 0 (all) or more, got {count}")
    import sqlite3

    try:
        rows = answer_log.recent(count, search)
    except sqlite3.Error as exc:
        raise UserError(f"cannot read the answer log {answer_log.log_path()}: {exc}") from exc
    if json_out:
        print(json.dumps(rows, ensure_ascii=False))
        return
    if not answer_log.logging_on():
        err.print("note: logging is off (hermes logs on turns it back on)", soft_wrap=True)
    if not rows:
        err.print("no answers logged yet" + (f" containing {search!r}" if search else "")
                  + f" ({answer_log.log_path()})", soft_wrap=True)
        return
    for row in rows:
        out.print(_header(row), soft_wrap=True, highlight=False)
        out.print(f"[bold]Q[/]: {escape(row['question'])}", soft_wrap=True)
        out.print(f"[bold]A[/]: {escape(row['answer'])}", soft_wrap=True)
        out.print()


def _header(row: dict) -> str:
    """One dim line: when, which command on which source at what stream time, model, policy, timings."""
    when = (row["datetime_utc"] or "")[:19].replace("T", " ")
    where = " ".join(str(x) for x in (row.get("command"), row.get("source")) if x)
    stream = f" @ {row['stream_time_s']:.1f}s" if row.get("stream_time_s") is not None else ""
    timing = " · ".join(f"{name} {row[key]:.0f} ms" for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))
                        if row.get(key) is not None)
    parts = [p for p in (f"#{row['id']} {when} UTC", f"{where}{stream}".strip(), row.get("model"),
                         row.get("policy") and f"policy {row['policy']}", timing) if p]
    return f"[dim]{escape(' · '.join(parts))}[/]"
