"""Test media made on the spot with PyAV: videos, broken files and local stream servers.

Nothing binary is committed; every helper writes into a path the test owns (``tmp_path``).

Every generated frame identifies itself: a band of black/white blocks along the top spells
the frame's index in binary (``read_index``), and the background color changes every
second (``color_name``). Servers listen on 127.0.0.1 only and stop by themselves.
"""

from __future__ import annotations

import bisect
import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 200, 40),
    "blue": (30, 40, 220),
    "yellow": (230, 220, 30),
    "magenta": (210, 30, 210),
    "cyan": (30, 210, 210),
}
DEFAULT_COLORS = tuple(PALETTE)

INDEX_BITS = 12
TIME_BASE = Fraction(1, 1000)


def vfr_timestamps(seconds: float, fps: float) -> list[float]:
    """Frame times of a variable-frame-rate clip: gaps cycle through 0.5, 1, 1, 2.5 × 1/fps."""
    gaps = [0.5 / fps, 1 / fps, 1 / fps, 2.5 / fps]
    times, t = [], 0.0
    while t < seconds - 1e-9:
        times.append(round(t, 3))
        t += gaps[len(times) % len(gaps)]
    return times


def cfr_timestamps(seconds: float, fps: float) -> list[float]:
    """Frame times of a constant-frame-rate clip, rounded to the 1 ms time base."""
    return [round(i / fps, 3) for i in range(round(seconds * fps))]


