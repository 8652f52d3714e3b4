"""``hermes bench``: time to first token, time per token, memory and ingest speed per policy."""
