"""``hermes``: HERMES hierarchical KV-cache memory: per-layer scores, smoothing, summary tokens.

HERMES ("HERMES: KV Cache as Hierarchical Memory for Efficient Streaming Video Understanding",
arXiv 2601.14724, ACL 2026). Each layer keeps its ``budget`` best tokens under its own score:

- Roles by depth: shallow ``l < int(0.1 L)``, deep ``l >= int(0.7 L)``, middle between, with
  ``p = (l − l_s) / (l_d − l_s)`` (fractions are parameters; ``int`` is taken exactly, so
  90 layers split at 63, not at the float ``int(0.7 * 90) = 62``).
- Score ``S = (1 − ω)·Â + ω·R̂``: ``R = exp(−k·d)`` with ``d`` the token's age in physical
  order scaled to [0, 1]; ``A`` the engine's mean pseudo-query attention to the token;
  ``x̂`` min–max normalised. Shallow: ``ω = 1, k = k0`` (recency only, no attention needed);
  middle: ``ω = ω0 − γ·p``, ``k = k0 − k1·p``, attention of local + "; " + global; deep: ``ω = 0``,
  attention of the global pseudo-query.
- Cross-layer smoothing from the deepest layer up, ``S̃_l = (1 − λ_l)·S_l + λ_l·S̃_{l+1}``,
  blended by cache index as in the paper and the official code (when two layers hold different
  numbers of tokens, the layer above is resampled by linear interpolation along the index, as
  ``F.interpolate(mode="linear", align_corners=False)`` does). ``smooth_by_identity`` (ours,
  off by default) matches the same token id instead (a token missing above contributes 0).
- Deep layers keep ``budget − 1`` tokens plus one summary token folding every evicted entry:
  value = mean of evicted values, key = mean of evicted keys rotated to the summary's position,
  so the average is phase-aligned. An older summary competes in top-k like any token, as in the
  official code (``fold_old_summary``, ours: always fold it). The summary's position is the
  overall maximum of the kept positions + 1 on every axis, as in the official code
  (``summary_position_per_axis``, ours: per axis max + 1). Without a rotary
  (``state.rotary is None``) keys are averaged as they are.
- ``profile``: ``paper`` (default) follows the paper's text, and the official code where the
  paper is silent; ``reference`` reproduces the official code for the model family in use:
  its float layer split ``int(L · fraction)`` and, for LLaVA-OneVision, its middle-layer
  constants ``ω = 1 − 0.9p``, ``k = 20 − 19.5p``. See docs/policies.md for every difference.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch import Tensor

from .base import (
    LayerChoice,
    LayerTokens,
    Policy,
    Rotary,
    StreamState,
    Summary,
    at_rest,
    keep_all,
    param,
    require,
    take_tokens,
    top_k_sorted,
)

SHALLOW, MIDDLE, DEEP = "shallow", "middle", "deep"
LOCAL_QUERY = (
    "Describe the current scene in detail, focusing on specific objects, fine-grained actions, "
    "and spatial relationships."
)
GLOBAL_QUERY = (
    "Summarize the video narrative, identifying main characters, key events, timeline changes, "
    "and the overall theme."
)
ATTENTION_BY_ROLE = {MIDDLE: "mixed", DEEP: "global"}  # shallow layers need no attention
MINMAX_EPS = 1e-6
PROFILES = ("paper", "reference")
FAMILIES = ("auto", "qwen-vl", "llava-ov")
# The official LLaVA-OneVision code's middle layers: ω = 1 − 0.9p, k = 20 − 19.5p (omega0, gamma, k0, k1).
LLAVA_REFERENCE_CONSTANTS = (1.0, 0.9, 20.0, 19.5)


@dataclass(frozen=True)
class LayerRole:
    kind: str  # SHALLOW, MIDDLE or DEEP
    depth: float  # p in [0, 1) for a middle layer; 0 otherwise


@dataclass
class HermesPolicy(Policy):
    name = "hermes"
    description = "HERMES: per-layer recency/attention scores, cross-layer smoothing, deep summary tokens"

    shallow_fraction: float = param(0.1, "layers l < int(fraction · L) are shallow (recency only)")
    deep_fraction: float = param(0.7, "layers l >= int(fraction · L) are deep (global attention + summary)")
    omega0: float = param(0.75, "middle layers: recency weight ω = omega0 − gamma · p")
    gamma: float = param(0.6, "middle layers: how fast the recency weight falls with depth p")
    k0: float = param(20.0, "recency decay k = k0 − k1 · p (shallow layers: k0)")
    k1: float = param(12.0, "middle layers: how fast the recency decay falls with depth p")
    lambda_shallow: float = param(0.1, "smoothing weight λ of the layer above, for shallow layers")
    lambda_middle: float = param(0.3, "smoothing weight λ of the layer above, for middle layers")
    lambda_deep: float = param(0.4, "smoothing weight λ of the layer above, for deep layers")
    smoothing: bool = param(True, "blend each layer's scores with the layer above (ablation: off)")
    summary: bool = param(True, "fold evicted deep-layer tokens into one summary token (ablation: off)")
    profile: str = param(
        "paper",
        "paper: the paper's method (official code where the paper is silent); reference: the official "
        "code for the model family (float layer split; LLaVA-OV middle constants ω = 1 − 0.9p, k = 20 − 19.5p)",
    )
    family: str = param("auto", "model family for profile=reference: auto (3 position axes: qwen-vl, 1: llava-ov), qwen-vl, llava-ov")
    smooth_by_identity: bool = param(False, "ours: smooth scores of the same token id across layers, not the same cache index")
    fold_old_summary: bool = param(False, "ours: always fold an older summary into the new one instead of letting it compete")
    summary_position_per_axis: bool = param(False, "ours: summary position max + 1 per axis, not the overall max + 1 on all axes")
    rewrite_choices: bool = param(
        True, "pseudo-queries: a bare option letter answer becomes the option's text, 'X) ' prefixes dropped (official code)"
    )

    def __post_init__(self) -> None:
        require(
            0 <= self.shallow_fraction <= self.deep_fraction <= 1,
            f"hermes needs 0 <= shallow_fraction <= deep_fraction <= 1, got {self.shallow_fraction}, {self.deep_fraction}",
        )
        for name in ("lambda_shallow", "lambda_middle", "lambda_deep"):
            value = getattr(self, name)
            require(0 <= value <= 1, f"hermes.{name} must be in [0, 1], got {value}")
        require(self.profile in PROFILES, f"hermes.profile must be one of {', '.join(PROFILES)}, got {self.profile!r}")
        require(self.family in FAMILIES, f"hermes.family must be one of {', '.join(FAMILIES)}, got {self.family!r}")

    def pseudo_queries(self, history: tuple[tuple[str, str], ...]) -> dict[str, str]:
        texts = pseudo_query_texts(history, rewrite_choices=self.rewrite_choices)
        return {name: texts[name] for name in ATTENTION_BY_ROLE.values()}

    def resolved_family(self, state: StreamState) -> str:
        """qwen-vl or llava-ov: ``family``, or from the position axes (M-RoPE: qwen-vl) when auto."""
        if self.family != "auto":
            return self.family
        axes = state.layers[0].positions.shape[-1] if state.layers else 1
        return "qwen-vl" if axes == 3 else "llava-ov"

    def constants(self, state: StreamState) -> tuple[float, float, float, float]:
        """(omega0, gamma, k0, k1) in force: the parameters, or the official LLaVA-OV code's under the reference profile."""
        if self.profile == "reference" and self.resolved_family(state) == "llava-ov":
            return LLAVA_REFERENCE_CONSTANTS
        return self.omega0, self.gamma, self.k0, self.k1

    def roles(self, num_layers: int) -> list[LayerRole]:
        """Layer roles: exact ``int(fraction · L)`` (paper), or the official code's float arithmetic (reference)."""
        return layer_roles(num_layers, self.shallow_fraction, self.deep_fraction, exact=self.profile != "reference")

    def attention_layers(self, num_layers: int) -> dict[str, list[int]]:
        """Middle layers read the mixed pseudo-query's attention, deep ones the global one."""
        wanted: dict[str, list[int]] = {}
        for index, role in enumerate(self.roles(num_layers)):
            if role.kind in ATTENTION_BY_ROLE:
                wanted.setdefault(ATTENTION_BY_ROLE[role.kind], []).append(index)
        return wanted

    def layer_groups(self, num_layers: int) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = {}
        for index, role in enumerate(self.roles(num_layers)):
            groups.setdefault(role.kind, []).append(index)
        return groups

    def select(self, state: StreamState) -> list[LayerChoice]:
        if at_rest(self, state):
            return keep_all(state)
        roles = self.roles(state.num_layers)
        constants = self.constants(state)
        scores = [
            self.layer_score(layer, role, index, constants)
            for index, (layer, role) in enumerate(zip(state.layers, roles, strict=True))
        ]
        if self.smoothing:
            weights = [self.smoothing_weight(role) for role in roles]
            if self.smooth_by_identity:
                scores = smooth_across_layers(scores, [layer.token_id for layer in state.layers], weights)
            else:
                scores = smooth_by_index(scores, weights)
        return [self.choose(layer, score, role, state) for layer, score, role in zip(state.layers, scores, roles, strict=True)]

    def omega(self, role: LayerRole, constants: tuple[float, float, float, float] | None = None) -> float:
        """Recency weight ω_l."""
        omega0, gamma, _, _ = constants or (self.omega0, self.gamma, self.k0, self.k1)
        return {SHALLOW: 1.0, MIDDLE: omega0 - gamma * role.depth, DEEP: 0.0}[role.kind]

    def decay(self, role: LayerRole, constants: tuple[float, float, float, float] | None = None) -> float:
        """Recency decay k_l (unused in deep layers, where ω = 0)."""
        _, _, k0, k1 = constants or (self.omega0, self.gamma, self.k0, self.k1)
        return k0 - k1 * role.depth if role.kind == MIDDLE else k0

    def smoothing_weight(self, role: LayerRole) -> float:
        """λ_l: how much of the (smoothed) layer above a layer takes."""
        return {SHALLOW: self.lambda_shallow, MIDDLE: self.lambda_middle, DEEP: self.lambda_deep}[role.kind]

    def layer_score(self, layer: LayerTokens, role: LayerRole, index: int,
                    constants: tuple[float, float, float, float] | None = None) -> Tensor:
        """S_l = (1 − ω)·Â + ω·R̂ over the layer's tokens."""
        omega = self.omega(role, constants)
        recency_hat = min_max(recency(layer.n, self.decay(role, constants), layer.keys.device))
        if omega >= 1:
            return recency_hat
        attention_hat = min_max(pseudo_query_attention(layer, ATTENTION_BY_ROLE[role.kind], index))
        return (1 - omega) * attention_hat + omega * recency_hat

    def choose(self, layer: LayerTokens, score: Tensor, role: LayerRole, state: StreamState) -> LayerChoice:
        """TopK per layer; deep layers with summaries keep budget − 1 and fold the rest."""
        if not (self.summary and role.kind == DEEP):
            return LayerChoice(top_k_sorted(score, state.budget))
        candidates = score.masked_fill(layer.is_summary, -math.inf) if self.fold_old_summary else score
        keep = top_k_sorted(candidates, state.budget - 1)
        evicted = torch.ones(layer.n, dtype=torch.bool, device=keep.device)
        evicted[keep] = False
        summary = fold_summary(
            layer, keep, torch.nonzero(evicted).squeeze(1), state.rotary, per_axis=self.summary_position_per_axis
        )
        return LayerChoice(keep, summary)


