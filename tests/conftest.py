"""Shared fixtures: tiny random-weight models (built once per test session) and frames."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from contextlib import contextmanager

import numpy as np
import pytest
import torch

# Tiny models do tiny matrix products: a second intra-op thread only adds overhead, and the CI
# machine has two cores shared with PyAV's decoder threads.
torch.set_num_threads(1)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# answers the CLI under test logs go to a throwaway file, never the user's own log
_LOGS = tempfile.mkdtemp(prefix="hermes-test-logs-")
atexit.register(shutil.rmtree, _LOGS, True)
os.environ["HERMES_LOGS"] = os.path.join(_LOGS, "logs.db")


@pytest.fixture(scope="session")
def tiny_qwen():
    from hermes_cli.models.loading import load_model

    return load_model("tiny", device="cpu", dtype="fp32")


@pytest.fixture(scope="session")
def tiny_llava():
    from hermes_cli.models.loading import load_model

    return load_model("tiny-llava-onevision", device="cpu", dtype="fp32")


@pytest.fixture(params=["qwen", "llava"])
def adapter(request, tiny_qwen, tiny_llava):
    return tiny_qwen if request.param == "qwen" else tiny_llava


def moving_square_frames(n: int, size=(96, 128), seed: int = 0) -> np.ndarray:
    """n RGB frames (H, W, 3): a coloured square moving across a noisy background."""
    rng = np.random.default_rng(seed)
    h, w = size
    frames = rng.integers(0, 40, size=(n, h, w, 3), dtype=np.uint8)
    for i in range(n):
        x = (i * 11) % (w - 24)
        y = (i * 7) % (h - 24)
        frames[i, y : y + 24, x : x + 24] = [(50 * i) % 256, 200, 255 - (30 * i) % 256]
    return frames


@pytest.fixture(scope="session")
def video(tmp_path_factory):
    """A 12-second 8 fps clip with a scene change at 6 s."""
    from tests.media import make_video

    path = tmp_path_factory.mktemp("media") / "clip.mp4"
    make_video(path, seconds=12, fps=8, size=(96, 64), scene_change_at=6)
    return str(path)


@pytest.fixture(scope="session")
def two_minutes(tmp_path_factory):
    """A two-minute 2 fps clip with a scene change at 1 min: long enough for every budget test."""
    from tests.media import make_video

    path = tmp_path_factory.mktemp("media") / "two-minutes.mp4"
    make_video(path, seconds=120, fps=2, size=(160, 120), scene_change_at=60)
    return str(path)


@contextmanager
def on_engine(adapter, policy: str = "full", config=None, *, live: bool = False):
    """A stream of ``policy`` on a fresh engine over ``adapter``; the engine stops afterwards."""
    from hermes_cli.engine.client import open_stream
    from hermes_cli.engine.core import Engine
    from hermes_cli.engine.session import SessionConfig
    from policies import make_policy

    engine = Engine(adapter).start()
    try:
        yield open_stream(engine, make_policy(policy), config or SessionConfig(), live=live)
    finally:
        engine.stop()
