"""The registry's stream → engine table as pure Python (no torch, no Ray): placement, epochs,
moves, drain and rebalance plans, failover, and the rebuild after a registry restart.

A stream lives on exactly one engine. Its ingest costs ``fps × tokens per frame × (1 + c)``
prefill tokens per second (c: the compression overhead); its questions cost ``answer_load``, the
share of an engine's time they take (questions per second × seconds per answer; 0 until known),
counted as ``answer_load × prefill rate`` token-equivalents. An engine offers ``slots`` streams
and a sustained prefill rate, of which ``max_busy`` may be claimed by its streams' ingest and
expected answers; the rest absorbs bursts. ``place`` applies the rules in order:

1. the engine accepts streams (not draining) and serves the stream's model;
2. node affinity ``"required"`` (a local camera whose reader runs on that node): that node only;
3. a free slot;
4. spare budget for the stream's cost on that engine (ingest + expected answers);
5. node affinity ``"preferred"``: that node's engines when one of them fits;
6. the least projected utilisation ``(load + cost) / prefill rate``; ties by stream count, id.

So a stream is refused (with the rule that failed) only when no engine fits, and no engine is
ever placed over its budget. Every placement of a stream — the first, a move, a restore
elsewhere after a failure — bumps that stream's ``epoch`` by one; an answer carries the epoch
of the memory that produced it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

COMPRESSION_OVERHEAD = 0.02  # c at the defaults: compression ≈ 2 % of prefill (docs/benchmarks.md)
MAX_BUSY = 0.8  # of an engine's time, what its streams' ingest and expected answers may claim
AFFINITIES = ("required", "preferred")
_EPS = 1e-9


class PlacementError(ValueError):
    """A placement request that cannot be met; the message is one line saying why."""


class NoFit(PlacementError):
    """No engine can take the stream under the rules."""


class StaleMove(PlacementError):
    """A planned move no longer matches the table (the stream moved, or the target filled up)."""


@dataclass(frozen=True)
class Engine:
    """An engine's capacity: one model copy, ``slots`` streams, a sustained prefill rate, a node."""

    id: str
    model: str
    slots: int
    prefill_tps: float  # sustained prefill tokens per second (vision encoding included)
    node: str = "node-0"

    def __post_init__(self) -> None:
        if not self.id:
            raise PlacementError("an engine needs an id")
        if self.slots < 1:
            raise PlacementError(f"engine {self.id}: slots must be at least 1, not {self.slots}")
        if not self.prefill_tps > 0:
            raise PlacementError(f"engine {self.id}: prefill_tps must be positive, not {self.prefill_tps}")


@dataclass(frozen=True)
class Stream:
    """A stream's demand and constraints. ``node`` with ``affinity`` ``"required"`` pins it to
    that node (a local camera); ``"preferred"`` only prefers it."""

    id: str
    model: str
    fps: float
    tokens_per_frame: int
    overhead: float = COMPRESSION_OVERHEAD
    node: str | None = None
    affinity: str = "required"
    answer_load: float = 0.0  # share of an engine its questions take: questions/s × seconds per answer

    def __post_init__(self) -> None:
        if not self.id:
            raise PlacementError("a stream needs an id")
        if not 0 <= self.answer_load < 1:
            raise PlacementError(f"stream {self.id}: answer_load must be in [0, 1), not {self.answer_load}")
        if not self.fps > 0:
            raise PlacementError(f"stream {self.id}: fps must be positive, not {self.fps}")
        if self.tokens_per_frame < 1:
            raise PlacementError(f"stream {self.id}: tokens_per_frame must be at least 1, not {self.tokens_per_frame}")
        if self.overhead < 0:
            raise PlacementError(f"stream {self.id}: overhead must be 0 or more, not {self.overhead}")
        if self.affinity not in AFFINITIES:
            raise PlacementError(f"stream {self.id}: affinity must be one of {', '.join(AFFINITIES)}, not {self.affinity!r}")

    @property
    def demand(self) -> float:
        """Prefill tokens per second this stream costs its engine."""
        return self.fps * self.tokens_per_frame * (1.0 + self.overhead)

    def cost(self, prefill_tps: float) -> float:
        """Prefill token-equivalents per second on an engine of that rate: ingest + expected answers."""
        return self.demand + self.answer_load * prefill_tps

    @property
    def pinned(self) -> bool:
        return self.node is not None and self.affinity == "required"


