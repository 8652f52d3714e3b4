"""A bounded load test of ``hermes serve`` on loopback (docs/benchmarks.md, issue 22 must-show 3).

    python scripts/serve_load.py                      # 50 clients × 10 questions over 4 streams, tiny model
    python scripts/serve_load.py --clients 8 --questions 3 --json

It starts ``hermes serve --model tiny`` as a subprocess on a free loopback port, generates four
short videos, opens one stream on each (played at real time, so questions arrive while chunks
are prefilled), then runs the clients at once: each asks its questions one after another with
the ``openai`` SDK, streamed, round-robin over the streams. Bounded in count (clients ×
questions) and in time (``--deadline``: clients stop asking then, and what is unanswered counts
as lost). It reports errors, lost answers, time to first token (client side: request sent to
first piece received) and the server's resident memory sampled through the run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path


def make_clip(path: Path, seconds: float, fps: int, hue: int) -> None:
    """A small H.264 clip: a square moving over a background of ``hue``."""
    import av
    import numpy as np

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 128, 96, "yuv420p"
        for i in range(int(seconds * fps)):
            image = np.full((96, 128, 3), (hue, 255 - hue, (hue * 7) % 256), np.uint8)
            x = (i * 6) % 100
            image[30:58, x:x + 28] = 255
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = i, Fraction(1, fps)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--questions", type=int, default=10, help="per client")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--video-seconds", type=float, default=60.0)
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds the clients may ask for")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args()

    from openai import OpenAI

    work = Path(tempfile.mkdtemp(prefix="hermes-load-"))
    for i in range(args.streams):
        make_clip(work / f"cam{i}.mp4", args.video_seconds, 4, 40 + 50 * i)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HERMES_API_KEY", None)
    command = [sys.executable, "-m", "hermes_cli", "serve", "--model", args.model, "--port", "0", "--media-root",
               str(work), "--max-streams", str(args.streams), "--max-answers-per-stream", str(args.clients)]
    server = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    url = None
    while url is None:
        line = server.stderr.readline()
        if not line and server.poll() is not None:
            print("the server did not start", file=sys.stderr)
            return 1
        if m := re.search(r"listening on (http://\S+)", line):
            url = m.group(1)
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()  # type: ignore[union-attr]

    samples: list[tuple[float, float]] = []
    stop_sampling = threading.Event()

    def sample() -> None:
        while not stop_sampling.is_set():
            value = rss_mib(server.pid)
            if value is not None:
                samples.append((time.monotonic(), value))
            stop_sampling.wait(0.25)

    try:
        sdk = OpenAI(base_url=url + "/v1", api_key="loopback", max_retries=0, timeout=120)
        import httpx2 as httpx

        with httpx.Client(base_url=url, timeout=60) as http:
            ids = [http.post("/v1/streams", json={"source": f"cam{i}.mp4", "fps": 2, "chunk": 4, "budget": 64,
                                                  "realtime": True}).json()["id"] for i in range(args.streams)]
            time.sleep(2.5)  # a first chunk in each memory
            ttft: list[float] = []
            total: list[float] = []
            errors: list[str] = []
            answered = [0]
            lock = threading.Lock()
            deadline = time.monotonic() + args.deadline
            threading.Thread(target=sample, daemon=True).start()

            def client(c: int) -> None:
                for q in range(args.questions):
                    if time.monotonic() > deadline:
                        return
                    sid = ids[(c + q) % len(ids)]
                    sent = time.perf_counter()
                    first = None
                    finish = None
                    try:
                        for chunk in sdk.chat.completions.create(
                                model=f"hermes:stream/{sid}", stream=True, max_tokens=args.max_tokens,
                                messages=[{"role": "user", "content": f"Client {c}, question {q}: what happens?"}]):
                            if chunk.choices and chunk.choices[0].delta.content and first is None:
                                first = time.perf_counter() - sent
                            if chunk.choices and chunk.choices[0].finish_reason:
                                finish = chunk.choices[0].finish_reason
                    except Exception as exc:
                        with lock:
                            errors.append(f"{type(exc).__name__}: {exc}")
                        continue
                    with lock:
                        if finish is not None and first is not None:
                            answered[0] += 1
                            ttft.append(first)
                            total.append(time.perf_counter() - sent)

            started = time.monotonic()
            clients = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
            for t in clients:
                t.start()
            for t in clients:
                t.join()
            wall = time.monotonic() - started
            stop_sampling.set()
            views = [http.get(f"/v1/streams/{sid}").json() for sid in ids]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()

    asked = args.clients * args.questions
    rss = [v for _, v in samples]
    tenth = max(1, len(rss) // 10)
    result = {
        "clients": args.clients, "questions_per_client": args.questions, "streams": args.streams,
        "max_tokens": args.max_tokens, "asked": asked, "answered": answered[0], "errors": len(errors),
        "lost": asked - answered[0] - len(errors), "wall_s": round(wall, 2),
        "answers_per_s": round(answered[0] / wall, 2) if wall else None,
        "ttft_ms": {"p50": round(1000 * statistics.median(ttft), 1), "p99": round(1000 * percentile(ttft, 99), 1),
                    "max": round(1000 * max(ttft), 1)} if ttft else None,
        "answer_ms": {"p50": round(1000 * statistics.median(total), 1),
                      "p99": round(1000 * percentile(total, 99), 1)} if total else None,
        "server_rss_mib": {"first_tenth_mean": round(statistics.mean(rss[:tenth]), 1),
                           "last_tenth_mean": round(statistics.mean(rss[-tenth:]), 1),
                           "min": round(min(rss), 1), "max": round(max(rss), 1), "samples": len(rss)} if rss else None,
        "frames_seen": [v.get("frames_seen") for v in views],
        "frames_submitted": [v["counts"]["frames_submitted"] for v in views],
        "lag_s": [round(v["counts"]["lag_s"], 1) for v in views],
        "memory_tokens": [max(v["cache"]["stream_tokens_per_layer"]) for v in views],
        "first_errors": errors[:3],
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0 if not errors and result["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
