"""Memory snapshots: a session's whole memory in one safetensors file, and back.

A snapshot holds everything a session needs to continue a stream as if it had never stopped:
every layer's keys and values (the held tokens only) and their token metadata, the prefix's
token ids, the video clock and re-index count, the conversation, the policy with its
parameters, the stream counters and any frames queued for the next chunk. The file is
safetensors — tensors plus a str→str header, parsed as JSON: loading never unpickles and never
runs anything from the file. The format is documented in docs/snapshots.md.

``read`` checks what the file alone can tell (format, version, checksum, structure);
``check_fits`` what needs the session (model identity, dtype, policy and settings); ``load``
does both and only then replaces the session's memory. Every refusal is a ``SnapshotError``
whose message is one line. ``save`` writes atomically (a temporary file in the same folder,
fsync, rename), so a crash at any moment leaves the previous complete snapshot.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .. import __version__
from ..errors import HermesError
from ..settings import BY_FIELD, memory_fields

FORMAT = "hermes-video-memory"
FORMAT_VERSION = 2  # the newest format this code reads (and writes for 8-bit keys and values)
OLDEST_FORMAT_VERSION = 1  # 16-bit memories are still written as format 1, so older releases read them
LAYER_FIELDS = ("keys", "values", "kind", "token_id", "frame", "patch", "positions")
SCALE_FIELDS = ("key_scales", "value_scales")  # kv_bits=8: a float16 scale per token and head
KV_FIELDS = ("keys", "values", *SCALE_FIELDS)
META_DTYPES = {"kind": torch.int8, "token_id": torch.int64, "frame": torch.int64, "patch": torch.int64,
               "positions": torch.int64}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
# Settings that shape what the memory holds (the schema's MEMORY role): a snapshot continues only under the same ones.
MEMORY_SETTINGS = memory_fields()


class SnapshotError(HermesError):
    """A snapshot that cannot be written or loaded here; str() is one line saying why and what to do."""


@dataclass
class Snapshot:
    """A snapshot read and checked for integrity (not yet for fitting a session)."""

    path: Path
    header: dict[str, str]  # the safetensors metadata, checksum included
    state: dict  # the parsed "state" entry of the header
    tensors: dict[str, Tensor]  # on the CPU

    @property
    def model_name(self) -> str:
        return self.header["model_name"]

    @property
    def dtype(self) -> str:
        return self.header["dtype"]

    @property
    def num_layers(self) -> int:
        return int(self.header["num_layers"])

    @property
    def kv_bits(self) -> int:
        """16: keys and values in ``dtype``; 8: int8 codes with float16 scales (format 2)."""
        return int(self.header.get("kv_bits", "16"))

    def layer_fields(self) -> tuple[str, ...]:
        return LAYER_FIELDS + (SCALE_FIELDS if self.kv_bits == 8 else ())

    @property
    def source(self) -> str | None:
        return self.state.get("source")

    @property
    def consumed_until_s(self) -> float | None:
        """Stream time of the last frame the session took in (queued ones included); None before any."""
        return self.state["consumed_until_s"]

    def layers(self) -> list[dict[str, Tensor]]:
        return [{f: self.tensors[f"layers.{l}.{f}"] for f in self.layer_fields()} for l in range(self.num_layers)]

    def kv_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for l in self.layers() for k, t in l.items() if k in KV_FIELDS)


@dataclass(frozen=True)
class SaveReport:
    path: Path
    bytes: int
    kv_bytes: int
    locked_s: float  # the copy taken on the engine's thread (every stream's work waits this long)
    capture_s: float  # the copy, the header and the checksum
    write_s: float  # serialising, writing, fsync, rename


# -- identity and checksum -------------------------------------------------------------------------
def _strip_runtime(value):
    """A config dict without what changes at run time (dtype, private keys such as the attention kernel)."""
    if isinstance(value, dict):
        return {k: _strip_runtime(v) for k, v in value.items()
                if not k.startswith("_") and k not in ("dtype", "torch_dtype")}
    if isinstance(value, list):
        return [_strip_runtime(v) for v in value]
    return value


def config_hash(adapter) -> str:
    """sha256 of the model's configuration (``to_json_string``, canonical, dtype and private keys left out)."""
    config = _strip_runtime(json.loads(adapter.model.config.to_json_string()))
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def checksum(tensors: dict[str, Tensor], metadata: dict[str, str]) -> str:
    """sha256 over every tensor (name, dtype, shape, bytes; by name) and the canonical metadata
    (every entry but ``checksum``, as sorted compact JSON)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}\0{dtype_name(t.dtype)}\0{list(t.shape)}\0".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    rest = {k: v for k, v in metadata.items() if k != "checksum"}
    h.update(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode())
    return "sha256:" + h.hexdigest()


# -- saving --------------------------------------------------------------------------------------------
def capture(session, *, source: str | None = None) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The session's memory as (tensors on the CPU, header): a consistent copy (call it on the
    thread that drives the session: the engine's)."""
    tensors, metadata, _ = _capture(session, source)
    return tensors, metadata


