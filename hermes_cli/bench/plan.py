"""What a benchmark run measures, read from its options without loading anything (no torch)."""

from __future__ import annotations

DEFAULT_STEPS = (16, 64, 256, 512)


def parse_steps(text: str) -> list[int]:
    """``"512"`` → the default steps up to 512 (16, 64, 256, 512); ``"16,64,256"`` → those steps."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--frames expects a number or a comma-separated list of numbers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"--frames needs positive frame counts, got {text!r}")
    if len(values) == 1:
        top = values[0]
        return [s for s in DEFAULT_STEPS if s < top] + [top]
    return sorted(set(values))


def policy_names(text: str) -> list[str]:
    """The names in ``"hermes,fifo"``, in order, without repeats (not checked against the policies)."""
    names = [p.strip() for p in str(text).split(",") if p.strip()]
    if not names:
        raise ValueError("--policies needs at least one policy name")
    return list(dict.fromkeys(names))


def parse_counts(text: str, flag: str, most: int = 64) -> list[int]:
    """``"1,4"`` → [1, 4] (sorted, without repeats): stream counts or batch sizes for ``flag``."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{flag} expects a comma-separated list of counts such as 1,4; got {text!r}") from None
    if not values or any(v < 1 or v > most for v in values):
        raise ValueError(f"{flag} needs counts from 1 to {most}, got {text!r}")
    return sorted(set(values))
