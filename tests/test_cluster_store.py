"""The cluster's snapshot store under faults (issue 25, must-show 5), on a real engine stream:
a full disk (a small tmpfs) and a read-only store make the autosave warn and keep the previous
snapshot while the stream goes on; a corrupt newest snapshot falls back to the one before. No Ray.

The full-disk and read-only cases mount a tmpfs, which needs root (CAP_SYS_ADMIN); without it
they skip with that reason. The fallback case runs everywhere.
"""

from __future__ import annotations

import contextlib
import subprocess

import pytest

from hermes_cli.cluster.store import IndexEntry, SnapshotStore, StoreAutosaver
from hermes_cli.engine.client import open_stream
from hermes_cli.engine.config import SessionConfig
from hermes_cli.engine.core import Engine
from policies import make_policy
from tests.conftest import moving_square_frames


@pytest.fixture(scope="module")
def engine(tiny_qwen):
    with Engine(tiny_qwen) as running:
        yield running


def stream_with_autosave(engine, store: SnapshotStore, sid: str):
    client = open_stream(engine, make_policy("hermes"), SessionConfig(chunk_frames=2, budget=24, max_new_tokens=4),
                         name=sid)
    saver = engine.call(client.id, lambda session: StoreAutosaver(session, store, sid, 0.0))
    engine.set_autosaver(client.id, saver)
    return client, saver


def feed(client, start: int, n: int) -> None:
    frames = moving_square_frames(start + n, seed=3)
    client.ingest(list(frames[start:]), [float(k) for k in range(start, start + n)])


@contextlib.contextmanager
def tmpfs(path, size_bytes: int):
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def snapshot_bytes(engine, tmp_path) -> int:
    tmp_path.mkdir()
    store = SnapshotStore(tmp_path)
    client, _ = stream_with_autosave(engine, store, "probe")
    feed(client, 0, 8)
    client.close()
    return store.path("probe").stat().st_size


def test_full_disk_keeps_the_previous_snapshot_and_the_stream_runs(engine, tmp_path):
    size = snapshot_bytes(engine, tmp_path / "probe")
    with tmpfs(tmp_path / "small", 4 * size) as root:
        store = SnapshotStore(root)
        client, saver = stream_with_autosave(engine, store, "full")
        feed(client, 0, 8)
        kept = store.path("full").read_bytes()
        free = subprocess.run(["df", "-B1", "--output=avail", str(root)], capture_output=True, text=True)
        avail = int(free.stdout.split()[-1])
        (root / "filler").write_bytes(b"\0" * max(avail - size // 4, 0))  # less than one snapshot left
        feed(client, 8, 4)
        stats = client.fresh_stats()
        assert stats.frames_seen == 12 and client.state == "live"  # the stream went on
        assert any("autosave failed" in w and "No space left" in w for w in client.warnings), client.warnings
        assert store.path("full").read_bytes() == kept  # the last good snapshot stays
        assert saver.failures >= 1
        assert store.latest("full")[1].consumed_until_s == 7.0
        (root / "filler").unlink()
        feed(client, 12, 2)  # space again: the next chunk saves
        assert store.latest("full")[1].consumed_until_s == 13.0
        client.close()


def test_read_only_store_keeps_the_previous_snapshot_and_the_stream_runs(engine, tmp_path):
    size = snapshot_bytes(engine, tmp_path / "probe")
    with tmpfs(tmp_path / "ro", 8 * size) as root:
        store = SnapshotStore(root)
        client, saver = stream_with_autosave(engine, store, "ro")
        feed(client, 0, 6)
        kept = store.path("ro").read_bytes()
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
        feed(client, 6, 4)
        assert client.fresh_stats().frames_seen == 10 and client.state == "live"
        assert any("autosave failed" in w and "Read-only" in w for w in client.warnings), client.warnings
        assert store.path("ro").read_bytes() == kept and saver.failures >= 1
        assert store.latest("ro")[1].consumed_until_s == 5.0
        client.close()


def test_corrupt_latest_snapshot_falls_back_to_the_one_before(engine, tmp_path):
    store = SnapshotStore(tmp_path)
    client, saver = stream_with_autosave(engine, store, "c")
    feed(client, 0, 6)  # three chunks: three saves, the last two kept
    client.close()
    assert saver.saves == 3
    path, snap = store.latest("c")
    assert path == store.path("c") and snap.consumed_until_s == 5.0
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the tensors: the checksum fails
    path.write_bytes(bytes(data))
    path, snap = store.latest("c")
    assert path == store.path("c", "prev") and snap.consumed_until_s == 3.0
    store.path("c", "prev").write_bytes(b"not a snapshot")
    assert store.latest("c") is None


def test_index_records_epochs_and_ends(tmp_path):
    store = SnapshotStore(tmp_path)
    store.write_index(IndexEntry("s1", {"source": "a.mp4", "fps": 2}, 1))
    store.write_index(IndexEntry("s1", {"source": "a.mp4", "fps": 2}, 3))
    store.write_index(IndexEntry("s2", {"source": "b.mp4"}, 1))
    store.forget("s2")
    assert store.read_index() == [IndexEntry("s1", {"source": "a.mp4", "fps": 2}, 3),
                                  IndexEntry("s2", {"source": "b.mp4"}, 1, ended=True)]
    with pytest.raises(ValueError, match="--snapshot-store"):
        SnapshotStore(tmp_path / "missing")