def draw_frame(
    index: int,
    t: float,
    size: tuple[int, int],
    colors: Sequence[str] = DEFAULT_COLORS,
    scene_change_at: float | None = None,
) -> np.ndarray:
    """The RGB image of frame `index` at time `t` (see the module docstring for its content).

    Background: colors[int(t)] cycling, one color per second; with `scene_change_at`,
    colors[0] before that time and colors[1] from it on (a single cut). A white square
    moves left to right once every 2 s.
    """
    width, height = size
    if width < 2 * INDEX_BITS or height < 16:
        raise ValueError(f"frame {size} too small to carry the index band")
    if scene_change_at is None:
        color = colors[int(t) % len(colors)]
    else:
        color = colors[0] if t < scene_change_at else colors[1]
    image = np.empty((height, width, 3), np.uint8)
    image[:] = PALETTE[color]
    side = max(4, height // 5)
    x = int((t / 2 % 1) * (width - side))
    y = height // 2
    image[y : y + side, x : x + side] = 255
    band, block = height // 6, width // INDEX_BITS
    for bit in range(INDEX_BITS):
        on = (index >> (INDEX_BITS - 1 - bit)) & 1
        image[:band, bit * block : (bit + 1) * block] = 255 if on else 0
    return image


def read_index(image: np.ndarray) -> int:
    """The frame index spelled by the band of blocks at the top of a decoded frame."""
    height, width, _ = image.shape
    band, block = height // 6, width // INDEX_BITS
    index = 0
    for bit in range(INDEX_BITS):
        left = bit * block
        cell = image[band // 4 : band * 3 // 4, left + block // 4 : left + block - block // 4]
        index = index << 1 | int(cell.mean() > 128)
    return index


def color_name(image: np.ndarray) -> str:
    """The palette color nearest to the background of a decoded frame (bottom-left corner)."""
    height, width, _ = image.shape
    corner = image[height - height // 8 :, : width // 8].reshape(-1, 3).mean(axis=0)
    return min(PALETTE, key=lambda name: float(np.sum((np.array(PALETTE[name]) - corner) ** 2)))


def make_video(
    path: str | os.PathLike,
    seconds: float,
    fps: float,
    size: tuple[int, int] = (64, 48),
    *,
    scene_change_at: float | None = None,
    vfr: bool = False,
    audio: bool = False,
    codec: str = "libx264",
    colors: Sequence[str] = DEFAULT_COLORS,
    faststart: bool = False,
    rotation: int = 0,
    keyframe_every: int | None = None,
    time_base: Fraction = TIME_BASE,
) -> list[float]:
    """Write a clip to `path` (container from the suffix) and return its frame times in seconds.

    Frame i shows index i in its band (content: see `draw_frame`); `vfr` gives irregular
    gaps (see `vfr_timestamps`).
    `audio` adds a quiet AAC sine track. `faststart` puts an mp4's index before the data.
    `rotation` (degrees counter-clockwise) is stored as display-matrix metadata; the pixels
    are drawn upright as usual, so a player that honours it shows them turned.
    `keyframe_every` sets the keyframe interval in frames (the encoder's default otherwise).
    `time_base`: of the stream and encoder (1/fps for an AVI, which stores one tick per frame);
    frame i gets pts round(times[i] / time_base). `fps` may be a Fraction (30000/1001).
    Codecs: libx264 (mp4, mkv, ts), libvpx / libvpx-vp9 (webm), mpeg4 or mjpeg (avi).
    """
    times = vfr_timestamps(seconds, fps) if vfr else cfr_timestamps(seconds, fps)
    options = {"movflags": "+faststart"} if faststart else {}
    rate = fps if isinstance(fps, Fraction) else Fraction(fps).limit_denominator(1001)
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height = size
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else _pixel_format(size)
        stream.time_base = time_base
        stream.codec_context.time_base = time_base
        if rotation:
            stream.set_display_rotation(rotation)
        if codec == "libx264":
            stream.codec_context.options = {"preset": "ultrafast"}
        elif codec.startswith("libvpx"):
            stream.codec_context.options = {"deadline": "realtime", "cpu-used": "8"}
        if keyframe_every is not None:
            stream.codec_context.gop_size = keyframe_every
        audio_stream = _add_sine_stream(container) if audio else None
        for index, t in enumerate(times):
            frame = av.VideoFrame.from_ndarray(
                draw_frame(index, t, size, colors, scene_change_at), format="rgb24"
            )
            frame.pts, frame.time_base = round(Fraction(t) / time_base), time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
        if audio_stream is not None:
            _write_sine(container, audio_stream, seconds)
    return times


def _pixel_format(size: tuple[int, int]) -> str:
    """4:2:0 needs even sides; odd sizes (e.g. 177x99) are written as 4:4:4."""
    return "yuv420p" if size[0] % 2 == 0 and size[1] % 2 == 0 else "yuv444p"


def _add_sine_stream(container: av.container.OutputContainer, rate: int = 16000) -> av.AudioStream:
    """Add a mono AAC stream to an output container (before any packet is muxed)."""
    stream = container.add_stream("aac", rate=rate)
    stream.layout = "mono"
    return stream


def _write_sine(
    container: av.container.OutputContainer, stream: av.AudioStream, seconds: float
) -> None:
    """Encode a quiet 440 Hz tone of `seconds` into `stream`, one encoder frame at a time."""
    rate, chunk = stream.rate, 1024
    samples = (np.sin(2 * np.pi * 440 * np.arange(int(seconds * rate)) / rate) * 0.1).astype(np.float32)
    for start in range(0, len(samples) - chunk + 1, chunk):
        chunk_samples = samples[None, start : start + chunk]
        frame = av.AudioFrame.from_ndarray(chunk_samples, format="fltp", layout="mono")
        frame.sample_rate, frame.pts = rate, start
        container.mux(stream.encode(frame))
    container.mux(stream.encode())


def make_audio_only(path: str | os.PathLike, seconds: float = 1.0) -> None:
    """Write a file with one AAC audio stream and no video (use an .m4a or .mp4 suffix)."""
    with av.open(str(path), "w") as container:
        _write_sine(container, _add_sine_stream(container), seconds)


def make_empty(path: str | os.PathLike) -> None:
    """Write a zero-byte file."""
    Path(path).write_bytes(b"")


def make_zero_frames(path: str | os.PathLike, size: tuple[int, int] = (64, 48)) -> None:
    """Write a container with a video stream that holds no frames.

    Use .avi: FFmpeg reads an empty .mp4 as having no stream, and empty .mkv/.ts/.nut as
    unreadable."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        container.start_encoding()


def truncate(path: str | os.PathLike, fraction: float) -> None:
    """Cut the file at `path` down to `fraction` of its size, in place."""
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: int(len(data) * fraction)])


def random_bytes(path: str | os.PathLike, size: int = 64 * 1024, seed: int = 0) -> None:
    """Write `size` pseudo-random bytes (not a media file of any kind)."""
    Path(path).write_bytes(np.random.default_rng(seed).integers(0, 256, size, np.uint8).tobytes())


def corrupt_middle(
    path: str | os.PathLike, start: float = 0.4, end: float = 0.6, seed: int = 0
) -> None:
    """Overwrite the bytes between fractions `start` and `end` of the file with random bytes."""
    data = bytearray(Path(path).read_bytes())
    lo, hi = int(len(data) * start), int(len(data) * end)
    data[lo:hi] = np.random.default_rng(seed).integers(0, 256, hi - lo, np.uint8).tobytes()
    Path(path).write_bytes(bytes(data))


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves the files of one folder (no subfolders), honouring single `Range: bytes=a-b`
    requests (what FFmpeg sends)."""

    folder: Path

    def do_GET(self) -> None:
        name = self.path.lstrip("/")
        if not name or "/" in name or name.startswith(".") or not (self.folder / name).is_file():
            self.send_error(404)
            return
        data = (self.folder / name).read_bytes()
        byte_range = self.headers.get("Range")
        if byte_range and byte_range.startswith("bytes="):
            first, _, last = byte_range[len("bytes=") :].partition("-")
            start = int(first or 0)
            end = min(int(last), len(data) - 1) if last else len(data) - 1
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        else:
            start, end = 0, len(data) - 1
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        try:
            self.wfile.write(data[start : end + 1])
        except (BrokenPipeError, ConnectionResetError):
            pass  # FFmpeg closes a connection once it has read what it wanted

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve_http(path: str | os.PathLike, lifetime_s: float = 60.0) -> tuple[str, Callable[[], None]]:
    """Serve `path` over HTTP on 127.0.0.1 at a free port; return (url of path, stop).

    The other files of its folder are served too (an HLS playlist's segments).
    The server shuts down when `stop()` is called or after `lifetime_s`, whichever is first.
    """
    handler = type("Handler", (_RangeHandler,), {"folder": Path(path).parent})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    stopped = threading.Lock()

    def stop() -> None:
        if stopped.acquire(blocking=False):
            timer.cancel()
            server.shutdown()
            server.server_close()
            thread.join()

    timer = threading.Timer(lifetime_s, stop)
    timer.daemon = True
    timer.start()
    return f"http://127.0.0.1:{server.server_address[1]}/{Path(path).name}", stop


class _SocketWriter:
    """The write-only file object PyAV needs to mux into a connected socket."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn

    def write(self, data: bytes) -> int:
        self.conn.sendall(data)
        return len(data)


def serve_mpegts_tcp(
    seconds: float,
    fps: float,
    size: tuple[int, int] = (64, 48),
    *,
    speed: float = 1.0,
    accept_timeout_s: float = 10.0,
    start_pts_s: float = 10.0,
    stall_s: float = 0.0,
    port: int = 0,
    first_index: int = 0,
) -> tuple[str, threading.Thread]:
    """Stream a generated clip as live MPEG-TS to the first client of a tcp:// URL on 127.0.0.1.

    Returns (url, thread) at once; the socket is listening before this returns. Frames go out
    paced by their timestamps at `speed` × real time, starting at pts `start_pts_s` (as live
    streams do). With `stall_s`, the connection then stays open and silent that long (a stalled
    stream). The thread ends after that, when the client goes away, or when no client
    connects within `accept_timeout_s`; after that the URL refuses connections.
    Frame content as in `make_video` (index band, color per second), frame i showing index
    `first_index + i`. `port`: 0 for a free one, or a given one (a server restarted in place).
    """
    return serve_live_mpegts(
        seconds, fps, size, protocol="tcp", speed=speed, accept_timeout_s=accept_timeout_s,
        start_pts_s=start_pts_s, stall_s=stall_s, port=port, first_index=first_index,
    )


def serve_live_mpegts(
    seconds: float,
    fps: float,
    size: tuple[int, int] = (64, 48),
    *,
    protocol: str = "tcp",
    speed: float = 1.0,
    accept_timeout_s: float = 10.0,
    start_pts_s: float = 10.0,
    stall_s: float = 0.0,
    port: int = 0,
    first_index: int = 0,
) -> tuple[str, threading.Thread]:
    """`serve_mpegts_tcp` over `protocol` "tcp" (tcp://127.0.0.1:PORT) or "http"
    (http://127.0.0.1:PORT/live.ts: one GET answered with an endless-looking body, no length,
    as a live HTTP stream is). When the clip is over the server closes the connection and
    stops listening: to the client, the server went down."""
    if protocol not in ("tcp", "http"):
        raise ValueError(f"protocol must be tcp or http, got {protocol!r}")
    listener = socket.create_server(("127.0.0.1", port))
    listener.settimeout(accept_timeout_s)
    port = listener.getsockname()[1]

    def run() -> None:
        with listener:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                return
        with conn:
            try:
                if protocol == "http":
                    _read_request(conn)
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: video/mp2t\r\nConnection: close\r\n\r\n")
                _mux_paced(_SocketWriter(conn), seconds, fps, size, speed, start_pts_s, stall_s, first_index)
            except (BrokenPipeError, ConnectionResetError, av.error.PyAVCallbackError):
                pass  # the client stopped reading (PyAV wraps the socket error on close)

    thread = threading.Thread(target=run, name=f"mpegts-server:{port}", daemon=True)
    thread.start()
    url = f"tcp://127.0.0.1:{port}" if protocol == "tcp" else f"http://127.0.0.1:{port}/live.ts"
    return url, thread


def _read_request(conn: socket.socket) -> bytes:
    """Read an HTTP request's head (up to the blank line) from `conn`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _mux_paced(
    sink: _SocketWriter,
    seconds: float,
    fps: float,
    size: tuple[int, int],
    speed: float,
    start_pts_s: float,
    stall_s: float,
    first_index: int = 0,
) -> None:
    """Encode the clip with a low-latency H.264 setup and mux MPEG-TS into `sink`, paced;
    then wait `stall_s` before closing."""
    with av.open(sink, "w", format="mpegts", buffer_size=2048) as container:  # small: low latency
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = TIME_BASE
        stream.codec_context.options = {"preset": "ultrafast", "tune": "zerolatency"}
        started = time.monotonic()
        for index, t in enumerate(cfr_timestamps(seconds, fps)):
            delay = started + t / speed - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            frame = av.VideoFrame.from_ndarray(draw_frame(first_index + index, t, size), format="rgb24")
            frame.pts, frame.time_base = round((start_pts_s + t) / TIME_BASE), TIME_BASE
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
        time.sleep(stall_s)


def nearest_rule(
    times: Sequence[Fraction], fps: float | Fraction, start: Fraction | float = 0, end: Fraction | float | None = None
) -> list[int]:
    """Reference for docs/sources.md's rule, computed directly (not streamed): indices of the
    frames (increasing exact `times`) that targets start + k/fps take, each once.

    A target takes the nearest frame (the earlier on a tie); targets run while <= end and <=
    the last frame plus half the last interval. fps as a fraction of denominator <= 10^6.
    """
    rate = fps if isinstance(fps, Fraction) else Fraction(fps).limit_denominator(1_000_000)
    start = start if isinstance(start, Fraction) else Fraction(start).limit_denominator(1_000_000)
    if not times:
        return []
    limit = times[-1] + ((times[-1] - times[-2]) / 2 if len(times) > 1 else 0)
    if end is not None:
        limit = min(limit, end if isinstance(end, Fraction) else Fraction(end).limit_denominator(1_000_000))
    chosen: list[int] = []
    k = 0
    while (target := start + k / rate) <= limit:
        after = bisect.bisect_right(times, target)  # times[after - 1] <= target < times[after]
        before = after - 1
        if before < 0 or (after < len(times) and times[after] - target < target - times[before]):
            pick = after
        else:
            pick = before
        if not chosen or chosen[-1] != pick:
            chosen.append(pick)
        k += 1
    return chosen


def exact_times(times: Sequence[float]) -> list[Fraction]:
    """make_video's frame times (rounded to its 1 ms time base) as exact fractions."""
    return [Fraction(t).limit_denominator(1000) for t in times]


def json_lines(text: str) -> list[dict]:
    """The JSON objects printed one per line in ``text`` (other lines skipped)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