@dataclass(frozen=True)
class EngineState:
    """An engine with the streams it holds, as ``place`` sees it."""

    engine: Engine
    streams: tuple[Stream, ...] = ()
    draining: bool = False
    max_busy: float = MAX_BUSY

    @property
    def load(self) -> float:
        """The streams' cost here, prefill token-equivalents per second."""
        return sum(s.cost(self.engine.prefill_tps) for s in self.streams)

    @property
    def budget(self) -> float:
        return self.engine.prefill_tps * self.max_busy

    @property
    def spare(self) -> float:
        return self.budget - self.load

    @property
    def free_slots(self) -> int:
        return self.engine.slots - len(self.streams)

    @property
    def utilisation(self) -> float:
        """The planned busy share: load / prefill rate (≤ ``max_busy`` when placed by the rules)."""
        return self.load / self.engine.prefill_tps

    def cost_of(self, stream: Stream) -> float:
        return stream.cost(self.engine.prefill_tps)

    def utilisation_with(self, stream: Stream) -> float:
        return (self.load + self.cost_of(stream)) / self.engine.prefill_tps

    def fits(self, stream: Stream) -> bool:
        return stream_fits(stream, self) is None

    def with_stream(self, stream: Stream) -> EngineState:
        return replace(self, streams=(*self.streams, stream))

    def without(self, stream_id: str) -> EngineState:
        return replace(self, streams=tuple(s for s in self.streams if s.id != stream_id))


@dataclass(frozen=True)
class Decision:
    """Where ``place`` puts a stream: an engine id, or None and the rule that failed."""

    stream: str
    engine: str | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.engine is not None


def stream_fits(stream: Stream, state: EngineState) -> str | None:
    """None when ``state`` can take ``stream`` under the hard rules (1–4), else why not."""
    engine = state.engine
    if state.draining:
        return f"engine {engine.id} is draining"
    if engine.model != stream.model:
        return f"engine {engine.id} serves {engine.model!r}, not {stream.model!r}"
    if stream.pinned and engine.node != stream.node:
        return f"stream {stream.id} must run on node {stream.node} (its camera is there), engine {engine.id} is on {engine.node}"
    if state.free_slots < 1:
        return f"engine {engine.id} has no free slot ({engine.slots} streams)"
    if state.spare + _EPS < state.cost_of(stream):
        return (f"engine {engine.id} has {max(state.spare, 0.0):.0f} spare prefill tokens/s, "
                f"stream {stream.id} needs {state.cost_of(stream):.0f}")
    return None


def place(stream: Stream, engines: Sequence[EngineState]) -> Decision:
    """The engine for ``stream`` under the module's rules, or the first rule no engine met."""
    pool = [e for e in engines if not e.draining]
    if not pool:
        return Decision(stream.id, None, "no engine accepts streams (none registered, or all draining)")
    pool = [e for e in pool if e.engine.model == stream.model]
    if not pool:
        return Decision(stream.id, None, f"no engine serves model {stream.model!r}")
    if stream.pinned:
        pool = [e for e in pool if e.engine.node == stream.node]
        if not pool:
            return Decision(stream.id, None, f"no engine for {stream.model!r} on node {stream.node}, where the stream's camera is")
    pool = [e for e in pool if e.free_slots >= 1]
    if not pool:
        return Decision(stream.id, None, "every engine that could take it is full (no free slot)")
    roomy = [e for e in pool if e.spare + _EPS >= e.cost_of(stream)]
    if not roomy:
        best = max(pool, key=lambda e: (e.spare - e.cost_of(stream), e.engine.id))
        return Decision(stream.id, None, f"it needs {best.cost_of(stream):.0f} prefill tokens/s; the most spare budget "
                                         f"is {max(best.spare, 0.0):.0f} tokens/s (engine {best.engine.id}): add an engine")
    if stream.node is not None and not stream.pinned:
        local = [e for e in roomy if e.engine.node == stream.node]
        roomy = local or roomy
    best = min(roomy, key=lambda e: (e.utilisation_with(stream), len(e.streams), e.engine.id))
    return Decision(stream.id, best.engine.id)


