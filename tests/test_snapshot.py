"""Memory snapshots: a saved and restored stream continues exactly as if it had never stopped;
damaged, foreign or newer snapshots are refused in one line; autosave survives SIGKILL."""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from hermes_cli.cli.main import main
from hermes_cli.engine import snapshot
from hermes_cli.engine.cache import KIND_PREFIX
from hermes_cli.engine.session import Session, SessionConfig
from hermes_cli.engine.snapshot import SnapshotError
from hermes_cli.models.loading import load_model
from policies import make_policy
from tests.conftest import moving_square_frames
from tests.media import make_video

ROOT = Path(__file__).resolve().parents[1]
NAMES = {"qwen": "tiny", "llava": "tiny-llava-onevision"}
CHUNK = {"qwen": 4, "llava": 2}  # Qwen-VL: whole temporal patches
N, M = 13, 9  # N is not a multiple of either chunk: the snapshot holds queued frames
BUDGET = 40  # stream tokens per layer: both families compress before and after the split
QUESTION = "What is happening in the video?"


def config(family: str, policy: str, **extra) -> SessionConfig:
    return SessionConfig(chunk_frames=CHUNK[family], budget=None if policy == "full" else BUDGET, **extra)


def stream(n: int, start: int = 0):
    frames = moving_square_frames(N + M)
    return list(frames[start : start + n]), [float(i) for i in range(start, start + n)]


def state_of(session) -> tuple[dict, dict]:
    """Every tensor a snapshot takes from the session, and its state (everything else)."""
    tensors, header = snapshot.capture(session)
    return tensors, json.loads(header["state"])


def assert_same_memory(a: tuple[dict, dict], b: tuple[dict, dict]) -> None:
    (ta, sa), (tb, sb) = a, b
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and torch.equal(ta[name], tb[name]), name
    assert sa == sb


def assert_same_answer(a, b) -> None:
    assert a.text == b.text and a.tokens == b.tokens
    assert len(a.step_logits) == len(b.step_logits) > 0
    for x, y in zip(a.step_logits, b.step_logits, strict=True):
        assert torch.equal(x, y)


@pytest.fixture(scope="module")
def fresh():
    """Models built again (same seed, separate objects) for the sessions that load a snapshot."""
    return {family: load_model(name, device="cpu", dtype="fp32") for family, name in NAMES.items()}


def continuous(adapter, family: str, policy: str, **extra):
    """One session that ingests N + M frames without stopping, then answers."""
    session = Session(adapter, make_policy(policy), config(family, policy, **extra))
    session.ingest(*stream(N + M))
    return session, session.answer(QUESTION, max_new_tokens=4, record_logits=True)


# -- round trip ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["hermes", "infinipot", "full"])
@pytest.mark.parametrize("family", ["qwen", "llava"])
def test_round_trip_continues_as_if_never_stopped(family, policy, tiny_qwen, tiny_llava, fresh, tmp_path):
    adapter = tiny_qwen if family == "qwen" else tiny_llava
    whole, expected = continuous(adapter, family, policy)

    first = Session(adapter, make_policy(policy), config(family, policy))
    first.ingest(*stream(N))
    saved = state_of(first)
    report = snapshot.save(first, tmp_path / "m.safetensors")
    assert report.bytes == (tmp_path / "m.safetensors").stat().st_size and report.kv_bytes == first.cache.kv_bytes()

    second = Session(fresh[family], make_policy(policy), config(family, policy))
    snap = snapshot.load(tmp_path / "m.safetensors", second)
    assert snap.state["pending_frames"] == N % CHUNK[family] > 0
    assert_same_memory(state_of(second), saved)  # restored exactly, spare capacity included
    assert second.cache.capacities() == first.cache.capacities()
    second.ingest(*stream(M, start=N))
    answer = second.answer(QUESTION, max_new_tokens=4, record_logits=True)

    assert_same_answer(answer, expected)
    assert_same_memory(state_of(second), state_of(whole))
    if policy != "full":
        assert first.compressions > 0 and whole.compressions > first.compressions


