"""Every repository path named in docs/, the README and the code's docstrings and comments exists.

Files move (``hermes_cli/memory.py`` became ``engine/cache.py``, ``sources.py`` a package); a
doc that still names the old place sends the reader nowhere. Named paths are: anything under
the repository's top folders (``hermes_cli/…``, ``docs/…``, ``tests/…``), paths inside the
package written without ``hermes_cli/`` (``engine/session.py``, ``models/attention.row_attention``
— a module and one of its names), bare ``*.py`` / ``*.md`` file names, and markdown links.
``<family>`` and ``*`` stand for any name and must match at least one file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("hermes_cli", "policies", "tests", "docs", "scripts", ".ci")
SUBPACKAGES = tuple(p.name for p in (ROOT / "hermes_cli").iterdir() if (p / "__init__.py").exists())
PREFIXES = "|".join(re.escape(p) for p in (*TOP, *SUBPACKAGES))
PATH = re.compile(rf"(?<![\w./~-])((?:{PREFIXES})/[\w./<>*-]*[\w*>])")
BARE = re.compile(r"(?<![\w./~-])([\w-]+\.(?:py|md))\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")

# Named on purpose, not in this repository: transformers' own file, and a listing the reader saves.
ELSEWHERE = {
    "processing_qwen3_vl.py": "transformers' Qwen3-VL processor, whose layout the adapter follows",
    "snapbench.py": "docs/benchmarks.md's listing, saved under that name by the reader",
    "kvcache_utils.py": "the official InfiniPot-V code's file (aiha-lab/InfiniPot-V) that docs/policies.md follows",
    "cache_utils.py": "transformers' cache module (the design our cache follows)",
}


def documents() -> list[tuple[Path, str]]:
    """(file, text that names paths): each doc page and the README whole; for Python files their
    docstrings and comments."""
    found = [(path, path.read_text()) for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]]
    for path in sorted(p for top in ("hermes_cli", "policies", "tests", "scripts") for p in (ROOT / top).rglob("*.py")):
        if path == Path(__file__).resolve():
            continue  # its examples are stale on purpose
        source = path.read_text()
        parts = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
        parts += [line.split("#", 1)[1] for line in source.splitlines() if "#" in line]
        found.append((path, "\n".join(parts)))
    return found


def exists(name: str, bases: list[Path]) -> bool:
    pattern = re.sub(r"<[^>]+>", "*", name.rstrip("/."))
    for base in bases:
        if "*" in pattern:
            if any(base.glob(pattern)):
                return True
        elif (base / pattern).exists():
            return True
        elif "." in Path(pattern).name and (base / pattern).with_suffix(".py").is_file():
            module, attr = (base / pattern).with_suffix(".py"), Path(pattern).suffix[1:]
            if re.search(rf"\b{re.escape(attr)}\b", module.read_text()):
                return True  # module.name
    return False


def stale_paths() -> list[str]:
    files = {p.name for p in ROOT.rglob("*") if not {".git", ".venv"} & set(p.parts)}
    stale = []
    for doc, text in documents():
        where = doc.relative_to(ROOT)
        for name in PATH.findall(text):
            bases = [ROOT] if name.split("/")[0] in TOP else [ROOT / "hermes_cli", ROOT]
            if not exists(name, bases):
                stale.append(f"{where}: {name}")
        for name in BARE.findall(text):
            if name not in files and name not in ELSEWHERE:
                stale.append(f"{where}: {name}")
        if doc.suffix == ".md":
            for target in LINK.findall(text):
                target = target.split("#", 1)[0]
                local = target and "://" not in target and not target.startswith("mailto:")
                if local and not (doc.parent / target).exists():
                    stale.append(f"{where}: link {target}")
    return stale


def test_every_named_path_exists():
    assert stale_paths() == []


@pytest.mark.parametrize(("text", "named"), [
    ("see hermes_cli/memory.py", "hermes_cli/memory.py"), ("``engine/nothing.py``", "engine/nothing.py"),
    ("(`gone.py`)", "gone.py"), ("models/attention.no_such_name", "models/attention.no_such_name"),
    ("[x](missing.md#part)", "missing.md"), ("models/configs/<family>.yaml", "models/configs/<family>.yaml"),
])
def test_a_stale_name_is_found(text, named, monkeypatch):
    monkeypatch.setattr("tests.test_paths.documents", lambda: [(ROOT / "docs" / "page.md", text)])
    stale = stale_paths()
    assert stale and all(named in line for line in stale), stale


def test_names_that_exist_pass(monkeypatch):
    text = ("hermes_cli/models/configs/<family>.json, `engine/cache.py`, models/attention.row_attention, "
            "[sources](sources.md#live-sources), policies/*, `rope.py`, https://example.org/docs/x.md")
    monkeypatch.setattr("tests.test_paths.documents", lambda: [(ROOT / "docs" / "page.md", text)])
    assert stale_paths() == []
