"""Command-line options shared by the ``hermes`` commands (typer annotations; light to import)."""

from __future__ import annotations

from typing import Annotated

import typer

ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", metavar="NAME|PATH",
        help="Hub id, local directory, or 'tiny' / 'tiny-llava-onevision' (random weights). "
        "Default: HERMES_MODEL, else a real model that fits this machine (see `hermes models`).",
    ),
]
PolicyOpt = Annotated[str, typer.Option("--policy", "-p", metavar="NAME", help="Memory policy (see `hermes policies`).")]
BudgetOpt = Annotated[int, typer.Option("--budget", "-b", metavar="TOKENS", help="Stream tokens kept per layer (the memory cap).")]
PolicyOptsOpt = Annotated[
    list[str] | None,
    typer.Option("--policy-opt", metavar="KEY=VALUE", help="Policy parameter KEY=VALUE (repeatable), e.g. alpha=0.4."),
]
FpsOpt = Annotated[float, typer.Option("--fps", metavar="FPS", help="Frames sampled per second of video.")]
ChunkOpt = Annotated[int, typer.Option("--chunk", metavar="FRAMES", help="Frames per prefill chunk (even for Qwen-VL).")]
DeviceOpt = Annotated[str | None, typer.Option("--device", metavar="DEVICE", help="cpu, cuda, cuda:1 …, or auto: spread over GPUs, CPU, disk (default: GPU if present).")]
DtypeOpt = Annotated[str | None, typer.Option("--dtype", metavar="DTYPE", help="auto, fp32, bf16, fp16 (default: bf16 on GPU, fp32 on CPU).")]
ReindexOpt = Annotated[
    str,
    typer.Option("--reindex", metavar="MODE", help="Position re-indexing: lazy (near the limit), eager (every compression), off."),
]
PseudoQueryOpt = Annotated[
    str,
    typer.Option("--pseudo-query", metavar="MODE", help="How attention-scored policies (hermes) read attention: approx "
                 "(the paper's method: raw embeddings through each layer's norm and projections) or forward "
                 "(a real forward of the pseudo-query on the cache)."),
]
KvBitsOpt = Annotated[
    int,
    typer.Option("--kv-bits", metavar="BITS", help="Bits per stored key/value element: 16 (the model's dtype) or 8 "
                 "(int8 with a float16 scale per token and head, dequantised on use: about half the memory; "
                 "answers can change slightly)."),
]
ReindexSpacingOpt = Annotated[
    str,
    typer.Option("--reindex-spacing", metavar="SPACING", help="How re-indexing compacts positions: rank (the "
                 "paper's Eq. 11: dense rank on every axis) or interval (ours: M-RoPE keeps its temporal spacing)."),
]
PseudoQueryHistoryOpt = Annotated[
    bool,
    typer.Option("--pseudo-query-history/--no-pseudo-query-history", help="Pseudo-queries follow the last question "
                 "and answer even when the prompt carries no history (the official code's protocol)."),
]
PenalisePromptOpt = Annotated[
    bool,
    typer.Option("--penalise-prompt", help="Repetition penalty over the prompt's tokens too (ours); by default "
                 "only over the answer's own tokens, as in the official code."),
]
ReconnectOpt = Annotated[
    str | None,
    typer.Option("--reconnect", metavar="DURATION", help="Live streams and cameras: after a drop, keep reconnecting "
                 "this long (e.g. 30s, 2m; 0 turns it off). Default: 30s."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object per answer (for scripts).")]
MaxNewTokensOpt = Annotated[int, typer.Option("--max-new-tokens", metavar="N", help="Longest answer in tokens.")]
SystemOpt = Annotated[str | None, typer.Option("--system", metavar="TEXT", help="System prompt.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")]
MaxPixelsOpt = Annotated[
    int | None,
    typer.Option("--max-pixels", metavar="PIXELS", help="Qwen-VL: cap each frame's area (fewer tokens per frame), "
                 "e.g. 200704 (448×448). Default: the model's own setting. LLaVA-OneVision ignores it."),
]
NoProgressOpt = Annotated[bool, typer.Option("--no-progress", help="No progress bar (it is shown on a terminal only).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Only answers and errors: no notes, warnings or progress.")]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="Also say what is loaded and from where, with the libraries' own messages."),
]
MemoryOpt = Annotated[
    str | None,
    typer.Option("--memory", metavar="FILE", help="Start from a saved memory (see --save-memory) and answer from it at once; "
                 "a source keeps streaming on top of it (the same file resumes after its last frame). The model and "
                 "memory settings not given default to the snapshot's."),
]
SaveMemoryOpt = Annotated[
    str | None,
    typer.Option("--save-memory", metavar="FILE", help="Write the memory to FILE (safetensors) when the stream ends, "
                 "or when the prompt closes; /save [FILE] writes it any time."),
]
AutosaveOpt = Annotated[
    str | None,
    typer.Option("--autosave", metavar="FILE", help="Save the memory to FILE every --autosave-every while streaming "
                 "(atomically: a crash leaves the last complete snapshot; resume with --memory FILE)."),
]
AutosaveEveryOpt = Annotated[str, typer.Option("--autosave-every", metavar="TIME", help="Wall-clock interval of --autosave (30s, 5m).")]
AcceptPolicyOpt = Annotated[
    bool,
    typer.Option("--accept-policy", help="Load a --memory made under another policy, policy parameters or memory "
                 "settings, and continue under the ones given here."),
]
ConvertMemoryOpt = Annotated[
    bool,
    typer.Option("--convert-memory", help="Convert a --memory saved in another dtype (e.g. bf16 on a GPU) to the "
                 "model's dtype instead of refusing it."),
]
HistoryTokensOpt = Annotated[
    int,
    typer.Option("--history-tokens", metavar="N", help="Earlier questions and answers carried in each question's "
                 "prompt, newest first, up to N tokens (0: none); keeps the time to first token bounded."),
]
