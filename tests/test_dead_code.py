"""A dead-code scan: vulture (configured in pyproject.toml, [tool.vulture]) finds nothing unused.

Its short list of ignored names is for what vulture cannot see being used (a typer callback, a
transformers interface, a name the family records give as a string). Anything else it reports
is code nobody calls: delete it, or, if something outside the scan does call it, name it there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def vulture(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vulture", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_nothing_unused():
    pytest.importorskip("vulture")
    done = vulture()
    assert done.stdout == "" and done.returncode == 0, done.stdout + done.stderr


def test_the_scan_reports_an_unused_function(tmp_path):
    pytest.importorskip("vulture")
    (tmp_path / "module.py").write_text("def used():\n    return 1\n\n\ndef forgotten():\n    return 2\n\n\nused()\n")
    done = vulture("module.py", "--min-confidence", "60", cwd=tmp_path)
    assert "unused function 'forgotten'" in done.stdout and "'used'" not in done.stdout
