"""The settings schema (hermes_cli/settings.py) is the one owner of every setting.

Walking the schema: each setting is the command-line option of every command that takes it
(and of no other), its config-file key, its snapshot role, its engine field and eval's
fingerprint — all read back from the real command line, config loader, snapshot and engine, so
a setting declared once shows up everywhere, and a hand-kept copy anywhere fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hermes_cli import settings as schema
from hermes_cli.cli.config import default_map, load_config
from hermes_cli.cli.console import UserError
from hermes_cli.cli.main import app, main
from hermes_cli.settings import COMMAND, INHERITED, MEMORY, SETTINGS

ROOT = Path(__file__).resolve().parents[1]


def click_params() -> dict[str, dict]:
    """Command → parameter name → the click parameter typer built."""
    group = typer.main.get_command(app)
    return {name: {p.name: p for p in command.params} for name, command in group.commands.items()}  # type: ignore[attr-defined]


def sample(s: schema.Setting):
    """A valid value of ``s`` other than its default."""
    if s.choices:
        return next(c for c in s.choices if c != s.default)
    if s.kind is bool:
        return not s.default
    if s.kind in (int, float):
        return s.kind((s.default or 1) * 2)
    return ["alpha=0.3"] if s.kind is list else "Answer in one word."


def test_every_setting_is_its_option_in_each_command_that_takes_it_and_in_no_other():
    params = click_params()
    assert set(schema.COMMANDS) <= set(params)
    for s in SETTINGS:
        assert s.kind in schema.KINDS and s.snapshot in schema.ROLES, s.name
        assert set(s.commands) <= set(schema.COMMANDS), s.name
        assert s.group in schema.GROUPS, s.name
        assert bool(s.flags) == bool(s.commands), f"{s.name}: an option needs flags, flags need a command"
        for command in schema.COMMANDS:
            param = params[command].get(s.name)
            if command not in s.commands:
                assert param is None, f"{command} has a --{s.name} the schema does not give it"
                continue
            assert param is not None, f"{command} lacks {s.flag}"
            flags = [f for pair in s.flags for f in pair.split("/")]
            assert sorted([*param.opts, *param.secondary_opts]) == sorted(flags), (command, s.name)
            assert param.help == s.help_for(command), (command, s.name)
            default = s.default_for(command)
            assert param.default == default or (s.kind is list and param.default in (None, ())), (command, s.name)
            if s.kind is not bool:
                assert param.metavar and "<" not in param.metavar, (command, s.name)
            assert param.multiple == (s.kind is list), (command, s.name)


@pytest.mark.parametrize("name", ["watch", "chat"])  # chat too: --no-history, --reindex-spacing …
def test_every_engine_setting_given_on_the_command_line_reaches_the_session_config(name):
    from hermes_cli.cli.groups import AnswerOptions, MemoryOptions, ModelOptions, session_settings

    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    engine = [s for s in SETTINGS if s.field and name in s.commands]
    assert {"history", "reindex_spacing", "reindex_margin"} <= {s.name for s in engine}
    args = ["clip.mp4"]
    for s in engine:
        value = sample(s)
        if s.kind is bool:
            args.append(s.flags[0].split("/")[1 if s.default else 0])
        else:
            args += [s.flag, str(value[0] if s.kind is list else value)]
    params = command.make_context(name, args).params
    config = session_settings(*(group.of(params) for group in (ModelOptions, MemoryOptions, AnswerOptions))).config()
    for s in engine:
        assert getattr(config, s.field) == sample(s), s.name


def test_no_option_placeholder_is_a_python_type():
    for command in ("watch", "chat", "eval", "bench"):
        text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        assert "<str>" not in text and "<list[str]>" not in text and "<int>" not in text, command


def test_every_setting_is_its_config_file_key(tmp_path, monkeypatch):
    monkeypatch.delenv("HERMES_MODEL", raising=False)
    path = tmp_path / "config.toml"
    for s in SETTINGS:
        value = sample(s)
        literal = {bool: str(value).lower(), list: '["alpha=0.3"]'}.get(s.kind, repr(value).replace("'", '"'))
        for command in s.commands:
            path.write_text(f"[{command}]\n{s.name.replace('_', '-')} = {literal}\n")
            if not s.config:
                with pytest.raises(UserError, match=f"unknown setting '{command}.{s.name.replace('_', '-')}'"):
                    load_config(path)
                continue
            assert default_map(load_config(path))[command][s.name] == value, (command, s.name)
            path.write_text(f"{s.name} = {literal}\n")  # top level: every command of watch, chat, eval that takes it
            maps = default_map(load_config(path))
            assert {c for c in maps if s.name in maps[c]} == {c for c in s.commands if c != "bench"}, s.name
        path.write_text(f"{s.name} = 1\n" if s.kind is str else f'{s.name} = "x"\n')
        if s.config and set(s.commands) - {"bench"}:
            with pytest.raises(UserError, match=f"{s.name} must be"):
                load_config(path)


def test_every_engine_field_is_one_setting_with_the_engines_default():
    from hermes_cli.engine.config import SessionConfig

    config = SessionConfig()
    fields = [s.field for s in SETTINGS if s.field]
    assert sorted(fields) == sorted(f.name for f in dataclasses.fields(SessionConfig))
    for s in SETTINGS:
        if s.field and not s.or_default:
            assert getattr(config, s.field) == s.default, s.name


def test_eval_fingerprints_the_settings_its_results_depend_on():
    from hermes_cli.evaluation.runner import EvalSettings

    names = {f.name for f in dataclasses.fields(EvalSettings)}
    assert names == {s.name for s in schema.fingerprinted("eval")} | {"protocol", "npy_fps", "notify"}
    keys = set(EvalSettings(model="tiny").fingerprint())  # the keys results files have always held
    assert keys == {"model", "policy", "budget", "policy_opts", "fps", "chunk", "reindex", "reindex_spacing",
                    "pseudo_query", "pseudo_query_history", "penalise_prompt", "protocol", "history",
                    "max_new_tokens", "npy_fps", "max_pixels"}
    import hashlib
    import json

    # the default results file is named by this hash: files written before the schema still resume
    key = hashlib.sha1(json.dumps(EvalSettings(model="tiny").fingerprint(), sort_keys=True).encode()).hexdigest()
    assert key[:8] == "2a13d5e6"


def test_snapshot_roles_are_what_a_real_snapshot_passes_on_and_checks(tiny_qwen, tmp_path):
    """A snapshot made under a non-default value of every setting it carries: a resumed session
    takes each MEMORY and INHERITED one from it, keeps each COMMAND one, and the engine checks
    exactly the MEMORY ones."""
    from hermes_cli.cli.factory import SessionSettings
    from hermes_cli.cli.memory import MemoryRun
    from hermes_cli.engine import snapshot
    from hermes_cli.engine.config import SessionConfig
    from hermes_cli.engine.session import Session
    from policies import make_policy
    from tests.conftest import moving_square_frames

    carried = [s for s in SETTINGS if s.snapshot in (MEMORY, INHERITED)]
    assert tuple(s.field for s in SETTINGS if s.snapshot == MEMORY) == snapshot.MEMORY_SETTINGS
    engine = {s.field: sample(s) for s in carried if s.field}
    session = Session(tiny_qwen, make_policy("infinipot", alpha=0.3), SessionConfig(**engine))
    session.ingest(list(moving_square_frames(2)), [0.0, 1.0])
    path = tmp_path / "memory.safetensors"
    snapshot.save(session, path)
    run = MemoryRun(load=str(path))
    resumed = run.settings(SessionSettings(), given=set()).values()
    expected = {"model": "tiny", "dtype": "fp32", "policy": "infinipot",
                **{s.name: engine[s.field] for s in carried if s.field}}
    assert {s.name for s in carried} == {*expected, "policy_opt"}
    for name, value in expected.items():
        assert resumed[name] == value, name
    policy = SessionSettings.of(resumed).memory.make_policy()  # the parameters come back whole
    assert snapshot.policy_parameters(policy) == snapshot.policy_parameters(session.policy)
    assert policy.alpha == 0.3
    mine = SessionSettings().replace(**{s.name: sample(s) for s in SETTINGS
                                        if s.snapshot == COMMAND and s.name in SessionSettings().values()})
    kept = run.settings(mine, given=set()).values()
    for s in SETTINGS:
        if s.snapshot == COMMAND and s.name in kept:
            assert kept[s.name] == mine.values()[s.name], s.name
    for s in SETTINGS:  # a different value of each MEMORY setting is refused; --accept-policy lets it through
        if s.snapshot != MEMORY:
            continue
        other = Session(tiny_qwen, make_policy("infinipot", alpha=0.3),
                        SessionConfig(**{**engine, s.field: getattr(SessionConfig(), s.field)}))
        with pytest.raises(snapshot.SnapshotError, match=f"made with {s.field}="):
            snapshot.check_fits(snapshot.read(path), other)
        snapshot.check_fits(snapshot.read(path), other, accept_policy=True)


DECLARE = {"Option", "Argument", "add_argument"}  # what declares a command-line option
OWN_MEANING = {  # a flag that means something else there, not the setting of that name
    ("hermes_cli/cli/info.py", "--json"),  # hermes models / policies: print the listing as JSON
    ("hermes_cli/cli/main.py", "--quiet"), ("hermes_cli/cli/main.py", "--verbose"),  # the root's, for every command
    ("hermes_cli/bench/soak.py", "--json"),  # the soak's: a file to write its record to
    # the cluster simulation's: its simulated streams' fps choices and chunk size, its summary as JSON
    ("hermes_cli/cluster/simulate.py", "--fps"), ("hermes_cli/cluster/simulate.py", "--chunk"),
    ("hermes_cli/cluster/simulate.py", "--json"),
    ("hermes_cli/cli/logs.py", "--json"),  # hermes logs: print the log's rows as JSON
    ("hermes_cli/cli/serve.py", "--autosave-every"),  # hermes serve: the interval of its streams' autosaves
    # the engine's micro-benchmarks: the shape of a synthetic cache or run, not a session's setting
    *(("hermes_cli/engine/microbench/kvbits.py", f) for f in ("--dtype", "--chunk", "--budget", "--policy",
                                                             "--max-new-tokens")),
    *(("hermes_cli/engine/microbench/selection.py", f) for f in ("--budget", "--chunk", "--dtype")),
}


# Lists of names that are something else: the HTTP API's request fields (issue 22 names them; the
# server maps them onto the settings in one place).
OWN_LISTS = {"hermes_cli/serve/streams.py"}


def test_no_module_keeps_its_own_copy_of_a_setting():
    """Outside the schema no source file declares a setting's flag as an option, nor lists
    three or more setting names together (as FROM_SNAPSHOT and MEMORY_SETTINGS once did)."""
    flags = {f for s in SETTINGS for pair in s.flags for f in pair.split("/") if f.startswith("--")}
    names = {s.name for s in SETTINGS} | {s.field for s in SETTINGS if s.field}
    found = []
    for path in sorted([*(ROOT / "hermes_cli").rglob("*.py"), *(ROOT / "policies").rglob("*.py")]):
        if path.name == "settings.py" and path.parent.name == "hermes_cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in DECLARE:
                for arg in node.args:
                    where = (str(path.relative_to(ROOT)), getattr(arg, "value", None))
                    if where[1] in flags and where not in OWN_MEANING:
                        found.append(f"{where[0]}:{node.lineno}: {where[1]}")
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                strings = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if sum(v in names for v in strings) >= 3 and str(path.relative_to(ROOT)) not in OWN_LISTS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {strings}")
    assert not found, "\n".join(found)


# -- must-show 2: --reindex-spacing is a memory-shaping setting ----------------------------------------
def run_cli(capsys, *args: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    argv, sys.argv = sys.argv, ["hermes", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        sys.argv = argv
    return code, capsys.readouterr().err.strip().splitlines()


def test_reindex_spacing_is_inherited_from_a_memory_and_a_conflict_is_refused(video, tmp_path, capsys):
    from hermes_cli.engine import snapshot

    first, second = tmp_path / "interval.safetensors", tmp_path / "resumed.safetensors"
    common = ("--ask", "hi", "--max-new-tokens", "1", "--json")
    code, lines = run_cli(capsys, "watch", video, "--model", "tiny", "--chunk", "4", "--budget", "60",
                          "--reindex-spacing", "interval", "--save-memory", str(first), *common)
    assert code == 0, lines
    assert snapshot.read(first).state["config"]["reindex_spacing"] == "interval"
    code, lines = run_cli(capsys, "watch", video, "--memory", str(first), "--save-memory", str(second), *common)
    assert code == 0, lines
    assert snapshot.read(second).state["config"]["reindex_spacing"] == "interval"  # inherited, not the default rank
    code, lines = run_cli(capsys, "watch", video, "--memory", str(first), "--reindex-spacing", "rank", *common)
    assert code == 2 and lines == [f"error: {first} was made with reindex_spacing='interval', this session has "
                                   "'rank' — pass --accept-policy to continue with the new setting"]
    code, lines = run_cli(capsys, "watch", video, "--memory", str(first), "--chunk", "2", *common)  # like the others
    assert code == 2 and lines == [f"error: {first} was made with chunk_frames=4, this session has 2 — "
                                   "pass --accept-policy to continue with the new setting"]
    code, lines = run_cli(capsys, "watch", video, "--memory", str(first), "--reindex-spacing", "rank",
                          "--accept-policy", *common)
    assert code == 0, lines


def test_policy_options_complete_policy_names_in_a_real_shell_completion(tmp_path):
    import os
    import subprocess

    (tmp_path / "hermes_notes.txt").write_text("a file the shell must not offer")

    def complete(*words: str) -> list[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "_HERMES_COMPLETE": "complete_bash",
               "COMP_WORDS": " ".join(["hermes", *words]), "COMP_CWORD": str(len(words))}
        done = subprocess.run([sys.executable, "-c", "from hermes_cli.cli.main import app; app(prog_name='hermes')"], env=env,
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        return done.stdout.split()

    assert complete("watch", "--policy", "in") == ["infinipot"]
    assert complete("chat", "-p", "") == ["full", "fifo", "sink", "uniform", "infinipot", "hermes"]
    assert complete("eval", "--policy", "h") == ["hermes"]
    assert complete("bench", "--policies", "hermes,f") == ["hermes,full", "hermes,fifo"]
