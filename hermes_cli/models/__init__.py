"""Model adapters: one per family, hiding model differences from the engine.

Light on purpose: ``registry`` (names, families, checks) imports no torch; ``loading`` loads.
"""
