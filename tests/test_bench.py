"""`hermes bench`: records, bounded memory for hermes vs growing for full, the plot, synthetic vision."""

from __future__ import annotations

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from hermes_cli.bench.plan import parse_steps
from hermes_cli.bench.runner import RECORD_FIELDS, policy_summaries, run_bench, ttft_versus
from hermes_cli.cli.bench import bench
from hermes_cli.models.synthetic import BenchAdapter, synthetic_frames
from tests.media import json_lines

runner = CliRunner()


@pytest.fixture(scope="module")
def app():
    application = typer.Typer()
    application.command("bench")(bench)
    application.command("noop")(lambda: None)  # keeps "bench" a subcommand
    return application


def test_parse_steps():
    assert parse_steps("512") == [16, 64, 256, 512]
    assert parse_steps("100") == [16, 64, 100]
    assert parse_steps("8") == [8]
    assert parse_steps("64, 16,256") == [16, 64, 256]
    for bad in ("", "a", "0", "16,-1"):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_cli_json_records_hermes_bounded_full_grows(app):
    """Must-show 1: the records; hermes's KV bytes at 256 frames equal those at 64, full's grow."""
    # tiny: 4 tokens per 2-frame unit → 64 frames = 128 stream tokens; budget 96 is smaller
    result = runner.invoke(app, [
        "bench", "--model", "tiny", "--frames", "16,64,256", "--policies", "hermes,full", "--budget", "96",
        "--chunk", "32", "--size", "56x56", "--repeats", "1", "--warmup", "1", "--max-new-tokens", "3", "--json",
    ])
    assert result.exit_code == 0, result.output
    records = json_lines(result.stdout)
    assert [(r["policy"], r["frames"]) for r in records] == [
        ("hermes", 16), ("hermes", 64), ("hermes", 256), ("full", 16), ("full", 64), ("full", 256),
    ]
    for r in records:
        assert set(RECORD_FIELDS) <= set(r)
        assert r["ttft_ms"] > 0 and r["tpot_ms"] > 0 and r["peak_memory_bytes"] > 0
        assert r["ingest_ms_per_frame"] > 0 and r["compress_fraction"] >= 0
    hermes = {r["frames"]: r for r in records if r["policy"] == "hermes"}
    full = {r["frames"]: r for r in records if r["policy"] == "full"}
    assert hermes[64]["stream_tokens"] > 96  # the budget is smaller than the 64-frame stream
    assert hermes[256]["kv_bytes"] == hermes[64]["kv_bytes"]
    assert hermes[256]["cache_tokens"] == hermes[64]["cache_tokens"]
    assert hermes[256]["compress_ms_per_chunk"] > 0
    assert full[16]["kv_bytes"] < full[64]["kv_bytes"] < full[256]["kv_bytes"]
    assert full[256]["kv_bytes"] == pytest.approx(4 * full[64]["kv_bytes"], rel=0.2)
    assert "TTFT(256)/TTFT(16)" in result.stderr  # the summary line per policy
    assert "parameters" in result.stderr and "float32" in result.stderr


def test_plot_one_line_per_policy(app, tmp_path):
    """Must-show 3: the PNG is written and has one line per policy in each panel."""
    pytest.importorskip("matplotlib")
    from hermes_cli.bench.runner import plot_figure

    path = tmp_path / "bench.png"
    result = runner.invoke(app, [
        "bench", "--model", "tiny", "--frames", "4,8", "--policies", "fifo,full", "--budget", "8",
        "--chunk", "4", "--size", "56x56", "--repeats", "1", "--warmup", "0", "--max-new-tokens", "2",
        "--plot", str(path),
    ])
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fifo" in result.stdout and "TTFT" in result.stdout  # the table
    # the figure the file was drawn from
    from hermes_cli.bench.runner import BenchRecord

    records = [BenchRecord(p, f, 1.0 + f, 1.0, 100 + f, 10 * f, f, 1.0, 0.0, 0.0)
               for p in ("hermes", "fifo", "full") for f in (4, 8)]
    fig = plot_figure(records)
    for ax in fig.axes:
        assert sorted(line.get_label() for line in ax.get_lines()) == ["fifo", "full", "hermes"]


