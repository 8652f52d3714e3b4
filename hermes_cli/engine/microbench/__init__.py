"""Benchmarks of the engine's own mechanisms, run on their parts directly (they look inside sessions and
caches, which only the engine may): ``selection`` times one compression at a real cache shape
without the model; ``kvbits`` the memory and logit error of ``--kv-bits 8``."""