def layer_roles(num_layers: int, shallow_fraction: float, deep_fraction: float, exact: bool = True) -> list[LayerRole]:
    """Role of each layer: shallow below int(shallow·L), deep from int(deep·L), middle between.

    ``exact``: the products in exact arithmetic on the fractions as written (0.7 · 90 = 63);
    otherwise in float, as the official code does (0.7 · 90 = 62.99… → 62).
    """
    first_middle = exact_floor(shallow_fraction, num_layers) if exact else int(num_layers * shallow_fraction)
    first_deep = exact_floor(deep_fraction, num_layers) if exact else int(num_layers * deep_fraction)

    def role(layer: int) -> LayerRole:
        if layer < first_middle:
            return LayerRole(SHALLOW, 0.0)
        if layer >= first_deep:
            return LayerRole(DEEP, 0.0)
        return LayerRole(MIDDLE, (layer - first_middle) / (first_deep - first_middle))

    return [role(layer) for layer in range(num_layers)]


def exact_floor(fraction: float, count: int) -> int:
    """int(fraction · count) in exact arithmetic on the fraction as written (0.7 · 90 = 63)."""
    return int(Fraction(str(fraction)) * count)


def recency(n: int, decay: float, device: torch.device | None = None) -> Tensor:
    """R_i = exp(−k · d_i) with d_i = (n − 1 − i) / max(n − 1, 1): 1 for the newest token."""
    age = torch.arange(n - 1, -1, -1, dtype=torch.float32, device=device) / max(n - 1, 1)
    return torch.exp(-decay * age)


