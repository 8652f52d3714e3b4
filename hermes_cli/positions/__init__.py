"""Rotary positions: the delta rotation of cached keys, position layouts and compaction (torch only)."""
