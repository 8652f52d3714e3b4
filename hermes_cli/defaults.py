"""Every default setting in one place (no heavy imports: the CLI reads these for --help).

The engine's ``SessionConfig``, the command-line options, ``hermes eval`` and ``hermes bench``
all take their defaults from here, so a default changes in one line.
"""

from __future__ import annotations

POLICY = "hermes"
BUDGET = 6000  # stream tokens kept per decoder layer
CHUNK_FRAMES = 16
FPS = 1.0
MAX_NEW_TOKENS = 128
REPETITION_PENALTY = 1.1
SYSTEM_PROMPT = "You are a helpful assistant."
HISTORY_TOKENS = 512  # earlier turns carried in a question's prompt, newest first (0: none)
HISTORY_KV = True  # carry them as kept keys and values, not re-encoded text

REINDEX_MODES = ("lazy", "eager", "off")
REINDEX = "lazy"
PSEUDO_QUERY_MODES = ("forward", "approx")
PSEUDO_QUERY = "approx"  # the paper's method; "forward" (a real forward) is ours
REINDEX_SPACINGS = ("rank", "interval")
REINDEX_SPACING = "rank"  # paper Eq. 11; "interval" keeps M-RoPE's temporal spacing (ours)
KV_BITS_CHOICES = (16, 8)
KV_BITS = 16  # bits per stored key/value element: 16 = the model's dtype; 8 = int8 + a scale per token and head
DTYPES = ("auto", "fp32", "float32", "bf16", "bfloat16", "fp16", "float16")

# hermes eval: the papers' settings
EVAL_BUDGET = 4000

# hermes bench
BENCH_POLICIES = "hermes,infinipot,fifo,full"
BENCH_FRAMES = "512"
BENCH_MODEL = "tiny"
BENCH_QUESTION = "What is happening in the video?"