def test_round_trip_keeps_reindexed_positions(tiny_qwen, fresh, tmp_path):
    """Eager re-indexing moves the video clock and rotates keys: both survive the round trip."""
    whole, expected = continuous(tiny_qwen, "qwen", "hermes", reindex="eager")
    first = Session(tiny_qwen, make_policy("hermes"), config("qwen", "hermes", reindex="eager"))
    first.ingest(*stream(N))
    assert first.positions.reindex_count > 0
    snapshot.save(first, tmp_path / "m.safetensors")
    second = Session(fresh["qwen"], make_policy("hermes"), config("qwen", "hermes", reindex="eager"))
    snapshot.load(tmp_path / "m.safetensors", second)
    assert second.positions.clock == first.positions.clock
    second.ingest(*stream(M, start=N))
    assert_same_answer(second.answer(QUESTION, max_new_tokens=4, record_logits=True), expected)
    assert_same_memory(state_of(second), state_of(whole))


RESUME = """
import json, sys
import torch
torch.set_num_threads(1)
from safetensors.torch import save_file
from hermes_cli.engine import snapshot
from hermes_cli.engine.session import Session, SessionConfig
from hermes_cli.models.loading import load_model
from policies import make_policy
from tests.conftest import moving_square_frames
name, policy, chunk, budget, path, n, m, out = sys.argv[1:]
n, m = int(n), int(m)
session = Session(load_model(name, device="cpu", dtype="fp32"), make_policy(policy),
                  SessionConfig(chunk_frames=int(chunk), budget=int(budget)))
snapshot.load(path, session)
session.ingest(list(moving_square_frames(n + m)[n:]), [float(i) for i in range(n, n + m)])
answer = session.answer("What is happening in the video?", max_new_tokens=4, record_logits=True)
snapshot.save(session, out + ".safetensors")
save_file({f"step.{i}": l.contiguous() for i, l in enumerate(answer.step_logits)}, out + ".logits",
          metadata={"text": answer.text, "tokens": json.dumps(answer.tokens)})
"""


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen", "llava"])
def test_round_trip_through_a_fresh_process(family, tiny_qwen, tiny_llava, tmp_path):
    """Saved here, loaded in another Python process, continued there: the same as never stopping."""
    adapter = tiny_qwen if family == "qwen" else tiny_llava
    whole, expected = continuous(adapter, family, "hermes")
    first = Session(adapter, make_policy("hermes"), config(family, "hermes"))
    first.ingest(*stream(N))
    snapshot.save(first, tmp_path / "m.safetensors")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = str(tmp_path / "resumed")
    subprocess.run([sys.executable, "-c", RESUME, NAMES[family], "hermes", str(CHUNK[family]), str(BUDGET),
                    str(tmp_path / "m.safetensors"), str(N), str(M), out], check=True, cwd=ROOT, env=env, timeout=300)
    resumed = snapshot.read(out + ".safetensors")
    tensors, state = state_of(whole)
    assert resumed.tensors.keys() == tensors.keys()
    for name, t in tensors.items():
        assert torch.equal(resumed.tensors[name], t), name
    assert resumed.state == state
    logits = load_file(out + ".logits")
    from safetensors import safe_open

    with safe_open(out + ".logits", "pt") as f:
        meta = f.metadata()
    assert meta["text"] == expected.text and json.loads(meta["tokens"]) == expected.tokens
    assert len(logits) == len(expected.step_logits)
    for i, step in enumerate(expected.step_logits):
        assert torch.equal(logits[f"step.{i}"], step)