def placement_order(streams: Iterable[Stream]) -> list[Stream]:
    """The order in which a batch of streams is placed: pinned first, then largest demand first
    (first-fit decreasing packs tighter), then id — deterministic."""
    return sorted(streams, key=lambda s: (not s.pinned, -s.demand, -s.answer_load, s.id))


@dataclass(frozen=True)
class Move:
    """Stream ``stream`` from engine ``source`` (None: from its snapshot, no engine holds it) to
    ``target``. ``epoch`` is None in a plan and the stream's new epoch once applied."""

    stream: str
    source: str | None
    target: str
    epoch: int | None = None


@dataclass(frozen=True)
class Plan:
    """Moves to run one at a time (each at a chunk boundary, then ``apply``), and the streams
    that cannot go anywhere, with why."""

    moves: tuple[Move, ...] = ()
    stuck: tuple[Decision, ...] = ()


@dataclass(frozen=True)
class Outcome:
    """What a failover (or a retry of pending streams) did: moves applied, streams left unplaced."""

    moved: tuple[Move, ...] = ()
    unplaced: tuple[Decision, ...] = ()


@dataclass(frozen=True)
class EngineReport:
    """What an engine says about itself (its ``list_streams()``): capacity, draining, streams held
    with the epoch each was restored or created at."""

    engine: Engine
    streams: tuple[tuple[Stream, int], ...] = ()
    draining: bool = False


@dataclass(frozen=True)
class SnapshotEntry:
    """The snapshot store's latest entry for a stream: its spec, the epoch it was saved at, and
    whether the stream ended (deleted: not to be restored)."""

    stream: Stream
    epoch: int
    ended: bool = False


@dataclass(frozen=True)
class TableState:
    """The whole table as a comparable value: engines, draining, and per stream (engine, epoch)."""

    engines: tuple[Engine, ...]
    draining: frozenset[str]
    streams: tuple[Stream, ...]
    assignments: tuple[tuple[str, str | None, int], ...]


