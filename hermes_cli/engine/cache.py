"""The stream's memory: a per-layer KV cache that knows what each cached token is.

``StreamingCache`` plugs into a transformers model as its ``cache``. Every layer holds, in
physical order, the system-prompt *prefix*, then *stream* tokens (video, and summary tokens a
policy added), then — only while a question is being answered — *text* tokens. For every token
it records an identity (kind, frame, patch, a stable id shared by all layers) and the rotary
position its key was rotated with (1-D, or t/h/w for M-RoPE).

This is the only module that slices cache tensors. Its invariant: all layers hold the same
number of tokens, so one attention mask and one position counter serve every layer. Layers may
hold *different* tokens (a policy chooses per layer), and so may the key-value heads of a layer
when a policy chooses per head (InfiniPot-V's reference profile): that layer's metadata then has
a leading head axis. Positions are session-owned and never derived from the physical length.

``kv_bits=8`` stores keys and values as int8 with one float16 scale per token and head
(symmetric, ``scale = max|x| / 127`` over the head dimension): about half the bytes of bf16.
Everything outside this module still sees float keys and values of the model's dtype —
``update``'s return, ``stored_keys``/``stored_values``, ``stream_view``, ``copy_tail`` dequantise on
use; compaction moves the stored bytes and scales as they are (no requantisation), a summary
token or a re-indexing rotation is quantised when it is written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer

from policies.base import LayerChoice, LayerTokens, Rotary

KIND_PREFIX, KIND_VIDEO, KIND_SUMMARY, KIND_TEXT = 0, 1, 2, 3
KV_BITS = (16, 8)  # 16: keys and values in the model's dtype; 8: int8 + a float16 scale per token and head
SCALE_DTYPE = torch.float16
_SCALE_FLOOR = 2.0**-14  # the smallest normal float16: an all-zero vector still gets a usable scale


def quantise(x: Tensor) -> tuple[Tensor, Tensor]:
    """(..., n, D) float → (int8 codes (..., n, D), float16 scales (..., n, 1)), per token: symmetric,
    ``scale = max|x| / 127`` (at least 2⁻¹⁴), ``code = round(x / scale)`` clamped to ±127."""
    amax = x.detach().abs().amax(dim=-1, keepdim=True).float()
    scale = (amax / 127).clamp_min(_SCALE_FLOOR).to(SCALE_DTYPE)
    codes = torch.round(x.float() / scale.float()).clamp_(-127, 127).to(torch.int8)
    return codes, scale


def dequantise(codes: Tensor, scales: Tensor, dtype: torch.dtype) -> Tensor:
    """int8 codes × their float16 scales, in float32, returned in ``dtype`` (a new tensor)."""
    return (codes.float() * scales.float()).to(dtype)


@dataclass
class TokenMeta:
    """Identity and position of n tokens: what ``append`` records for each layer.

    Shared by a layer's key-value heads: fields (n,) and positions (n, A). Per head (a policy
    chose per KV head): a leading head axis, (H, n) and (H, n, A); slot j of head h is then a
    different token from slot j of another head.
    """

    kind: Tensor  # (n,) int8
    token_id: Tensor  # (n,) int64
    frame: Tensor  # (n,) int64, -1 where not a video token
    patch: Tensor  # (n,) int64, -1 where not a video token
    positions: Tensor  # (n, A) int64

    def __len__(self) -> int:
        return int(self.kind.shape[-1])

    @property
    def per_head(self) -> bool:
        return self.kind.dim() == 2

    @property
    def heads(self) -> int:
        """Head sets held: H when per head, else 1."""
        return int(self.kind.shape[0]) if self.per_head else 1

    def head(self, h: int) -> TokenMeta:
        """The (shared-shaped) metadata of head ``h``'s tokens; itself when shared."""
        return TokenMeta(*(t[h] for t in self._fields())) if self.per_head else self

    def expand(self, heads: int) -> TokenMeta:
        """Per-head metadata: this shared metadata for each of ``heads`` heads (views)."""
        if self.per_head:
            return self
        return TokenMeta(*(t.unsqueeze(0).expand(heads, *t.shape) for t in self._fields()))

    def gather(self, index: Tensor) -> TokenMeta:
        """Per-head metadata of ``index`` (H, K): head h keeps its tokens ``index[h]``."""
        if not self.per_head:
            return TokenMeta(*(t[index] for t in self._fields()))
        a = self.positions.shape[-1]
        return TokenMeta(
            kind=torch.gather(self.kind, 1, index), token_id=torch.gather(self.token_id, 1, index),
            frame=torch.gather(self.frame, 1, index), patch=torch.gather(self.patch, 1, index),
            positions=torch.gather(self.positions, 1, index[..., None].expand(-1, -1, a)),
        )

    @classmethod
    def new(cls, kind: int, first_id: int, positions: Tensor, frame: Tensor | None = None,
            patch: Tensor | None = None) -> TokenMeta:
        """Fresh tokens with consecutive ids from ``first_id``; frame/patch -1 unless given."""
        n = positions.shape[0]
        minus = torch.full((n,), -1, dtype=torch.long, device=positions.device)
        return cls(
            kind=torch.full((n,), kind, dtype=torch.int8, device=positions.device),
            token_id=torch.arange(first_id, first_id + n, device=positions.device),
            frame=minus if frame is None else frame.to(positions.device),
            patch=minus.clone() if patch is None else patch.to(positions.device),
            positions=positions,
        )

    def select(self, index: Tensor | slice) -> TokenMeta:
        """The tokens at ``index`` along the token axis (in every head)."""
        return TokenMeta(kind=self.kind[..., index], token_id=self.token_id[..., index], frame=self.frame[..., index],
                         patch=self.patch[..., index], positions=self.positions[..., index, :])

    def _fields(self) -> tuple[Tensor, ...]:
        return (self.kind, self.token_id, self.frame, self.patch, self.positions)

    @staticmethod
    def cat(parts: list[TokenMeta]) -> TokenMeta:
        """Along the token axis; shared parts are repeated per head when any part is per head."""
        heads = max(p.heads for p in parts)
        if heads > 1:
            parts = [p.expand(heads) for p in parts]
        axis = 1 if heads > 1 else 0
        return TokenMeta(*(torch.cat(ts, dim=axis) for ts in zip(*(p._fields() for p in parts), strict=True)))


