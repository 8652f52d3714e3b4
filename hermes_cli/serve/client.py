"""A stream of a ``hermes serve`` server, driven over HTTP: what ``hermes chat --server`` uses.

``RemoteStream`` implements the methods of the engine's ``StreamClient`` that the interactive
prompt calls (``ask``, ``answer``, ``stats``, ``fresh_stats``, ``counts``, ``warnings``,
``state``, ``error``, ``paused``, ``last_answer``, ``memory_map``, ``clear_history``, ``pause``,
``resume``, ``save``, ``policy``, ``config``, ``model``, ``frames_per_unit``) on the routes of
docs/serve.md. The server owns the stream's source: ``submit`` is refused, ``flush`` and
``end`` do nothing; ``ServerFrames`` is the prompt's "source", which ends when the server's
stream does. The conversation is kept here and sent with each question (the server's
chat completions are stateless), so ``/clear`` forgets it.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx

from ..engine.config import SessionConfig
from ..engine.core import Event, StreamCounts
from ..engine.readouts import MemoryMap
from ..engine.records import Answer, CacheStats, ChunkReport, MemoryStats, PositionStats, SessionStats
from ..errors import HermesError
from ..frames import SourceStats

__all__ = ["RemoteAnswer", "RemoteStream", "ServerError", "ServerFrames"]


class ServerError(HermesError, RuntimeError):
    """The server refused or failed a request; str() is its one-line message."""


@dataclass(frozen=True)
class RemoteSave:
    path: Path
    bytes: int


def stats_from_json(view: dict) -> SessionStats:
    s = view["stats"]
    last = view.get("last_chunk")
    return SessionStats(
        stream_time_s=s["stream_time_s"], frames_seen=s["frames_seen"], units_seen=s["units_seen"],
        units_kept=s["units_kept"], cache=CacheStats(**s["cache"]), positions=PositionStats(**s["positions"]),
        last_chunk=None if last is None else ChunkReport(**last), memory=MemoryStats(**s["memory"]),
        model=s["model"], random_weights=s["random_weights"], policy=s["policy"])


def memory_map_from_json(data: dict) -> MemoryMap:
    layers = data["layers"]
    return MemoryMap([(a, b) for a, b in data["units"]], [{int(u): share for u, share in l["held"].items()} for l in layers],
                     data["groups"], [l["summary_tokens"] for l in layers], data["frames_per_unit"], data["recent_from_s"])


class RemoteAnswer:
    """An answer streamed from the server: iterate for its pieces; ``answer`` is the record once
    it is done; ``close()`` drops the connection, and the server cancels it between two tokens."""

    def __init__(self, stream: RemoteStream, question: str, body: dict) -> None:
        self._stream, self.question = stream, question
        self._context = stream.http.stream("POST", "/v1/chat/completions", json=body)
        self._response = self._context.__enter__()
        if self._response.status_code != 200:
            self._response.read()
            self.close()
            raise ServerError(_message(self._response))
        self._lines = self._response.iter_lines()
        self._text: list[str] = []
        self._answer: Answer | None = None
        self._done = False

    def __iter__(self):
        return self

    def __next__(self) -> str:
        while not self._done:
            try:
                line = next(self._lines)
            except StopIteration:
                self._done = True
                break
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                self._done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                self._done = True
                self.close()
                raise ServerError(chunk["error"]["message"])
            choice = chunk["choices"][0] if chunk.get("choices") else {}
            piece = (choice.get("delta") or {}).get("content")
            if choice.get("finish_reason"):
                self._finish(chunk)
            if piece:
                self._text.append(piece)
                return piece
        self.close()
        raise StopIteration

    def _finish(self, chunk: dict) -> None:
        extra = chunk.get("hermes", {})
        usage = chunk.get("usage") or {}
        text = "".join(self._text)
        answer = Answer(question=self.question, text=text, tokens=list(extra.get("token_ids", [])),
                        stream_time_s=extra.get("stream_time_s", 0.0), frames_seen=extra.get("frames_seen", 0),
                        ttft_ms=extra.get("ttft_ms"), tpot_ms=extra.get("tpot_ms"),
                        no_frames=extra.get("no_frames", False), prompt_tokens=usage.get("prompt_tokens", 0),
                        context_tokens=extra.get("context_tokens", 0))
        self._answer = answer
        self._stream._answered(answer)

    @property
    def answer(self) -> Answer:
        for _ in self:
            pass
        if self._answer is None:
            raise ServerError(f"the answer to {self.question!r} was cut short")
        return self._answer

    @property
    def finished(self) -> bool:
        return self._done

    def close(self) -> None:
        self._done = True
        self._context.__exit__(None, None, None)


class RemoteStream:
    """One stream of a server (see the module docstring)."""

    def __init__(self, url: str, stream_id: str, *, api_key: str | None = None, timeout_s: float = 600.0,
                 max_new_tokens: int | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url, self.id = url.rstrip("/"), stream_id
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self.max_new_tokens = max_new_tokens  # None: the stream's own setting
        self._history: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._followers: dict[int, threading.Event] = {}
        self.last_answer: Answer | None = None
        view = self.view()  # the stream exists, the key is right: or one line now
        from policies import make_policy

        self.policy = make_policy(view["policy"], **view.get("policy_parameters", {}))
        self.config = SessionConfig(**view["config"])
        self.model: str = view["model"]
        self.frames_per_unit: int = view["frames_per_unit"]
        self.source: str | None = view.get("source")
        self.is_live: bool = bool(view.get("live") or view.get("realtime"))

    # -- requests ---------------------------------------------------------------------------------
    def _request(self, method: str, path: str, **kwargs) -> dict:
        try:
            reply = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot reach {self.url}: {exc}") from None
        if reply.status_code >= 400:
            raise ServerError(_message(reply))
        return reply.json()

    def view(self, *, memory_map: bool = False) -> dict:
        return self._request("GET", f"/v1/streams/{self.id}", params={"memory_map": "true"} if memory_map else None)

    # -- questions ------------------------------------------------------------------------------
    def ask(self, question: str, *, max_new_tokens: int | None = None, flush: bool = False,
            history=None) -> RemoteAnswer:
        """``flush`` has no meaning here: the server answers from the memory as it is."""
        turns = list(self._history if history is None else history)
        messages: list[dict] = []
        for q, a in turns:
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": question})
        body: dict = {"model": f"hermes:stream/{self.id}", "messages": messages, "stream": True}
        if (max_new_tokens or self.max_new_tokens) is not None:
            body["max_tokens"] = max_new_tokens or self.max_new_tokens
        handle = RemoteAnswer(self, question, body)
        handle.own_history = history is None  # type: ignore[attr-defined]
        return handle

    def _answered(self, answer: Answer) -> None:
        with self._lock:
            self.last_answer = answer
            if self.config.history and not answer.no_frames:
                self._history.append((answer.question, answer.text))

    def answer(self, question: str, **kwargs) -> Answer:
        return self.ask(question, **kwargs).answer

    def clear_history(self) -> None:
        with self._lock:
            self._history.clear()

    def history(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self._history)

    # -- readouts -------------------------------------------------------------------------------
    def stats(self) -> SessionStats:
        return stats_from_json(self.view())

    def fresh_stats(self) -> SessionStats:
        return self.stats()

    def counts(self) -> StreamCounts:
        return StreamCounts(**self.view()["counts"])

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(self.view()["warnings"])

    @property
    def state(self) -> str:
        return self.view()["state"]

    @property
    def error(self) -> str | None:
        return self.view().get("error")

    @property
    def paused(self) -> bool:
        return bool(self.view()["paused"])

    def memory_map(self) -> MemoryMap:
        return memory_map_from_json(self.view(memory_map=True)["memory_map"])

    def subscribe(self) -> queue.SimpleQueue:
        """A queue of the stream's ``Event``s from now on, read from its SSE route by a thread."""
        q: queue.SimpleQueue = queue.SimpleQueue()
        stop = threading.Event()
        ready = threading.Event()

        def follow() -> None:
            try:
                with self.http.stream("GET", f"/v1/streams/{self.id}/events", timeout=None) as response:
                    ready.set()
                    kind = None
                    for line in response.iter_lines():
                        if stop.is_set():
                            return
                        if line.startswith("event:"):
                            kind = line[6:].strip()
                        elif line.startswith("data:") and kind is not None:
                            data = json.loads(line[5:])
                            stream, wall_s = data.pop("stream", self.id), data.pop("wall_s", time.time())
                            data.pop("event", None)
                            q.put(Event(kind, stream, data, wall_s))
                            kind = None
            except httpx.HTTPError:
                pass
            finally:
                ready.set()

        thread = threading.Thread(target=follow, name=f"hermes-events-{self.id}", daemon=True)
        with self._lock:
            self._followers[id(q)] = stop
        thread.start()
        ready.wait(10)
        return q

    def unsubscribe(self, q: queue.SimpleQueue) -> None:
        with self._lock:
            stop = self._followers.pop(id(q), None)
        if stop is not None:
            stop.set()  # the thread leaves at the next line (a keep-alive at the latest)

    # -- control --------------------------------------------------------------------------------
    def pause(self) -> None:
        self._request("POST", f"/v1/streams/{self.id}/pause")

    def resume(self) -> None:
        self._request("POST", f"/v1/streams/{self.id}/resume")

    def save(self, path, *, source: str | None = None) -> RemoteSave:
        """Saved on the server, under its --memory-root, by the file name's stem."""
        saved = self._request("POST", f"/v1/streams/{self.id}/snapshot", json={"name": Path(path).stem})
        return RemoteSave(Path(saved["path"]), saved["bytes"])

    def submit(self, image, timestamp: float, *, block: bool = True) -> bool:
        raise ServerError("frames of a server's stream come from its own source")

    def flush(self) -> None:
        return None

    def end(self, error: str | None = None) -> None:
        return None

    def note(self, kind: str, **data) -> None:
        return None

    def close(self) -> None:
        self.http.close()


class ServerFrames:
    """The prompt's source for a server's stream: no frames here; it ends when the stream does."""

    def __init__(self, stream: RemoteStream, poll_s: float = 0.5) -> None:
        self.stream, self.poll_s = stream, poll_s
        self._closed = threading.Event()
        self.stats = SourceStats()

    @property
    def name(self) -> str:
        return self.stream.source or self.stream.id

    @property
    def is_live(self) -> bool:
        """False: nothing is read here (a waiting prompt asks the server's memory, not frames read
        locally; the server paces and times its source)."""
        return False

    @property
    def duration_s(self) -> float | None:
        return None

    def __iter__(self):
        while not self._closed.wait(self.poll_s):
            try:
                view = self.stream.view()
            except ServerError:
                return
            if view["state"] != "live":
                break
        yield from ()  # no frames: a generator that ends with the server's stream

    def close(self) -> None:
        self._closed.set()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _message(reply) -> str:
    try:
        return reply.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"HTTP {reply.status_code} from the server"

