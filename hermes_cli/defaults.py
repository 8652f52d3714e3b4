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
DTYPES = ("auto", "fp32", "float32", "bf16", "bfloat16", "fp16", "float16")

# hermes eval: the papers' settings
EVAL_BUDGET = 4000

# hermes bench
BENCH_POLICIES = "hermes,infinipot,fifo,full"
BENCH_FRAMES = "512"
BENCH_MODEL = "tiny"
BENCH_QUESTION = "What is happening in the video?"

# --notify: proactive alerts (engine/notify.py, docs/notify.md)
NOTIFY_THRESHOLD = 0.5  # --notify-threshold: on-threshold on p(yes), 0-1 (0: fire at the first probe)
NOTIFY_OFF_RATIO = 0.8  # --notify-off-threshold defaults to this × the on-threshold
NOTIFY_CONSECUTIVE = 1  # --notify-consecutive: probes in a row above the on-threshold before firing
NOTIFY_COOLDOWN = 4  # --notify-cooldown: probes (chunks) after a fire during which it cannot fire again
NOTIFY_MARGIN = 0.1  # --notify-margin: how far p(yes) must rise above the condition's own baseline
NOTIFY_BASELINE = 8  # --notify-baseline: span in probes of the baseline's moving average
NOTIFY_DESCRIBE_TOKENS = 32  # the description generated when a condition fires
