"""Rotary-position arithmetic for a KV cache whose keys are stored *after* RoPE.

Positions belong to the session (see docs/architecture.md). When tokens are evicted the retained
positions are re-indexed (*compaction*) and the cached keys are corrected in place by the rotary
delta instead of being recomputed:

    k' = k * cos(angles(Δ)) + rotate_half(k) * sin(angles(Δ)),   Δ = p_new − p_old

This is exact because a RoPE angle is linear in the position: R(θ(p_old) + θ(Δ)) = R(θ(p_new)).

Position layout used throughout this module: ``(N, A)`` int64, one row per token, one column per
position axis — ``A = 1`` for 1-D RoPE (Qwen2 / LLaVA-OneVision), ``A = 3`` (t, h, w) for M-RoPE
(Qwen2-VL, Qwen2.5-VL, Qwen3-VL). transformers uses ``(A, batch, N)``; see
``positions.layout``.

``attention_scaling``: transformers multiplies cos and sin by the rotary module's
``attention_scaling`` (1.0 for default/linear RoPE, != 1 for e.g. YaRN), so a cached key is
``s · R(θ_old) k_raw``. Rotating it by the *unscaled* R(Δ) gives ``s · R(θ_new) k_raw`` — exactly the
key the model would have cached at the new position. The delta rotation must therefore NOT
apply the scaling again (that would multiply the key by ``s`` a second time); this module never
uses it, it only records it in :attr:`RotaryDelta.attention_scaling` for reference.

Only torch is imported; no model code is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["RotaryDelta", "rotate_half"]

# Rotary types whose frequencies change with the sequence length inside the forward pass
# (``dynamic_rope_update``): a cached key then has no single well-defined angle per position.
_LENGTH_DEPENDENT_ROPE_TYPES = frozenset({"dynamic", "longrope"})


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(-x2, x1)`` over the last dim, the same convention as transformers' Qwen/Llama models."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _sectioned_axes(mrope_section: Sequence[int], interleaved: bool) -> torch.Tensor:
    """Axis (0=t, 1=h, 2=w) of each of the head_dim/2 frequencies, as transformers 5.24 lays them out.

    - Qwen2-VL / Qwen2.5-VL (``interleaved=False``): the frequency vector is cut into consecutive
      sections of sizes ``mrope_section``; section i takes its angle from axis ``i % 3``.
    - Qwen3-VL (``interleaved=True``): frequency j takes axis 1 if ``j % 3 == 1 and j < 3·sec[1]``,
      axis 2 if ``j % 3 == 2 and j < 3·sec[2]``, otherwise axis 0.
    """
    sections = [int(s) for s in mrope_section]
    half = sum(sections)
    if not interleaved:
        return torch.cat(
            [torch.full((s,), i % 3, dtype=torch.long) for i, s in enumerate(sections)]
        )
    axes = torch.zeros(half, dtype=torch.long)
    for axis in (1, 2):
        axes[axis : sections[axis] * 3 : 3] = axis
    return axes


class RotaryDelta:
    """Rotates post-RoPE keys by a position delta, for 1-D RoPE and M-RoPE.

    Attributes:
        inv_freq: fp32 ``(head_dim/2,)`` — the model's (possibly rescaled) inverse frequencies.
        mrope_section: section sizes for M-RoPE, or ``None`` for 1-D RoPE.
        head_dim: rotary dimension (= 2 · len(inv_freq)).
        num_axes: 1 for 1-D RoPE, 3 for M-RoPE.
        axis_of_dim: int64 ``(head_dim,)`` — which position axis drives each key dimension.
        attention_scaling: the module's cos/sin scale, recorded only (never applied, see module doc).
    """

    def __init__(
        self,
        inv_freq: torch.Tensor,
        mrope_section: Sequence[int] | None = None,
        *,
        interleaved: bool = False,
        axis_of_freq: torch.Tensor | None = None,
        attention_scaling: float = 1.0,
    ) -> None:
        """Build from inverse frequencies.

        Args:
            inv_freq: ``(head_dim/2,)`` inverse frequencies (cast to fp32).
            mrope_section: M-RoPE section sizes summing to head_dim/2, or ``None`` for 1-D RoPE.
            interleaved: Qwen3-VL interleaved M-RoPE layout instead of the Qwen2(.5)-VL one.
            axis_of_freq: advanced — explicit ``(head_dim/2,)`` axis per frequency (overrides the
                layout derived from ``mrope_section``/``interleaved``).
            attention_scaling: informational, see the module docstring.
        """
        inv_freq = torch.as_tensor(inv_freq).detach().to(torch.float32).flatten().clone()
        half = inv_freq.numel()
        if half == 0:
            raise ValueError("inv_freq is empty")
        self.inv_freq = inv_freq
        self.head_dim = 2 * half
        self.mrope_section = None if mrope_section is None else tuple(int(s) for s in mrope_section)
        self.interleaved = bool(interleaved)
        self.attention_scaling = float(attention_scaling)

        if axis_of_freq is not None:
            axes = torch.as_tensor(axis_of_freq, dtype=torch.long).flatten().cpu()
            if axes.numel() != half:
                raise ValueError(f"axis_of_freq has {axes.numel()} entries, expected {half}")
        elif self.mrope_section is not None:
            if sum(self.mrope_section) != half or any(s < 0 for s in self.mrope_section):
                raise ValueError(
                    f"mrope_section {self.mrope_section} must be non-negative and sum to "
                    f"head_dim/2 = {half}"
                )
            axes = _sectioned_axes(self.mrope_section, self.interleaved)
        else:
            axes = torch.zeros(half, dtype=torch.long)
        if axes.numel() and int(axes.min()) < 0:
            raise ValueError("axis indices must be non-negative")
        if self.mrope_section is not None:
            self.num_axes = max(3, int(axes.max()) + 1)
        else:
            self.num_axes = int(axes.max()) + 1
        self.axis_of_freq = axes
        self.axis_of_dim = torch.cat((axes, axes))
        self._inv_freq_dim = torch.cat((inv_freq, inv_freq))  # (head_dim,)
        self._per_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_rotary_embedding(cls, module: torch.nn.Module) -> RotaryDelta:
        """Build from a model's own rotary module (e.g. ``model.language_model.rotary_emb``).

        Reads the ``inv_freq`` buffer (it already contains any frequency rescaling: linear, YaRN,
        …), ``attention_scaling`` and ``mrope_section``. When the module has
        ``recomposition_frequencies`` (M-RoPE modules in transformers 5.x) the per-dimension axis
        layout is *probed from the module itself* and checked against the known layouts, so a
        change of layout in transformers is caught instead of silently mis-rotating.

        Raises:
            ValueError: for rope types whose frequencies depend on the sequence length
                (``dynamic``, ``longrope``): no fixed delta rotation exists for those.
        """
        rope_type = getattr(module, "rope_type", "default")
        if isinstance(rope_type, str) and rope_type in _LENGTH_DEPENDENT_ROPE_TYPES:
            raise ValueError(
                f"rope_type {rope_type!r} recomputes its frequencies from the sequence length; "
                "cached keys cannot be re-positioned by a fixed rotary delta"
            )
        inv_freq = getattr(module, "inv_freq", None)
        if not isinstance(inv_freq, torch.Tensor):
            raise TypeError(f"{type(module).__name__} has no inv_freq tensor")
        inv_freq = inv_freq.detach().to(torch.float32).cpu()
        scaling = float(getattr(module, "attention_scaling", 1.0) or 1.0)
        section = getattr(module, "mrope_section", None)
        recompose = getattr(module, "recomposition_frequencies", None)
        if section is None:
            return cls(inv_freq, None, attention_scaling=scaling)
        section = tuple(int(s) for s in section)
        if recompose is None:
            return cls(inv_freq, section, attention_scaling=scaling)

        axes = _probe_axes(recompose, inv_freq.numel())
        for interleaved in (False, True):
            try:
                candidate = _sectioned_axes(section, interleaved)
            except (IndexError, RuntimeError):
                continue
            if candidate.shape == axes.shape and torch.equal(candidate, axes):
                return cls(inv_freq, section, interleaved=interleaved, attention_scaling=scaling)
        # Unknown but well-formed layout: trust the probe.
        return cls(inv_freq, section, axis_of_freq=axes, attention_scaling=scaling)

    # ------------------------------------------------------------------ angles
    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._per_device:
            self._per_device[device] = (
                self._inv_freq_dim.to(device),
                self.axis_of_dim.to(device),
            )
        return self._per_device[device]

    def _check_positions(self, positions: torch.Tensor) -> torch.Tensor:
        positions = torch.as_tensor(positions)
        if positions.dtype.is_floating_point or positions.dtype == torch.bool:
            raise TypeError(f"positions must be an integer tensor, got {positions.dtype}")
        if positions.ndim == 1:
            positions = positions[:, None]
        a = positions.shape[-1]
        if a not in (1, self.num_axes):
            raise ValueError(
                f"positions have {a} axes; this rotary scheme takes 1 or {self.num_axes}"
            )
        return positions

    def _gather(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        inv, axis = self._tables(positions.device)
        if positions.shape[-1] == 1:  # one axis, broadcast to all (as the model's expand(3, …))
            p = positions.to(dtype)
        else:
            p = positions.index_select(-1, axis).to(dtype)
        return p * inv.to(dtype)

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """Per-dimension rotary angles, laid out exactly as the model builds cos/sin.

        Args:
            positions: int ``(..., N, A)`` with A = 1 (or a 1-D ``(N,)``) or A = num_axes;
                a single axis is broadcast to every axis, as transformers does.
        Returns:
            fp32 ``(..., N, head_dim)``; bit-identical to the model's ``freqs`` (its cos/sin are
            ``angles.cos() * attention_scaling`` and ``angles.sin() * attention_scaling``).
        """
        positions = self._check_positions(positions)
        # Same ops as transformers: position.float() * inv_freq (fp32), then the layout.
        return self._gather(positions, torch.float32)

    def cos_sin(self, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 ``(cos, sin)`` of the delta angles, each ``(..., N, head_dim)``, *unscaled*.

        Angles are formed and reduced in float64 (float32 on MPS, which has no float64) so that
        a large delta adds no rounding of its own beyond the final fp32 cast.
        """
        delta = self._check_positions(delta)
        work = torch.float32 if delta.device.type == "mps" else torch.float64
        ang = self._gather(delta, work)
        return ang.cos().to(torch.float32), ang.sin().to(torch.float32)

    # ------------------------------------------------------------------ rotation
    def _rotated_fp32(self, keys: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        if keys.shape[-1] != self.head_dim:
            raise ValueError(f"keys have last dim {keys.shape[-1]}, expected {self.head_dim}")
        delta = torch.as_tensor(delta, device=keys.device)
        n = delta.shape[0]
        if keys.ndim < 2 or keys.shape[-2] != n:
            raise ValueError(f"keys {tuple(keys.shape)} do not have N = {n} tokens at dim -2")
        cos, sin = self.cos_sin(delta)
        k = keys.to(torch.float32)
        return k * cos + rotate_half(k) * sin

    def rotate(self, keys: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Return ``keys`` moved by ``delta`` positions (a new tensor, same dtype as ``keys``).

        Args:
            keys: post-RoPE keys ``(..., N, head_dim)`` (e.g. ``(batch, kv_heads, N, head_dim)``).
            delta: int ``(N, A)`` (or ``(N,)``) = new position − old position per token and axis.
        Computed in fp32; rotations compose: ``rotate(rotate(k, d1), d2) ≈ rotate(k, d1 + d2)``.
        """
        return self._rotated_fp32(keys, delta).to(keys.dtype)

    def __repr__(self) -> str:
        return (
            f"RotaryDelta(head_dim={self.head_dim}, mrope_section={self.mrope_section}, "
            f"interleaved={self.interleaved}, attention_scaling={self.attention_scaling})"
        )


def _probe_axes(recompose, half: int) -> torch.Tensor:
    """Ask the module's ``recomposition_frequencies`` which axis feeds each frequency slot.

    Feeds a ``(3, 1, 1, half)`` tensor whose entry (axis a, freq j) is ``a·half + j`` and decodes
    the result. Also checks the ``cat((f, f))`` duplication, which :class:`RotaryDelta` assumes.
    """
    code = (torch.arange(3)[:, None] * half + torch.arange(half)[None, :]).to(torch.float64)
    out = recompose(code.view(3, 1, 1, half).clone()).reshape(-1).round().to(torch.long)
    if out.numel() != 2 * half:
        raise ValueError(f"recomposition_frequencies returned {out.numel()} dims, expected {2 * half}")
    axes, freqs = out // half, out % half
    expected_freqs = torch.arange(2 * half) % half
    if not torch.equal(freqs, expected_freqs) or not torch.equal(axes[:half], axes[half:]):
        raise ValueError("unsupported rotary layout: not a duplicated cat((f, f)) of per-frequency angles")
    return axes[:half].clone()
