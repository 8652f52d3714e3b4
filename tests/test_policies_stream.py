"""Every policy on simulated streams: the engine's cache and compression step, no model.

``Stream`` appends chunks of random keys/values to every layer of a ``StreamingCache`` (fresh
token ids shared by all layers) and runs the engine's model-free ``compress`` step with random
pseudo-query attention whenever the policy asks to compress. Hypothesis draws the stream
shapes, budgets and policy options.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_cli.engine.cache import KIND_VIDEO, StreamingCache, TokenMeta
from hermes_cli.engine.compression import Signals, compress, policy_state
from policies import POLICIES, LayerChoice, Policy, StreamState, make_policy

FIELDS = ("keys", "values", "token_id", "frame", "patch", "positions", "is_summary")


class ToyRotary:
    """RoPE over 1 or 3 position axes (the frequencies split into contiguous sections per axis)."""

    def __init__(self, dim: int, axes: int):
        self.inv_freq = 1.0 / 10.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        self.axis_of_freq = torch.arange(dim // 2) * axes // (dim // 2)

    def rotate(self, keys, delta):
        angle = delta[:, self.axis_of_freq].to(torch.float64) * self.inv_freq
        angle = torch.cat((angle, angle), dim=-1)
        half = keys.shape[-1] // 2
        rotated_half = torch.cat((-keys[..., half:], keys[..., :half]), dim=-1)
        return (keys * angle.cos() + rotated_half * angle.sin()).to(keys.dtype)


@dataclass(frozen=True)
class Spec:
    seed: int
    chunks: int
    tokens_per_frame: int
    max_frames_per_chunk: int
    newline: bool  # LLaVA-OneVision style: one extra token (patch = tokens_per_frame) per chunk
    axes: int
    num_layers: int
    budget: int


@dataclass
class Stream:
    policy: Policy
    spec: Spec
    heads: int = 2
    dim: int = 4
    appended: list[int] = field(init=False, default_factory=list)  # stream token ids, oldest first
    compressions: int = field(init=False, default=0)

    def __post_init__(self):
        self.random = random.Random(self.spec.seed)
        self.generator = torch.Generator().manual_seed(self.spec.seed)
        self.rotary = ToyRotary(self.dim, self.spec.axes)
        self.cache = StreamingCache(self.spec.num_layers)
        self.next_frame = self.next_position = 0

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def layers(self) -> list[dict[str, torch.Tensor]]:
        """Each layer's stream tokens (copies), by field."""
        views = [self.cache.stream_view(l) for l in range(self.spec.num_layers)]
        return [{name: getattr(view, name).clone() for name in FIELDS} for view in views]

    def append_chunk(self) -> None:
        frames = self.random.randint(1, self.spec.max_frames_per_chunk)
        tpf = self.spec.tokens_per_frame
        frame = torch.arange(self.next_frame, self.next_frame + frames).repeat_interleave(tpf)
        patch = torch.arange(tpf).repeat(frames)
        if self.spec.newline:
            frame = torch.cat([frame, frame[-1:]])
            patch = torch.cat([patch, torch.tensor([tpf])])
        n = frame.shape[0]
        positions = self.positions(frame, patch)
        for layer in range(self.spec.num_layers):  # what the model's attention does for each layer
            keys = torch.randn(1, self.heads, n, self.dim, generator=self.generator)
            values = torch.randn(1, self.heads, n, self.dim, generator=self.generator)
            self.cache.update(keys, values, layer)
        first = self.cache.new_ids(n)
        self.appended += list(range(first, first + n))
        self.cache.record(TokenMeta.new(KIND_VIDEO, first, positions, frame=frame, patch=patch))
        self.next_frame += frames

    def positions(self, frame: torch.Tensor, patch: torch.Tensor) -> torch.Tensor:
        """1-D: consecutive; 3-D: (t, h, w) = start + (frame offset, patch // 2, patch % 2)."""
        start = self.next_position
        if self.spec.axes == 1:
            positions = torch.arange(start, start + frame.shape[0]).unsqueeze(1)
        else:
            positions = torch.stack([start + frame - frame[0], start + patch // 2, start + patch % 2], dim=1)
        self.next_position = int(positions.max()) + 1
        return positions

    def signals(self, budget: int | None = None, history=()) -> Signals:
        names = self.policy.pseudo_queries(history)
        attention = {name: [torch.rand(self.length, generator=self.generator) for _ in range(self.spec.num_layers)]
                     for name in names}
        budget = self.spec.budget if budget is None else budget
        return Signals(budget=budget, tokens_per_frame=self.spec.tokens_per_frame, attention=attention,
                       rotary=self.rotary)

    def state(self, budget: int | None = None, history=()) -> StreamState:
        return policy_state(self.cache, self.signals(budget, history))

    def compress_if_needed(self, history=()) -> list[LayerChoice] | None:
        if not self.policy.should_compress(self.length, self.spec.budget):
            return None
        choices = compress(self.cache, self.policy, self.signals(history=history))
        self.compressions += 1
        return choices


@st.composite
def specs(draw, max_chunks: int = 200, max_budget: int = 24) -> Spec:
    return Spec(
        seed=draw(st.integers(0, 2**16)),
        chunks=draw(st.integers(1, max_chunks)),
        tokens_per_frame=draw(st.integers(1, 4)),
        max_frames_per_chunk=draw(st.integers(1, 3)),
        newline=draw(st.booleans()),
        axes=draw(st.sampled_from([1, 3])),
        num_layers=draw(st.integers(1, 10)),
        budget=draw(st.integers(1, max_budget)),
    )


OPTIONS = {
    "full": st.just({}),
    "fifo": st.just({}),
    "sink": st.fixed_dictionaries({"n_sink": st.integers(0, 12)}),
    "uniform": st.just({}),
    "infinipot": st.fixed_dictionaries({
        "ratio": st.sampled_from([0.5, 0.75, 1.0]),
        "alpha": st.sampled_from([0.0, 0.5, 1.0]),
        "recent_fraction": st.sampled_from([0.125, 0.25, 1.0]),
        "van_pool": st.booleans(),
        "per_head": st.booleans(),
        "profile": st.sampled_from(["paper", "reference"]),
    }),
    "hermes": st.fixed_dictionaries({
        "smoothing": st.booleans(), "summary": st.booleans(), "profile": st.sampled_from(["paper", "reference"]),
        "smooth_by_identity": st.booleans(), "fold_old_summary": st.booleans(),
        "summary_position_per_axis": st.booleans(),
    }),
}


def ids(layer) -> list[int]:
    return layer["token_id"].tolist()


def check_choices(choices: list[LayerChoice], stream: Stream, n: int) -> None:
    """One choice per layer, sorted in-range indices, every layer at the policy's target."""
    policy, spec = stream.policy, stream.spec
    assert len(choices) == spec.num_layers
    target = policy.target(spec.budget, spec.tokens_per_frame)
    for choice in choices:
        keep = choice.keep
        assert keep.dtype == torch.long and keep.dim() in ((1, 2) if policy.keeps_per_head() else (1,))
        assert keep.dim() == 1 or keep.shape[0] == stream.heads  # a set per key-value head
        assert bool((keep.diff() > 0).all()) and (keep.numel() == 0 or (int(keep.min()) >= 0 and int(keep.max()) < n))
        assert choice.size == target
        if choice.summary is not None:
            assert choice.summary.key.shape == choice.summary.value.shape == (stream.heads, stream.dim)
            assert choice.summary.position.shape == (spec.axes,)


def check_after_compression(stream: Stream, choices: list[LayerChoice], before: list[dict]) -> None:
    """The cache invariants, plus what each policy promises about which tokens stay."""
    policy, spec = stream.policy, stream.spec
    lengths = {layer["token_id"].shape[-1] for layer in stream.layers}
    assert len(lengths) == 1 and lengths.pop() <= spec.budget
    if policy.name == "fifo":
        assert all(ids(layer) == stream.appended[-spec.budget:] for layer in stream.layers)
    if policy.name == "sink":
        n_sink = min(policy.n_sink, spec.budget // 2)
        window = stream.appended[len(stream.appended) - (spec.budget - n_sink):]
        assert all(ids(layer) == stream.appended[:n_sink] + window for layer in stream.layers)
    if policy.name == "uniform":
        check_whole_frames(stream)
    if policy.name == "hermes":
        check_summaries(stream, choices, before)
    if policy.name != "hermes":
        assert all(choice.summary is None for choice in choices)


def check_whole_frames(stream: Stream) -> None:
    """uniform: the same tokens in every layer, and each kept frame has all its grid patches."""
    first = stream.layers[0]
    assert all(ids(layer) == ids(first) for layer in stream.layers)
    grid = first["patch"] < stream.spec.tokens_per_frame
    frames, counts = torch.unique(first["frame"][grid], return_counts=True)
    assert bool((counts == stream.spec.tokens_per_frame).all())


def check_summaries(stream: Stream, choices: list[LayerChoice], before: list[dict]) -> None:
    """hermes: once anything was evicted, deep layers hold a new summary; with fold_old_summary
    exactly one (an old one is never kept), otherwise old ones may stay by competing in top-k."""
    policy = stream.policy
    for layer, choice, old, role in zip(stream.layers, choices, before, policy.roles(stream.spec.num_layers)):
        deep = policy.summary and role.kind == "deep"
        held = int(layer["is_summary"].sum())
        if not deep:
            assert held == 0
        elif policy.fold_old_summary:
            assert held == 1 and not bool(old["is_summary"][choice.keep].any())
        else:
            assert choice.summary is not None and 1 <= held <= stream.compressions + 1


def run(stream: Stream) -> None:
    for _ in range(stream.spec.chunks):
        stream.append_chunk()
        n, before = stream.length, [dict(layer) for layer in stream.layers]
        choices = stream.compress_if_needed()
        if choices is not None:
            check_choices(choices, stream, n)
            check_after_compression(stream, choices, before)


def check_a_random_stream(name: str, data, max_chunks: int) -> None:
    spec = data.draw(specs(max_chunks=max_chunks), label="spec")
    policy = make_policy(name, **data.draw(OPTIONS[name], label="options"))
    stream = Stream(policy, spec)
    run(stream)
    if name != "full":
        peak = spec.budget + spec.max_frames_per_chunk * spec.tokens_per_frame + spec.newline
        assert stream.length <= peak


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_policy_keeps_the_cache_invariants(name, data):
    check_a_random_stream(name, data, max_chunks=200)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_policy_keeps_the_cache_invariants_on_many_long_streams(name, data):
    check_a_random_stream(name, data, max_chunks=400)


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_a_budget_larger_than_the_stream_equals_full(name, data):
    spec = data.draw(specs(max_chunks=30), label="spec")
    total = spec.chunks * (spec.max_frames_per_chunk * spec.tokens_per_frame + spec.newline)
    spec = Spec(**{**spec.__dict__, "budget": total + data.draw(st.integers(1, 5), label="spare")})
    options = data.draw(OPTIONS[name], label="options")
    streams = Stream(make_policy(name, **options), spec), Stream(make_policy("full"), spec)
    for stream in streams:
        run(stream)
    assert streams[0].compressions == 0
    for mine, full in zip(*(s.layers for s in streams)):
        assert all(torch.equal(mine[f], full[f]) for f in FIELDS)
    for choice, layer in zip(streams[0].policy.select(streams[0].state()), streams[0].layers):
        assert torch.equal(choice.keep, torch.arange(layer["token_id"].shape[0])) and choice.summary is None


def test_hermes_keeps_one_summary_through_questions_and_history():
    spec = Spec(seed=3, chunks=40, tokens_per_frame=3, max_frames_per_chunk=2, newline=True, axes=3,
                num_layers=10, budget=9)
    stream = Stream(make_policy("hermes", fold_old_summary=True), spec)
    history = (("What is on the table?", "A cup."),)
    for _ in range(spec.chunks):
        stream.append_chunk()
        stream.compress_if_needed(history)
    assert [int(layer["is_summary"].sum()) for layer in stream.layers] == [0] * 7 + [1] * 3


@pytest.mark.parametrize("name", list(POLICIES))
def test_policies_at_a_realistic_size(name):
    """28 layers, 196 tokens per frame + a newline per chunk, 2K budget: the invariants hold."""
    spec = Spec(seed=0, chunks=12, tokens_per_frame=196, max_frames_per_chunk=4, newline=True, axes=1,
                num_layers=28, budget=2048)
    run(Stream(make_policy(name), spec, heads=2, dim=16))
