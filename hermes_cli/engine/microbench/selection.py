"""What one compression step costs a policy at a real model's cache shape, without the model.

``python -m hermes_cli.engine.microbench.selection --arch llava-onevision-0.5b --budget 2000 --policies hermes,infinipot``
fills a ``StreamingCache`` shaped like the architecture's (layers, key-value heads, head size; a
prefix, ``budget`` stream tokens and one chunk of ``--chunk`` frames on top, 1-D positions) with
seeded random keys and values, and times ``compress`` — the policy's view of the cache, its
``select`` (scores, smoothing, top-k, summary tokens) and the compaction — on a fresh copy each
round, the pseudo-query attention given as random numbers (its forward is not what is timed
here: that is the prefill's, see ``--profile`` of ``hermes bench``). Prints, per policy, the
median milliseconds per step and the range over ``--rounds`` after ``--warmup-rounds``.

It is what ``--profile``'s ``select_ms`` column measures, alone and in milliseconds instead of
minutes, so before/after comparisons of the selection code are not lost in the prefill's noise.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="llava-onevision-0.5b", help="architecture whose cache shape is used")
    parser.add_argument("--budget", type=int, default=2000)
    parser.add_argument("--chunk", type=int, default=16, help="frames in the chunk on top of the budget")
    parser.add_argument("--tokens-per-frame", type=int, default=196)
    parser.add_argument("--prefix", type=int, default=14, help="system-prompt tokens before the stream")
    parser.add_argument("--policies", default="hermes,infinipot,uniform")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default); 1 is "
                        "steadier on a shared machine")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                        help="wall: elapsed time; cpu: this process's CPU time (with --threads 1, what other "
                        "processes on a shared machine disturb least)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup-rounds", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from policies import make_policy

    from ...models.archs import arch_config
    from ...positions.rope import RotaryDelta
    from ..cache import KIND_PREFIX, KIND_VIDEO, StreamingCache, TokenMeta
    from ..compression import Signals, compress

    if args.threads:
        torch.set_num_threads(args.threads)

    text = arch_config(args.arch)["text_config"]
    layers, heads = text["num_hidden_layers"], text["num_key_value_heads"]
    dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    dtype = getattr(torch, args.dtype)
    tpf = args.tokens_per_frame
    frames = args.budget // tpf + args.chunk
    stream = frames * tpf + 1  # LLaVA-OneVision: one newline token per chunk
    n = args.prefix + stream
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(1, heads, n, dim, generator=g).to(dtype) for _ in range(layers)]
    values = [torch.randn(1, heads, n, dim, generator=g).to(dtype) for _ in range(layers)]
    frame = torch.cat([torch.arange(frames).repeat_interleave(tpf), torch.tensor([frames - 1])])
    patch = torch.cat([torch.arange(tpf).repeat(frames), torch.tensor([tpf])])
    inv_freq = 1.0 / text.get("rope_theta", 1e6) ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    rotary = RotaryDelta(inv_freq)
    print(f"{args.arch}: {layers} layers × {heads} KV heads × {dim}, {stream} stream tokens/layer "
          f"(budget {args.budget} + {args.chunk} frames), {args.dtype}", flush=True)

    def fresh() -> StreamingCache:
        cache = StreamingCache(layers)
        for l in range(layers):
            cache.update(keys[l].clone(), values[l].clone(), l)
        cache.record(TokenMeta.cat([
            TokenMeta.new(KIND_PREFIX, cache.new_ids(args.prefix), torch.arange(args.prefix)[:, None]),
            TokenMeta.new(KIND_VIDEO, cache.new_ids(stream), torch.arange(args.prefix, n)[:, None],
                          frame=frame, patch=patch),
        ]))
        return cache

    for name in [p for p in args.policies.split(",") if p]:
        policy = make_policy(name)
        wanted = policy.attention_layers(layers)
        attention = {q: [torch.rand(stream, generator=g) if l in wanted.get(q, ()) else None for l in range(layers)]
                     for q in policy.pseudo_queries(())}
        signals = Signals(budget=args.budget, tokens_per_frame=tpf, attention=attention, rotary=rotary)
        times = []
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        for round_ in range(args.warmup_rounds + args.rounds):
            cache = fresh()
            t0 = clock()
            compress(cache, policy, signals)
            elapsed = (clock() - t0) * 1e3
            if round_ >= args.warmup_rounds:
                times.append(elapsed)
        print(f"{name:>10}: {statistics.median(times):7.1f} ms ({args.clock}) per compression, median "
              f"(range {min(times):.1f}–{max(times):.1f}, {args.rounds} rounds)", flush=True)


if __name__ == "__main__":
    main()