class PlacementTable:
    """The registry's table: engines, streams, where each stream is and its epoch.

    Streams no engine could take after a failure stay in the table as *pending* (engine None)
    with the reason, and go back with ``place_pending()`` once capacity appears.
    """

    def __init__(self, engines: Iterable[Engine] = (), *, max_busy: float = MAX_BUSY) -> None:
        if not 0 < max_busy <= 1:
            raise PlacementError(f"max_busy must be in (0, 1], not {max_busy}")
        self.max_busy = max_busy
        self._engines: dict[str, Engine] = {}
        self._draining: set[str] = set()
        self._streams: dict[str, Stream] = {}
        self._where: dict[str, str | None] = {}
        self._epochs: dict[str, int] = {}
        self._pending: dict[str, str] = {}
        for engine in engines:
            self.add_engine(engine)

    # ---- reading -------------------------------------------------------------------------------

    @property
    def engines(self) -> dict[str, Engine]:
        return dict(self._engines)

    @property
    def streams(self) -> dict[str, Stream]:
        return dict(self._streams)

    def engine_of(self, stream_id: str) -> str | None:
        return self._where[self._known(stream_id)]

    def epoch(self, stream_id: str) -> int:
        return self._epochs[self._known(stream_id)]

    def pending(self) -> dict[str, str]:
        """Streams no engine holds, with why they could not be placed."""
        return dict(self._pending)

    def engine_state(self, engine_id: str) -> EngineState:
        if engine_id not in self._engines:
            raise PlacementError(f"no engine {engine_id!r}; known: {', '.join(sorted(self._engines)) or 'none'}")
        held = tuple(self._streams[s] for s in sorted(self._where) if self._where[s] == engine_id)
        return EngineState(self._engines[engine_id], held, engine_id in self._draining, self.max_busy)

    def engine_states(self) -> list[EngineState]:
        return [self.engine_state(e) for e in sorted(self._engines)]

    def utilisation(self) -> dict[str, float]:
        return {s.engine.id: s.utilisation for s in self.engine_states()}

    def state(self) -> TableState:
        return TableState(
            engines=tuple(self._engines[e] for e in sorted(self._engines)),
            draining=frozenset(self._draining),
            streams=tuple(self._streams[s] for s in sorted(self._streams)),
            assignments=tuple((s, self._where[s], self._epochs[s]) for s in sorted(self._streams)),
        )

    def reports(self) -> list[EngineReport]:
        """What each engine would report (``list_streams()``) for this table."""
        return [EngineReport(s.engine, tuple((x, self._epochs[x.id]) for x in s.streams), s.draining)
                for s in self.engine_states()]

    # ---- engines -------------------------------------------------------------------------------

    def add_engine(self, engine: Engine) -> None:
        if engine.id in self._engines:
            raise PlacementError(f"engine {engine.id!r} is already registered")
        self._engines[engine.id] = engine

    def remove_engine(self, engine_id: str) -> None:
        """Forget an engine that holds nothing (drain it first)."""
        held = self.engine_state(engine_id).streams
        if held:
            raise PlacementError(f"engine {engine_id} still holds {len(held)} streams: drain it first")
        del self._engines[engine_id]
        self._draining.discard(engine_id)

    def drain(self, engine_id: str) -> Plan:
        """Stop placing on ``engine_id`` and plan moving every stream off it."""
        self.engine_state(engine_id)
        self._draining.add(engine_id)
        return self.plan_drain(engine_id)

    def undrain(self, engine_id: str) -> None:
        self.engine_state(engine_id)
        self._draining.discard(engine_id)

    def fail(self, engine_id: str) -> Outcome:
        """``engine_id`` died: forget it and re-place its streams on the others (each from its
        last snapshot, a new epoch); the ones that fit nowhere stay pending and are reported."""
        orphans = self.engine_state(engine_id).streams
        del self._engines[engine_id]
        self._draining.discard(engine_id)
        for stream in orphans:
            self._where[stream.id] = None
        return self._place_all(orphans)

    def place_pending(self) -> Outcome:
        """Try every pending stream again (after an engine was added)."""
        return self._place_all([self._streams[s] for s in self._pending])

    # ---- streams -------------------------------------------------------------------------------

    def add_stream(self, stream: Stream) -> Move:
        """Place a new stream (epoch 1), or raise ``NoFit`` with the rule no engine met."""
        if stream.id in self._streams:
            raise PlacementError(f"stream {stream.id!r} already exists")
        decision = place(stream, self.engine_states())
        if not decision.ok:
            raise NoFit(f"cannot place stream {stream.id}: {decision.reason}")
        assert decision.engine is not None
        self._streams[stream.id] = stream
        self._where[stream.id] = decision.engine
        self._epochs[stream.id] = 1
        return Move(stream.id, None, decision.engine, 1)

    def update_stream(self, stream: Stream) -> bool:
        """Replace a stream's measured figures (fps, tokens per frame, ``answer_load``) where it is;
        its model and node constraint stay. Returns True when its engine is now over budget —
        ``plan_rebalance`` then moves streams off it first."""
        held = self._streams[self._known(stream.id)]
        if (stream.model, stream.node, stream.affinity) != (held.model, held.node, held.affinity):
            raise PlacementError(f"stream {stream.id}: a new model or node is a new stream (remove it and add it)")
        self._streams[stream.id] = stream
        engine = self._where[stream.id]
        if engine is None:
            return False
        state = self.engine_state(engine)
        return state.load > state.budget + _EPS

    def remove_stream(self, stream_id: str) -> None:
        self._known(stream_id)
        for table in (self._streams, self._where, self._epochs, self._pending):
            table.pop(stream_id, None)

    def plan_move(self, stream_id: str, to: str | None = None) -> Move:
        """The move of one stream: to ``to`` if it fits there, else to where ``place`` puts it
        among the other engines. Raises ``NoFit`` when there is nowhere to go."""
        stream = self._streams[self._known(stream_id)]
        source = self._where[stream_id]
        if to is not None:
            if to == source:
                raise NoFit(f"stream {stream_id} is already on engine {to}")
            why = stream_fits(stream, self.engine_state(to))
            if why:
                raise NoFit(f"cannot move stream {stream_id} to engine {to}: {why}")
            return Move(stream_id, source, to)
        decision = place(stream, [s for s in self.engine_states() if s.engine.id != source])
        if not decision.ok:
            raise NoFit(f"cannot move stream {stream_id}: {decision.reason}")
        assert decision.engine is not None
        return Move(stream_id, source, decision.engine)

    def move(self, stream_id: str, to: str | None = None) -> Move:
        return self.apply(self.plan_move(stream_id, to))

    def apply(self, move: Move) -> Move:
        """Commit one planned move (its snapshot is restored on the target): the stream's epoch
        goes up by one. Raises ``StaleMove`` if the table changed so that the move no longer holds."""
        stream = self._streams.get(move.stream)
        if stream is None:
            raise StaleMove(f"stream {move.stream} no longer exists")
        if self._where[move.stream] != move.source:
            raise StaleMove(f"stream {move.stream} is on {self._where[move.stream]}, not {move.source}: plan again")
        if move.target not in self._engines:
            raise StaleMove(f"engine {move.target} is gone: plan again")
        why = stream_fits(stream, self.engine_state(move.target))
        if why:
            raise StaleMove(f"cannot move stream {move.stream}: {why}: plan again")
        self._where[move.stream] = move.target
        self._epochs[move.stream] += 1
        self._pending.pop(move.stream, None)
        return replace(move, epoch=self._epochs[move.stream])

    # ---- plans ---------------------------------------------------------------------------------

    def plan_drain(self, engine_id: str) -> Plan:
        """Moves that empty ``engine_id`` onto the others (pinned and largest streams first)."""
        states = {s.engine.id: s for s in self.engine_states()}
        leaving = states.pop(engine_id)
        moves, stuck = [], []
        for stream in placement_order(leaving.streams):
            decision = place(stream, list(states.values()))
            if decision.ok:
                assert decision.engine is not None
                moves.append(Move(stream.id, engine_id, decision.engine))
                states[decision.engine] = states[decision.engine].with_stream(stream)
            else:
                stuck.append(decision)
        return Plan(tuple(moves), tuple(stuck))

    def plan_rebalance(self, tolerance: float = 0.05, max_moves: int | None = None) -> Plan:
        """Moves that lower the peak utilisation: repeatedly take a stream off the busiest engine
        to where ``place`` puts it, when that lowers the pair's peak by more than ``tolerance``
        (by anything while that engine is over its budget, e.g. after ``update_stream``). Each
        move lowers the sorted utilisations lexicographically, so the plan is finite."""
        states = {s.engine.id: s for s in self.engine_states() if not s.draining}
        limit = len(self._streams) if max_moves is None else max_moves
        moves: list[Move] = []
        while len(moves) < limit and len(states) > 1:
            hot = max(states.values(), key=lambda s: (s.utilisation, s.engine.id))
            others = [s for s in states.values() if s.engine.id != hot.engine.id]
            margin = 0.0 if hot.load > hot.budget + _EPS else tolerance
            chosen = None
            for stream in sorted(hot.streams, key=lambda s: (-hot.cost_of(s), s.id)):
                decision = place(stream, others)
                if not decision.ok:
                    continue
                assert decision.engine is not None
                target = states[decision.engine]
                after = max((hot.load - hot.cost_of(stream)) / hot.engine.prefill_tps, target.utilisation_with(stream))
                if after < hot.utilisation - margin - _EPS:
                    chosen = (stream, target)
                    break
            if chosen is None:
                break
            stream, target = chosen
            moves.append(Move(stream.id, hot.engine.id, target.engine.id))
            states[hot.engine.id] = hot.without(stream.id)
            states[target.engine.id] = target.with_stream(stream)
        return Plan(tuple(moves))

    # ---- internals -----------------------------------------------------------------------------

    def _known(self, stream_id: str) -> str:
        if stream_id not in self._streams:
            raise PlacementError(f"no stream {stream_id!r}")
        return stream_id

    def _place_all(self, streams: Iterable[Stream]) -> Outcome:
        moved, unplaced = [], []
        for stream in placement_order(streams):
            decision = place(stream, self.engine_states())
            if decision.ok:
                assert decision.engine is not None
                moved.append(self.apply(Move(stream.id, None, decision.engine)))
            else:
                self._pending[stream.id] = decision.reason
                unplaced.append(decision)
        return Outcome(tuple(moved), tuple(unplaced))


