"""Is the installed PyTorch usable? torch and torchvision must come from the same build.

A CPU torch beside a torchvision built for another torch (the default index's CUDA build, or a
newer release) imports torch fine and fails deep inside transformers with an unrelated message
(``Could not import module 'AttentionInterface'``). ``check_torch_stack`` imports both before a
model is loaded and turns such a failure into one line naming both versions and the command that
installs a matching pair.
"""

from __future__ import annotations

from functools import cache

from .console import UserError

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _installed(dist: str) -> str:
    """The installed distribution's version, read from its metadata (no import), or 'unknown'."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def fix_command(torch_version: str, cuda: str | None) -> str:
    """The pip command that installs torch (this release) and a torchvision built for it, together."""
    release = torch_version.split("+")[0]
    index = f" --index-url {CPU_INDEX}" if cuda is None else ""
    return f"pip install --force-reinstall torch=={release} torchvision{index}"


@cache
def torch_stack_problem() -> str | None:
    """None when torch and torchvision both import; else the one line that says why not and how to fix it."""
    try:
        import torch
    except Exception as exc:
        return (f"PyTorch {_installed('torch')} cannot be imported ({_first_line(exc)}) — reinstall it with "
                f"torchvision: pip install --force-reinstall torch torchvision (CPU only: add --index-url {CPU_INDEX})")
    try:
        import torchvision  # noqa: F401  # transformers' video and image processors import it
    except Exception as exc:
        fix = fix_command(torch.__version__, torch.version.cuda)
        return (f"torchvision {_installed('torchvision')} does not match torch {torch.__version__} "
                f"({_first_line(exc)}) — install the pair together: {fix}")
    return None


def check_torch_stack() -> None:
    """Raise the one-line ``UserError`` of ``torch_stack_problem`` (checked once per process)."""
    if problem := torch_stack_problem():
        raise UserError(problem)
