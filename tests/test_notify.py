"""The --notify firing rule on scripted p(yes) sequences, the event record, and --on-notify (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hermes_cli.engine.notify import (
    ConditionState,
    Notifier,
    NotifyCommand,
    NotifyCommandError,
    NotifyEvent,
    NotifySettings,
    command_argv,
    run_on_notify,
)


def fires(ps, **knobs) -> list[int]:
    """The indices of the probes a condition fires on."""
    state = ConditionState(NotifySettings(**knobs).check())
    return [i for i, p in enumerate(ps) if state.update(p)]


def test_once_per_rising_edge_then_rearms():
    # low, a rise held for 4 probes, low again (re-arms), a second rise
    ps = [0.1, 0.1, 0.9, 0.9, 0.9, 0.9, 0.1, 0.1, 0.9, 0.9]
    assert fires(ps, cooldown=0, margin=0.0) == [2, 8]


def test_no_rearm_without_falling_below_the_off_threshold():
    # dips to 0.45: under the on-threshold (0.5) but not under the off-threshold (0.4): no new edge
    ps = [0.1, 0.9, 0.45, 0.9, 0.45, 0.9, 0.3, 0.9]
    assert fires(ps, cooldown=0, margin=0.0) == [1, 7]
    assert fires(ps, cooldown=0, margin=0.0, off_threshold=0.5) == [1, 3, 5, 7]


def test_cooldown_blocks_exactly_that_many_probes():
    ps = [0.9, 0.0] * 6  # an edge at every even probe, re-armed at every odd one
    assert fires(ps, cooldown=0, margin=0.0) == [0, 2, 4, 6, 8, 10]
    assert fires(ps, cooldown=1, margin=0.0) == [0, 2, 4, 6, 8, 10]  # the probe after a fire is low anyway
    assert fires(ps, cooldown=2, margin=0.0) == [0, 4, 8]  # probes 1 and 2 cannot fire; 3 re-arms, 4 fires
    assert fires(ps, cooldown=3, margin=0.0) == [0, 4, 8]
    assert fires(ps, cooldown=4, margin=0.0) == [0, 6]


def test_consecutive_probes_needed():
    ps = [0.1, 0.9, 0.1, 0.9, 0.9, 0.9, 0.1]
    assert fires(ps, consecutive=2, margin=0.0, cooldown=0) == [4]
    assert fires(ps, consecutive=3, margin=0.0, cooldown=0) == [5]
    assert fires(ps, consecutive=4, margin=0.0, cooldown=0) == []


def test_baseline_keeps_a_yes_biased_model_quiet():
    # a model that leans to "Yes" whatever it sees: p wanders between 0.38 and 0.72 (its noise crosses
    # both thresholds), then the event really happens (0.99)
    noisy = [0.7, 0.38, 0.72, 0.39, 0.7, 0.37, 0.71, 0.38] * 3
    event = [*noisy, 0.99]
    # judged on the thresholds alone it fires on every swing up
    assert fires(event, cooldown=0, margin=0.0) == [*range(0, 24, 2), 24]
    # against its own baseline (about 0.55) a swing to 0.72 is no rise; the first probe (no baseline
    # yet) and the event are
    assert fires(event, cooldown=0, margin=0.2) == [0, 24]
    assert fires(event, cooldown=0, margin=0.5) == [0]


def test_baseline_is_the_moving_average_before_the_probe():
    state = ConditionState(NotifySettings(baseline=3, margin=0.2, cooldown=0))
    assert state.update(0.2) is False and state.baseline == pytest.approx(0.2)
    # weight 2 / (3 + 1) = 0.5: the baseline is 0.2 when 0.6 is judged (0.6 - 0.2 >= 0.2: fires)
    assert state.update(0.6) is True and state.baseline == pytest.approx(0.4)
    assert state.update(0.1) is False and state.baseline == pytest.approx(0.25)  # re-armed (0.1 < 0.4)
    # 0.5 is above the on-threshold but only 0.25 above the baseline of 0.25 ... enough for 0.2
    assert state.update(0.5) is True and state.baseline == pytest.approx(0.375)
    assert state.update(0.1) is False  # re-armed
    # 0.55 >= 0.5, but the baseline is now 0.2375: 0.3125 above it, fires; with a larger margin it would not
    assert state.update(0.55) is True
    strict = ConditionState(NotifySettings(baseline=3, margin=0.35, cooldown=0))
    assert [strict.update(p) for p in (0.2, 0.6, 0.1, 0.5, 0.1, 0.55)] == [False, True, False, False, False, False]


def test_threshold_zero_fires_at_the_first_probe_once():
    for first in (0.0, 0.3, 1.0):
        assert fires([first, 0.0, 1.0, 0.0, 1.0], threshold=0.0) == [0]
        assert fires([first, 1.0], threshold=0.0, margin=1.0, cooldown=0) == [0]
    n = Notifier(["a person enters", "the kettle boils"], NotifySettings(threshold=0.0))
    assert n.update({"a person enters": 0.0, "the kettle boils": 0.0}) == ["a person enters", "the kettle boils"]
    assert n.update({"a person enters": 1.0, "the kettle boils": 1.0}) == []


def test_threshold_one_needs_certainty():
    assert fires([0.99, 0.999999, 1.0], threshold=1.0, margin=0.0) == [2]


@pytest.mark.parametrize("knobs, flag", [
    ({"threshold": 1.5}, "--notify-threshold"), ({"threshold": -0.1}, "--notify-threshold"),
    ({"threshold": 0.5, "off_threshold": 0.6}, "--notify-off-threshold"),
    ({"consecutive": 0}, "--notify-consecutive"), ({"cooldown": -1}, "--notify-cooldown"),
    ({"margin": 2.0}, "--notify-margin"), ({"baseline": 0}, "--notify-baseline"),
])
def test_bad_knobs_name_their_flag(knobs, flag):
    with pytest.raises(ValueError, match=flag):
        NotifySettings(**knobs).check()


def test_defaults_are_documented_values():
    s = NotifySettings()
    assert (s.threshold, s.off, s.consecutive, s.cooldown, s.margin, s.baseline) == (0.5, 0.4, 1, 4, 0.1, 8)


def test_notifier_keeps_conditions_apart():
    n = Notifier(["a", "b", "a"], NotifySettings(margin=0.0, cooldown=0))
    assert n.conditions == ["a", "b"]
    assert n.update({"a": 0.9, "b": 0.1}) == ["a"]
    assert n.update({"a": 0.9, "b": 0.9}) == ["b"]
    with pytest.raises(ValueError, match="needs a condition"):
        Notifier(["  "])


def test_a_condition_is_polled_in_its_window_only():
    from hermes_cli.engine.notify import Condition

    n = Notifier(["always", Condition(" posed at 20 s ", question="What now?", start_s=20.0, stop_s=33.0)],
                 NotifySettings(threshold=0.0))
    assert n.conditions == ["always", "posed at 20 s"] and n.question("posed at 20 s") == "What now?"
    assert n.question("always") is None
    assert n.due(19.5) == ["always"] and n.due(20.0) == n.due(33.0) == ["always", "posed at 20 s"]
    assert n.due(33.5) == ["always"]
    # polled only from its start: its first poll is its first probe (threshold 0 fires there)
    assert n.update({"always": 0.2}) == ["always"]
    assert n.states["posed at 20 s"].probes == 0
    assert n.update({"always": 0.2, "posed at 20 s": 0.1}) == ["posed at 20 s"]
    assert Condition("c", start_s=5.0).due(1e9) and not Condition("c", stop_s=5.0).due(5.1)
    with pytest.raises(ValueError, match="ends .* before it starts"):
        Notifier([Condition("c", start_s=5.0, stop_s=4.0)])


EVENT = NotifyEvent("a person enters", 12.34567, 17, 0.8123456789, "A man walks in.", 41.23456)


def test_event_record_has_every_field():
    record = EVENT.to_json()
    assert list(record) == ["notification", "stream_time_s", "frames_seen", "p_yes", "text", "latency_ms"]
    assert record == {"notification": "a person enters", "stream_time_s": 12.346, "frames_seen": 17,
                      "p_yes": 0.812346, "text": "A man walks in.", "latency_ms": 41.235}
    env = EVENT.environment()
    assert env["HERMES_NOTIFICATION"] == "a person enters" and env["HERMES_P_YES"] == "0.812346"
    assert env["HERMES_FRAMES_SEEN"] == "17" and json.loads(env["HERMES_EVENT"]) == record


# The child writes what it got (environment and stdin) to a file, as a user's script would.
CHILD = (
    "import json, os, sys; "
    "json.dump({'env': {k: v for k, v in os.environ.items() if k.startswith('HERMES_')}, 'stdin': sys.stdin.read(), "
    "'argv': sys.argv[1:]}, open(sys.argv[1], 'w'))"
)


def test_on_notify_runs_the_command_with_the_event(tmp_path):
    out = tmp_path / "got.json"
    proc = run_on_notify([sys.executable, "-c", CHILD, str(out), "two words"], EVENT)
    assert proc.wait(30) == 0
    got = json.loads(out.read_text())
    assert json.loads(got["stdin"]) == EVENT.to_json() and got["stdin"].endswith("\n")
    assert got["env"]["HERMES_NOTIFICATION"] == "a person enters"
    assert json.loads(got["env"]["HERMES_EVENT"]) == EVENT.to_json()
    assert got["argv"] == [str(out), "two words"]


def test_on_notify_string_is_split_not_shelled(tmp_path):
    out = tmp_path / "got.json"
    marker = tmp_path / "shell-ran"
    # a shell would run the `touch` after the semicolon; shlex.split passes it on as arguments
    cmd = f"{sys.executable} -c \"{CHILD}\" {out} ';' touch {marker}"
    hook = NotifyCommand(cmd)
    hook(EVENT)
    assert hook.close(30) == [0]
    assert json.loads(out.read_text())["argv"] == [str(out), ";", "touch", str(marker)]
    assert not marker.exists()


def test_on_notify_shell_when_asked(tmp_path):
    out = tmp_path / "shell.txt"
    proc = run_on_notify(f'printf "%s|" "$HERMES_NOTIFICATION" > {out}; cat >> {out}', EVENT, shell=True)
    assert proc.wait(30) == 0
    name, stdin = out.read_text().split("|", 1)
    assert name == "a person enters" and json.loads(stdin) == EVENT.to_json()


def test_on_notify_command_that_ignores_stdin():
    proc = run_on_notify(["true"], EVENT)
    assert proc.wait(30) == 0


def test_on_notify_bad_commands_fail_in_one_line():
    with pytest.raises(NotifyCommandError, match="no program 'no-such-program-xyz'"):
        command_argv("no-such-program-xyz --flag")
    with pytest.raises(NotifyCommandError, match="quote"):
        command_argv("echo 'unbalanced")
    with pytest.raises(NotifyCommandError, match="needs a command"):
        command_argv("   ")


def test_notify_is_torch_free():
    code = "import sys, hermes_cli.engine.notify; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
