"""Cameras: this platform's capture format (v4l2 / avfoundation / dshow), its default camera,
listing cameras and the one-line hint for finding them.

PyAV is imported only to list DirectShow devices on Windows.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .targets import SourceError, Target

__all__ = ["camera_target", "default_camera", "devices_hint", "list_devices"]

PLATFORM = sys.platform  # read at call time, so tests can pose as another platform
CAMERA_FORMATS = {"linux": "v4l2", "darwin": "avfoundation", "win32": "dshow"}
LIST_DEVICES_COMMAND = "hermes chat --list-devices"


def default_camera() -> str:
    """This platform's default camera spec ("" when there is no sensible default)."""
    if PLATFORM.startswith("linux"):
        return "/dev/video0"
    if PLATFORM == "darwin":
        return "0"
    if PLATFORM == "win32":
        cameras = list_devices()
        return cameras[0] if cameras else ""
    return ""


def list_devices() -> list[str]:
    """Camera specs usable with `open_source(spec, webcam=True)`, where they can be listed.

    Linux: the /dev/video* nodes (a camera often has two; the first one carries video).
    Elsewhere FFmpeg offers no reliable listing through PyAV: [] (see `devices_hint`).
    """
    if PLATFORM.startswith("linux"):
        nodes = Path("/dev").glob("video*")
        return [str(node) for node in sorted(nodes, key=lambda node: _trailing_number(node.name))]
    if PLATFORM == "win32":
        import av
        import av.error

        try:
            return [f"video={device.name}" for device in av.device.enumerate_input_devices("dshow")]
        except (av.error.FFmpegError, ValueError):  # ValueError: no dshow in this build
            return []
    return []


def devices_hint() -> str:
    """One line telling the user how to find camera names on this platform."""
    if PLATFORM.startswith("linux"):
        return "cameras are /dev/video* (try `v4l2-ctl --list-devices`); pass one as `hermes chat --webcam /dev/videoN`"
    if PLATFORM == "darwin":
        return 'list cameras with `ffmpeg -f avfoundation -list_devices true -i ""`; pass the number'
    if PLATFORM == "win32":
        return 'list cameras with `ffmpeg -list_devices true -f dshow -i dummy`; pass "video=NAME"'
    return "camera capture is supported on Linux, macOS and Windows"


def camera_target(spec: str, input_format: str | None) -> Target:
    """Camera device and input format for this platform (v4l2 / avfoundation / dshow)."""
    device = spec or default_camera()
    camera_format = input_format or CAMERA_FORMATS.get(PLATFORM)
    if camera_format is None or not device:
        raise SourceError(f"no default camera on this platform — {devices_hint()}")
    options: dict[str, str] = {}
    if camera_format == "v4l2":
        if device.isdigit():
            device = f"/dev/video{device}"
        if not Path(device).exists():
            raise SourceError(f"no camera at {device} — list cameras with `{LIST_DEVICES_COMMAND}`")
    elif camera_format == "avfoundation":
        options["framerate"] = "30"  # the default 29.97 is refused by many Mac cameras
    elif camera_format == "dshow" and not device.startswith("video="):
        device = f"video={device}"
    return Target(device, f"camera {device}", "camera", camera_format, options)


def _trailing_number(text: str) -> tuple[int, str]:
    digits = text[len(text.rstrip("0123456789")) :]
    return (int(digits) if digits else -1, text)
