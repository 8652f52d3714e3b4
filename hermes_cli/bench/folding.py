"""What hermes's pseudo-query attention costs on top of a chunk's prefill, four ways, side by side.

``python -m hermes_cli.bench.folding --arch llava-onevision-0.5b --frames 32 --chunk 16``
fills a memory with ``--frames`` frames (synthetic vision, nothing evicted), then times the next
chunk, each variant from the same memory (rolled back in between), in rounds:

- ``plain``: the chunk's prefill alone (what fifo pays);
- ``folded``: the chunk's prefill with the pseudo-queries in the same forward (what hermes does);
- ``separate``: the prefill, then a separate row-only pseudo-query forward (where folding cannot apply);
- ``eager``: the prefill, then the pseudo-query forward with eager attention and every layer's
  full weights (what hermes did before).

Each round runs the four in turn; the first ``--warmup-rounds`` are not counted (the first run of
each path pays first-touch memory costs). Prints the median seconds of each and their ratio to
``plain``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ..settings import add_arguments


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=None, help="full-size random-weight architecture (default: --model)")
    add_arguments(parser, {"model": "tiny", "chunk": 16})  # flags, types and help from the settings schema
    parser.add_argument("--frames", type=int, default=32, help="frames in the memory before the timed chunk")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (medians)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="unmeasured rounds first (first-touch costs)")
    args = parser.parse_args(argv)

    import torch

    from policies import make_policy

    from ..engine.cache import KIND_VIDEO
    from ..engine.compression import prefill_with_pseudo_queries, pseudo_query_attention, side_by_side_mask
    from ..engine.prefill import prefill
    from ..engine.session import Session, SessionConfig
    from ..models.loading import load_model
    from .runner import bench_adapter, synthetic_frames

    if args.arch:
        from ..models.archs import load_random_arch

        adapter = load_random_arch(args.arch, device=None, dtype=None)
    else:
        adapter = load_model(args.model)
    adapter = bench_adapter(adapter, synthetic_vision=True)
    session = Session(adapter, make_policy("full"), SessionConfig(budget=None, chunk_frames=args.chunk))
    frames = synthetic_frames()
    for _ in range(args.frames):
        frame, ts = next(frames)
        session.ingest([frame], [ts])
    session.flush()
    hermes = make_policy("hermes")
    layers = hermes.attention_layers(adapter.num_layers)
    texts = {name: text for name, text in hermes.pseudo_queries(()).items() if layers.get(name)}
    cache, positions = session.cache, session.positions
    chunk = adapter.encode(next(frames)[0][None].repeat(args.chunk, axis=0), session.units_seen)
    where = positions.for_chunk(chunk, session.units_seen, bounded=False)
    start = max(positions.next(), int(where.max()) + 1)
    text_tokens = sum(adapter.tokens(t).shape[0] for t in texts.values())
    print(f"{adapter.name}: memory {cache.length} tokens/layer, chunk {chunk.embeds.shape[1]} tokens, "
          f"pseudo-queries {', '.join(texts)} ({text_tokens} tokens)", flush=True)

    def plain():
        prefill(adapter, cache, chunk.embeds, where, KIND_VIDEO, chunk)

    def folded():
        prefill_with_pseudo_queries(adapter, cache, chunk, where, texts, start, layers)

    def separate():
        plain()
        pseudo_query_attention(adapter, cache, texts, positions.next(), "forward", layers)

    def eager():
        plain()
        ids = [adapter.tokens(t) for t in texts.values()]
        sizes = [t.shape[0] for t in ids]
        mask = side_by_side_mask(cache.length, sizes, adapter.dtype, adapter.device)
        at = torch.cat([adapter.text_positions(positions.next(), n) for n in sizes])
        inner = cache.mark()
        _, weights = adapter.forward(adapter.embed(torch.cat(ids)), at, cache, attentions=True, attention_mask=mask)
        [w[0].float().mean(dim=(0, 1)) for w in weights]  # what the old path then averaged
        cache.rollback(inner)

    variants = {"plain": plain, "folded": folded, "separate": separate, "eager": eager}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.warmup_rounds + args.rounds):
        warm = round_ < args.warmup_rounds
        for name, run in variants.items():
            mark = cache.mark()
            t0 = time.perf_counter()
            run()
            elapsed = time.perf_counter() - t0
            cache.rollback(mark)
            if not warm:
                seconds[name].append(elapsed)
            label = "warm-up" if warm else f"round {round_ + 1 - args.warmup_rounds}"
            print(f"  {label} {name:>8}: {elapsed:.2f} s", flush=True)
    base = statistics.median(seconds["plain"])
    for name, values in seconds.items():
        m = statistics.median(values)
        print(f"{name:>8}: {m:.2f} s  ×{m / base:.3f} of plain  (+{100 * (m / base - 1):.1f} %)")


if __name__ == "__main__":
    main()
