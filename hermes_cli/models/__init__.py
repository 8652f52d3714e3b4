"""Model adapters: one module per family, hiding model differences from the engine.

Light on purpose: ``families`` (one record per family) and ``registry`` (names, checks, the
default model, all derived from the records) import no torch; ``loading`` loads.
"""
