"""docs/screens.md holds captures of the real program; regenerating it must give the same page
(numbers, memory units and the tiny model's noise answers masked). Regenerate with
``python scripts/docs_screens.py``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "docs_screens.py"


def load_script():
    spec = importlib.util.spec_from_file_location("docs_screens", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mask_keeps_words_and_layout():
    screens = load_script()
    assert screens.mask("TTFT 13 ms · RSS 1.03 GiB\nA: noise 12\nQ (4.0s, 5 frames)") == \
        "TTFT N ms · RSS N XiB\nA: …\nQ (Ns, N frames)"


@pytest.mark.slow
def test_screens_page_matches_the_program():
    screens = load_script()
    page = screens.PAGE.read_text(encoding="utf-8")
    fresh = screens.render()
    assert screens.mask(page) == screens.mask(fresh), "docs/screens.md is stale: python scripts/docs_screens.py"
    for heading in ("## `hermes watch`", "## The toolbar", "## `/memory`", "## `/stats`", "## `hermes eval`"):
        assert heading in page