class StreamLayer(DynamicLayer):
    """One decoder layer: K/V in a growable buffer of shape (1, H, capacity, D) plus token metadata.

    ``update`` (called by the model's attention) writes the new keys/values after the current
    length and returns everything held: views (16 bits), or float copies dequantised from the
    int8 storage (8 bits), always in the model's dtype. Truncating (rollback) only moves the
    length, so what stays is bit-identical.
    """

    keys: Tensor  # (1, H, capacity, D) once initialised: the model's dtype, or int8 codes (kv_bits=8)
    values: Tensor

    def __init__(self, kv_bits: int = 16) -> None:
        super().__init__()
        if kv_bits not in KV_BITS:
            raise ValueError(f"--kv-bits must be one of {', '.join(map(str, KV_BITS))}, got {kv_bits}")
        self.kv_bits = kv_bits
        self.length = 0
        self.meta: TokenMeta | None = None
        self.dtype: torch.dtype | None = None  # the float dtype keys and values are handed out in
        self.key_scales: Tensor | None = None  # (1, H, capacity, 1) float16 when kv_bits=8
        self.value_scales: Tensor | None = None
        self._meta_store: TokenMeta | None = None  # growable metadata; ``meta`` is a prefix view of it

    def append_meta(self, new: TokenMeta) -> TokenMeta:
        """``meta`` with ``new`` appended, written in place into spare room of the metadata store
        when ``meta`` is still the store's prefix view (a decoding step then copies nothing held);
        otherwise a new store with room to grow. Views of slots past a rollback mark are
        overwritten by later appends: copy what must outlive them (``copy_tail`` does)."""
        old, store = self.meta, self._meta_store
        if old is None:
            full = new
        else:
            n_old, n = len(old), len(old) + len(new)
            heads = max(old.heads, new.heads)
            if (store is not None and n <= len(store) and store.heads == heads and old.heads == heads
                    and all(a.data_ptr() == b.data_ptr() and a.stride() == b.stride()
                            for a, b in zip(old._fields(), store._fields(), strict=True))):
                for target, part in zip(store._fields(), new.expand(heads)._fields() if heads > 1 else new._fields(),
                                        strict=True):
                    if target.dim() > (2 if heads > 1 else 1):  # positions: the token axis is second to last
                        target[..., n_old:n, :] = part
                    else:
                        target[..., n_old:n] = part
                return store.select(slice(0, n))
            full = TokenMeta.cat([old, new])
        n = len(full)
        capacity = n + max(64, n // 8)  # room to grow, as the key and value buffers have

        def room(t: Tensor, axis: int) -> Tensor:
            shape = list(t.shape)
            shape[axis] = capacity
            grown = t.new_empty(shape)
            grown.narrow(axis, 0, n).copy_(t)
            return grown

        self._meta_store = TokenMeta(*(room(t, t.dim() - 2 if t is full.positions else t.dim() - 1)
                                       for t in full._fields()))
        return self._meta_store.select(slice(0, n))

    @property
    def quantised(self) -> bool:
        return self.kv_bits == 8

    def buffer_names(self) -> tuple[str, ...]:
        """The per-token buffers that hold keys and values (with their scales when quantised)."""
        return ("keys", "values", "key_scales", "value_scales") if self.quantised else ("keys", "values")

    def write(self, start: int, keys: Tensor | None = None, values: Tensor | None = None) -> None:
        """Store float keys and/or values (1, H, q, D) in slots ``start … start + q`` (room reserved)."""
        for name, x in (("keys", keys), ("values", values)):
            if x is None:
                continue
            q = x.shape[-2]
            if self.quantised:
                codes, scales = quantise(x)
                getattr(self, name)[:, :, start : start + q] = codes
                getattr(self, name[:-1] + "_scales")[:, :, start : start + q] = scales
            else:
                getattr(self, name)[:, :, start : start + q] = x.to(self.keys.dtype)

    def keep_tokens(self, index: Tensor) -> None:
        """Move the stored tokens ``index`` ((k,) increasing, or (H, k) per head) to slots 0 … k − 1,
        codes and scales as they are; the length is the caller's."""
        held, k = self.length, index.shape[-1]
        for name in self.buffer_names():
            buf = getattr(self, name)
            for h in range(buf.shape[1]):
                # One head's (tokens, D) rows are contiguous: index_select copies them out (so writing
                # back in place is safe) several times faster than a 4-D gather or advanced indexing.
                rows = index[h] if index.dim() == 2 else index
                buf[0, h, :k] = torch.index_select(buf[0, h, :held], 0, rows)

    def fit(self) -> None:
        """Hand the spare room back: buffers of exactly the tokens held, and no metadata store
        beside ``meta`` (a compression leaves the store's old contents behind)."""
        self._meta_store = None
        if not self.is_initialized or self.keys.shape[-2] == self.length:
            return
        for name in self.buffer_names():
            setattr(self, name, getattr(self, name)[:, :, : self.length].contiguous())

    def held_meta(self) -> TokenMeta:
        """The metadata of the tokens held (the layer must not be empty)."""
        if self.meta is None:
            raise RuntimeError("the cache is empty")
        return self.meta

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.allocate(key_states.shape[1], key_states.shape[-1], value_states.shape[-1], 0, key_states.device)

    def allocate(self, heads: int, key_dim: int, value_dim: int, capacity: int, device) -> None:
        """Empty buffers for ``capacity`` tokens (the layer's ``dtype`` must be set)."""
        assert self.dtype is not None
        store = torch.int8 if self.quantised else self.dtype
        self.keys = torch.empty((1, heads, capacity, key_dim), dtype=store, device=device)
        self.values = torch.empty((1, heads, capacity, value_dim), dtype=store, device=device)
        if self.quantised:
            self.key_scales = torch.empty((1, heads, capacity, 1), dtype=SCALE_DTYPE, device=device)
            self.value_scales = torch.empty((1, heads, capacity, 1), dtype=SCALE_DTYPE, device=device)
        self.device = device
        self.is_initialized = True

    def _reserve(self, needed: int) -> None:
        """Room for ``needed`` tokens: a chunk gets exactly its room, a decoding step an eighth
        more than the layer holds (so a long answer reallocates every few hundred tokens, and the
        spare never doubles a stream's memory)."""
        capacity = self.keys.shape[-2]
        if needed <= capacity:
            return
        new_capacity = max(needed, capacity + max(64, capacity // 8))
        for name in self.buffer_names():
            old = getattr(self, name)
            grown = old.new_empty((*old.shape[:2], new_capacity, old.shape[-1]))
            grown[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, grown)

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        self._reserve(self.length + q)
        self.write(self.length, key_states, value_states)
        self.length += q
        return self.stored_keys(), self.stored_values()

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("use StreamingCache.rollback")

    def reset(self) -> None:
        super().reset()
        self.length = 0
        self.meta = None
        self._meta_store = None

    def stored_keys(self) -> Tensor:
        """The keys held (1, H, length, D) in the model's dtype: a view, or a dequantised copy (8 bits)."""
        if self.quantised:
            assert self.key_scales is not None and self.dtype is not None
            return dequantise(self.keys[:, :, : self.length], self.key_scales[:, :, : self.length], self.dtype)
        return self.keys[:, :, : self.length]

    def stored_values(self) -> Tensor:
        """The values held, like ``stored_keys``."""
        if self.quantised:
            assert self.value_scales is not None and self.dtype is not None
            return dequantise(self.values[:, :, : self.length], self.value_scales[:, :, : self.length], self.dtype)
        return self.values[:, :, : self.length]

    def held_bytes(self) -> int:
        """Bytes of the keys and values held (scales included), not the spare capacity."""
        if not self.is_initialized:
            return 0
        return sum(getattr(self, n)[0, :, 0].numel() * getattr(self, n).element_size() for n in self.buffer_names()) \
            * self.length


@dataclass(frozen=True)
class Mark:
    """A point to roll the cache back to (see ``StreamingCache.mark``)."""

    length: int
    next_id: int


class StreamingCache(Cache):
    """The session's KV cache: ``num_layers`` StreamLayers that always have equal length."""

    def __init__(self, num_layers: int, kv_bits: int = 16) -> None:
        super().__init__(layers=[StreamLayer(kv_bits) for _ in range(num_layers)])
        self.kv_bits = kv_bits
        self.next_id = 0  # next fresh token identity

    # -- what is held -------------------------------------------------------------------------
    @property
    def stream_layers(self) -> list[StreamLayer]:
        return self.layers  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def length(self) -> int:
        """Tokens held per layer (equal in every layer)."""
        return self.stream_layers[0].length

    def meta(self, layer: int) -> TokenMeta:
        return self.stream_layers[layer].held_meta()

    def held_keys(self) -> list[Tensor]:
        """Every layer's cached keys (1, H, length, D): views, not copies."""
        return [layer.stored_keys() for layer in self.stream_layers]

    def prefix_length(self) -> int:
        if self.stream_layers[0].meta is None:
            return 0
        return int((self.meta(0).head(0).kind == KIND_PREFIX).sum())

    def count(self, kind: int) -> list[int]:
        """Tokens of ``kind`` per layer (in its first head, where it holds a set per head)."""
        return [0 if l.meta is None else int((l.meta.head(0).kind == kind).sum()) for l in self.stream_layers]

    def stream_counts(self) -> list[int]:
        """Stream tokens (video + summary) per layer: what a budget counts."""
        video, summary = self.count(KIND_VIDEO), self.count(KIND_SUMMARY)
        return [v + s for v, s in zip(video, summary, strict=True)]

    def kv_bytes(self) -> int:
        """Bytes of the keys and values held (not the spare capacity of the buffers)."""
        return sum(layer.held_bytes() for layer in self.stream_layers)

    def max_positions(self) -> Tensor | None:
        """Per axis, the largest position held in any layer (None when empty)."""
        if self.stream_layers[0].meta is None or self.length == 0:
            return None
        home = self.stream_layers[0].held_meta().positions.device  # layers may sit on different devices
        return torch.stack([
            l.held_meta().positions.flatten(0, -2).max(dim=0).values.to(home) for l in self.stream_layers
        ]).max(dim=0).values

    # -- growing ------------------------------------------------------------------------------
    def new_ids(self, n: int) -> int:
        """Reserve n fresh token identities; returns the first."""
        first = self.next_id
        self.next_id += n
        return first

    def record(self, meta: TokenMeta) -> None:
        """Record identities of the tokens the last forward appended (same for every layer)."""
        for layer in self.stream_layers:
            if layer.is_initialized and meta.kind.device != layer.keys.device:
                meta = TokenMeta(*(t.to(layer.keys.device) for t in meta._fields()))
            held = 0 if layer.meta is None else len(layer.meta)
            if layer.length != held + len(meta):
                raise RuntimeError(
                    f"cache out of sync: layer holds {layer.length} tokens, metadata for {held + len(meta)}"
                )
            layer.meta = layer.append_meta(meta)

    # -- rolling back -------------------------------------------------------------------------
    def mark(self) -> Mark:
        return Mark(self.length, self.next_id)

    def rollback(self, mark: Mark) -> None:
        """Forget every token appended after ``mark``; what stays is bit-identical."""
        for layer in self.stream_layers:
            if layer.length < mark.length:
                raise RuntimeError("cannot roll back to a mark beyond the current length")
            layer.length = mark.length
            if layer.meta is not None:
                layer.meta = layer.meta.select(slice(0, mark.length))
        self.next_id = mark.next_id

    def drop_tail(self, n: int) -> None:
        """Forget the last ``n`` tokens a forward appended before they were recorded (the
        pseudo-queries folded into a chunk's prefill); what stays is bit-identical."""
        for layer in self.stream_layers:
            held = 0 if layer.meta is None else len(layer.meta)
            if n < 0 or layer.length - n < held:
                raise RuntimeError(f"cannot drop {n} unrecorded tokens: layer holds {layer.length}, recorded {held}")
            layer.length -= n

    def copy_tail(self, mark: Mark) -> tuple[list[Tensor], list[Tensor], TokenMeta]:
        """Copies of every layer's keys and values appended after ``mark`` (1, H, n, D), and the
        first layer's metadata for them (the tokens after a mark are the same in every layer)."""
        keys = [l.stored_keys()[:, :, mark.length :].clone() for l in self.stream_layers]
        values = [l.stored_values()[:, :, mark.length :].clone() for l in self.stream_layers]
        tail = self.meta(0).head(0).select(slice(mark.length, self.length))
        return keys, values, TokenMeta(*(t.clone() for t in tail._fields()))

    def append(self, keys: list[Tensor], values: list[Tensor], meta: TokenMeta) -> None:
        """Append already computed keys and values (one (1, H, n, D) pair per layer) with ``meta``."""
        if len(keys) != self.num_layers or len(values) != self.num_layers:
            raise ValueError(f"keys and values for {len(keys)} layers, the cache has {self.num_layers}")
        for layer, k, v in zip(self.stream_layers, keys, values, strict=True):
            layer.update(k, v)
        self.record(meta)

    # -- what policies see and what they choose -------------------------------------------------
    def stream_view(self, layer: int, attention: dict[str, Tensor] | None = None) -> LayerTokens:
        """The stream tokens (everything after the prefix) of one layer, as a policy sees them
        (with a head axis on the identities where the layer holds a token set per head)."""
        lay = self.stream_layers[layer]
        p = self.prefix_length()
        meta = self.meta(layer).select(slice(p, lay.length))
        return LayerTokens(
            keys=lay.stored_keys()[0, :, p:],
            values=lay.stored_values()[0, :, p:],
            token_id=meta.token_id,
            frame=meta.frame,
            patch=meta.patch,
            positions=meta.positions,
            is_summary=meta.kind == KIND_SUMMARY,
            attention=attention or {},
        )

    def apply(self, choices: list[LayerChoice]) -> None:
        """Keep, in each layer, the chosen stream tokens (in order) and append its summary token;
        then every layer's buffers hold exactly what it keeps (``StreamLayer.fit``).

        A choice of (H, K) indices keeps a set per key-value head. Every layer must end with the
        same length; text tokens must not be present.
        """
        if len(choices) != len(self.layers):
            raise ValueError(f"{len(choices)} choices for {len(self.layers)} layers")
        sizes = {c.size for c in choices}
        if len(sizes) != 1:
            raise ValueError(f"a policy left layers of different sizes: {sorted(sizes)}")
        if any(self.count(KIND_TEXT)):
            raise RuntimeError("compress only between questions")
        p = self.prefix_length()
        summary_ids = [self.new_ids(1) if c.summary is not None else -1 for c in choices]
        for layer, choice, sid in zip(self.stream_layers, choices, summary_ids, strict=True):
            n_stream = layer.length - p
            keep = choice.keep.to(device=layer.keys.device, dtype=torch.long)
            if keep.numel() and (keep.min() < 0 or keep.max() >= n_stream or (keep.diff() <= 0).any()):
                raise ValueError("keep indices must be strictly increasing and inside the layer")
            prefix = torch.arange(p, device=keep.device)
            if keep.dim() == 2:
                heads = layer.keys.shape[1]
                if keep.shape[0] != heads:
                    raise ValueError(f"a choice per head for {keep.shape[0]} heads, the layer has {heads}")
                index = torch.cat([prefix.expand(heads, p), keep + p], dim=1)
                k = index.shape[1]
                layer.keep_tokens(index)
                meta = layer.held_meta().gather(index)
            else:
                index = torch.cat([prefix, keep + p])
                k = index.numel()
                layer.keep_tokens(index)
                meta = layer.held_meta().select(index)
            if choice.summary is not None:
                layer._reserve(k + 1)
                s = choice.summary
                layer.write(k, s.key[None, :, None], s.value[None, :, None])
                pos = s.position.to(meta.positions).reshape(1, -1)
                meta = TokenMeta.cat([meta, TokenMeta.new(KIND_SUMMARY, sid, pos)])
                k += 1
            layer.length = k
            layer.meta = meta
            layer.fit()  # the room the chunk took is handed back: at rest a stream holds what it keeps

    def reposition(self, layer: int, positions: Tensor, rotary: Rotary) -> None:
        """Move one layer's stream tokens to new ``positions`` (N, A), or (H, N, A) where the layer
        holds a set per head, rotating their keys to match.

        The keys are corrected by the rotary delta in place; nothing is recomputed.
        """
        lay = self.stream_layers[layer]
        p = self.prefix_length()
        held = lay.held_meta()
        old = held.positions[..., p : lay.length, :]
        if positions.shape != old.shape:
            raise ValueError(f"expected positions of shape {tuple(old.shape)}, got {tuple(positions.shape)}")
        positions = positions.to(old)
        delta = positions - old
        if bool((delta != 0).any()):
            keys = lay.stored_keys()[:, :, p:]  # a view of the buffer, or a dequantised copy (8 bits)
            if held.per_head:
                for h in range(held.heads):
                    keys[:, h].copy_(rotary.rotate(keys[:, h], delta[h]))
            else:
                keys.copy_(rotary.rotate(keys, delta))
            if lay.quantised:
                lay.write(p, keys=keys)
        held.positions = torch.cat([held.positions[..., :p, :], positions], dim=-2)

    # -- snapshots ------------------------------------------------------------------------------
    def export_layers(self, device: torch.device | str = "cpu") -> list[dict[str, Tensor]]:
        """Copies of what each layer holds, on ``device``: ``keys``/``values`` (1, H, length, D) —
        the held length only, never the spare capacity; with ``kv_bits=8`` the int8 codes and
        ``key_scales``/``value_scales`` (1, H, length, 1) float16 — and the token metadata (``kind``,
        ``token_id``, ``frame``, ``patch``, ``positions``; with a head axis where the layer holds
        a set per head). Text tokens must not be present."""
        if any(self.count(KIND_TEXT)):
            raise RuntimeError("export the cache only between questions")
        out = []
        for layer in self.stream_layers:
            if not layer.is_initialized or layer.meta is None:
                raise RuntimeError("the cache is empty")
            held = {name: getattr(layer, name)[:, :, : layer.length] for name in layer.buffer_names()}
            held.update(zip(("kind", "token_id", "frame", "patch", "positions"), layer.meta._fields(), strict=True))
            out.append({k: v.detach().to(device, copy=True).contiguous() for k, v in held.items()})
        return out

    def capacities(self) -> list[int]:
        """Tokens each layer's buffers have room for (held + spare)."""
        return [l.keys.shape[-2] if l.is_initialized else 0 for l in self.stream_layers]

    def import_layers(self, layers: list[dict[str, Tensor]], next_id: int, capacities: list[int] | None = None,
                      dtype: torch.dtype | None = None) -> None:
        """Replace everything held by ``layers`` (as ``export_layers`` gives them, already on the
        model's device; float keys and values in its dtype); buffers get ``capacities`` (default:
        the held length). ``dtype``: the model's (default: the float keys' own). Float keys and
        values are quantised into an 8-bit cache; int8 ones (with their scales) are dequantised
        into a 16-bit one.

        The caller checks shapes first: this only re-checks the invariant (equal lengths).
        """
        if len(layers) != self.num_layers:
            raise ValueError(f"{len(layers)} layers for a cache of {self.num_layers}")
        lengths = {int(l["keys"].shape[-2]) for l in layers}
        if len(lengths) != 1:
            raise ValueError(f"layers of different lengths: {sorted(lengths)}")
        (length,) = lengths
        capacities = capacities or [length] * len(layers)
        for layer, held, capacity in zip(self.stream_layers, layers, capacities, strict=True):
            keys, values = held["keys"], held["values"]
            coded = "key_scales" in held
            layer.dtype = dtype or (layer.dtype if coded else keys.dtype)
            if layer.dtype is None:
                raise ValueError("8-bit keys and values need the model's dtype to import them")
            layer.allocate(keys.shape[1], keys.shape[-1], values.shape[-1], max(capacity, length), keys.device)
            if coded and layer.quantised:
                for name in layer.buffer_names():
                    getattr(layer, name)[:, :, :length] = held[name]
            else:
                if coded:
                    keys = dequantise(keys, held["key_scales"], layer.dtype)
                    values = dequantise(values, held["value_scales"], layer.dtype)
                layer.write(0, keys, values)
            layer.length = length
            layer.meta = TokenMeta(*(held[k].to(keys.device) for k in ("kind", "token_id", "frame", "patch", "positions")))
        self.next_id = int(next_id)


class BatchLayer(DynamicLayer):
    """One decoder layer of a ``BatchView``: the rows' keys and values copied once into a padded
    (B, H, capacity, D) buffer; each step writes row b's new key after its own length, in the
    buffer and in the row's own ``StreamLayer`` (so that stream's cache stays complete)."""

    keys: Tensor  # (B, H, capacity, D)
    values: Tensor

    def __init__(self, rows: list[StreamLayer], lengths: list[int], reserve: int) -> None:
        super().__init__()
        self.rows = rows
        self.lengths = lengths  # shared with the view: each row's length before the current step
        first = rows[0]
        held = max(lengths)
        b, (_, h, _, d), dv = len(rows), first.keys.shape, first.values.shape[-1]
        self.keys = first.keys.new_zeros((b, h, held + reserve, d))
        self.values = first.values.new_zeros((b, h, held + reserve, dv))
        for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
            self.keys[i, :, :n] = row.keys[0, :, :n]
            self.values[i, :, :n] = row.values[0, :, :n]
        self.device = first.keys.device
        self.is_initialized = True
        self._rows = torch.arange(b, device=self.device)

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if key_states.shape[-2] != 1:
            raise ValueError("a batch view decodes one token per row and step")
        at = torch.tensor(self.lengths, device=self.device)
        end = int(at.max()) + 1
        if end > self.keys.shape[-2]:
            for name in ("keys", "values"):
                old = getattr(self, name)
                grown = old.new_zeros((*old.shape[:2], 2 * old.shape[-2], old.shape[-1]))
                grown[:, :, : old.shape[-2]] = old
                setattr(self, name, grown)
        self.keys[self._rows, :, at] = key_states[:, :, 0]
        self.values[self._rows, :, at] = value_states[:, :, 0]
        for i, row in enumerate(self.rows):
            row.update(key_states[i : i + 1], value_states[i : i + 1])
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_seq_length(self) -> int:
        return max(self.lengths)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return max(self.lengths) + query_length, 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a batch view only grows; roll back each stream's own cache")


class BatchView(Cache):
    """The caches of B streams, each with an answer open, presented as one padded batch.

    Built once for a set of rows (copying what each holds, right-padded to the longest) and kept
    while the set is unchanged; ``step_mask`` masks each row's padding for the next one-token
    step, ``advance`` moves every row on by the token the step appended. The streams' own caches
    are appended too (``BatchLayer.update``), so each can be rolled back, captured or decoded
    alone at any step; the view is dropped when a row joins or leaves.
    """

    def __init__(self, caches: list[StreamingCache], reserve: int = 64) -> None:
        if len({c.num_layers for c in caches}) != 1:
            raise ValueError("a batch needs caches of one model")
        self.caches = caches
        self.lengths = [c.length for c in caches]
        self.batch_layers = [BatchLayer([c.stream_layers[l] for c in caches], self.lengths, reserve)
                             for l in range(caches[0].num_layers)]
        layers: list = list(self.batch_layers)
        super().__init__(layers=layers)

    def step_mask(self) -> Tensor:
        """(B, 1, 1, longest + 1) boolean: row b sees its own tokens and the one it appends now."""
        device = self.batch_layers[0].device
        width = max(self.lengths) + 1
        at = torch.tensor(self.lengths, device=device)
        return (torch.arange(width, device=device)[None, :] <= at[:, None])[:, None, None, :]

    def advance(self) -> None:
        for i in range(len(self.lengths)):
            self.lengths[i] += 1
