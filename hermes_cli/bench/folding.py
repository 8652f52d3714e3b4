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
``plain``. The memory is filled through a stream of the engine; the timing itself looks inside
the stream, so it runs on the engine thread (``engine.measure.pseudo_query_variants``).
"""

from __future__ import annotations

import argparse
import statistics

from ..settings import add_arguments


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=None, help="full-size random-weight architecture (default: --model)")
    add_arguments(parser, {"model": "tiny", "chunk": 16})  # flags, types and help from the settings schema
    parser.add_argument("--frames", type=int, default=32, help="frames in the memory before the timed chunk")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (medians)")
    parser.add_argument("--warmup-rounds", type=int, default=1, help="unmeasured rounds first (first-touch costs)")
    args = parser.parse_args(argv)

    from policies import make_policy

    from ..engine.client import open_stream
    from ..engine.config import SessionConfig
    from ..engine.core import Engine
    from ..engine.measure import pseudo_query_variants
    from ..models.loading import load_model
    from ..models.synthetic import bench_adapter, synthetic_frames

    if args.arch:
        from ..models.archs import load_random_arch

        adapter = load_random_arch(args.arch, device=None, dtype=None)
    else:
        adapter = load_model(args.model)
    adapter = bench_adapter(adapter, synthetic_vision=True)
    with Engine(adapter) as engine:
        stream = open_stream(engine, make_policy("full"), SessionConfig(budget=None, chunk_frames=args.chunk))
        frames = synthetic_frames()
        for _ in range(args.frames):
            frame, ts = next(frames)
            stream.submit(frame, ts)
        stream.flush()

        def on_start(facts: dict) -> None:
            print(f"{adapter.name}: memory {facts['memory_tokens']} tokens/layer, chunk {facts['chunk_tokens']} tokens, "
                  f"pseudo-queries {', '.join(facts['pseudo_queries'])} ({facts['pseudo_query_tokens']} tokens)",
                  flush=True)

        def on_time(label: str, name: str, elapsed: float) -> None:
            print(f"  {label} {name:>8}: {elapsed:.2f} s", flush=True)

        measured = engine.call(stream.id, pseudo_query_variants(next(frames)[0], args.chunk, args.rounds,
                                                                args.warmup_rounds, on_time, on_start))
        stream.close()
    seconds = measured["seconds"]
    base = statistics.median(seconds["plain"])
    for name, values in seconds.items():
        m = statistics.median(values)
        print(f"{name:>8}: {m:.2f} s  ×{m / base:.3f} of plain  (+{100 * (m / base - 1):.1f} %)")


if __name__ == "__main__":
    main()