def capture_timed(session, *, source: str | None = None) -> tuple[dict[str, Tensor], dict[str, str], float]:
    """``capture`` and the seconds it took (what a save holds the engine up)."""
    return _capture(session, source)


def _capture(session, source: str | None) -> tuple[dict[str, Tensor], dict[str, str], float]:
    adapter = session.adapter
    t0 = time.perf_counter()
    layers = session.cache.export_layers("cpu")
    capacities = session.cache.capacities()
    next_id = session.cache.next_id
    positions = session.positions.state()
    stream = session.stream_state()
    policy = session.policy
    config = dataclasses.asdict(session.config)
    locked_s = time.perf_counter() - t0
    prefix_ids = adapter.tokens(adapter.prefix_text(config["system_prompt"]))
    tensors: dict[str, Tensor] = {"prefix.token_ids": prefix_ids.to(torch.int64)}
    for l, held in enumerate(layers):
        tensors.update({f"layers.{l}.{k}": v for k, v in held.items()})
    tensors["stream.unit_times"] = torch.tensor(stream["unit_times"], dtype=torch.float64)
    pending = stream["pending"]
    tensors["pending.timestamps"] = torch.tensor([t for _, t in pending], dtype=torch.float64)
    for i, (frame, _) in enumerate(pending):
        tensors[f"pending.{i}.image"] = torch.from_numpy(np.ascontiguousarray(frame, dtype=np.uint8))
    times = [t for _, t in pending]
    consumed = max([stream["stream_time_s"]] * bool(stream["frames_seen"]) + times, default=None)
    state = {
        "policy": {"name": policy.name, "parameters": policy_parameters(policy)},
        "config": config,
        "positions": positions,
        "cache": {"next_id": int(next_id), "capacity": capacities, "length": int(layers[0]["keys"].shape[-2]),
                  "prefix_length": int((layers[0]["kind"] == 0).sum())},
        "stream": {k: stream[k] for k in ("frames_seen", "units_seen", "stream_time_s", "compressions",
                                          "tokens_per_unit", "warnings")},
        "history": stream["history"],
        "pending_frames": len(pending),
        "consumed_until_s": consumed,
        "source": source,
    }
    kv_bits = session.cache.kv_bits
    metadata = {
        "format": FORMAT,
        "format_version": str(FORMAT_VERSION if kv_bits == 8 else OLDEST_FORMAT_VERSION),
        "hermes_version": __version__,
        "model_name": adapter.name,
        "model_family": adapter.family,
        "model_config_sha256": config_hash(adapter),
        "dtype": dtype_name(session.cache.stream_layers[0].dtype or layers[0]["keys"].dtype),
        "kv_bits": str(kv_bits),
        "num_layers": str(len(layers)),
        "position_axes": str(adapter.position_axes),
        "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "state": json.dumps(state, sort_keys=True, separators=(",", ":")),
    }
    metadata["checksum"] = checksum(tensors, metadata)
    return tensors, metadata, locked_s


def policy_parameters(policy) -> dict:
    return {f.name: getattr(policy, f.name) for f in policy.parameters()}


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is always either the old file or the whole new one:
    a temporary file in the same folder, fsync, ``os.replace``, fsync of the folder."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:  # the rename itself must reach the disk
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def save(session, path: str | os.PathLike, *, source: str | None = None) -> SaveReport:
    """Write the session's memory to ``path`` atomically; ``source`` names the stream (for resuming)."""
    check_destination(path)
    t0 = time.perf_counter()
    tensors, metadata, locked_s = _capture(session, source)
    return write_captured(path, tensors, metadata, locked_s, time.perf_counter() - t0)


def check_destination(path: str | os.PathLike) -> None:
    path = Path(path)
    if not path.parent.is_dir():
        raise SnapshotError(f"cannot save the memory to {path}: folder {path.parent} does not exist")