def min_max(x: Tensor) -> Tensor:
    """(x − min x) / (max x − min x + 1e−6)."""
    if x.numel() == 0:
        return x
    low = x.min()
    return (x - low) / (x.max() - low + MINMAX_EPS)


def pseudo_query_attention(layer: LayerTokens, name: str, index: int) -> Tensor:
    """(N,) float32 attention the engine measured from pseudo-query ``name`` in this layer."""
    if name not in layer.attention:
        raise ValueError(f"hermes needs the {name!r} pseudo-query attention in layer {index}; the cache did not provide it")
    return layer.attention[name].to(device=layer.keys.device, dtype=torch.float32)


def align_by_id(values: Tensor, ids: Tensor, wanted: Tensor) -> Tensor:
    """``values`` (indexed like ``ids``) looked up at ``wanted`` ids; 0 where an id is absent."""
    if ids.numel() == 0:
        return torch.zeros(wanted.shape, dtype=values.dtype, device=values.device)
    order = torch.argsort(ids)
    sorted_ids = ids[order]
    slot = torch.searchsorted(sorted_ids, wanted).clamp(max=ids.numel() - 1)
    found = sorted_ids[slot] == wanted
    return torch.where(found, values[order][slot], torch.zeros((), dtype=values.dtype, device=values.device))


