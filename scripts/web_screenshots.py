"""Regenerate the web view's screenshots in docs/ (docs/web.md) from the real program.

    python scripts/web_screenshots.py                  # docs/web-1280x800.png, docs/web-390x844.png
    python scripts/web_screenshots.py --out /tmp/shots

It generates a clip (tests/media.py), runs ``hermes watch CLIP --web --model tiny --realtime
--notify …`` (the built-in tiny model: its answers are noise), opens the printed address in the
machine's Chromium (``/usr/bin/chromium`` or ``HERMES_CHROMIUM``) with Playwright, waits until the
memory has forgotten something and a notification has fired, asks one question, and takes a
screenshot at 1280×800 and one at 390×844 (a phone).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHROMIUM = os.environ.get("HERMES_CHROMIUM", "/usr/bin/chromium")
SIZES = ((1280, 800), (390, 844))


def start_watch(clip: Path) -> tuple[subprocess.Popen, str]:
    """``hermes watch CLIP --web`` in a subprocess; (process, the page's address)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "hermes_cli", "watch", str(clip), "--model", "tiny", "--fps", "2", "--chunk", "4",
               "--budget", "100", "--realtime", "--notify", "the background turns blue", "--notify-threshold", "0",
               "--web"]
    process = subprocess.Popen(command, cwd=clip.parent, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    deadline = time.monotonic() + 120
    for line in process.stderr:
        found = re.search(r"http://127\.0\.0\.1:\d+/\?stream=\S+", line)
        if found:
            return process, found.group(0)
        if time.monotonic() > deadline:
            break
    process.kill()
    raise SystemExit("hermes watch --web did not print its address")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the PNG files (default docs/)")
    parser.add_argument("--seconds", type=float, default=14.0, help="stream time to let play before the shots")
    args = parser.parse_args()
    if not Path(CHROMIUM).is_file():
        raise SystemExit(f"no Chromium at {CHROMIUM}: apt-get install chromium (or set HERMES_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    from tests.media import make_video

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        clip = Path(tmp) / "street.mp4"
        make_video(clip, seconds=60, fps=4, size=(320, 192))
        process, url = start_watch(clip)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": SIZES[0][0], "height": SIZES[0][1]})
                page.goto(url)
                page.wait_for_selector("#notifications .note", timeout=60000)
                time.sleep(args.seconds)
                page.fill("#question", "What is on the screen?")
                page.press("#question", "Enter")
                page.wait_for_function("() => document.querySelector('#conversation .turn .meta')"
                                       ".textContent.includes('TTFT')", timeout=60000)
                time.sleep(1.5)  # the next poll: the readouts with the answer's TTFT/TPOT
                for width, height in SIZES:
                    page.set_viewport_size({"width": width, "height": height})
                    time.sleep(0.5)
                    path = args.out / f"web-{width}x{height}.png"
                    page.screenshot(path=str(path))
                    print(path)
                browser.close()
        finally:
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    main()