def write_captured(path: str | os.PathLike, tensors: dict[str, Tensor], metadata: dict[str, str], locked_s: float,
                   capture_s: float) -> SaveReport:
    """Serialise a ``capture`` and write it to ``path`` atomically (any thread)."""
    from safetensors.torch import save as serialise

    path = Path(path)
    check_destination(path)
    t1 = time.perf_counter()
    data = serialise(tensors, metadata)
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise SnapshotError(f"cannot save the memory to {path}: {exc.strerror or exc}") from exc
    kv = sum(t.numel() * t.element_size() for k, t in tensors.items() if k.rsplit(".", 1)[-1] in KV_FIELDS)
    return SaveReport(path, len(data), kv, locked_s, capture_s, time.perf_counter() - t1)


# -- reading -------------------------------------------------------------------------------------------
def _damaged(path: Path, why: str) -> SnapshotError:
    return SnapshotError(f"{path} is damaged or not a complete memory snapshot ({why}) — refusing to load it")


def _not_ours(path: Path, what: str) -> SnapshotError:
    return SnapshotError(f"{path} is not a hermes-video memory snapshot: {what} — load a file that --save-memory, "
                         "--autosave or /save wrote")


def _what_file(data: bytes) -> str:
    """What a file that is not safetensors looks like, from its first bytes."""
    if data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a Python pickle"
    if data[:4] == b"PK\x03\x04":
        return "a zip archive (torch.save writes these)"
    if data[4:8] == b"ftyp" or data[:4] == b"\x1a\x45\xdf\xa3":
        return "a video file"
    if data[:2] == b"\x1f\x8b":
        return "a gzip archive"
    try:
        text = data[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return "binary data"
    return "a JSON file" if text.lstrip()[:1] in ("{", "[") else "a text file"


def _foreign_safetensors(header, metadata) -> str:
    """A safetensors file that is not a hermes-video memory, in words: what its header says it is."""
    if not isinstance(header, dict):
        return "its safetensors header is not a JSON object"
    tensors = len([k for k in header if k != "__metadata__"])
    held = f"{tensors} tensor{'s' * (tensors != 1)}"
    if isinstance(metadata, dict) and metadata.get("format") not in (None, FORMAT):
        kind = "; model weights" if metadata["format"] in ("pt", "tf", "flax", "np", "mlx") else ""
        return f"it is a safetensors file of format {metadata['format']!r} ({held}{kind})"
    return f"it is a safetensors file without hermes-video's header (no 'format' entry; {held})"


def read(path: str | os.PathLike) -> Snapshot:
    """Read ``path`` and check what the file alone can tell: the format and its version, the
    checksum, the structure. Raises SnapshotError (one line). Nothing in the file is executed:
    the header is JSON and the tensors are raw bytes."""
    from safetensors.torch import load as deserialise

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"cannot read memory snapshot {path}: {exc.strerror or exc}") from exc
    if len(data) < 9:
        raise _damaged(path, f"{len(data)} bytes")
    (header_len,) = struct.unpack("<Q", data[:8])
    # A safetensors header is a JSON object right after its length: "{" … "}" (space-padded).
    framed = 8 + header_len <= len(data) and data[8 : 8 + header_len].rstrip().endswith(b"}")
    if data[8:9] != b"{" and not framed:
        raise _not_ours(path, f"it is {_what_file(data)}, not a safetensors file")
    if 8 + header_len > len(data):
        raise _damaged(path, "cut short")
    try:
        header = json.loads(data[8 : 8 + header_len])
    except ValueError:
        raise _damaged(path, "its header is not valid JSON") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        if isinstance(header, dict) and "layers.0.keys" in header:  # a memory's tensors, its header altered
            raise _damaged(path, "its header was altered")
        raise _not_ours(path, _foreign_safetensors(header, metadata))
    version = str(metadata.get("format_version", ""))
    if not version.isdigit():
        raise _damaged(path, f"format version {version!r}")
    if int(version) > FORMAT_VERSION:
        raise SnapshotError(
            f"{path} was written by a newer hermes-video ({metadata.get('hermes_version', '?')}, snapshot format "
            f"{version}); this one ({__version__}) reads format {FORMAT_VERSION} — upgrade hermes-video to load it"
        )
    if int(version) < OLDEST_FORMAT_VERSION:
        raise SnapshotError(f"{path} has snapshot format {version}, which this hermes-video no longer reads "
                            f"(it reads formats {OLDEST_FORMAT_VERSION}–{FORMAT_VERSION})")
    try:
        tensors = deserialise(data)
    except Exception as exc:  # safetensors raises its own error class for every malformed layout
        raise _damaged(path, str(exc).splitlines()[0][:120]) from None
    if checksum(tensors, metadata) != metadata.get("checksum"):
        raise _damaged(path, "checksum mismatch: the file was altered")
    try:
        state = json.loads(metadata["state"])
        snap = Snapshot(path, metadata, state, tensors)
        _check_structure(snap)
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        raise _damaged(path, f"inconsistent content: {exc}") from None
    return snap


