"""Driving a session from a source: timed questions in batch mode and the interactive assistant."""