def test_run_bench_continues_one_stream(tiny_llava):
    records = run_bench(tiny_llava, ["fifo"], [2, 5], budget=6, chunk=2, repeats=2, warmup=0, max_new_tokens=3,
                        frames=lambda: synthetic_frames((56, 56)))
    assert [r.frames for r in records] == [2, 5]
    # 4 tokens per frame + 1 newline per chunk: 2 frames → 9 tokens; 5 = 2 chunks + a flushed frame → 9+9+5
    assert [r.stream_tokens for r in records] == [9, 23]
    assert records[0].cache_tokens == records[1].cache_tokens  # fifo: over the budget at both steps
    assert records[0].kv_bytes == records[1].kv_bytes
    assert len(records[0].ttft_samples_ms) == 2
    s = policy_summaries(records)[0]
    assert s.frames_fewest == 2 and s.frames_most == 5 and s.ttft_ratio > 0
    assert ttft_versus(records, "fifo", "fifo") == pytest.approx(1.0)


@pytest.mark.parametrize("which", ["qwen", "llava"])
def test_synthetic_encode_has_the_real_layout(which, tiny_qwen, tiny_llava):
    adapter = tiny_qwen if which == "qwen" else tiny_llava
    source = synthetic_frames((90, 120))
    frames = np.stack([next(source)[0] for _ in range(4)])
    real = adapter.encode(frames, 6)
    fake = adapter.synthetic_encode(4, 6, (90, 120))
    assert fake.embeds.shape == real.embeds.shape and fake.embeds.dtype == real.embeds.dtype
    for name in ("unit", "patch", "row", "col", "input_ids"):
        assert torch_equal(getattr(fake, name), getattr(real, name)), name
    assert fake.units == real.units


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def test_bench_adapter_ignores_eos_and_uses_synthetic_vision(tiny_qwen):
    wrapped = BenchAdapter(tiny_qwen, synthetic_vision=True)
    assert wrapped.eos_token_ids == set()
    assert wrapped.num_layers == tiny_qwen.num_layers
    chunk = wrapped.encode(np.zeros((2, 56, 56, 3), dtype=np.uint8), 0)
    assert chunk.pixel_values is None  # the vision tower did not run


def test_user_errors(app):
    cases = [
        (["--frames", "x"], "--frames"),
        (["--policies", "nope"], "unknown policy"),
        (["--arch", "llava-onevision-0.5b"], "--random-weights"),
        (["--random-weights"], "--arch"),
        (["--arch", "gpt-9", "--random-weights"], "unknown architecture"),
        (["--video", "/nonexistent/file.mp4"], "file.mp4"),
    ]
    from hermes_cli.errors import HermesError

    for args, needle in cases:
        result = runner.invoke(app, ["bench", "--model", "tiny", *args])
        assert isinstance(result.exception, HermesError), (args, result.output)
        assert needle in str(result.exception), (args, str(result.exception))


def test_shipped_architectures_are_full_size():
    from hermes_cli.models.archs import ARCHS, arch_config
    from tests.model_sizes import parameter_estimate

    expected_text_layers = {"llava-onevision-0.5b": 24, "llava-onevision-7b": 28, "qwen2.5-vl-3b": 36,
                            "qwen2.5-vl-7b": 28, "qwen3-vl-2b": 28, "qwen3-vl-4b": 36, "qwen3-vl-8b": 36}
    for name in ARCHS:
        cfg = arch_config(name)
        assert cfg["text_config"]["num_hidden_layers"] == expected_text_layers[name]
        assert cfg["text_config"]["vocab_size"] > 150_000
    # the language model of LLaVA-OneVision 0.5B (Qwen2-0.5B): 494 M parameters
    assert parameter_estimate("llava-onevision-0.5b") == pytest.approx(494e6, rel=0.01)