def _check_structure(snap: Snapshot) -> None:
    """Every tensor the header promises, with consistent shapes and dtypes (ValueError otherwise)."""
    n_layers = snap.num_layers
    axes = int(snap.header["position_axes"])
    length = int(snap.state["cache"]["length"])
    if n_layers < 1 or len(snap.state["cache"]["capacity"]) != n_layers:
        raise ValueError("layer count")
    kv_dtype = None
    if snap.kv_bits not in (8, 16):
        raise ValueError(f"kv_bits {snap.kv_bits}")
    for l, layer in enumerate(snap.layers()):
        k, v = layer["keys"], layer["values"]
        if k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3] or k.shape[0] != 1 or k.shape[2] != length:
            raise ValueError(f"layer {l} keys {tuple(k.shape)} / values {tuple(v.shape)}")
        if snap.kv_bits == 8:
            for name in SCALE_FIELDS:
                scales = layer[name]
                if scales.dtype != torch.float16 or tuple(scales.shape) != (*k.shape[:3], 1):
                    raise ValueError(f"layer {l} {name}")
            if k.dtype != torch.int8 or v.dtype != torch.int8:
                raise ValueError(f"layer {l} dtype")
        else:
            if kv_dtype is None:
                kv_dtype = k.dtype
            if k.dtype != kv_dtype or v.dtype != kv_dtype or dtype_name(kv_dtype) != snap.dtype:
                raise ValueError(f"layer {l} dtype")
        per_head = (k.shape[1],) if layer["kind"].ndim == 2 else ()  # a token set per key-value head
        for name, dtype in META_DTYPES.items():
            t = layer[name]
            shape = (*per_head, length, axes) if name == "positions" else (*per_head, length)
            if t.dtype != dtype or tuple(t.shape) != shape:
                raise ValueError(f"layer {l} {name}")
    pending = snap.state["pending_frames"]
    if snap.tensors["pending.timestamps"].shape != (pending,):
        raise ValueError("queued frames")
    for i in range(pending):
        image = snap.tensors[f"pending.{i}.image"]
        if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"queued frame {i}")
    if snap.tensors["stream.unit_times"].shape != (int(snap.state["stream"]["units_seen"]),):
        raise ValueError("unit times")


# -- fitting a session -------------------------------------------------------------------------------
def check_model(snap: Snapshot, model: str) -> None:
    """Refuse (SnapshotError, one line) a snapshot made by another model than ``model`` (by name):
    told by the header alone, so a command can refuse before the model loads."""
    if snap.model_name != model:
        raise SnapshotError(f"{snap.path} holds the memory of model {snap.model_name!r}, not {model!r} — load it "
                            f"with --model {snap.model_name}")


def check_fits(snap: Snapshot, session, *, accept_policy: bool = False, convert_dtype: bool = False) -> None:
    """Refuse (SnapshotError, one line) a snapshot that does not fit ``session``: another model or
    model configuration, another dtype (unless ``convert_dtype``), another policy, policy parameters
    or memory settings (unless ``accept_policy``)."""
    adapter = session.adapter
    name, path = snap.model_name, snap.path
    check_model(snap, adapter.name)
    if snap.header["model_config_sha256"] != config_hash(adapter):
        raise SnapshotError(f"{path} was saved from another configuration of {name!r} (config hash "
                            f"{snap.header['model_config_sha256'][:12]}…, this model {config_hash(adapter)[:12]}…) "
                            "— a memory only fits the model that made it")
    if snap.num_layers != adapter.num_layers or int(snap.header["position_axes"]) != adapter.position_axes:
        raise SnapshotError(f"{path} has {snap.num_layers} layers; {name!r} has {adapter.num_layers}")
    here = dtype_name(adapter.dtype)
    if snap.dtype != here and not convert_dtype:
        flag = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(snap.dtype, snap.dtype)
        raise SnapshotError(f"{path} holds {snap.dtype} memory and the model runs in {here} — run it with "
                            f"--dtype {flag}, or pass --convert-memory to convert the memory to {here}")
    bits = session.cache.kv_bits
    if snap.kv_bits != bits and not convert_dtype:
        raise SnapshotError(f"{path} holds {snap.kv_bits}-bit keys and values and this session keeps {bits} — run it "
                            f"with --kv-bits {snap.kv_bits}, or pass --convert-memory to convert the memory")
    if any(layer["kind"].ndim == 2 for layer in snap.layers()) and not session.policy.keeps_per_head():
        raise SnapshotError(f"{path} holds a token set per key-value head (infinipot profile=reference); "
                            f"{session.policy.name!r} keeps one set per layer — load it under --policy infinipot "
                            "--policy-opt profile=reference")
    if accept_policy:
        return
    policy = snap.state["policy"]
    if policy["name"] != session.policy.name:
        raise SnapshotError(f"{path} was made with policy {policy['name']!r}, this session uses "
                            f"{session.policy.name!r} — pass --accept-policy to continue under the new policy")
    ours = policy_parameters(session.policy)
    for key in sorted(set(ours) | set(policy["parameters"])):
        theirs = policy["parameters"].get(key)
        if ours.get(key) != theirs:
            raise SnapshotError(f"{path} was made with {policy['name']}.{key}={theirs!r}, this session has "
                                f"{ours.get(key)!r} — pass --accept-policy to continue with the new parameters")
    config = dataclasses.asdict(session.config)
    for key in MEMORY_SETTINGS:
        saved = snap.state["config"].get(key, BY_FIELD[key].default)  # absent: saved before the setting existed
        if config[key] != saved:
            raise SnapshotError(f"{path} was made with {key}={saved!r}, this session has "
                                f"{config[key]!r} — pass --accept-policy to continue with the new setting")


