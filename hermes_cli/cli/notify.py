"""``--notify CONDITION`` on ``watch`` and ``chat``: its options, checked before anything loads,
and what a run does with each notification (docs/notify.md)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Annotated

import typer

from .. import defaults
from .console import UserError, err

PANEL = "Notifications"

NotifyOpt = Annotated[list[str] | None, typer.Option(
    "--notify", metavar="CONDITION", rich_help_panel=PANEL,
    help="Say when CONDITION becomes true (repeatable), e.g. --notify \"a person enters\": probed from the memory after each chunk.")]
ThresholdOpt = Annotated[float, typer.Option(
    "--notify-threshold", metavar="P", min=0.0, max=1.0, rich_help_panel=PANEL,
    help="On-threshold on p(yes), 0–1 (0: fire at the first probe).")]
OffThresholdOpt = Annotated[float | None, typer.Option(
    "--notify-off-threshold", metavar="P", min=0.0, max=1.0, rich_help_panel=PANEL,
    help=f"Re-arm once p(yes) falls below P (default {defaults.NOTIFY_OFF_RATIO} × --notify-threshold).")]
ConsecutiveOpt = Annotated[int, typer.Option(
    "--notify-consecutive", metavar="N", min=1, rich_help_panel=PANEL,
    help="Chunks in a row above the threshold before firing.")]
CooldownOpt = Annotated[int, typer.Option(
    "--notify-cooldown", metavar="N", min=0, rich_help_panel=PANEL,
    help="Chunks after a notification during which the condition cannot fire again.")]
MarginOpt = Annotated[float, typer.Option(
    "--notify-margin", metavar="P", min=0.0, max=1.0, rich_help_panel=PANEL,
    help="How far p(yes) must rise above the condition's own running baseline.")]
BaselineOpt = Annotated[int, typer.Option(
    "--notify-baseline", metavar="N", min=1, rich_help_panel=PANEL,
    help="Span in probes of the condition's running p(yes) baseline (its moving average).")]
OnNotifyOpt = Annotated[str | None, typer.Option(
    "--on-notify", metavar="CMD", rich_help_panel=PANEL,
    help="Run CMD for each notification: the event as JSON on stdin and HERMES_* variables (no shell).")]
OnNotifyShellOpt = Annotated[bool, typer.Option(
    "--on-notify-shell", rich_help_panel=PANEL, help="Run --on-notify's CMD through the shell (sh -c).")]


@dataclass(frozen=True)
class NotifyOptions:
    """--notify and its knobs (docs/notify.md)."""

    notify: NotifyOpt = None
    notify_threshold: ThresholdOpt = defaults.NOTIFY_THRESHOLD
    notify_off_threshold: OffThresholdOpt = None
    notify_consecutive: ConsecutiveOpt = defaults.NOTIFY_CONSECUTIVE
    notify_cooldown: CooldownOpt = defaults.NOTIFY_COOLDOWN
    notify_margin: MarginOpt = defaults.NOTIFY_MARGIN
    notify_baseline: BaselineOpt = defaults.NOTIFY_BASELINE
    on_notify: OnNotifyOpt = None
    on_notify_shell: OnNotifyShellOpt = False

    def conditions(self) -> list[str]:
        return [c.strip() for c in self.notify or [] if c.strip()]

    def check(self) -> None:
        """Every value and the command, before the model loads; one line naming the option."""
        if self.notify and not self.conditions():
            raise UserError("--notify needs a condition, e.g. --notify \"a person enters\"")
        if (self.on_notify or self.on_notify_shell) and not self.conditions():
            raise UserError("--on-notify runs for --notify's notifications: add --notify CONDITION")
        try:
            self.settings().check()
        except ValueError as exc:
            raise UserError(str(exc)) from None
        self.command()

    def settings(self):
        return rule_settings(self)

    def notifier(self):
        """The engine's ``Notifier`` for these conditions (None without --notify)."""
        from ..engine.notify import Notifier

        conditions = self.conditions()
        return Notifier(conditions, self.settings()) if conditions else None

    def command(self):
        """--on-notify's ``NotifyCommand`` (None without it); a command that cannot run is one line."""
        if not self.on_notify:
            return None
        from ..engine.notify import NotifyCommand, NotifyCommandError

        try:
            return NotifyCommand(self.on_notify, shell=self.on_notify_shell)
        except NotifyCommandError as exc:
            raise UserError(f"--on-notify: {exc}") from None


@dataclass(frozen=True)
class NotifyRuleOptions:
    """The firing rule's knobs alone (``hermes eval``: its StreamingBench proactive questions
    fire by them; same flags and defaults as watch's, docs/notify.md)."""

    notify_threshold: ThresholdOpt = defaults.NOTIFY_THRESHOLD
    notify_off_threshold: OffThresholdOpt = None
    notify_consecutive: ConsecutiveOpt = defaults.NOTIFY_CONSECUTIVE
    notify_cooldown: CooldownOpt = defaults.NOTIFY_COOLDOWN
    notify_margin: MarginOpt = defaults.NOTIFY_MARGIN
    notify_baseline: BaselineOpt = defaults.NOTIFY_BASELINE

    def values(self) -> dict:
        """``NotifySettings``' fields → these values (checked: one line naming the flag)."""
        import dataclasses

        rule = rule_settings(self)
        try:
            rule.check()
        except ValueError as exc:
            raise UserError(str(exc)) from None
        return dataclasses.asdict(rule)


def rule_settings(options: NotifyOptions | NotifyRuleOptions):
    """The engine's ``NotifySettings`` from the firing rule's flags (unchecked)."""
    from ..engine.notify import NotifySettings

    return NotifySettings(threshold=options.notify_threshold, off_threshold=options.notify_off_threshold,
                          consecutive=options.notify_consecutive, cooldown=options.notify_cooldown,
                          margin=options.notify_margin, baseline=options.notify_baseline)


def show_notification(json_out: bool):
    """How a batch run or plain lines show a notification: one JSON object on stdout with --json,
    else one line on stderr."""
    from ..app.notifications import notification_line

    def show(record: dict) -> None:
        if "error" in record:
            err.print(f"warning: {record['error']}", soft_wrap=True, highlight=False)
        elif json_out:
            sys.stdout.write(json.dumps(record) + "\n")  # one write: whole lines beside the answers
            sys.stdout.flush()
        else:
            err.print(f"» {notification_line(record)}", soft_wrap=True, highlight=False, markup=False)
    return show


