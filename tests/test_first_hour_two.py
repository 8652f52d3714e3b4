"""The first hour, round two (issue 26): an install that gives what it promises, output scripts
can trust, and the tools people expect around a model (pull, logs).

Subprocesses run ``python -m hermes_cli`` from this worktree where start-up matters; the rest
uses typer's runner.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("HERMES_MODEL", "HF_HUB_OFFLINE", "HERMES_CONFIG")}
    return {**base, "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": "/nonexistent-hermes-config",
            "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def hermes(*args: str, input: str | None = None, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermes_cli", *args], capture_output=True, text=True, input=input,
                          timeout=timeout, env=env(**extra), cwd=ROOT)


# -- 1. a torchvision that does not match torch ----------------------------------------------------------
def test_a_mismatched_torchvision_is_one_line_naming_both_versions_and_the_fix(tmp_path, video):
    """A torchvision whose import raises what a build for another torch raises: one line, exit 2."""
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    pythonpath = f"{fake.parent}{os.pathsep}{ROOT}"
    for args in (["watch", video, "--model", "tiny", "--ask", "hi"], ["bench", "--model", "tiny", "--frames", "4"]):
        done = hermes(*args, PYTHONPATH=pythonpath)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        import torch

        line = lines[0]
        assert f"torchvision {metadata.version('torchvision')}" in line and f"torch {torch.__version__}" in line
        assert "operator torchvision::nms does not exist" in line
        assert f"pip install --force-reinstall torch=={torch.__version__.split('+')[0]} torchvision" in line
        assert "AttentionInterface" not in done.stderr


def test_the_fix_for_a_cpu_torch_names_the_cpu_index():
    from hermes_cli.cli.torch_stack import CPU_INDEX, fix_command

    assert fix_command("2.13.0+cpu", None) == f"pip install --force-reinstall torch==2.13.0 torchvision --index-url {CPU_INDEX}"
    assert fix_command("2.14.1+cu130", "13.0") == "pip install --force-reinstall torch==2.14.1 torchvision"


def test_a_matching_pair_passes():
    from hermes_cli.cli.torch_stack import torch_stack_problem

    assert torch_stack_problem() is None