def restore(snap: Snapshot, session, *, convert_dtype: bool = False) -> None:
    """Replace the session's memory by the snapshot's (checked with ``check_fits`` first).

    Tensors move to the model's device; keys and values keep their dtype, or with
    ``convert_dtype`` take the model's (and the session's ``kv_bits``: 8-bit codes are dequantised
    into a 16-bit memory, float keys quantised into an 8-bit one). The system prompt is the
    snapshot's (its tokens are in the memory); every other setting stays the session's.
    """
    adapter = session.adapter
    device, dtype = adapter.device, adapter.dtype
    if snap.dtype != dtype_name(dtype) and not convert_dtype:
        raise SnapshotError(f"{snap.path} holds {snap.dtype} memory and the model runs in {dtype_name(dtype)}")
    floats = ("keys", "values") if snap.kv_bits == 16 else ()
    layers = [
        {k: (t.to(device=device, dtype=dtype) if k in floats else t.to(device)) for k, t in layer.items()}
        for layer in snap.layers()
    ]
    pending_times = snap.tensors["pending.timestamps"].tolist()
    stream = dict(snap.state["stream"])
    stream.update(
        unit_times=snap.tensors["stream.unit_times"].tolist(),
        history=snap.state["history"],
        pending=[(snap.tensors[f"pending.{i}.image"].numpy().copy(), t) for i, t in enumerate(pending_times)],
    )
    system_prompt = snap.state["config"]["system_prompt"]
    session.cache.import_layers(layers, snap.state["cache"]["next_id"], snap.state["cache"]["capacity"], dtype)
    session.positions.restore(snap.state["positions"])
    session.restore_stream_state(stream)
    session.config = dataclasses.replace(session.config, system_prompt=system_prompt)


def load(path: str | os.PathLike, session, *, accept_policy: bool = False, convert_dtype: bool = False) -> Snapshot:
    """Read, check and restore a snapshot into ``session``; the session is untouched unless all checks pass."""
    snap = read(path)
    check_fits(snap, session, accept_policy=accept_policy, convert_dtype=convert_dtype)
    restore(snap, session, convert_dtype=convert_dtype)
    return snap


# -- saving as a stream goes -----------------------------------------------------------------------------
class Autosaver:
    """Saves a session to one file at most every ``every_s`` seconds of wall-clock time.

    Call ``tick()`` between frames (it saves when the interval has passed) and ``save()`` at
    the end. Each save is atomic, so a crash loses at most one interval. A failed autosave (a
    full disk) does not stop the stream: it becomes one of the session's warnings, once, and the
    last good snapshot stays.
    """

    def __init__(self, session, path: str | os.PathLike, every_s: float, *, source: str | None = None,
                 clock=time.monotonic) -> None:
        self.session = session
        self.path = Path(path)
        self.every_s = every_s
        self.source = source
        self.clock = clock
        self.last = clock()

    def tick(self) -> bool:
        """Save if the interval has passed; whether a snapshot was written."""
        if self.clock() - self.last < self.every_s:
            return False
        try:
            self.save()
        except SnapshotError as exc:
            self.last = self.clock()  # try again one interval later
            warning = f"autosave failed: {exc} — the stream goes on; the last good snapshot stays"
            if warning not in self.session.warnings:
                self.session.warnings.append(warning)
            return False
        return True

    def save(self) -> SaveReport:
        report = save(self.session, self.path, source=self.source)
        self.last = self.clock()
        return report
