// The web view of hermes serve (docs/web.md): plain JavaScript, no build step, this origin only.
// Every call goes through call(), which adds the API key (kept in sessionStorage) when there is
// one; events and answers are read from fetch() streams, since EventSource cannot send a header.
"use strict";

(() => {
  const KEY_STORE = "hermes.apiKey";
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  const SVG = "http://www.w3.org/2000/svg";

  let apiKey = sessionStorage.getItem(KEY_STORE) || "";
  let current = null;          // the stream on view
  let follower = null;         // AbortController of its events reader
  let asking = null;           // AbortController of the answer in flight
  let refreshTimer = null;
  let pollTimer = null;
  let lastMemory = null;
  let drawnFrame = null;       // stream time of the frame on the canvas
  let samples = [];            // [wall ms, stream time s] for the ingest speed
  const conversations = new Map();  // stream id -> [{q, a, done, note, el}]
  const notesShown = new Map();     // stream id -> Set of notification indexes drawn
  let keyWaiters = null;
  const pending = new Set();        // calls in flight (a close waits for them: no 404 from a late poll)

  class HttpError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  // -- calls -------------------------------------------------------------------------------
  function askKey(why) {
    if (keyWaiters) return new Promise((resolve) => keyWaiters.push(resolve));
    keyWaiters = [];
    const dialog = $("key-dialog");
    $("key-why").textContent = why;
    $("key-input").value = "";
    dialog.showModal();
    $("key-input").focus();
    return new Promise((resolve) => keyWaiters.push(resolve));
  }

  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    apiKey = $("key-input").value.trim();
    sessionStorage.setItem(KEY_STORE, apiKey);
    $("key-dialog").close();
    const waiting = keyWaiters || [];
    keyWaiters = null;
    waiting.forEach((resolve) => resolve());
  });
  $("key-dialog").addEventListener("cancel", (e) => e.preventDefault());  // the page needs the key

  async function call(path, options = {}) {
    for (;;) {
      const headers = {};
      if (apiKey) headers.Authorization = "Bearer " + apiKey;
      const init = { method: options.method || "GET", headers, signal: options.signal, cache: "no-store" };
      if (options.json !== undefined) {
        headers["Content-Type"] = "application/json";
        init.body = JSON.stringify(options.json);
      }
      const made = fetch(path, init);
      pending.add(made);
      made.catch(() => {}).finally(() => pending.delete(made));
      const response = await made;
      if (response.status === 401) {
        await askKey(apiKey ? "That key was refused: enter the server's API key." :
          "This server needs its API key. It is kept in this tab only (session storage).");
        continue;
      }
      if (!response.ok) {
        let message = `${response.status} ${response.statusText}`;
        try { message = (await response.json()).error.message; } catch (_) { /* not JSON */ }
        throw new HttpError(response.status, message);
      }
      return response;
    }
  }
  const getJSON = async (path) => (await call(path)).json();

  // Server-sent events from a fetch() response: onEvent(kind, data text) per event.
  async function readEvents(response, onEvent) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let kind = "message";
        const data = [];
        for (const line of block.split("\n")) {
          if (!line || line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const name = colon < 0 ? line : line.slice(0, colon);
          let text = colon < 0 ? "" : line.slice(colon + 1);
          if (text.startsWith(" ")) text = text.slice(1);
          if (name === "event") kind = text;
          else if (name === "data") data.push(text);
        }
        if (data.length) onEvent(kind, data.join("\n"));
      }
    }
  }

  function say(text, bad = false) {
    const status = $("status");
    status.textContent = text;
    status.classList.toggle("bad", bad);
  }

  // -- formatting ----------------------------------------------------------------------------
  const clock = (s) => {
    if (s === null || s === undefined) return "—";
    const m = Math.floor(s / 60);
    return `${String(m).padStart(2, "0")}:${(s - 60 * m).toFixed(1).padStart(4, "0")}`;
  };
  const mib = (n) => (n === null || n === undefined) ? "—" :
    n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(2)} GiB` : `${(n / 2 ** 20).toFixed(1)} MiB`;
  const ms = (v) => (v === null || v === undefined) ? "—" : v >= 10 ? `${v.toFixed(0)} ms` : `${v.toFixed(1)} ms`;

  function el(tag, attrs = {}, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function svg(tag, attrs = {}) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  // -- streams -------------------------------------------------------------------------------
  async function loadStreams(select) {
    const list = (await getJSON("/v1/streams")).data;
    const box = $("stream-select");
    box.replaceChildren();
    if (!list.length) box.append(el("option", { value: "" }, "none open"));
    for (const view of list) box.append(el("option", { value: view.id }, `${view.id} · ${view.source || "memory"}`));
    const wanted = select !== undefined ? select : current;
    const pick = list.some((v) => v.id === wanted) ? wanted : (list[0] ? list[0].id : null);
    box.value = pick || "";
    if (!list.length) $("open-panel").open = true;
    if (pick !== current) show(pick);
  }

  function show(sid) {
    if (follower) follower.abort();
    follower = null;
    clearInterval(pollTimer);
    current = sid;
    lastMemory = null;
    drawnFrame = null;
    samples = [];
    const url = new URL(location.href);
    if (sid) url.searchParams.set("stream", sid); else url.searchParams.delete("stream");
    history.replaceState(null, "", url);
    $("view").classList.toggle("empty", !sid);
    $("conversation").replaceChildren();
    $("notifications").replaceChildren();
    notesShown.set(sid, new Set());
    $("no-notes").hidden = false;
    for (const id of ["r-time", "r-tokens", "r-kv", "r-answer", "r-speed", "r-lag", "r-rss"]) $(id).textContent = "—";
    $("map").replaceChildren();
    $("state").textContent = "";
    $("frame-time").textContent = "";
    const canvas = $("frame");
    canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
    if (!sid) return;
    renderConversation();
    follow(sid);
    scheduleRefresh();
    loadNotifications(sid);
    pollTimer = setInterval(() => { if (current === sid) refresh(); }, 1000);
  }

  async function follow(sid) {
    const control = new AbortController();
    follower = control;
    try {
      const response = await call(`/v1/streams/${enc(sid)}/events`, { signal: control.signal });
      await readEvents(response, (kind) => {
        if (current !== sid) return;
        if (kind === "notification") loadNotifications(sid);
        if (["chunk", "compress", "reindex", "notification", "ended", "failed", "closed", "gap", "warning"].includes(kind)) {
          scheduleRefresh();
        }
      });
    } catch (err) {
      if (control.signal.aborted) return;
      if (current === sid) say(`events of ${sid}: ${err.message}`, true);
    }
    if (current === sid && !control.signal.aborted) scheduleRefresh();
  }

  // The map is fetched when an event says the memory changed (chunk, compress, reindex …); the
  // readouts and the frame are polled every second as well (frames arrive between chunks).
  let memoryWanted = false;
  function scheduleRefresh() {
    memoryWanted = true;
    if (refreshTimer) return;
    refreshTimer = setTimeout(() => { refreshTimer = null; refresh(); }, 150);
  }

  let refreshing = false;
  async function refresh() {
    const sid = current;
    if (!sid || refreshing) return;
    refreshing = true;
    const withMemory = memoryWanted;
    memoryWanted = false;
    try {
      const [view, memory] = await Promise.all([getJSON(`/v1/streams/${enc(sid)}`),
        withMemory ? getJSON(`/v1/streams/${enc(sid)}/memory`) : Promise.resolve(null)]);
      if (current !== sid) return;
      renderReadouts(view);
      if (memory) {
        lastMemory = memory;
        renderMap(memory);
      }
      if (view.frame_s !== null && view.frame_s !== drawnFrame) {
        drawnFrame = view.frame_s;
        await drawJpeg($("frame"), `/v1/streams/${enc(sid)}/frame.jpg`);
        $("frame-time").textContent = `at ${clock(view.frame_s)}`;
      }
      if (view.state !== "live") clearInterval(pollTimer);
    } catch (err) {
      if (current === sid) {
        if (err.status === 404) { say(err.message, true); clearInterval(pollTimer); loadStreams(); }
        else say(err.message, true);
      }
    } finally {
      refreshing = false;
      if (memoryWanted && current === sid) scheduleRefresh();
    }
  }

  async function drawJpeg(canvas, path) {
    const blob = await (await call(path)).blob();
    const bitmap = await createImageBitmap(blob);
    canvas.width = bitmap.width;
    canvas.height = bitmap.height;
    canvas.getContext("2d").drawImage(bitmap, 0, 0);
    bitmap.close();
  }

  function renderReadouts(view) {
    const cache = view.cache;
    const tokens = Math.max(0, ...(cache.stream_tokens_per_layer || [0]));
    const state = view.state + (view.paused ? " · paused" : "");
    $("state").textContent = state;
    $("pause-btn").textContent = view.paused ? "Resume" : "Pause";
    $("pause-btn").setAttribute("aria-pressed", String(view.paused));
    $("pause-btn").disabled = view.state !== "live";
    $("state").dataset.state = view.state;
    $("r-time").textContent = `${clock(view.stream_time_s)} · ${view.frames_seen} frames`;
    $("r-tokens").textContent = `${tokens} / ${cache.budget === null ? "∞" : cache.budget}`;
    $("r-kv").textContent = mib(cache.kv_bytes);
    const answer = view.last_answer;
    $("r-answer").textContent = answer ? `TTFT ${ms(answer.ttft_ms)} · TPOT ${ms(answer.tpot_ms)}` : "—";
    const now = performance.now();
    if (view.state === "live") {
      samples.push([now, view.stream_time_s]);
      samples = samples.filter(([t]) => now - t <= 10000);
    }
    const [t0, s0] = samples[0] || [now, 0];
    const [t1, s1] = samples[samples.length - 1] || [now, 0];
    $("r-speed").textContent = view.state !== "live" ? `${view.state}` :
      t1 - t0 >= 1500 ? `${((s1 - s0) / ((t1 - t0) / 1000)).toFixed(2)}× real time` : "measuring…";
    $("r-lag").textContent = `${view.counts.lag_s.toFixed(1)} s`;
    const memory = view.stats.memory || {};
    $("r-rss").textContent = mib(memory.rss_bytes) + (memory.gpu_allocated_bytes ? ` · GPU ${mib(memory.gpu_allocated_bytes)}` : "");
  }

  // -- the memory map --------------------------------------------------------------------------
  const WIDTH = 1000;

  function mapRows(memory) {
    const units = memory.units.length;
    if (!$("per-layer").checked) {
      return memory.group_rows.map((row) => ({
        key: row.group, label: row.group,
        detail: `${row.layers.length === 1 ? `layer ${row.layers[0]}` :
          `layers ${row.layers[0]}–${row.layers[row.layers.length - 1]}`} · ${row.units_kept} of ${units} units`,
        held: row.held, summary: row.summary_tokens, group: true,
      }));
    }
    const rows = [];
    for (const row of memory.group_rows) {
      for (const layer of row.layers) {
        const data = memory.layers[layer];
        rows.push({ key: `${row.group}-${layer}`, label: `${row.group} · layer ${layer}`,
          detail: `${Object.keys(data.held).length} of ${units} units`, held: data.held,
          summary: data.summary_tokens, group: false });
      }
    }
    return rows;
  }

  function renderMap(memory) {
    const map = $("map");
    map.replaceChildren();
    const units = memory.units;
    $("map-caption").textContent = units.length ? `${units.length} moments · ${memory.group_rows.length} layer groups` : "";
    if (!units.length) { map.append(el("p", { class: "muted" }, "nothing streamed yet")); return; }
    const end = Math.max(memory.end_s, 1e-6);
    const x = (t) => (t / end) * WIDTH;
    for (const row of mapRows(memory)) {
      const line = el("div", { class: "map-row", "data-row": row.key, "data-kind": row.group ? "group" : "layer" });
      const label = el("div", { class: "map-label" });
      label.append(el("strong", {}, row.label), el("span", { class: "muted" }, ` ${row.detail}`));
      const summary = el("div", { class: "map-summary", title: "summary tokens per layer" },
        row.summary ? `Σ ${row.summary}` : "Σ 0");
      summary.classList.toggle("has", row.summary > 0);
      const cells = svg("svg", { class: "cells", viewBox: `0 0 ${WIDTH} 20`, preserveAspectRatio: "none",
        role: "img", "aria-label": `${row.label}: ${row.detail}` });
      units.forEach(([a, b], u) => {
        const share = row.held[String(u)] || 0;
        const rect = svg("rect", { x: x(a).toFixed(2), y: 0, width: Math.max(x(b) - x(a), 0.6).toFixed(2), height: 20,
          class: share > 0 ? "held" : "gone", "data-unit": u, "data-share": share.toFixed(4) });
        if (share > 0) rect.setAttribute("fill-opacity", (0.2 + 0.8 * share).toFixed(3));
        const title = svg("title");
        title.textContent = `${a.toFixed(1)}–${b.toFixed(1)} s: ${(100 * share).toFixed(0)}% held`;
        rect.append(title);
        cells.append(rect);
      });
      if (memory.recent_from_s !== null) {
        cells.append(svg("rect", { class: "recent", x: x(memory.recent_from_s).toFixed(2), y: 0.5,
          width: Math.max(WIDTH - x(memory.recent_from_s), 1).toFixed(2), height: 19 }));
      }
      line.append(label, summary, cells);
      map.append(line);
    }
    const axis = el("div", { class: "map-row axis" });
    const ticks = el("div", { class: "ticks" });
    ticks.append(el("span", {}, "0 s"));
    if (memory.recent_from_s !== null) ticks.append(el("span", { class: "recent-label" }, `recent from ${memory.recent_from_s.toFixed(1)} s`));
    ticks.append(el("span", {}, `${end.toFixed(1)} s`));
    axis.append(el("div", { class: "map-label" }), el("div", { class: "map-summary" }), ticks);
    map.append(axis);
  }

  $("per-layer").addEventListener("change", () => { if (lastMemory) renderMap(lastMemory); });

  // -- asking ----------------------------------------------------------------------------------
  function conversation(sid) {
    if (!conversations.has(sid)) conversations.set(sid, []);
    return conversations.get(sid);
  }

  function renderTurn(turn) {
    if (!turn.el) {
      turn.el = el("li", { class: "turn" });
      turn.el.append(el("p", { class: "q" }), el("p", { class: "a" }), el("p", { class: "meta muted" }));
    }
    const [q, a, meta] = turn.el.children;
    q.textContent = turn.q;
    a.textContent = turn.a.trim() || (turn.done || turn.note ? "" : "…");
    meta.textContent = turn.note || (turn.meta ? `at ${clock(turn.meta.stream_time_s)} · ${turn.meta.frames_seen} frames · TTFT ${ms(turn.meta.ttft_ms)}` : "");
    return turn.el;
  }

  function renderConversation() {
    const list = $("conversation");
    list.replaceChildren(...conversation(current).map(renderTurn));
    list.scrollTop = list.scrollHeight;
  }

  function setAsking(on) {
    $("ask-btn").disabled = on;
    $("cancel-btn").disabled = !on;
  }

  async function ask(question) {
    const sid = current;
    if (!sid) { say("open a stream first", true); return; }
    const turns = conversation(sid);
    const messages = [];
    for (const t of turns) if (t.done) messages.push({ role: "user", content: t.q }, { role: "assistant", content: t.a });
    messages.push({ role: "user", content: question });
    const turn = { q: question, a: "", done: false };
    turns.push(turn);
    $("conversation").append(renderTurn(turn));
    const control = new AbortController();
    asking = control;
    setAsking(true);
    try {
      const response = await call("/v1/chat/completions", { method: "POST", signal: control.signal,
        json: { model: `hermes:stream/${sid}`, stream: true, messages } });
      await readEvents(response, (_, data) => {
        if (data === "[DONE]") return;
        const body = JSON.parse(data);
        if (body.error) throw new Error(body.error.message);
        const piece = body.choices && body.choices[0] && body.choices[0].delta.content;
        if (piece) { turn.a += piece; renderTurn(turn); }
        if (body.hermes) turn.meta = body.hermes;
      });
      turn.done = true;
    } catch (err) {
      turn.note = control.signal.aborted ? "cancelled" : `could not answer: ${err.message}`;
    } finally {
      if (asking === control) { asking = null; setAsking(false); }
      renderTurn(turn);
      scheduleRefresh();
    }
  }

  function cancel() { if (asking) asking.abort(); }

  $("ask-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("question").value.trim();
    if (!text || asking) return;
    $("question").value = "";
    ask(text);
  });
  $("question").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("ask-form").requestSubmit(); }
  });
  $("cancel-btn").addEventListener("click", cancel);
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && asking && !$("key-dialog").open) { e.preventDefault(); cancel(); }
  });

  // -- notifications ---------------------------------------------------------------------------
  let loadingNotes = false;
  async function loadNotifications(sid) {
    if (loadingNotes) { setTimeout(() => loadNotifications(sid), 300); return; }
    loadingNotes = true;
    try {
      const list = (await getJSON(`/v1/streams/${enc(sid)}/notifications`)).data;
      const shown = notesShown.get(sid) || new Set();
      notesShown.set(sid, shown);
      for (const note of list) {
        if (shown.has(note.index) || current !== sid) continue;
        shown.add(note.index);
        const item = el("li", { class: "note", "data-index": note.index });
        const canvas = el("canvas", { width: 160, height: 90, role: "img",
          "aria-label": `the frame at ${clock(note.stream_time_s)}` });
        const words = el("div");
        words.append(el("strong", {}, note.notification), el("span", { class: "muted" },
          ` at ${clock(note.stream_time_s)} · p(yes) ${note.p_yes.toFixed(2)}`), el("p", {}, note.text || ""));
        item.append(canvas, words);
        $("notifications").prepend(item);
        $("no-notes").hidden = true;
        if (note.frame) drawJpeg(canvas, note.frame).catch((err) => say(err.message, true));
      }
    } catch (err) {
      if (current === sid && err.status !== 404) say(err.message, true);
    } finally {
      loadingNotes = false;
    }
  }

  // -- opening, closing, saving -------------------------------------------------------------------
  $("open-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { source: $("source").value.trim() };
    const policy = $("opt-policy").value.trim();
    if (policy) body.policy = policy;
    for (const [id, key, parse] of [["opt-budget", "budget", parseInt], ["opt-fps", "fps", parseFloat],
                                    ["opt-chunk", "chunk", parseInt]]) {
      const text = $(id).value.trim();
      if (text) body[key] = parse(text, 10);
    }
    if ($("opt-realtime").checked) body.realtime = true;
    const conditions = $("opt-notify").value.split("\n").map((s) => s.trim()).filter(Boolean);
    if (conditions.length) {
      const threshold = $("opt-threshold").value.trim();
      body.notify = threshold ? { conditions, threshold: parseFloat(threshold) } : conditions;
    }
    $("open-btn").disabled = true;
    try {
      const view = await (await call("/v1/streams", { method: "POST", json: body })).json();
      say(`opened stream ${view.id} on ${view.source}`);
      await loadStreams(view.id);
    } catch (err) {
      say(`could not open: ${err.message}`, true);
    } finally {
      $("open-btn").disabled = false;
    }
  });

  $("close-btn").addEventListener("click", async () => {
    if (!current) return;
    const sid = current;
    cancel();
    show(null);  // stop following it, then let the calls in flight finish before it goes
    await Promise.allSettled([...pending]);
    try {
      await call(`/v1/streams/${enc(sid)}`, { method: "DELETE" });
      say(`closed stream ${sid}`);
      conversations.delete(sid);
      await loadStreams(null);
    } catch (err) {
      say(`could not close ${sid}: ${err.message}`, true);
      loadStreams(sid).catch(() => {});
    }
  });

  $("pause-btn").addEventListener("click", async () => {
    if (!current) return;
    const sid = current;
    const verb = $("pause-btn").getAttribute("aria-pressed") === "true" ? "resume" : "pause";
    try {
      const view = await (await call(`/v1/streams/${enc(sid)}/${verb}`, { method: "POST" })).json();
      if (current === sid) renderReadouts(view);
      say(verb === "pause" ? `stream ${sid} paused: no frames are taken, answers still work` : `stream ${sid} resumed`);
    } catch (err) {
      say(`could not ${verb} ${sid}: ${err.message}`, true);
    }
  });

  $("save-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!current) return;
    const name = $("save-name").value.trim();
    try {
      const saved = await (await call(`/v1/streams/${enc(current)}/snapshot`, { method: "POST",
        json: name ? { name } : {} })).json();
      say(`memory saved to ${saved.path} (${mib(saved.bytes)})`);
    } catch (err) {
      say(`could not save: ${err.message}`, true);
    }
  });

  $("stream-select").addEventListener("change", (e) => show(e.target.value || null));

  // -- start -------------------------------------------------------------------------------------
  const wanted = new URL(location.href).searchParams.get("stream");
  loadStreams(wanted || undefined).catch((err) => say(err.message, true));
})();
