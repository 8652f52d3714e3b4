"""What ``--kv-bits 8`` changes: memory, snapshot size and the answers' logits, against 16 bits.

``python -m hermes_cli.engine.microbench.kvbits --arch llava-onevision-0.5b --dtype bfloat16 --frames 32 --chunk 8 --budget 6000``
streams the same synthetic-vision frames into two sessions of the same full-size random-weight
model — keys and values in the model's dtype, and int8 with float16 scales — then asks the same
``--questions`` questions of both (no history, so each sees the same memory) and prints, per
question, the max and mean absolute difference of the first answer token's logits and whether
the greedy answers (``--max-new-tokens``) are the same; then ``kv_bytes`` and the snapshot
file's bytes of both and their ratio. Random weights: this measures what quantisation does to
the computation, not to answer quality, which is for real weights to judge.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

QUESTIONS = (
    "What is happening in the video?", "What color is the background?", "How many objects are there?",
    "What moves first?", "Describe the scene.", "What happens at the end?", "Is there a person?",
    "Where is the camera?", "What is on the left?", "What is on the right?", "What changes over time?",
    "What is the main object?", "Is it indoors or outdoors?", "What is the weather like?",
    "What sound would this make?", "What happened before this?", "What will happen next?",
    "Summarize the video.", "What is in the center?", "What is the mood of the video?",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="llava-onevision-0.5b")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--frames", type=int, default=32)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--budget", type=int, default=6000)
    parser.add_argument("--policy", default="hermes")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--size-budget", type=int, default=6000,
                        help="also give kv_bytes and snapshot bytes of a memory holding this many stream tokens")
    args = parser.parse_args(argv)


    from policies import make_policy

    from ...models.archs import load_random_arch
    from ...models.synthetic import bench_adapter, synthetic_frames
    from .. import snapshot
    from ..session import Session, SessionConfig

    adapter = bench_adapter(load_random_arch(args.arch, device=None, dtype=args.dtype),
                            synthetic_vision=True)
    sessions = {}
    for bits in (16, 8):
        config = SessionConfig(budget=args.budget, chunk_frames=args.chunk, history=False,
                               max_new_tokens=args.max_new_tokens, kv_bits=bits)
        session = Session(adapter, make_policy(args.policy), config)
        frames = synthetic_frames()
        for _ in range(args.frames):
            frame, ts = next(frames)
            session.ingest([frame], [ts])
        session.flush()
        sessions[bits] = session
        print(f"{bits}-bit: {session.cache.length} tokens/layer, {session.compressions} compressions", flush=True)
    rows = []
    for question in (QUESTIONS * (args.questions // len(QUESTIONS) + 1))[: args.questions]:
        answers = {bits: s.answer(question, record_logits=True) for bits, s in sessions.items()}
        diff = (answers[8].step_logits[0] - answers[16].step_logits[0]).abs()
        rows.append((float(diff.max()), float(diff.mean()), answers[8].tokens == answers[16].tokens,
                     float(answers[16].step_logits[0].abs().max())))
        print(f"  max |Δ| {rows[-1][0]:.4f} · mean |Δ| {rows[-1][1]:.5f} · same answer {rows[-1][2]} · "
              f"max |logit| {rows[-1][3]:.2f}  ({question})", flush=True)
    print(f"first-token logits over {len(rows)} questions: max |Δ| median {statistics.median(r[0] for r in rows):.4f} "
          f"(worst {max(r[0] for r in rows):.4f}), mean |Δ| median {statistics.median(r[1] for r in rows):.5f}; "
          f"same greedy answer ({args.max_new_tokens} tokens) {sum(r[2] for r in rows)}/{len(rows)}")
    sizes = {}
    with tempfile.TemporaryDirectory() as folder:
        for bits, session in sessions.items():
            report = snapshot.save(session, Path(folder) / f"{bits}.safetensors")
            sizes[bits] = (session.cache.kv_bytes(), report.bytes)
    for bits, (kv, file) in sizes.items():
        print(f"{bits}-bit ({args.dtype}): kv_bytes {kv} · snapshot {file} bytes")
    print(f"8-bit / 16-bit: kv_bytes {sizes[8][0] / sizes[16][0]:.3f} · snapshot {sizes[8][1] / sizes[16][1]:.3f}")
    if args.size_budget:
        full = memory_sizes(adapter, args.size_budget, args.chunk)
        print(f"a memory of {args.size_budget} stream tokens ({args.dtype}): " + " · ".join(
            f"{bits}-bit kv_bytes {kv} snapshot {file}" for bits, (kv, file) in full.items())
            + f" · 8/16: kv_bytes {full[8][0] / full[16][0]:.3f}, snapshot {full[8][1] / full[16][1]:.3f}")


def memory_sizes(adapter, tokens: int, chunk: int) -> dict[int, tuple[int, int]]:
    """(kv_bytes, snapshot file bytes) per width of a session whose memory holds ``tokens`` stream
    tokens of the model's real shape (layers, key-value heads, head size, dtype). The content is
    seeded random numbers imported into the cache: sizes do not depend on it, and no forward runs."""
    import tempfile

    import torch

    from policies import make_policy

    from .. import snapshot
    from ..cache import KIND_VIDEO, TokenMeta
    from ..session import Session, SessionConfig

    out = {}
    for bits in (16, 8):
        session = Session(adapter, make_policy("full"), SessionConfig(budget=None, chunk_frames=chunk, kv_bits=bits))
        held = session.cache.export_layers()  # the prefix, in this width
        p = int(held[0]["keys"].shape[-2])
        g = torch.Generator().manual_seed(0)
        layers = []
        for l, layer in enumerate(session.cache.stream_layers):
            prefix_k, prefix_v = layer.stored_keys(), layer.stored_values()
            keys = torch.cat([prefix_k, torch.randn(1, prefix_k.shape[1], tokens, prefix_k.shape[-1], generator=g)
                              .to(prefix_k.dtype)], dim=2)
            values = torch.cat([prefix_v, torch.randn(1, prefix_v.shape[1], tokens, prefix_v.shape[-1], generator=g)
                                .to(prefix_v.dtype)], dim=2)
            axes = session.cache.meta(l).positions.shape[-1]
            meta = TokenMeta.cat([session.cache.meta(l), TokenMeta.new(
                KIND_VIDEO, p, torch.arange(p, p + tokens)[:, None].expand(-1, axes).contiguous(),
                frame=torch.arange(tokens) // 196,
                patch=torch.arange(tokens) % 196)])
            layers.append({"keys": keys, "values": values, "kind": meta.kind, "token_id": meta.token_id,
                           "frame": meta.frame, "patch": meta.patch, "positions": meta.positions})
        session.cache.import_layers(layers, p + tokens, dtype=adapter.dtype)
        with tempfile.TemporaryDirectory() as folder:
            report = snapshot.save(session, Path(folder) / "memory.safetensors")
        out[bits] = (session.cache.kv_bytes(), report.bytes)
    return out


if __name__ == "__main__":
    main()