def test_saves_from_another_thread_while_ingesting_always_continue_exactly(tiny_llava, fresh, tmp_path):
    """The prompt's /save runs while the ingest thread works: every snapshot taken then is a
    consistent point of the stream, from which the rest of the stream gives the same end."""
    import threading

    from hermes_cli.engine.client import open_stream
    from hermes_cli.engine.core import Engine

    whole, expected = continuous(tiny_llava, "llava", "hermes")
    frames, times = stream(N + M)
    with Engine(tiny_llava) as engine:
        live = open_stream(engine, make_policy("hermes"), config("llava", "hermes"))

        def ingest():
            for frame, t in zip(frames, times, strict=True):
                live.submit(frame, t)
                time.sleep(0.002)
            live.flush()

        worker = threading.Thread(target=ingest)
        worker.start()
        paths = []
        while worker.is_alive() and len(paths) < 40:
            paths.append(tmp_path / f"s{len(paths)}.safetensors")
            live.save(paths[-1])
        worker.join()
    consumed = sorted({snapshot.read(p).consumed_until_s for p in paths} - {None})
    assert len(consumed) >= 3, consumed  # saves landed at several points of the stream
    for until in consumed[:: max(1, len(consumed) // 4)]:
        path = next(p for p in paths if snapshot.read(p).consumed_until_s == until)
        resumed = Session(fresh["llava"], make_policy("hermes"), config("llava", "hermes"))
        snapshot.load(path, resumed)
        rest = [i for i, t in enumerate(times) if t > until]
        resumed.ingest([frames[i] for i in rest], [times[i] for i in rest])
        assert_same_answer(resumed.answer(QUESTION, max_new_tokens=4, record_logits=True), expected)
        assert_same_memory(state_of(resumed), state_of(whole))


# -- what a snapshot holds -------------------------------------------------------------------------------
def test_file_holds_held_tokens_only_and_documented_fields(tiny_llava, tmp_path):
    session = Session(tiny_llava, make_policy("hermes"), config("llava", "hermes"))
    session.ingest(*stream(N))
    session.answer("first?", max_new_tokens=2)
    snapshot.save(session, tmp_path / "m.safetensors", source="/videos/talk.mp4")
    snap = snapshot.read(tmp_path / "m.safetensors")
    cache = session.cache
    assert cache.capacities()[0] > cache.length  # spare room exists, and is not written
    for l, layer in enumerate(snap.layers()):
        assert layer["keys"].shape == (1, 2, cache.length, 16) == layer["values"].shape
        assert layer["positions"].shape == (cache.length, 1)
        assert torch.equal(layer["keys"], cache.stream_layers[l].stored_keys())
    assert snap.kv_bytes() == cache.kv_bytes()
    prefix = snap.tensors["prefix.token_ids"]
    assert int((snap.layers()[0]["kind"] == KIND_PREFIX).sum()) == prefix.numel() == cache.prefix_length()
    h, s = snap.header, snap.state
    assert h["format"] == "hermes-video-memory" and h["format_version"] == "1" and h["dtype"] == "float32"
    assert h["model_name"] == "tiny-llava-onevision" and len(h["model_config_sha256"]) == 64
    assert h["checksum"].startswith("sha256:")
    assert s["policy"]["name"] == "hermes" and s["policy"]["parameters"]["lambda_deep"] == 0.4
    assert s["history"] == [["first?", session.history[0][1]]]
    assert s["source"] == "/videos/talk.mp4" and s["consumed_until_s"] == float(N - 1)
    assert s["stream"]["frames_seen"] == N - N % 2 and s["pending_frames"] == N % 2
    assert torch.equal(snap.tensors["pending.0.image"], torch.from_numpy(stream(N)[0][-1]))


def test_a_save_never_counts_a_prefilled_chunk_as_queued(tiny_llava):
    """Between a chunk's prefill and ingest() emptying its queue another thread may save: the
    stale queue must not be saved (the frames are in the memory already)."""
    session = Session(tiny_llava, make_policy("full"), config("llava", "full"))
    frames, times = stream(2)
    session._pending = list(zip(frames, times, strict=True))
    session._ingest_chunk(session._pending)  # what ingest() does before it resets the queue
    assert session.stream_state()["pending"] == []


# -- refusals ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good(tmp_path_factory, tiny_qwen):
    session = Session(tiny_qwen, make_policy("hermes"), config("qwen", "hermes"))
    session.ingest(*stream(N))
    path = tmp_path_factory.mktemp("snap") / "good.safetensors"
    snapshot.save(session, path)
    return path


def rewrite(src: Path, dst: Path, *, metadata_changes: dict, recompute_checksum: bool = True) -> None:
    from safetensors import safe_open

    with safe_open(str(src), "pt") as f:
        metadata = dict(f.metadata())
    tensors = load_file(str(src))
    metadata.update(metadata_changes)
    if recompute_checksum:
        metadata["checksum"] = snapshot.checksum(tensors, metadata)
    save_file(tensors, str(dst), metadata)


def test_every_single_byte_flip_is_refused(good, tmp_path):
    data = good.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    rng = random.Random(0)
    positions = sorted({*range(8), *rng.sample(range(8, header_end), 250), *rng.sample(range(header_end, len(data)), 150)})
    bad = tmp_path / "flipped.safetensors"
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(flipped))
        with pytest.raises(SnapshotError) as info:
            snapshot.read(bad)
        assert "\n" not in str(info.value)
        assert f"{bad} is damaged or not a complete memory snapshot (" in str(info.value), (pos, str(info.value))


def test_refusals_leave_the_session_untouched(good, tiny_qwen, tmp_path):
    session = Session(tiny_qwen, make_policy("hermes"), config("qwen", "hermes"))
    session.ingest(*stream(5))
    before = state_of(session)
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size * 2 // 3])
    other_policy = Session(tiny_qwen, make_policy("hermes", lambda_deep=0.5), config("qwen", "hermes"))
    for path, target, words in [
        (truncated, session, "damaged"),
        (good, Session(tiny_qwen, make_policy("infinipot"), config("qwen", "hermes")), "policy 'hermes'"),
        (good, other_policy, "hermes.lambda_deep=0.4"),
        (good, Session(tiny_qwen, make_policy("hermes"), config("qwen", "hermes", fps=2.0)), "fps=1.0"),
    ]:
        state = state_of(target)
        with pytest.raises(SnapshotError, match=words):
            snapshot.load(path, target)
        assert_same_memory(state_of(target), state)
    assert_same_memory(state_of(session), before)
    # told to accept: the memory is loaded and the session keeps its own policy
    snapshot.load(good, other_policy, accept_policy=True)
    assert other_policy.policy.lambda_deep == 0.5 and other_policy.frames_seen == N - N % 4


def test_loading_never_unpickles(tmp_path):
    """A pickle that would run code when unpickled is refused without running it."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    evil = tmp_path / "evil.safetensors"
    evil.write_bytes(pickle.dumps({"layers.0.keys": Payload()}))
    with pytest.raises(SnapshotError):
        snapshot.read(evil)
    torch.save({"x": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(SnapshotError):
        snapshot.read(tmp_path / "evil.pt")
    assert not marker.exists()


def cli(capsys, *args: str) -> tuple[int, list[str]]:
    """``hermes ARGS`` through the entry point in this process: (exit code, stderr lines)."""
    code, lines, _ = run_cli(capsys, *args)
    return code, lines


def run_cli(capsys, *args: str) -> tuple[int, list[str], str]:
    """``hermes ARGS`` through the entry point in this process: (exit code, stderr lines, stdout)."""
    capsys.readouterr()
    argv = sys.argv
    sys.argv = ["hermes", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        sys.argv = argv
    captured = capsys.readouterr()
    return code, captured.err.strip().splitlines(), captured.out


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = tmp_path_factory.mktemp("media") / "clip.mp4"
    make_video(path, seconds=8, fps=4, size=(96, 64))
    return str(path)


def test_cli_refuses_bad_snapshots_with_one_line_and_code_2(good, clip, tmp_path, capsys):
    flipped = tmp_path / "flipped.safetensors"
    data = bytearray(good.read_bytes())
    data[-5] ^= 0x10
    flipped.write_bytes(bytes(data))
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(good.read_bytes()[:-100])
    newer = tmp_path / "newer.safetensors"
    rewrite(good, newer, metadata_changes={"format_version": "3"})
    other = tmp_path / "other.safetensors"  # tiny, built with 4 layers instead of 10
    small = Session(load_model("tiny", device="cpu", dtype="fp32", num_layers=4), make_policy("hermes"),
                    config("qwen", "hermes"))
    small.ingest(*stream(4))
    snapshot.save(small, other)
    cases = {flipped: "checksum mismatch", truncated: "damaged", newer: "newer hermes-video",
             other: "another configuration of 'tiny'"}
    for path, words in cases.items():
        code, lines = cli(capsys, "watch", clip, "--memory", str(path), "--ask", "hi", "--json")  # --json: no notes
        assert code == 2 and len(lines) == 1 and words in lines[0] and lines[0].startswith("error:"), (path, lines)
    changed = ("watch", clip, "--memory", str(good), "--policy-opt", "lambda_deep=0.5", "--ask", "hi", "--json",
               "--max-new-tokens", "2")
    code, lines = cli(capsys, *changed)
    assert code == 2 and lines == [f"error: {good} was made with hermes.lambda_deep=0.4, this session has 0.5 — "
                                   "pass --accept-policy to continue with the new parameters"]
    assert cli(capsys, *changed, "--accept-policy")[0] == 0
    code, lines = cli(capsys, "watch", clip, "--memory", str(good), "--dtype", "bf16", "--ask", "hi", "--json")
    assert code == 2 and "--convert-memory" in lines[0]
    assert cli(capsys, "watch", clip, "--memory", str(good), "--dtype", "bf16", "--convert-memory", "--ask", "hi",
               "--json", "--max-new-tokens", "2")[0] == 0
    code, lines = cli(capsys, "chat", "--memory", str(good), "--model", "tiny-llava-onevision")
    assert code == 2 and lines[-1] == (f"error: {good} holds the memory of model 'tiny', not 'tiny-llava-onevision' "
                                       "— load it with --model tiny")


def test_cli_refusal_in_a_real_process(good, clip, tmp_path):
    newer = tmp_path / "newer.safetensors"
    rewrite(good, newer, metadata_changes={"format_version": "7"})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "hermes_cli", "watch", clip, "--memory", str(newer), "--ask", "hi"],
                            capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {newer} was written by a newer hermes-video (0.1.0, snapshot format 7); this one (0.1.0) reads "
        "format 2 — upgrade hermes-video to load it"
    ]


# -- devices and dtypes ------------------------------------------------------------------------------------
def test_bf16_memory_needs_the_same_dtype_or_an_explicit_conversion(tmp_path, tiny_qwen):
    bf16 = load_model("tiny", device="cpu", dtype="bf16")
    whole = Session(bf16, make_policy("hermes"), config("qwen", "hermes"))
    whole.ingest(*stream(N + M))
    first = Session(bf16, make_policy("hermes"), config("qwen", "hermes"))
    first.ingest(*stream(N))
    snapshot.save(first, tmp_path / "bf16.safetensors")
    assert snapshot.read(tmp_path / "bf16.safetensors").dtype == "bfloat16"

    fp32 = Session(tiny_qwen, make_policy("hermes"), config("qwen", "hermes"))
    with pytest.raises(SnapshotError, match="holds bfloat16 memory and the model runs in float32 — run it with --dtype bf16"):
        snapshot.load(tmp_path / "bf16.safetensors", fp32)
    snapshot.load(tmp_path / "bf16.safetensors", fp32, convert_dtype=True)
    for ours, theirs in zip(fp32.cache.stream_layers, first.cache.stream_layers, strict=True):
        assert ours.keys.dtype == torch.float32 and torch.equal(ours.stored_keys(), theirs.stored_keys().float())

    again = Session(load_model("tiny", device="cpu", dtype="bf16"), make_policy("hermes"), config("qwen", "hermes"))
    snapshot.load(tmp_path / "bf16.safetensors", again)
    again.ingest(*stream(M, start=N))
    assert_same_memory(state_of(again), state_of(whole))


# -- autosave -------------------------------------------------------------------------------------------------
def test_autosave_interval_and_atomic_write(tiny_llava, tmp_path):
    session = Session(tiny_llava, make_policy("full"), config("llava", "full"))
    now = [0.0]
    saver = snapshot.Autosaver(session, tmp_path / "auto.safetensors", 60, clock=lambda: now[0])
    session.ingest(*stream(2))
    now[0] = 59.0
    assert not saver.tick() and not (tmp_path / "auto.safetensors").exists()
    now[0] = 60.0
    assert saver.tick() and snapshot.read(tmp_path / "auto.safetensors").state["stream"]["frames_seen"] == 2
    session.ingest(*stream(2, start=2))
    assert not saver.tick()
    now[0] = 120.0
    assert saver.tick() and snapshot.read(tmp_path / "auto.safetensors").state["stream"]["frames_seen"] == 4
    assert [p.name for p in tmp_path.iterdir()] == ["auto.safetensors"]  # no temporary file left


def test_a_failed_autosave_warns_once_and_the_stream_goes_on(tiny_llava, tmp_path, monkeypatch):
    session = Session(tiny_llava, make_policy("full"), config("llava", "full"))
    saver = snapshot.Autosaver(session, tmp_path / "auto.safetensors", 0)

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    for start in (0, 2):
        session.ingest(*stream(2, start=start))
        assert not saver.tick()
    assert session.frames_seen == 4 and len(session.warnings) == 1 and "No space left" in session.warnings[0]
    monkeypatch.undo()
    assert saver.tick() and snapshot.read(tmp_path / "auto.safetensors").state["stream"]["frames_seen"] == 4


def test_a_failed_write_keeps_the_previous_snapshot(tiny_llava, tmp_path, monkeypatch):
    session = Session(tiny_llava, make_policy("full"), config("llava", "full"))
    session.ingest(*stream(2))
    path = tmp_path / "m.safetensors"
    snapshot.save(session, path)
    old = path.read_bytes()
    session.ingest(*stream(2, start=2))

    def crash(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(SnapshotError, match="No space left on device"):
        snapshot.save(session, path)
    assert path.read_bytes() == old and [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


@pytest.mark.slow
def test_sigkill_during_autosaved_ingestion_leaves_a_snapshot_that_resumes(tmp_path, capsys):
    """Kill a `hermes watch --autosave` process at seeded random moments: the snapshot always
    loads, and resuming the same file from it (`watch --memory`, here in this process) ends with
    the memory and the answer of an uninterrupted run, bit for bit."""
    video = tmp_path / "long.mp4"
    make_video(video, seconds=60, fps=4, size=(96, 64))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    common = ["--model", "tiny", "--fps", "4", "--chunk", "4", "--budget", "40", "--max-new-tokens", "3"]

    def finish(*args: str) -> tuple[dict, snapshot.Snapshot]:
        end = tmp_path / "end.safetensors"
        code, lines, out = run_cli(capsys, "watch", *args, str(video), *common, "--ask", QUESTION, "--json",
                                   "--save-memory", str(end))
        assert code == 0, lines
        return json.loads(out.splitlines()[-1]), snapshot.read(end)

    expected, reference = finish()
    assert expected["frames_seen"] == 240 and reference.state["stream"]["compressions"] > 0
    rng = random.Random(15)
    resumed_from = []
    for attempt in range(3):
        auto = tmp_path / f"auto{attempt}.safetensors"
        proc = subprocess.Popen([sys.executable, "-m", "hermes_cli", "watch", str(video), *common, "--autosave",
                                 str(auto), "--autosave-every", "0s"], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not auto.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 3.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        resumed_from.append(snapshot.read(auto).consumed_until_s)  # always a complete snapshot
        answer, final = finish("--memory", str(auto))
        assert answer["answer"] == expected["answer"] and answer["frames_seen"] == 240
        assert final.tensors.keys() == reference.tensors.keys()
        for name, t in reference.tensors.items():
            assert torch.equal(final.tensors[name], t), name
        assert final.state == reference.state
    assert any(t is not None and t < 59 for t in resumed_from), resumed_from  # killed mid-stream


def test_prompt_save_command(tiny_llava, tmp_path):
    from hermes_cli.app.live import SaveTarget
    from tests.conftest import on_engine

    with on_engine(tiny_llava, "full", config("llava", "full")) as live:
        live.ingest(*stream(2))
        assert SaveTarget().command(live, "/save").startswith("/save needs a file name")
        assert SaveTarget().command(live, f"/save {tmp_path / 'a.safetensors'}").startswith("memory saved to")
        target = SaveTarget(tmp_path / "b.safetensors")
        assert "b.safetensors" in target.command(live, "/save")
        assert snapshot.read(tmp_path / "b.safetensors").state["stream"]["frames_seen"] == 2
        assert target.command(live, "/save /no/such/dir/x.safetensors").startswith("could not save")


def test_continued_frames_skip_or_shift():
    from hermes_cli.cli.memory import ContinuedFrames
    from hermes_cli.sources import Frame

    frames = [Frame(np.zeros((2, 2, 3), np.uint8), float(t), t) for t in range(5)]
    seen = list(ContinuedFrames(frames, skip_until_s=2.0))
    assert [f.timestamp for f in seen] == [3.0, 4.0]
    shifted = list(ContinuedFrames(frames, offset_s=10.0))
    assert [f.timestamp for f in shifted] == [10.0, 11.0, 12.0, 13.0, 14.0]


def test_watch_memory_on_another_source_continues_the_stream_time(good, clip, tmp_path, capsys):
    out = tmp_path / "more.safetensors"
    code, lines = cli(capsys, "watch", clip, "--memory", str(good), "--save-memory", str(out), "--ask", "hi",
                      "--max-new-tokens", "2")
    assert code == 0, lines
    snap, before = snapshot.read(out), snapshot.read(good)
    consumed = before.consumed_until_s
    assert snap.state["stream"]["frames_seen"] == N + 8  # 8 s at 1 fps on top of the snapshot's N
    assert snap.state["stream"]["stream_time_s"] == pytest.approx(consumed + 1.0 + 7.0)
    assert snap.state["policy"] == before.state["policy"]  # the settings not given came from the snapshot
    for key in (*snapshot.MEMORY_SETTINGS, "system_prompt"):
        assert snap.state["config"][key] == before.state["config"][key]
    assert snap.state["history"][-1][0] == "hi"


def test_chat_memory_alone_opens_the_prompt_on_the_memory(good, tmp_path, capsys, monkeypatch):
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    import hermes_cli.app.live as live

    opened = {}
    written: list[str] = []

    def open_prompt(stream, frames, *args, **kwargs):  # the full prompt or, without a terminal, plain lines
        opened.update(seen=stream.fresh_stats().frames_seen, policy=stream.policy.name, model=stream.model)
        with create_pipe_input() as pipe:
            assistant = live.Assistant(stream, frames, input=pipe, output=DummyOutput(), write=written.append)
            pipe.send_text("What is happening?\r")
            pipe.send_text(f"/save {tmp_path / 'prompt.safetensors'}\r")
            pipe.send_text("/quit\r")
            assistant.run()

    monkeypatch.setattr(live, "run_interactive", open_prompt)
    monkeypatch.setattr(live, "run_lines", open_prompt)
    code, lines = cli(capsys, "chat", "--memory", str(good), "--save-memory", str(tmp_path / "after.safetensors"))
    assert code == 0, lines
    assert opened == {"seen": N - N % 4, "policy": "hermes", "model": "tiny"}
    text = "".join(written)
    assert "memory saved to" in text
    saved = snapshot.read(tmp_path / "prompt.safetensors")
    assert saved.state["history"][0][0] == "What is happening?"
    assert saved.state["stream"]["frames_seen"] == N  # the end of the (empty) stream flushed the queued frame
