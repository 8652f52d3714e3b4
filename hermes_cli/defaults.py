"""Default settings by their old names, derived from the schema in ``settings.py`` (no heavy imports).

The schema owns every default; this module only names them for the engine's ``SessionConfig``
and the code that predates the schema. Defaults of ``hermes bench`` alone are written here.
"""

from __future__ import annotations

from .settings import DTYPES, PSEUDO_QUERY_MODES, REINDEX_MODES, REINDEX_SPACINGS, SYSTEM_PROMPT, default

__all__ = ["DTYPES", "PSEUDO_QUERY_MODES", "REINDEX_MODES", "REINDEX_SPACINGS", "SYSTEM_PROMPT"]

POLICY = default("policy")
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

# hermes eval: the papers' settings
EVAL_BUDGET = default("budget", "eval")

# hermes bench
BENCH_POLICIES = "hermes,infinipot,fifo,full"
BENCH_FRAMES = "512"
BENCH_QUESTION = "What is happening in the video?"
