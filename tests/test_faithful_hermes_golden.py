"""Golden streams: the ``hermes`` policy under ``profile=reference`` against the official algorithm.

``OfficialHermes`` below is a small, separately written re-working of what the official HERMES
code does at each compression (``prune_kv_cache_by_attention`` then the shrink step of
``_shrink_positions_and_rerotate_keys``, for ``inference/qwenvl_hermes.py`` and
``inference/llavaov_hermes.py``), step by step on plain tensors: a cache that *includes* the
system-prompt prefix, softmax rows over prefix + stream + the pseudo-query's own keys sliced
``[prefix : −q]``, layer split in float arithmetic, per-family middle constants, index-aligned
smoothing with ``F.interpolate`` when lengths differ, ``topk`` of each layer's budget (deep:
budget − 1 over *every* token, an old summary included), prefix indices kept, the evicted
entries folded with keys rotated by textbook RoPE / M-RoPE to ``max(kept positions) + 1``, and
the next chunk placed at each layer's own ``max + 1``. It shares no code with ``policies/``.

Each family runs ≥ 8 compressions on seeded random keys, values and attention; at every step the
policy's kept indices must equal the official ones in every layer, and the summary tokens'
values, keys and positions must match.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hermes_cli.positions.rope import RotaryDelta
from policies import LayerTokens, StreamState, make_policy

VARIANT: dict = {}  # mutation checks set policy options here; the test must then fail
PREFIX = 3  # system-prompt tokens at the head of every layer's cache
HEADS, DIM = 2, 12
THETA = 100.0


def inv_freq() -> torch.Tensor:
    return 1.0 / THETA ** (torch.arange(0, DIM, 2, dtype=torch.float64) / DIM)


def textbook_rotate(keys: torch.Tensor, old: torch.Tensor, new: torch.Tensor, section) -> torch.Tensor:
    """Rotate (H, N, D) keys from positions ``old`` to ``new`` (N, A): angle per frequency from its axis."""
    freqs = inv_freq()
    if section is None:
        axis = torch.zeros(DIM // 2, dtype=torch.long)
    else:
        axis = torch.cat([torch.full((s,), i, dtype=torch.long) for i, s in enumerate(section)])
    delta = (new - old).to(torch.float64)[:, axis] * freqs  # (N, D/2)
    delta = torch.cat((delta, delta), dim=-1)
    half = DIM // 2
    rotated = torch.cat((-keys[..., half:], keys[..., :half]), dim=-1)
    return (keys.double() * delta.cos() + rotated.double() * delta.sin()).float()


class OfficialHermes:
    """The official code's per-step algorithm on a plain cache (prefix included)."""

    def __init__(self, family: str, num_layers: int, budget: int):
        self.family, self.num_layers, self.budget = family, num_layers, budget
        self.short = int(num_layers * 0.1)
        self.long = int(num_layers * (1 - 0.3))
        self.section = (2, 2, 2) if family == "qwen-vl" else None

    def layer_type(self, layer: int) -> str:
        if layer < self.short:
            return "short"
        return "long" if layer >= self.long else "mid"

    def scores(self, rows: dict[str, list[torch.Tensor]]) -> tuple[list[torch.Tensor], list[int]]:
        """Raw per-layer scores and budgets from softmax rows (H, q, PREFIX + N + q)."""
        raw, budgets = [], []
        for layer in range(self.num_layers):
            kind = self.layer_type(layer)
            if kind == "short":
                weights, alpha, k = rows["local"][layer], 1.0, 20.0
            elif kind == "long":
                weights, alpha, k = rows["global"][layer], 0.0, 0.0
            else:
                weights = rows["mixed"][layer]
                p = (layer - self.short) / (self.long - self.short)
                alpha, k = (0.75 - 0.6 * p, 20 - 12 * p) if self.family == "qwen-vl" else (1.0 - 0.9 * p, 20 - 19.5 * p)
            q = weights.shape[1]
            visual = weights.mean(dim=0)[:, PREFIX:-q].mean(dim=0)
            n = visual.shape[0]
            distance = (n - 1 - torch.arange(n, dtype=torch.float32)) / max(n - 1, 1)
            recency = torch.exp(-k * distance)
            a = (visual - visual.min()) / (visual.max() - visual.min() + 1e-6)
            r = (recency - recency.min()) / (recency.max() - recency.min() + 1e-6)
            raw.append(a * (1 - alpha) + r * alpha)
            budgets.append(min(self.budget - 1 if kind == "long" else self.budget, n))
        return raw, budgets

    def smooth(self, raw: list[torch.Tensor]) -> list[torch.Tensor]:
        refined = [s.clone() for s in raw]
        for i in range(len(refined) - 2, -1, -1):
            gamma = {"long": 0.4, "mid": 0.3, "short": 0.1}[self.layer_type(i)]
            nxt = refined[i + 1]
            if nxt.shape[0] != refined[i].shape[0]:
                nxt = F.interpolate(nxt.view(1, 1, -1), size=refined[i].shape[0], mode="linear",
                                    align_corners=False).view(-1)
            refined[i] = (1 - gamma) * refined[i] + gamma * nxt
        return refined

    def keep_indices(self, rows) -> list[torch.Tensor]:
        raw, budgets = self.scores(rows)
        out = []
        for score, budget in zip(self.smooth(raw), budgets):
            top = torch.sort(torch.topk(score, budget, sorted=False).indices + PREFIX).values
            out.append(torch.cat([torch.arange(PREFIX), top]))
        return out

    def shrink(self, cache: list[dict], keep: list[torch.Tensor]) -> list[dict]:
        """Gather kept entries; deep layers append the folded summary at max(kept positions) + 1."""
        new = []
        for layer, (entry, idx) in enumerate(zip(cache, keep)):
            k, v, pos = entry["k"][:, idx], entry["v"][:, idx], entry["pos"][idx]
            out = {"k": k, "v": v, "pos": pos, "id": entry["id"][idx]}
            if self.layer_type(layer) == "long":
                mask = torch.ones(entry["pos"].shape[0], dtype=torch.bool)
                mask[idx] = False
                pruned = torch.nonzero(mask).squeeze(1)
                if pruned.numel():
                    if self.section is None:
                        target = torch.full((1, 1), int(pos[-1, 0]) + 1)
                    else:
                        target = torch.full((1, 3), int(pos.max()) + 1)
                    old = entry["pos"][pruned]
                    k_sum = textbook_rotate(entry["k"][:, pruned], old, target.expand_as(old), self.section).mean(1)
                    v_sum = entry["v"][:, pruned].mean(1)
                    out = {
                        "k": torch.cat([k, k_sum.unsqueeze(1)], 1), "v": torch.cat([v, v_sum.unsqueeze(1)], 1),
                        "pos": torch.cat([pos, target]), "id": torch.cat([out["id"], torch.tensor([-1])]),
                    }
            new.append(out)
        return new


