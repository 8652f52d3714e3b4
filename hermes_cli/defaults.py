"""Default settings by their old names, derived from the schema in ``settings.py`` (no heavy imports).

The schema owns every default; this module only names them for the engine's ``SessionConfig``
and the code that predates the schema. Defaults of ``hermes bench`` alone are written here.
"""

from __future__ import annotations

from .settings import DTYPES, PSEUDO_QUERY_MODES, REINDEX_MODES, REINDEX_SPACINGS, SYSTEM_PROMPT, default

__all__ = ["DTYPES", "KV_BITS_CHOICES", "PSEUDO_QUERY_MODES", "REINDEX_MODES", "REINDEX_SPACINGS", "SYSTEM_PROMPT"]

BUDGET = default("budget")  # stream tokens kept per decoder layer
CHUNK_FRAMES = default("chunk")
FPS = default("fps")
MAX_NEW_TOKENS = default("max_new_tokens")
REPETITION_PENALTY = default("repetition_penalty")
HISTORY_TOKENS = default("history_tokens")  # earlier turns carried in a question's prompt, newest first (0: none)
HISTORY_KV = default("history_kv")  # carry them as kept keys and values, not re-encoded text
REINDEX = default("reindex")
PSEUDO_QUERY = default("pseudo_query")  # the paper's method; "forward" (a real forward) is ours
REINDEX_SPACING = default("reindex_spacing")  # paper Eq. 11; "interval" keeps M-RoPE's temporal spacing (ours)
KV_BITS = default("kv_bits")  # bits per stored key/value element: 16 = the model's dtype; 8 = int8 + scales
KV_BITS_CHOICES = (16, 8)


# hermes bench
BENCH_POLICIES = "hermes,infinipot,fifo,full"
BENCH_FRAMES = "512"
BENCH_QUESTION = "What is happening in the video?"

# --notify: proactive alerts (engine/notify.py, docs/notify.md)
NOTIFY_THRESHOLD = 0.5  # --notify-threshold: on-threshold on p(yes), 0-1 (0: fire at the first probe)
NOTIFY_OFF_RATIO = 0.8  # --notify-off-threshold defaults to this × the on-threshold
NOTIFY_CONSECUTIVE = 1  # --notify-consecutive: probes in a row above the on-threshold before firing
NOTIFY_COOLDOWN = 4  # --notify-cooldown: probes (chunks) after a fire during which it cannot fire again
NOTIFY_MARGIN = 0.1  # --notify-margin: how far p(yes) must rise above the condition's own baseline
NOTIFY_BASELINE = 8  # --notify-baseline: span in probes of the baseline's moving average
NOTIFY_DESCRIBE_TOKENS = 32  # the description generated when a condition fires