def test_default_budget_is_reached_and_printed(app):
    """`hermes bench` without --budget picks one the stream reaches early, and says so."""
    result = runner.invoke(app, [
        "bench", "--model", "tiny", "--frames", "8,32", "--policies", "hermes,fifo,full", "--chunk", "4",
        "--size", "56x56", "--repeats", "1", "--warmup", "0", "--max-new-tokens", "2", "--json", "--profile",
        "--pseudo-query", "forward",  # the real forward, so its pseudo-queries can ride in a chunk's prefill
    ])
    assert result.exit_code == 0, result.output
    from hermes_cli.bench.runner import default_budget
    from hermes_cli.models.loading import load_model

    budget, streamed = default_budget(load_model("tiny", device="cpu", dtype="fp32"), [8, 32], 4, (56, 56))
    assert budget == max(2 * streamed // 8, streamed // 4) and budget < streamed
    assert f"defaults: budget {budget} tokens/layer" in result.stderr
    records = {(r["policy"], r["frames"]): r for r in json_lines(result.stdout)}
    assert records[("hermes", 32)]["cache_tokens"] < records[("full", 32)]["cache_tokens"]
    assert records[("hermes", 32)]["kv_bytes"] < records[("full", 32)]["kv_bytes"]
    assert records[("hermes", 32)]["folded_chunks"] > 0  # its pseudo-queries rode in the prefill
    summary = result.stderr
    for needle in ("compress_fraction", "peak", "real time at 1 fps", "budget reached", "budget never reached"):
        assert needle in summary, needle
    assert "hermes per chunk: decode" in summary and "selection" in summary and "folded" in summary
    assert all(r["prefill_vs_bare"] > 0 and r["tpot_vs_bare"] > 0 for r in records.values())  # --profile's floor
    assert "prefill_vs_bare" in summary and "tpot_vs_bare" in summary


def test_summary_and_profile_from_records():
    from hermes_cli.bench.runner import BenchRecord, profile

    def record(frames, **kw):
        return BenchRecord("p", frames, 1.0, 1.0, 100 * frames, 10, 5, 1.0, 0.0, 0.0, **kw)

    rows = [record(4, chunks=2, prefill_ms_total=100.0, compress_ms_total=10.0, ingest_s=0.5, stream_s=4.0,
                   decode_ms_total=4.0, encode_ms_total=40.0, pseudo_query_ms_total=6.0),
            record(8, chunks=2, prefill_ms_total=100.0, compress_ms_total=30.0, ingest_s=1.5, stream_s=4.0,
                   decode_ms_total=4.0, encode_ms_total=40.0, pseudo_query_ms_total=10.0, compressions=1)]
    s = policy_summaries(rows)[0]
    assert s.compress_fraction == pytest.approx(40 / 200)
    assert s.peak_memory_bytes == 800 and s.realtime == pytest.approx(8 / 2.0) and s.budget_reached
    p = profile(rows)[0]
    assert p["chunks"] == 4 and p["decode_ms"] == pytest.approx(2.0) and p["encode_ms"] == pytest.approx(20.0)
    assert p["prefill_ms"] == pytest.approx(30.0) and p["pseudo_query_ms"] == pytest.approx(4.0)
    assert p["select_ms"] == pytest.approx(6.0)


def test_ctrl_c_reports_the_steps_already_measured(app, monkeypatch):
    import hermes_cli.bench.runner as bench_runner

    calls = {"n": 0}
    original = bench_runner.measure_answers

    def interrupted_on_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(bench_runner, "measure_answers", interrupted_on_second)
    result = runner.invoke(app, [
        "bench", "--model", "tiny", "--frames", "4,8", "--policies", "fifo", "--budget", "8", "--chunk", "4",
        "--size", "56x56", "--repeats", "1", "--warmup", "0", "--max-new-tokens", "2", "--json",
    ])
    assert result.exit_code == 130
    assert [(r["policy"], r["frames"]) for r in json_lines(result.stdout)] == [("fifo", 4)]
    assert "interrupted" in result.stderr and "fifo: TTFT(4)/TTFT(4)" in result.stderr
    with pytest.raises(bench_runner.BenchInterrupted) as caught:
        calls["n"] = 0
        from hermes_cli.models.loading import load_model

        run_bench(load_model("tiny", device="cpu", dtype="fp32"), ["fifo"], [2, 4], budget=8, chunk=2,
                  repeats=1, warmup=0, max_new_tokens=2, frames=lambda: synthetic_frames((56, 56)))
    assert [r.frames for r in caught.value.records] == [2]


def test_questions_mode_reports_first_and_last(app):
    result = runner.invoke(app, [
        "bench", "--model", "tiny", "--frames", "8", "--policies", "fifo", "--chunk", "4", "--size", "56x56",
        "--questions", "6", "--history-tokens", "40", "--max-new-tokens", "3", "--json",
    ])
    assert result.exit_code == 0, result.output
    records = json_lines(result.stdout)
    assert [r["index"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[0]["context_tokens"] == 0 and all(0 < r["context_tokens"] <= 40 for r in records[1:])
    assert "question 6: TTFT" in result.stderr and "kept keys and values" in result.stderr


def test_folding_bench_times_four_variants_from_the_same_memory(capsys):
    from hermes_cli.bench.folding import main

    main(["--frames", "8", "--chunk", "4", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "memory" in out and "pseudo-queries mixed, global" in out
    for name in ("plain", "folded", "separate", "eager"):
        assert f"{name:>8}: " in out and f"round 1 {name:>8}" in out


def test_a_plot_path_and_a_short_video_fail_before_the_model_loads(app, tmp_path, monkeypatch):
    """Bad --plot folders and videos too short for --frames are refused up front, not after the run."""
    import hermes_cli.cli.bench as bench_cli
    from tests.media import make_video

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(bench_cli, "_load", no_loading)
    result = runner.invoke(app, ["bench", "--plot", str(tmp_path / "missing" / "x.png"), "--frames", "16"])
    assert result.exit_code != 0 and "cannot write in" in str(result.exception)
    clip = tmp_path / "short.mp4"
    make_video(clip, 5, 4)
    result = runner.invoke(app, ["bench", "--video", str(clip), "--frames", "64"])
    assert result.exit_code != 0 and "fewer than --frames 64" in str(result.exception)


def test_full_size_builds_tokenize_the_pseudo_queries_at_their_real_length():
    """The --arch builds' tokenizer gives the built-in texts the length the real Qwen2 tokenizer
    does (counted once with Qwen's BPE ranks: local 21, global 22, mixed 43, the bench question
    7), so the pseudo-query cost they measure is not inflated; the tiny models' small one is not."""
    from hermes_cli.models.tiny import LLAVA_SPECIALS, WHOLE_WORDS, make_tokenizer
    from policies.hermes import pseudo_query_texts

    real = {"local": 21, "global": 22, "mixed": 43}
    whole, small = make_tokenizer(LLAVA_SPECIALS, WHOLE_WORDS), make_tokenizer(LLAVA_SPECIALS)
    texts = pseudo_query_texts(())
    for name, count in real.items():
        assert abs(len(whole(texts[name])["input_ids"]) - count) <= 0.1 * count + 1, name
        assert len(small(texts[name])["input_ids"]) > 1.5 * count, name
    assert len(whole("What is happening in the video?")["input_ids"]) == 7


def test_streams_records_one_per_count_with_aggregate_ingest_and_memory(app):
    """`--streams 1,3`: one record per stream count; every stream's frames reach its memory, the
    streams hold equal caches, and the memory they add is read against their kv_bytes."""
    from hermes_cli.bench.runner import STREAMS_FIELDS

    result = runner.invoke(app, [
        "bench", "--model", "tiny", "--frames", "8", "--policies", "hermes", "--budget", "16", "--chunk", "4",
        "--size", "56x56", "--warmup", "1", "--streams", "1,3", "--json",
    ])
    assert result.exit_code == 0, result.output
    records = json_lines(result.stdout)
    assert [r["streams"] for r in records] == [1, 3]
    for r in records:
        assert set(STREAMS_FIELDS) <= set(r)
        assert r["frames"] == 8 and r["ingest_frames_per_s"] > 0
        assert r["ingest_frames_per_s"] == pytest.approx(r["streams"] * 8 / r["ingest_s"], rel=1e-3)
        assert r["chunks"] == 2 * r["streams"]  # 8 frames in chunks of 4, on every stream
        assert r["kv_bytes_per_stream"] > 0 and r["rss_bytes"] > 0 and r["baseline_memory_bytes"] > 0
        # (no ordering of the two: the tiny model's memory is 100 kB, below the resident set's noise)
        assert r["rss_growth_per_stream_vs_kv"] == pytest.approx(
            r["memory_growth_per_stream"] / r["kv_bytes_per_stream"], rel=1e-3)
        assert r["rss_growth_vs_kv_over_no_stream"] == pytest.approx(
            (r["rss_bytes"] - r["baseline_memory_bytes"]) / r["streams"] / r["kv_bytes_per_stream"], rel=1e-3)
    one, three = records
    assert one["growth_reference"] == "no stream" and three["growth_reference"] == "one stream"
    assert one["kv_bytes_per_stream"] == three["kv_bytes_per_stream"]  # the same stream, three times
    assert three["memory_growth_per_stream"] == pytest.approx((three["rss_bytes"] - one["rss_bytes"]) / 2, abs=1)
    assert "3 streams: ingest ×" in result.stderr and "its kv_bytes" in result.stderr


def test_concurrent_questions_decode_b_answers_together(app, tiny_llava, monkeypatch):
    """`--concurrent-questions 1,4`: one record per batch; every answer runs to --max-new-tokens,
    and B answers decoded together are B rows of one step each (a step per token, not B)."""
    from hermes_cli.bench.runner import DECODE_FIELDS, run_concurrent

    result = runner.invoke(app, [
        "bench", "--model", "tiny", "--frames", "4", "--policies", "fifo", "--budget", "16", "--chunk", "4",
        "--size", "56x56", "--warmup", "0", "--max-new-tokens", "5", "--concurrent-questions", "1,4", "--json",
    ])
    assert result.exit_code == 0, result.output
    records = json_lines(result.stdout)
    assert [r["batch"] for r in records] == [1, 4]
    for r in records:
        assert set(DECODE_FIELDS) <= set(r)
        assert r["decode_tokens"] == r["batch"] * 4  # 5 tokens each, the first from the question's prefill
        assert r["decode_tokens_per_s"] > 0 and r["decode_s"] > 0 and r["max_new_tokens"] == 5
    assert records[0]["speedup"] == 1.0
    assert records[1]["speedup"] == pytest.approx(records[1]["decode_tokens_per_s"] / records[0]["decode_tokens_per_s"],
                                                  rel=1e-3)
    assert "batch 4: decode ×" in result.stderr

    from hermes_cli.engine import decoding

    steps: dict = {"rows": []}
    real = decoding.BatchDecoder.step

    def counting(self, decodes):
        steps["rows"].append(len(decodes))
        return real(self, decodes)

    monkeypatch.setattr(decoding.BatchDecoder, "step", counting)
    (record,) = run_concurrent(tiny_llava, [3], frames=4, policy="full", budget=None, chunk=2, max_new_tokens=6,
                               warmup=0, make_frames=lambda k: synthetic_frames((56, 56), seed=k))
    assert record.batch == 3 and record.decode_tokens == 15
    assert steps["rows"] == [3] * 5  # every token after the first: one step of all three answers


def test_engine_mode_user_errors(app):
    from hermes_cli.errors import HermesError

    for args, needle in [(["--streams", "0"], "--streams needs counts"), (["--streams", "a"], "--streams expects"),
                         (["--streams", "1", "--concurrent-questions", "2"], "pass one of them"),
                         (["--concurrent-questions", "2", "--questions", "3"], "--questions is a run of its own")]:
        result = runner.invoke(app, ["bench", "--model", "tiny", *args])
        assert isinstance(result.exception, HermesError), (args, result.output)
        assert needle in str(result.exception), (args, str(result.exception))


def test_soak_streams_through_the_engine_and_accounts_for_every_frame():
    """The soak benchmark, shortened: a stream of the engine fed by a thread while questions are
    asked; every frame submitted ends in the memory and each question mark is recorded."""
    import torch

    from hermes_cli.bench.soak import parse_args, run_soak

    threads = torch.get_num_threads()
    try:
        result = run_soak(parse_args(["--frames", "24", "--every", "8", "--baseline", "8", "--repeats", "1",
                                      "--chunk", "4", "--budget", "24", "--quiet"]))
    finally:
        torch.set_num_threads(threads)  # the soak sets its own
    assert result["checks"]["every_frame_in_memory"]
    counts = result["counts"]
    assert counts["frames_submitted"] == counts["frames_taken"] == counts["frames_seen"] == 24
    assert counts["frames_dropped"] == 0 and counts["answers"] == 3  # one question at 8, 16 and 24 frames
    assert [p["frames"] for p in result["points"]] == [8, 16, 24]
    assert all(p["cache_tokens"] <= 24 for p in result["points"]) and result["chunk_ms_max"] > 0


def test_notify_records_the_probes_cost_per_chunk(app):
    """Issue 23: --notify N probes N conditions after every chunk; each record gets
    notify_ms_per_chunk and notify_fraction (probe time over prefill time); without it, None."""
    args = ["bench", "--model", "tiny", "--frames", "8,16", "--policies", "hermes", "--chunk", "4",
            "--size", "56x56", "--repeats", "1", "--warmup", "0", "--max-new-tokens", "2", "--json"]
    with_probes = json_lines(runner.invoke(app, [*args, "--notify", "2"]).stdout)
    without = json_lines(runner.invoke(app, args).stdout)
    assert [r["frames"] for r in with_probes] == [8, 16]
    for r in with_probes:
        assert r["notify_conditions"] == 2 and r["notify_ms_per_chunk"] > 0
        assert r["notify_fraction"] == pytest.approx(r["notify_ms_per_chunk"] * r["chunks"] / r["prefill_ms_total"],
                                                     rel=0.01)
    assert all(r["notify_ms_per_chunk"] is None and r["notify_fraction"] is None for r in without)