def smooth_across_layers(scores: list[Tensor], token_ids: list[Tensor], weights: list[float]) -> list[Tensor]:
    """S̃_{L−1} = S_{L−1}; S̃_l = (1 − λ_l)·S_l + λ_l·S̃_{l+1}, matched by token id, deepest first."""
    smoothed = list(scores)
    for layer in range(len(scores) - 2, -1, -1):
        above = align_by_id(smoothed[layer + 1], token_ids[layer + 1], token_ids[layer])
        smoothed[layer] = (1 - weights[layer]) * scores[layer] + weights[layer] * above
    return smoothed


def resample(scores: Tensor, n: int) -> Tensor:
    """``scores`` linearly interpolated to ``n`` points along the index (half-pixel centres).

    Output point i samples source coordinate ``(i + 0.5) · len / n − 0.5`` clamped at 0, between
    its two neighbours: ``F.interpolate(mode="linear", align_corners=False)``.
    """
    size = scores.shape[0]
    if size == n or size == 0:
        return scores if size == n else torch.zeros(n, dtype=scores.dtype, device=scores.device)
    source = ((torch.arange(n, dtype=torch.float64, device=scores.device) + 0.5) * (size / n) - 0.5).clamp(min=0)
    low = source.floor().long().clamp(max=size - 1)
    high = (low + 1).clamp(max=size - 1)
    weight = (source - low).to(scores.dtype)
    return scores[low] * (1 - weight) + scores[high] * weight


