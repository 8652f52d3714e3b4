"""The `hermes` command as a user meets it: JSON answers, one-line errors, listings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from hermes_cli.cli.main import app
from tests.media import json_lines

runner = CliRunner()
REQUIRED = {"question", "answer", "stream_time_s", "frames_seen", "ttft_ms", "tpot_ms", "cache", "memory", "model", "policy"}


def hermes(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "hermes_cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_watch_json_answers(video):
    result = runner.invoke(app, ["watch", video, "--model", "tiny", "--policy", "full", "--chunk", "4",
                                 "--ask", "What happens?", "--ask", "And then?", "--max-new-tokens", "4", "--json"])
    assert result.exit_code == 0, result.output
    records = json_lines(result.stdout)
    assert [r["question"] for r in records] == ["What happens?", "And then?"]
    for record in records:
        assert record.keys() >= REQUIRED
        assert record["frames_seen"] == 12 and record["stream_time_s"] == pytest.approx(11.0)
        cache = record["cache"]
        assert len(cache["tokens_per_layer"]) == 10 and len(set(cache["tokens_per_layer"])) == 1
        assert cache["budget"] is None and cache["kv_bytes"] > 0
        assert record["memory"]["rss_bytes"] > 0 and record["memory"]["gpu_peak_bytes"] is None
        assert record["model"] == "tiny" and record["policy"] == "full" and record["ttft_ms"] > 0


def test_watch_ask_at_answers_at_stream_time(video):
    result = runner.invoke(app, ["watch", video, "--model", "tiny-llava-onevision", "--policy", "full", "--chunk", "4",
                                 "--ask-at", "3s=early?", "--ask", "late?", "--max-new-tokens", "2", "--json"])
    assert result.exit_code == 0, result.output
    early, late = json_lines(result.stdout)
    assert early["asked_at_s"] == 3 and early["frames_seen"] == 4 and early["stream_time_s"] == 3.0
    assert late["asked_at_s"] is None and late["frames_seen"] == 12


def test_unavailable_hub_model_fails_fast_with_one_line(video):
    result = hermes("watch", video, "--model", "nobody/no-such-model-7B", "--ask", "hi")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--model tiny" in lines[0] and "Traceback" not in result.stderr


def test_missing_file_is_one_line():
    result = hermes("watch", "/no/such/video.mp4", "--model", "tiny", "--ask", "hi")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: no such file: /no/such/video.mp4 — check the path"]


def test_bad_ask_at_and_policy_option(video):
    for args, needle in ((["--ask-at", "soon=hi"], "stream time"), (["--policy-opt", "nope=1"], "no parameter")):
        result = runner.invoke(app, ["watch", video, "--model", "tiny", *args])
        assert result.exit_code != 0 and needle in str(result.exception)


def test_models_and_policies_listings():
    models = runner.invoke(app, ["models", "--json"])
    data = json.loads(models.stdout)
    assert data["default"] == "llava-hf/llava-onevision-qwen2-0.5b-ov-hf"  # no GPU here
    assert {"qwen2.5-vl", "llava-onevision"} <= {m["family"] for m in data["models"]}
    policies = json.loads(runner.invoke(app, ["policies", "--json"]).stdout)
    assert policies[0]["name"] == "full"
    assert all(p["help"] for pol in policies for p in pol["parameters"])


def test_watch_a_file_served_over_http(video):
    from tests.media import serve_http

    url, stop = serve_http(video)
    try:
        result = runner.invoke(app, ["watch", url, "--model", "tiny", "--chunk", "4", "--budget", "40",
                                     "--ask", "What is shown?", "--max-new-tokens", "3", "--json"])
    finally:
        stop()
    assert result.exit_code == 0, result.output
    (record,) = json_lines(result.stdout)
    assert record["frames_seen"] == 12 and record["policy"] == "hermes"
    assert max(record["cache"]["video_tokens_per_layer"]) <= 40


def test_watch_a_live_mpegts_stream_over_tcp():
    from tests.media import serve_mpegts_tcp

    url, thread = serve_mpegts_tcp(seconds=6, fps=10, size=(96, 64), speed=4.0)
    result = runner.invoke(app, ["watch", url, "--model", "tiny-llava-onevision", "--chunk", "2", "--policy", "fifo",
                                 "--budget", "16", "--ask", "What is live?", "--max-new-tokens", "3", "--json",
                                 "--reconnect", "0"])
    thread.join(30)
    assert result.exit_code == 0, result.output
    (record,) = json_lines(result.stdout)
    assert 4 <= record["frames_seen"] <= 6 and record["stream_time_s"] >= 3
    assert max(record["cache"]["video_tokens_per_layer"]) <= 16


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full", "fifo", "sink", "uniform", "infinipot", "hermes"])
def test_every_policy_keeps_a_two_minute_stream_under_budget(two_minutes, policy):
    result = runner.invoke(app, ["watch", two_minutes, "--model", "tiny", "--policy", policy, "--budget", "512",
                                 "--ask", "What changed?", "--max-new-tokens", "2", "--json"])
    assert result.exit_code == 0, result.output
    (record,) = json_lines(result.stdout)
    cache = record["cache"]
    assert record["frames_seen"] == 120
    assert len(set(cache["tokens_per_layer"])) == 1
    if policy == "full":
        assert cache["budget"] is None and max(cache["video_tokens_per_layer"]) == 720
    else:
        assert cache["budget"] == 512 and cache["compressions"] >= 1
        assert max(cache["stream_tokens_per_layer"]) <= 512
        assert max(cache["video_tokens_per_layer"]) <= 512
    assert record["prefill_ms_last_chunk"] > 0 and record["compress_ms_last_chunk"] >= 0


def test_model_names_are_checked_before_loading(tmp_path, monkeypatch):
    from hermes_cli.models.registry import ModelLoadError, check_model_name

    check_model_name("tiny")
    check_model_name(str(tmp_path))  # an existing directory
    with pytest.raises(ModelLoadError, match="no model directory"):
        check_model_name(str(tmp_path / "missing"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE.*--model tiny"):
        check_model_name("nobody/no-such-model")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    check_model_name("nobody/no-such-model")  # online: left to the download, which says why it failed


def test_an_unexpected_error_is_one_line_unless_debug(monkeypatch, capsys, video):
    import hermes_cli.cli.main as cli
    import hermes_cli.cli.watch as watch

    def broken(*args, **kwargs):
        raise RuntimeError("boom [in brackets]")

    monkeypatch.setattr(watch, "run_batch", broken)
    monkeypatch.setattr(sys, "argv", ["hermes", "watch", video, "--model", "tiny", "--ask", "hi"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 1
    assert "internal error: RuntimeError: boom [in brackets]" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["hermes", "watch", video, "--model", "tiny", "--ask", "hi", "--debug"])
    with pytest.raises(RuntimeError, match="boom"):
        cli.main()


@pytest.mark.parametrize("name", ["tiny", "tiny-llava-onevision"])
def test_a_local_model_directory_loads_through_the_real_path(tmp_path, video, name):
    """save_pretrained → --model DIR goes through AutoConfig/AutoProcessor/AutoModel: same answers."""
    from hermes_cli.models.tiny import build_tiny

    model, processor = build_tiny(name)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    args = ["watch", video, "--chunk", "4", "--ask", "What happens?", "--max-new-tokens", "4", "--json"]
    local = runner.invoke(app, [*args, "--model", str(tmp_path)])
    builtin = runner.invoke(app, [*args, "--model", name])
    assert local.exit_code == 0, local.output
    (from_dir,), (built_in,) = json_lines(local.stdout), json_lines(builtin.stdout)
    assert from_dir["answer"] == built_in["answer"] and from_dir["cache"] == built_in["cache"]
    assert from_dir["model"] == str(tmp_path) and not from_dir["random_weights"]


def test_watch_does_its_start_up_work_once(video, monkeypatch):
    """The settings are checked once and the model prepared (name, folder, hub probe) once per run."""
    from hermes_cli.cli import factory

    calls = {"check": 0, "prepare": 0}
    check, prepare = factory.SessionSettings.check, factory.prepare_model

    def counted_check(self):
        calls["check"] += 1
        return check(self)

    def counted_prepare(settings):
        calls["prepare"] += 1
        return prepare(settings)

    monkeypatch.setattr(factory.SessionSettings, "check", counted_check)
    monkeypatch.setattr(factory, "prepare_model", counted_prepare)
    result = runner.invoke(app, ["watch", video, "--model", "tiny", "--policy", "full", "--chunk", "4",
                                 "--ask", "What happens?", "--max-new-tokens", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert calls == {"check": 1, "prepare": 1}


def test_the_default_model_is_named_without_torch_and_is_the_one_loaded(monkeypatch):
    """One decision: the name the checks see before torch is imported is the name that loads."""
    from hermes_cli.cli.factory import ModelSettings
    from hermes_cli.models import loading, registry

    monkeypatch.delenv("HERMES_MODEL", raising=False)
    monkeypatch.setattr(registry, "gpu_free_gib", lambda: 20.0)
    monkeypatch.setattr(registry, "locally_present", lambda name: False)
    assert ModelSettings.of({}).name() == "Qwen/Qwen3-VL-4B-Instruct"
    assert loading.default_model is registry.default_model  # load_model(None) asks the same function