def chunk_positions(family: str, start: int, units: int, rows: int, cols: int) -> torch.Tensor:
    """Qwen2.5-VL: t = start + unit · 2 s · 2 tokens/s, h = start + row, w = start + col; LLaVA: 1-D consecutive."""
    if family == "llava-ov":
        return torch.arange(start, start + units * rows * cols + 1).unsqueeze(1)  # + a newline token
    t = torch.arange(units).repeat_interleave(rows * cols) * 4
    h = torch.arange(rows).repeat_interleave(cols).repeat(units)
    w = torch.arange(cols).repeat(units * rows)
    return torch.stack([t, h, w], dim=1) + start


def layer_tokens(layer: int, entry: dict, rows: dict[str, torch.Tensor]) -> LayerTokens:
    """The stream part of an official cache layer as the engine hands it to a policy.

    A stream token has the same id in every layer; a summary gets an id of its own.
    """
    ids = entry["id"][PREFIX:]
    summary = ids < 0
    token_id = torch.where(summary, 10**6 + layer * 10**4 + torch.arange(ids.shape[0]), ids)
    frame = torch.where(summary, torch.full_like(ids, -1), ids // 100)
    patch = torch.where(summary, torch.full_like(ids, -1), ids % 100)
    length = entry["pos"].shape[0]
    attention = {name: w.float().mean(dim=(0, 1))[PREFIX:length] for name, w in rows.items()}
    return LayerTokens(
        keys=entry["k"][:, PREFIX:], values=entry["v"][:, PREFIX:], token_id=token_id,
        frame=frame, patch=patch, positions=entry["pos"][PREFIX:], is_summary=summary, attention=attention,
    )


@pytest.mark.parametrize("family", ["qwen-vl", "llava-ov"])
def test_reference_profile_reproduces_the_official_algorithm_over_a_stream(family):
    generator = torch.Generator().manual_seed(11 if family == "qwen-vl" else 12)
    num_layers, budget, units, rows, cols = 10, 20, 2, 2, 3
    axes = 3 if family == "qwen-vl" else 1
    official = OfficialHermes(family, num_layers, budget)
    policy = make_policy("hermes", **{"profile": "reference", **VARIANT})
    rotary = RotaryDelta(inv_freq(), official.section)
    prefix = {"k": torch.randn(HEADS, PREFIX, DIM, generator=generator), "pos": torch.arange(PREFIX).unsqueeze(1).expand(-1, axes)}
    cache = [
        {"k": prefix["k"].clone(), "v": torch.randn(HEADS, PREFIX, DIM, generator=generator), "pos": prefix["pos"].clone(),
         "id": torch.full((PREFIX,), -2)}
        for _ in range(num_layers)
    ]
    compressions, next_unit = 0, 0
    for step in range(20):
        for layer, entry in enumerate(cache):  # each layer places the chunk at its own max + 1
            pos = chunk_positions(family, int(entry["pos"].max()) + 1, units, rows, cols)
            n = pos.shape[0]
            unit = next_unit + torch.arange(n).clamp(max=units * rows * cols - 1) // (rows * cols)
            patch = torch.arange(n) % (rows * cols) if family == "qwen-vl" else torch.cat(
                [torch.arange(units * rows * cols) % (rows * cols), torch.tensor([rows * cols])])
            entry["k"] = torch.cat([entry["k"], torch.randn(HEADS, n, DIM, generator=generator)], 1)
            entry["v"] = torch.cat([entry["v"], torch.randn(HEADS, n, DIM, generator=generator)], 1)
            entry["pos"] = torch.cat([entry["pos"], pos])
            entry["id"] = torch.cat([entry["id"], unit * 100 + patch])
        next_unit += units
        stream = cache[0]["pos"].shape[0] - PREFIX
        if stream <= budget:
            continue
        rows_by_query = {}
        for name, q in (("local", 4), ("global", 5), ("mixed", 9)):
            rows_by_query[name] = [
                torch.softmax(3 * torch.randn(HEADS * 2, q, entry["pos"].shape[0] + q, generator=generator), dim=-1)
                for entry in cache
            ]
        expected = official.keep_indices(rows_by_query)
        state = StreamState(
            layers=[layer_tokens(l, entry, {n: r[l] for n, r in rows_by_query.items()}) for l, entry in enumerate(cache)],
            budget=budget, tokens_per_frame=rows * cols, rotary=rotary,
        )
        choices = policy.select(state)
        after = official.shrink(cache, expected)
        for layer, (choice, keep, entry) in enumerate(zip(choices, expected, after)):
            assert (choice.keep + PREFIX).tolist() == keep[PREFIX:].tolist(), f"step {compressions} layer {layer}"
            if official.layer_type(layer) == "long":
                s = choice.summary
                assert s is not None
                assert s.position.tolist() == entry["pos"][-1].tolist()
                torch.testing.assert_close(s.value, entry["v"][:, -1])
                torch.testing.assert_close(s.key, entry["k"][:, -1], atol=1e-5, rtol=1e-5)
            else:
                assert choice.summary is None
        cache = after
        compressions += 1
    assert compressions >= 8
    kept_old_summaries = sum(int((entry["id"] == -1).sum()) for entry in cache)
    deep_layers = num_layers - official.long
    assert kept_old_summaries > deep_layers  # old summaries really competed and some stayed


def test_the_golden_stream_tells_the_profiles_apart_on_llava():
    """LLaVA-OV's reference constants differ from the paper's: the middle layers' kept sets differ."""
    n, budget = 30, 20
    scores = {}
    for profile in ("paper", "reference"):
        layers = []
        g = torch.Generator().manual_seed(4)
        for _ in range(10):
            layers.append(LayerTokens(
                keys=torch.randn(HEADS, n, DIM, generator=g), values=torch.randn(HEADS, n, DIM, generator=g),
                token_id=torch.arange(n), frame=torch.arange(n) // 6, patch=torch.arange(n) % 6,
                positions=torch.arange(n).unsqueeze(1), is_summary=torch.zeros(n, dtype=torch.bool),
                attention={"mixed": torch.rand(n, generator=g), "global": torch.rand(n, generator=g)},
            ))
        state = StreamState(layers, budget, 6, None)
        scores[profile] = [c.keep.tolist() for c in make_policy("hermes", profile=profile).select(state)]
    assert scores["paper"][7:] == scores["reference"][7:]  # deep layers do not use the constants
    assert any(a != b for a, b in zip(scores["paper"][1:7], scores["reference"][1:7]))
