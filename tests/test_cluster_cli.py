"""``hermes serve --cluster [ADDRESS]``: the optional address, and one-line errors before Ray starts."""

from __future__ import annotations

import os
import subprocess
import sys

from hermes_cli.cli.serve import cluster_argv


def test_cluster_without_address_means_a_local_cluster():
    assert cluster_argv(["serve", "--cluster"]) == ["serve", "--cluster=local"]
    assert cluster_argv(["serve", "--cluster", "--engines", "2"]) == ["serve", "--cluster=local", "--engines", "2"]
    assert cluster_argv(["serve", "--cluster", "ray://head:10001"]) == ["serve", "--cluster", "ray://head:10001"]
    assert cluster_argv(["watch", "--cluster"]) == ["watch", "--cluster"]  # only serve's option


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "hermes_cli", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_bad_cluster_options_are_one_line_errors(tmp_path):
    done = run("serve", "--cluster", "--engines", "0", "--model", "tiny")
    assert done.returncode == 2 and "--engines must be at least 1" in done.stderr, done.stderr
    done = run("serve", "--cluster", "--model", "tiny", "--snapshot-store", str(tmp_path / "missing"))
    assert done.returncode == 2 and "--snapshot-store" in done.stderr and "no such folder" in done.stderr
    done = run("serve", "--cluster", "--model", "tiny", "--restore", str(tmp_path))
    assert done.returncode == 2 and "a cluster keeps its memories in --snapshot-store" in done.stderr
