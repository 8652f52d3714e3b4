"""The registry's placement table (hermes_cli/cluster/placement.py) and the cluster simulation
(simulate.py): issue 25's must-show 6 — 200 streams on 4 engines, no Ray, no torch."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_cli.cluster.placement import (
    MAX_BUSY,
    Engine,
    EngineState,
    Move,
    NoFit,
    PlacementError,
    PlacementTable,
    SnapshotEntry,
    StaleMove,
    Stream,
    place,
    rebuild,
    stream_fits,
)
from hermes_cli.cluster.simulate import Workload, build, rates_from_bench, simulate

ROOT = Path(__file__).resolve().parents[1]


def stream(sid: str, fps: float = 1.0, model: str = "m", node: str | None = None, affinity: str = "required",
           tokens: int = 100) -> Stream:
    return Stream(sid, model, fps, tokens, 0.0, node, affinity)


def engine(eid: str, node: str = "n0", slots: int = 8, tps: float = 1000.0, model: str = "m") -> Engine:
    return Engine(eid, model, slots, tps, node)


def assert_within_capacity(table: PlacementTable) -> None:
    for state in table.engine_states():
        assert state.load <= state.budget + 1e-6, (state.engine.id, state.load, state.budget)
        assert state.free_slots >= 0
        for s in state.streams:
            assert s.model == state.engine.model
            if s.pinned:
                assert state.engine.node == s.node


# ---- exact rules ---------------------------------------------------------------------------------


def test_demand_is_fps_times_tokens_per_frame_times_one_plus_overhead():
    assert Stream("s", "m", 1.0, 196, 0.02).demand == pytest.approx(199.92)
    assert Stream("s", "m", 2.0, 196, 0.0).demand == 392.0


def test_expected_answers_count_against_the_budget():
    """answer_load (share of an engine the questions take) costs answer_load × prefill rate."""
    asking = Stream("q1", "m", 1.0, 100, 0.0, answer_load=0.5)
    assert asking.cost(1000.0) == 600.0 and asking.cost(2000.0) == 1100.0
    table = PlacementTable([engine("e0", tps=1000.0)])
    table.add_stream(asking)
    assert table.utilisation() == {"e0": 0.6}
    with pytest.raises(NoFit, match="needs 600 prefill tokens/s; the most spare budget is 200"):
        table.add_stream(Stream("q2", "m", 1.0, 100, 0.0, answer_load=0.5))
    table.add_stream(stream("quiet", fps=2))  # 200 tokens/s, no questions: fits exactly


def test_each_rule_refuses_with_its_reason():
    busy = EngineState(engine("e0", slots=1), (stream("x"),))
    cases = [
        ([], "no engine accepts streams"),
        ([EngineState(engine("e0"), draining=True)], "no engine accepts streams"),
        ([EngineState(engine("e0", model="other"))], "no engine serves model 'm'"),
        ([EngineState(engine("e0", node="n1"))], "on node n0, where the stream's camera is"),
        ([busy], "no free slot"),
        ([EngineState(engine("e0", tps=100.0))], "needs 100 prefill tokens/s; the most spare budget is 80"),
    ]
    for engines, reason in cases:
        decision = place(stream("s", node="n0"), engines)
        assert not decision.ok and reason in decision.reason, (decision, reason)


def test_least_projected_utilisation_then_fewer_streams_then_id():
    e0 = EngineState(engine("e0"), (stream("a", fps=2),))
    e1 = EngineState(engine("e1"), (stream("b", fps=1),))
    assert place(stream("s"), [e0, e1]).engine == "e1"
    # a faster engine with the same load has the lower projected utilisation
    e2 = EngineState(engine("e2", tps=4000.0), (stream("c", fps=2),))
    assert place(stream("s"), [e0, e1, e2]).engine == "e2"
    tied = [EngineState(engine("e1"), (stream("a"), stream("b"))), EngineState(engine("e0"), (stream("c", fps=2),))]
    assert place(stream("s"), tied).engine == "e0"  # same load: fewer streams
    assert place(stream("s"), [EngineState(engine("e1")), EngineState(engine("e0"))]).engine == "e0"  # then id


def test_affinity_required_pins_and_preferred_prefers_when_it_fits():
    local = EngineState(engine("e0", node="n0"), (stream("a", fps=5),))
    remote = EngineState(engine("e1", node="n1"))
    assert place(stream("s", node="n0"), [local, remote]).engine == "e0"  # busier, but the camera is there
    assert place(stream("s", node="n0", affinity="preferred"), [local, remote]).engine == "e0"
    full_local = EngineState(engine("e0", node="n0", tps=500.0), (stream("a", fps=4),))
    assert not place(stream("s", node="n0"), [full_local, remote]).ok
    assert place(stream("s", node="n0", affinity="preferred"), [full_local, remote]).engine == "e1"


def test_epoch_starts_at_one_and_every_move_adds_one():
    table = PlacementTable([engine("e0"), engine("e1"), engine("e2", slots=1)])
    assert table.add_stream(stream("s")) == Move("s", None, "e0", 1)
    assert table.move("s").epoch == 2 and table.engine_of("s") == "e1"
    assert table.move("s", to="e2") == Move("s", "e1", "e2", 3)
    table.add_stream(stream("t"))
    with pytest.raises(NoFit, match="engine e2 has no free slot"):
        table.move("t", to="e2")
    with pytest.raises(NoFit, match="already on engine e2"):
        table.move("s", to="e2")
    assert table.epoch("s") == 3


def test_a_stale_planned_move_is_refused():
    table = PlacementTable([engine("e0"), engine("e1"), engine("e2")])
    table.add_stream(stream("s"))
    planned = table.plan_move("s", to="e1")
    table.move("s", to="e2")
    with pytest.raises(StaleMove, match="is on e2, not e0"):
        table.apply(planned)
    assert table.epoch("s") == 2


def test_drain_plans_every_stream_off_and_stops_new_placements():
    table = PlacementTable([engine("e0"), engine("e1"), engine("e2", node="n1")])
    for i in range(4):
        table.add_stream(stream(f"s{i}"))
    table.add_stream(stream("cam", node="n0"))
    on_e0 = [s.id for s in table.engine_state("e0").streams]
    plan = table.drain("e0")
    assert {m.stream for m in plan.moves} == set(on_e0) and not plan.stuck
    assert all(m.target != "e0" for m in plan.moves)
    assert table.add_stream(stream("new")).target != "e0"
    for move in plan.moves:
        table.apply(move)
    assert table.engine_state("e0").streams == ()
    table.remove_engine("e0")
    assert table.engine_of("cam") == "e1"  # pinned to n0: the only other n0 engine
    assert_within_capacity(table)


def test_drain_reports_what_can_go_nowhere():
    table = PlacementTable([engine("e0", node="n0"), engine("e1", node="n1")])
    table.add_stream(stream("cam", node="n0"))
    table.add_stream(stream("free", node="n0", affinity="preferred"))
    plan = table.drain("e0")
    assert [m.stream for m in plan.moves] == ["free"]
    assert [d.stream for d in plan.stuck] == ["cam"] and "on node n0" in plan.stuck[0].reason
    with pytest.raises(PlacementError, match="still holds 2 streams: drain it first"):
        table.remove_engine("e0")


def test_rebalance_lowers_the_peak_and_stops_when_balanced():
    table = PlacementTable([engine("e0")])
    for i in range(6):
        table.add_stream(stream(f"s{i}"))
    table.add_engine(engine("e1"))
    table.add_engine(engine("e2"))
    before = max(table.utilisation().values())
    plan = table.plan_rebalance()
    assert len(plan.moves) == 4
    for move in plan.moves:
        assert table.apply(move).epoch == 2
    assert max(table.utilisation().values()) < before
    assert sorted(len(s.streams) for s in table.engine_states()) == [2, 2, 2]
    assert table.plan_rebalance().moves == ()


def test_a_stream_grown_past_the_budget_is_moved_off_by_rebalance():
    table = PlacementTable([engine("e0"), engine("e1")])
    for i in range(4):
        table.add_stream(stream(f"s{i}"))  # 100 tokens/s each, two per engine
    grown = Stream("s0", "m", 1.0, 100, 0.0, answer_load=0.65)  # its questions now take 65 % of an engine
    on = table.engine_of("s0")
    assert table.update_stream(grown) is True and table.utilisation()[on] == pytest.approx(0.85)
    assert table.epoch("s0") == 1
    plan = table.plan_rebalance(tolerance=0.5)  # over budget: any lowering counts
    assert [m.source for m in plan.moves] == [on]
    for move in plan.moves:
        table.apply(move)
    assert_within_capacity(table)
    with pytest.raises(PlacementError, match="a new model or node is a new stream"):
        table.update_stream(stream("s1", node="n1"))


def test_failover_moves_what_fits_and_reports_the_rest_as_pending():
    table = PlacementTable([engine("e0", slots=3), engine("e1", slots=3), engine("e2", node="n1", slots=3)])
    for i in range(6):
        table.add_stream(stream(f"s{i}"))
    table.add_stream(stream("cam", node="n1"))
    outcome = table.fail("e2")
    orphans = {"s2", "s5", "cam"}
    moved = {m.stream for m in outcome.moved}
    unplaced = {d.stream for d in outcome.unplaced}
    assert moved | unplaced == orphans and not moved & unplaced
    assert "cam" in unplaced  # its node has no other engine
    assert set(table.pending()) == unplaced and all(table.engine_of(s) is None for s in unplaced)
    assert all(table.epoch(m.stream) == 2 and m.source is None for m in outcome.moved)
    table.add_engine(engine("e3", node="n1"))
    retry = table.place_pending()
    assert {m.stream for m in retry.moved} == unplaced and not retry.unplaced
    assert table.epoch("cam") == 2 and table.pending() == {}
    assert_within_capacity(table)


def test_rebuild_gives_the_same_table_and_names_stale_copies():
    table = PlacementTable([engine("e0"), engine("e1"), engine("e2", node="n1")])
    index: dict[str, SnapshotEntry] = {}
    for i in range(5):
        move = table.add_stream(stream(f"s{i}"))
        index[move.stream] = SnapshotEntry(table.streams[move.stream], move.epoch)
    table.add_stream(stream("cam", node="n1"))
    index["cam"] = SnapshotEntry(table.streams["cam"], 1)
    moved = table.move("s0")
    index["s0"] = SnapshotEntry(table.streams["s0"], moved.epoch)
    table.drain("e1")
    table.fail("e2")  # cam is pending now
    assert "cam" in table.pending()
    table.remove_stream("s4")
    index["s4"] = SnapshotEntry(stream("s4"), 1, ended=True)
    reports = table.reports()
    # a move in flight when the registry died: the source still holds an older copy
    old_copy = (stream("s0"), 1)
    source = next(r for r in reports if r.engine.id == "e0")
    reports = [r if r is not source else type(r)(r.engine, (*r.streams, old_copy), r.draining) for r in reports]
    rebuilt = rebuild(reports, index.values())
    assert rebuilt.table.state() == table.state()
    assert table.engine_of("s0") == "e1" and rebuilt.stale == (("e0", "s0", 1),)
    assert "cam" in rebuilt.table.pending()
    # a snapshot newer than every engine's copy: the copy is stale, the stream is to be restored
    newer = [*index.values(), SnapshotEntry(table.streams["s1"], table.epoch("s1") + 1)]
    again = rebuild(table.reports(), newer)
    assert again.table.engine_of("s1") is None and (table.engine_of("s1"), "s1", table.epoch("s1")) in again.stale


def test_bad_values_are_refused_with_one_line():
    for make, message in [
        (lambda: Engine("e", "m", 0, 1.0), "slots must be at least 1"),
        (lambda: Engine("e", "m", 1, 0.0), "prefill_tps must be positive"),
        (lambda: Stream("s", "m", 0.0, 1), "fps must be positive"),
        (lambda: Stream("s", "m", 1.0, 1, affinity="maybe"), "affinity must be one of required, preferred"),
        (lambda: PlacementTable(max_busy=1.5), "max_busy must be in"),
    ]:
        with pytest.raises(PlacementError, match=message) as info:
            make()
        assert "\n" not in str(info.value)


# ---- invariants (hypothesis) ---------------------------------------------------------------------

NODES = ("n0", "n1")
MODELS = ("a", "b")

engines_st = st.lists(
    st.builds(lambda i, m, n, slots, tps: Engine(f"e{i}", m, slots, tps, n),
              st.integers(0, 5), st.sampled_from(MODELS), st.sampled_from(NODES), st.integers(1, 4),
              st.sampled_from([400.0, 1000.0, 2500.0])),
    min_size=0, max_size=5, unique_by=lambda e: e.id)
stream_st = st.builds(lambda i, m, fps, tokens, node, aff: Stream(f"s{i}", m, fps, tokens, 0.02, node, aff),
                      st.integers(0, 40), st.sampled_from(MODELS), st.sampled_from([0.5, 1.0, 2.0]),
                      st.sampled_from([50, 196, 400]), st.sampled_from([None, *NODES]),
                      st.sampled_from(["required", "preferred"]))


def filled(engines: list[Engine], streams: list[Stream]) -> PlacementTable:
    table = PlacementTable(engines)
    for s in streams:
        if s.id not in table.streams:
            try:
                table.add_stream(s)
            except NoFit:
                pass
    return table


@settings(max_examples=150, deadline=None)
@given(engines_st, st.lists(stream_st, max_size=20), stream_st)
def test_place_finds_a_fit_whenever_one_exists_and_never_over_capacity(engines, existing, new):
    table = filled(engines, [s for s in existing if s.id != new.id])
    states = table.engine_states()
    fitting = [s for s in states if stream_fits(new, s) is None]
    decision = place(new, states)
    assert decision.ok == bool(fitting)
    if not decision.ok:
        assert decision.reason
        return
    chosen = next(s for s in states if s.engine.id == decision.engine)
    assert stream_fits(new, chosen) is None
    assert chosen.load + new.demand <= chosen.budget + 1e-6 and chosen.free_slots >= 1
    if new.pinned:
        assert chosen.engine.node == new.node
    candidates = fitting
    if new.node is not None and any(s.engine.node == new.node for s in fitting):
        assert chosen.engine.node == new.node
        candidates = [s for s in fitting if s.engine.node == new.node]
    assert chosen.utilisation_with(new) <= min(s.utilisation_with(new) for s in candidates) + 1e-12


operation = st.one_of(
    st.tuples(st.just("add"), stream_st),
    st.tuples(st.just("move"), st.integers(0, 40)),
    st.tuples(st.just("fail"), st.integers(0, 5)),
    st.tuples(st.just("drain"), st.integers(0, 5)),
    st.tuples(st.just("engine"), st.integers(6, 9), st.sampled_from(MODELS), st.sampled_from(NODES)),
    st.tuples(st.just("pending"),),
    st.tuples(st.just("rebalance"),),
    st.tuples(st.just("remove"), st.integers(0, 40)),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engines_st, st.lists(operation, max_size=25))
def test_every_operation_keeps_capacity_affinity_epochs_and_the_rebuild(engines, ops):
    table = PlacementTable(engines)
    index: dict[str, SnapshotEntry] = {}  # the store: the registry records each new epoch there
    seen: dict[str, int] = {}

    def record(moves):
        for m in moves:
            assert m.epoch == seen.get(m.stream, 0) + 1, m  # every placement adds exactly one
            seen[m.stream] = m.epoch
            index[m.stream] = SnapshotEntry(table.streams[m.stream], m.epoch)

    for op in ops:
        kind = op[0]
        if kind == "add" and op[1].id not in table.streams and op[1].id not in index:
            try:
                record([table.add_stream(op[1])])
            except NoFit:
                pass
        elif kind == "move" and f"s{op[1]}" in table.streams:
            try:
                record([table.move(f"s{op[1]}")])
            except NoFit:
                pass
        elif kind == "fail" and f"e{op[1]}" in table.engines:
            orphans = {s.id for s in table.engine_state(f"e{op[1]}").streams}
            outcome = table.fail(f"e{op[1]}")
            assert {m.stream for m in outcome.moved} | {d.stream for d in outcome.unplaced} == orphans
            assert all(d.reason for d in outcome.unplaced)
            record(outcome.moved)
        elif kind == "drain" and f"e{op[1]}" in table.engines:
            plan = table.drain(f"e{op[1]}")
            record([table.apply(m) for m in plan.moves])
            assert {s.id for s in table.engine_state(f"e{op[1]}").streams} == {d.stream for d in plan.stuck}
        elif kind == "engine" and f"e{op[1]}" not in table.engines:
            table.add_engine(Engine(f"e{op[1]}", op[2], 3, 1000.0, op[3]))
        elif kind == "pending":
            record(table.place_pending().moved)
        elif kind == "rebalance":
            peak = max(table.utilisation().values(), default=0.0)
            record([table.apply(m) for m in table.plan_rebalance().moves])
            assert max(table.utilisation().values(), default=0.0) <= peak + 1e-12
        elif kind == "remove" and f"s{op[1]}" in table.streams:
            sid = f"s{op[1]}"
            index[sid] = SnapshotEntry(table.streams[sid], table.epoch(sid), ended=True)
            table.remove_stream(sid)
        assert_within_capacity(table)
        for sid in table.streams:
            assert table.epoch(sid) == seen[sid]
            assert (table.engine_of(sid) is None) == (sid in table.pending())
        rebuilt = rebuild(table.reports(), index.values())
        assert rebuilt.table.state() == table.state() and rebuilt.stale == ()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.builds(lambda i, slots, tps, node: Engine(f"e{i}", "a", slots, tps, node), st.integers(0, 5),
                          st.integers(1, 6), st.sampled_from([400.0, 1000.0, 2500.0]), st.sampled_from(NODES)),
                min_size=2, max_size=5, unique_by=lambda e: e.id),
       st.lists(stream_st.map(lambda s: Stream(s.id, "a", s.fps, s.tokens_per_frame, s.overhead, s.node, "preferred")),
                max_size=30),
       st.integers(0, 4))
def test_failover_leaves_no_orphan_when_capacity_suffices(engines, streams, which):
    """Enough capacity: the survivors can surely take every orphan, i.e. the sum over them of
    min(free slots, spare budget // largest orphan demand) covers the orphans (then least-loaded
    placement cannot get stuck). Otherwise the ones left are reported, with a reason."""
    table = filled(engines, streams)
    dead = engines[which % len(engines)].id
    orphans = table.engine_state(dead).streams
    survivors = [s for s in table.engine_states() if s.engine.id != dead]
    biggest = max((s.demand for s in orphans), default=1.0)
    surely = sum(min(s.free_slots, math.floor((s.spare + 1e-9) / biggest)) for s in survivors)
    outcome = table.fail(dead)
    assert {m.stream for m in outcome.moved} | {d.stream for d in outcome.unplaced} == {s.id for s in orphans}
    if surely >= len(orphans):
        assert outcome.unplaced == ()
    assert set(table.pending()) == {d.stream for d in outcome.unplaced}
    assert_within_capacity(table)


# ---- the simulation: must-show 6 ------------------------------------------------------------------


def chunk_period(workload: Workload, longest: bool = False) -> float:
    return workload.chunk_frames / (min(workload.fps) if longest else max(workload.fps))


def test_200_streams_on_4_engines_under_capacity_bounded_lag_none_starved():
    workload = Workload(streams=200, engines=4)
    summary = simulate(workload)
    assert summary.placed == 200 and summary.refused == 0
    assert summary.max_planned_utilisation <= MAX_BUSY + 1e-9
    assert summary.max_engine_utilisation < MAX_BUSY + 0.02  # measured: the expected answers were counted
    assert summary.starved == 0 and summary.chunks_served == summary.chunks > 20000
    assert summary.lag_max_s < chunk_period(workload)  # memory never a whole (shortest) chunk period behind
    assert summary.answered == summary.questions > 0 and summary.refused_questions == 0
    # bounded: a horizon twice as long leaves the tail where it was (an overload's tail doubles, below)
    longer = simulate(Workload(streams=200, engines=4, duration_s=2 * workload.duration_s))
    assert longer.lag_p99_s < 1.3 * summary.lag_p99_s and longer.starved == 0


def test_the_same_streams_forced_onto_three_engines_starve():
    """What the rules prevent: placement bypassed, 200 streams on 3 of the 4 engines."""
    workload = Workload(streams=200, engines=4)
    _, streams = build(workload)
    forced = {s.id: f"e{i % 3}" for i, s in enumerate(streams)}
    summary = simulate(workload, forced)
    assert summary.max_planned_utilisation > 1.0
    assert summary.starved > 0 and summary.lag_max_s > chunk_period(workload, longest=True)
    longer = simulate(Workload(streams=200, engines=4, duration_s=2 * workload.duration_s), forced)
    assert longer.lag_p99_s > 1.5 * summary.lag_p99_s


def test_placing_by_ingest_alone_lets_questions_starve_ingest():
    """Frequent questions (one per stream per 4 min, 1.6 s each unbatched): placed by ingest alone
    the engines saturate and streams starve; counting the expected answers refuses streams instead."""
    ingest_only = simulate(Workload(question_every_s=240.0, answer_aware=False))
    assert ingest_only.placed == 200 and ingest_only.max_engine_utilisation > 0.99 and ingest_only.starved > 0
    aware = simulate(Workload(question_every_s=240.0))
    assert aware.refused > 0 and aware.starved == 0 and aware.max_engine_utilisation < MAX_BUSY + 0.02


def test_more_streams_than_capacity_are_refused_not_overloaded():
    summary = simulate(Workload(streams=260, engines=4, duration_s=300))
    assert summary.refused > 0 and summary.placed + summary.refused == 260
    assert "add an engine" in summary.refusals[0]
    assert summary.max_planned_utilisation <= MAX_BUSY + 1e-9 and summary.starved == 0


def test_simulated_failover_re_places_or_reports_and_loses_no_question():
    fits = simulate(Workload(streams=150, engines=4, fail_engine="e3", duration_s=1200, fail_at_s=630))
    f = fits.failover
    assert f is not None and f["orphans"] == f["moved"] > 0 and f["unplaced"] == 0
    assert f["restored_s"] < 10 and f["reingested_chunks"] > 0
    assert fits.starved == 0 and fits.answered + fits.refused_questions == fits.questions
    short = simulate(Workload(streams=200, engines=4, fail_engine="e3", duration_s=1200, fail_at_s=630))
    g = short.failover
    assert g is not None and g["unplaced"] > 0 and g["moved"] + g["unplaced"] == g["orphans"]
    assert all("add an engine" in r for r in g["unplaced_reasons"])
    assert short.starved == 0 and short.answered + short.refused_questions == short.questions
    assert short.refused_questions > 0


def test_simulate_command_prints_the_summary_without_torch_or_ray():
    code = ("import runpy, sys\n"
            "sys.argv = ['simulate', '--streams', '200', '--engines', '4', '--duration', '300', '--json']\n"
            "try:\n    runpy.run_module('hermes_cli.cluster.simulate', run_name='__main__')\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('HEAVY', sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stderr
    record = json.loads(done.stdout)
    assert record["placed"] == 200 and record["starved"] == 0
    text = subprocess.run([sys.executable, "-m", "hermes_cli.cluster.simulate", "--streams", "20", "--engines", "2",
                           "--duration", "120"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert text.returncode == 0 and "lag p50" in text.stdout and "starved streams 0" in text.stdout


def test_rates_from_bench_records(tmp_path):
    """Sizing from the measured prefill cost: ``hermes bench --json`` step records → the rates."""
    from hermes_cli.bench.runner import BenchRecord

    def step(frames, tokens, prefill_ms, compress_ms, tpot):
        return BenchRecord("hermes", frames, 10.0, tpot, 0, 0, 0, 0.0, 0.0, 0.0, stream_tokens=tokens,
                           prefill_ms_total=prefill_ms, compress_ms_total=compress_ms).to_json()

    records = [step(16, 3136, 2000.0, 40.0, 20.0), step(32, 6272, 1500.0, 30.0, 30.0), step(48, 9408, 1500.0, 30.0, 25.0),
               {**step(16, 3136, 1.0, 0.0, 1.0), "policy": "fifo"}]
    rates = rates_from_bench(records)
    assert rates.policy == "hermes" and rates.frames == 48 and rates.tokens_per_frame == 196
    assert rates.prefill_tps == pytest.approx(9408 / 5.0) and rates.overhead == pytest.approx(100 / 5000)
    assert rates.tpot_s == pytest.approx(0.025)
    assert rates_from_bench(records, "fifo").prefill_tps == pytest.approx(3136 / 0.001)
    with pytest.raises(PlacementError, match="no records of policy 'lru'; the file has fifo, hermes"):
        rates_from_bench(records, "lru")
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, "-m", "hermes_cli.cluster.simulate", "--from-bench", str(bench),
                           "--streams", "8", "--engines", "1", "--nodes", "1", "--duration", "120"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "measured (hermes, 48 frames): prefill 1882 tokens/s, 196 tokens/frame" in done.stdout
    assert "engine: 1882 prefill tokens/s" in done.stdout


@pytest.mark.parametrize("args, message", [
    (["--fps", "one"], "--fps must be numbers separated by commas"),
    (["--engines", "0"], "--engines must be at least 1"),
    (["--fail", "e9"], "--fail e9: no such engine; they are e0, e1, e2, e3"),
    (["--max-busy", "0"], "--max-busy must be in (0, 1]"),
    (["--from-bench", "no-such-file.jsonl"], "--from-bench no-such-file.jsonl: No such file or directory"),
    (["--streams"], "expected one argument"),
])
def test_simulate_command_refuses_bad_input_with_one_line(args, message):
    done = subprocess.run([sys.executable, "-m", "hermes_cli.cluster.simulate", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_docs_cite_the_simulation_as_it_runs(capsys):
    """docs/cluster.md's summary and tables are this command's output, not figures typed in."""
    from hermes_cli.cluster.simulate import main

    doc = (ROOT / "docs" / "cluster.md").read_text()

    def run(args: list[str]) -> dict:
        assert main([*args, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    assert main(["--streams", "200", "--engines", "4"]) == 0
    assert capsys.readouterr().out.strip() in doc
    rows = re.findall(r"^\| `(--streams [^`]*)`[^|]*\| (\d+) / (\d+) \| ([\d.]+)% \| ([\d.]+)% \| "
                      r"([\d.]+) / ([\d.]+) / ([\d.]+) \| (\d+) \|", doc, re.M)
    assert len(rows) >= 8
    for options, *cited in rows:
        out = run(options.split())
        assert cited == [str(out["placed"]), str(out["refused"]), f"{out['max_planned_utilisation']:.1%}"[:-1],
                         f"{out['max_engine_utilisation']:.1%}"[:-1], f"{out['lag_p50_s']:.2f}", f"{out['lag_p99_s']:.2f}",
                         f"{out['lag_max_s']:.2f}", str(out["starved"])], options
    failovers = re.findall(r"^\| `(--streams [^`]*--fail [^`]*)` \| (\d+) \| (\d+) / (\d+)[^|]*\| ([\d.]+) s \| (\d+) \| "
                           r"(\d+) \| ([\d.]+) s \| (\d+) \|", doc, re.M)
    assert len(failovers) == 2
    for options, *cited in failovers:
        out = run(options.split())
        f = out["failover"]
        assert cited == [str(f["orphans"]), str(f["moved"]), str(f["unplaced"]), f"{f['restored_s']:.1f}",
                         str(f["reingested_chunks"]), str(f["gap_chunks"]), f"{f['caught_up_s']:.1f}",
                         str(out["refused_questions"])], options
