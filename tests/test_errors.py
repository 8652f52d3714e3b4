"""One error base (hermes_cli/errors.py) mapped to exit codes in one place (cli/main.py)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

from hermes_cli.errors import EXIT_BUG, EXIT_INTERRUPTED, EXIT_USER, HermesError

ROOT = Path(__file__).resolve().parents[1]


def exception_classes() -> list[type]:
    """Every exception class the package defines (found in the source, then imported)."""
    found = []
    for path in sorted((ROOT / "hermes_cli").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        names = [node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.ClassDef)]
        if not names:
            continue
        loaded = importlib.import_module(module)
        found += [cls for name in names if isinstance(cls := getattr(loaded, name), type)
                  and issubclass(cls, BaseException) and cls.__module__ == module]
    return found


def test_every_exception_the_package_defines_has_the_one_base():
    classes = exception_classes()
    assert len(classes) >= 12, [c.__name__ for c in classes]
    assert [c.__name__ for c in classes if not issubclass(c, HermesError)] == []
    codes = {c.__name__: c.exit_code for c in classes}
    assert codes["UserError"] == codes["SourceError"] == codes["ModelLoadError"] == codes["SnapshotError"] == EXIT_USER
    assert codes["Interrupted"] == codes["BenchInterrupted"] == EXIT_INTERRUPTED
    assert codes["AnswerOpenError"] == codes["EngineStopped"] == codes["StreamFailed"] == EXIT_BUG  # not the user's


def test_library_errors_reach_the_user_as_one_line_and_their_exit_code(tmp_path):
    """Errors raised deep in sources, models and evaluation, with no conversion on the way up:
    ``main`` prints each as one ``error:`` line and exits with its code, before torch is loaded."""
    cases = [
        (["eval", str(tmp_path / "missing.json"), "--dry-run"], "missing.json"),  # AnnotationError
        (["bench", "--arch", "gpt-9", "--random-weights"], "unknown architecture 'gpt-9'"),  # ModelLoadError
        (["bench", "--model", "./no/such/model"], "no model directory at"),  # ModelLoadError
        (["watch", str(tmp_path / "clip.mp4"), "--model", "tiny"], "no such file"),  # SourceError
    ]
    code = (
        "import sys\nfrom hermes_cli.cli.main import main\n"
        f"for args in {[args for args, _ in cases]!r}:\n"
        "    sys.argv = ['hermes', *args]\n"
        "    try:\n        main()\n    except SystemExit as exc:\n"
        "        print('EXIT', exc.code, file=sys.stderr)\n"
        "print('TORCH', 'torch' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    exits = [line for line in lines if line.startswith("EXIT")]
    assert exits == [f"EXIT {EXIT_USER}"] * len(cases), done.stderr
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == len(cases), done.stderr
    for (_, needle), line in zip(cases, errors):
        assert needle in line, (needle, line)
    assert "TORCH False" in lines