def smooth_by_index(scores: list[Tensor], weights: list[float]) -> list[Tensor]:
    """S̃_{L−1} = S_{L−1}; S̃_l = (1 − λ_l)·S_l + λ_l·S̃_{l+1} slot by slot, deepest first.

    A layer above of another length is resampled to this layer's length first (``resample``).
    """
    smoothed = list(scores)
    for layer in range(len(scores) - 2, -1, -1):
        above = resample(smoothed[layer + 1], scores[layer].shape[0])
        smoothed[layer] = (1 - weights[layer]) * scores[layer] + weights[layer] * above
    return smoothed


def summary_position(positions: Tensor, keep: Tensor, per_axis: bool = False) -> Tensor:
    """(A,) the summary's position after the kept tokens (all tokens if none kept).

    Default: the overall max of the kept positions + 1 on every axis (official code);
    ``per_axis``: max + 1 of each axis separately.
    """
    source = positions[keep] if keep.numel() else positions
    if per_axis:
        return source.max(dim=0).values + 1
    return torch.full((positions.shape[-1],), int(source.max()) + 1, dtype=positions.dtype, device=positions.device)


def fold_summary(layer: LayerTokens, keep: Tensor, evicted: Tensor, rotary: Rotary | None,
                 per_axis: bool = False) -> Summary:
    """One token for all ``evicted`` entries: mean value, mean key phase-aligned at its position."""
    position = summary_position(layer.positions, keep, per_axis)
    keys = take_tokens(layer.keys, evicted)
    if rotary is not None:
        keys = rotary.rotate(keys, position.unsqueeze(0) - layer.positions.index_select(0, evicted))
    key = keys.float().mean(dim=-2).to(layer.keys.dtype)
    value = take_tokens(layer.values, evicted).float().mean(dim=-2).to(layer.values.dtype)
    return Summary(key=key, value=value, position=position)


OPTION_LINE = re.compile(r"^\s*\(?([A-Z])[).:]\s*(.+?)\s*$", re.MULTILINE)
LETTER_ANSWER = re.compile(r"^\s*(?:\()?([A-Z])(?:\))?\.?\s*$")
LETTER_PREFIX = re.compile(r"[A-Z]\) ")


def choice_options(question: str) -> dict[str, str]:
    """Options of a multiple-choice question, one per line as "(A) text", "A) text", "A. text" or "A: text"."""
    return {letter: text for letter, text in OPTION_LINE.findall(question)}


def rewrite_choice_answer(question: str, answer: str) -> str:
    """As the official code: a bare letter answer becomes that option's text; "X) " prefixes are dropped."""
    match = LETTER_ANSWER.match(answer)
    if match:
        answer = choice_options(question).get(match.group(1), answer)
    return LETTER_PREFIX.sub("", answer)


def pseudo_query_texts(history: tuple[tuple[str, str], ...], rewrite_choices: bool = True) -> dict[str, str]:
    """The local, global and mixed (local + "; " + global) pseudo-queries, after the last Q/A."""
    local, global_ = LOCAL_QUERY, GLOBAL_QUERY
    if history:
        question, answer = history[-1]
        if rewrite_choices:
            answer = rewrite_choice_answer(question, answer)
        context = f"Question: {question} Answer: {answer}"
        local = f"Find recent details related to: {context}. " + local
        global_ = f"Context summary: {context}. " + global_
    return {"local": local, "global": global_, "mixed": local + "; " + global_}