@dataclass(frozen=True)
class Rebuilt:
    """A table rebuilt after a registry restart, and the stale copies engines still hold
    (``(engine, stream, epoch)``: an older epoch than the stream's newest; free them)."""

    table: PlacementTable
    stale: tuple[tuple[str, str, int], ...] = field(default=())


def rebuild(reports: Iterable[EngineReport], snapshot_index: Iterable[SnapshotEntry], *,
            max_busy: float = MAX_BUSY) -> Rebuilt:
    """The table from what the engines hold and what the snapshot store indexes.

    The newest epoch of a stream wins: an engine's copy if its epoch is at least the newest
    snapshot's, else the stream is pending (restore it from the snapshot). Copies with an older
    epoch (a move that had restored on the target but not yet freed the source when the registry
    died) are stale. Streams only in the index, not ended, are pending at the index's epoch.
    """
    reports = list(reports)
    table = PlacementTable((r.engine for r in reports), max_busy=max_busy)
    claims: dict[str, list[tuple[int, str, Stream]]] = {}
    for report in reports:
        if report.draining:
            table._draining.add(report.engine.id)
        for stream, epoch in report.streams:
            claims.setdefault(stream.id, []).append((epoch, report.engine.id, stream))
    index: dict[str, SnapshotEntry] = {}
    for saved_entry in snapshot_index:
        held = index.get(saved_entry.stream.id)
        if held is None or saved_entry.epoch >= held.epoch:
            index[saved_entry.stream.id] = saved_entry
    stale: list[tuple[str, str, int]] = []
    for stream_id in sorted(set(claims) | set(index)):
        entry: SnapshotEntry | None = index.get(stream_id)
        copies = sorted(claims.get(stream_id, []), key=lambda c: (-c[0], c[1]))
        if entry is not None and entry.ended:
            stale.extend((engine, stream_id, epoch) for epoch, engine, _ in copies)
            continue
        saved = entry.epoch if entry is not None else 0
        if copies and copies[0][0] >= saved:
            epoch, engine, stream = copies[0]
            table._streams[stream_id] = stream
            table._where[stream_id] = engine
            table._epochs[stream_id] = epoch
            stale.extend((e, stream_id, ep) for ep, e, _ in copies[1:])
        else:
            assert entry is not None
            table._streams[stream_id] = entry.stream
            table._where[stream_id] = None
            table._epochs[stream_id] = entry.epoch
            table._pending[stream_id] = "restored from the snapshot index: no engine holds it"
            stale.extend((e, stream_id, ep) for ep, e, _ in copies)
    return Rebuilt(table, tuple(stale))
