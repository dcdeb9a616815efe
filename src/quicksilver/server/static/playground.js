// The quicksilver playground: talks to this server's OpenAI-compatible API (same origin), draws the
// `diffusing` stream's canvas states as cells, records them for step-through replay, and races the
// diffusion model against its AR twin. No framework, no build step, nothing fetched from elsewhere.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const MASK = "░";
const TOOL = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather in a city.",
    parameters: {
      type: "object",
      properties: { city: { type: "string" } },
      required: ["city"],
    },
  },
};

const state = {
  key: sessionStorage.getItem("qs-key") || "",
  models: [], // /v1/models cards
  history: [], // the conversation sent with each request
  abort: null, // AbortController of the reply in flight
  live: null, // the reply being decoded (its record)
};

// ---- HTTP ---------------------------------------------------------------------------------------
function headers() {
  const h = { "Content-Type": "application/json" };
  if (state.key) h.Authorization = "Bearer " + state.key;
  return h;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function failure(resp) {
  let msg = resp.status + " " + resp.statusText;
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) msg = body.error.message;
  } catch (_) {
    /* not JSON: keep the status line */
  }
  if (resp.status === 401) askForKey(msg);
  return new ApiError(resp.status, msg);
}

// POST a streaming chat request; call onChunk(obj) for every SSE data object until [DONE].
async function streamChat(body, onChunk, signal) {
  const resp = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(),
    body: JSON.stringify(body),
    signal,
  });
  if (!resp.ok) throw await failure(resp);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const obj = JSON.parse(data);
        if (obj.error) throw new ApiError(500, obj.error.message);
        onChunk(obj);
      }
    }
  }
}

// ---- settings -----------------------------------------------------------------------------------
function num(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

// The request fields the controls set (undefined ones are left to the server).
function settings() {
  const s = {
    reasoning_effort: $("#c-effort").value || undefined,
    threshold: num("#c-threshold"),
    policy: $("#c-policy").value || undefined,
    block_length: num("#c-block"),
    steps: num("#c-steps"),
    max_tokens: num("#c-max"),
    temperature: num("#c-temp"),
    seed: num("#c-seed"),
  };
  if ($("#c-tool").checked) s.tools = [TOOL];
  return s;
}

function request(model, messages, extra = {}) {
  return {
    model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    diffusing: true,
    ...settings(),
    ...extra,
  };
}

// ---- one reply: the record every view reads -----------------------------------------------------
// A reply's record: text, reasoning, tool calls, canvas frames, and the numbers for its stats.
function newRecord() {
  return {
    t0: performance.now(),
    ttft: null,
    tLast: null,
    content: "",
    reasoning: "",
    toolCalls: [],
    frames: [], // every canvas state, in order (step-through replays them)
    phaseSteps: {}, // phase -> forward passes so far
    phaseBase: 0, // committed tokens of the phases already finished (for the chart)
    lastPhase: null,
    tokens: null, // usage.completion_tokens once the usage chunk came
    finish: null,
    points: [[0, 0]], // (forward passes, committed tokens) for the chart
  };
}

function nfe(rec) {
  return Object.values(rec.phaseSteps).reduce((a, b) => a + b, 0);
}

function tokensOf(rec) {
  if (rec.tokens !== null) return rec.tokens;
  const last = rec.frames[rec.frames.length - 1];
  return last ? rec.phaseBase + last.cells.filter((c) => c !== null).length : 0;
}

// Fold one SSE chunk into the record; returns what changed: "text", "canvas" or "".

// Streamed tool calls arrive as deltas (OpenAI's shape): the first for an index carries its id and
// name, later ones append to its arguments.
function mergeToolCall(calls, delta) {
  const i = delta.index ?? calls.length;
  if (!calls[i]) calls[i] = { index: i, id: delta.id, type: "function", function: { name: "", arguments: "" } };
  const c = calls[i];
  if (delta.id) c.id = delta.id;
  const f = delta.function || {};
  if (f.name) c.function.name += f.name;
  if (f.arguments) c.function.arguments += f.arguments;
}

function absorb(rec, chunk) {
  if (chunk.usage) rec.tokens = chunk.usage.completion_tokens;
  const choice = chunk.choices && chunk.choices[0];
  if (!choice) return "";
  if (choice.finish_reason) rec.finish = choice.finish_reason;
  const d = choice.delta || {};
  let changed = "";
  const text = (d.content || "") + (d.reasoning_content || "");
  if (text) {
    const now = performance.now();
    if (rec.ttft === null) rec.ttft = now - rec.t0;
    rec.tLast = now;
    rec.content += d.content || "";
    rec.reasoning += d.reasoning_content || "";
    changed = "text";
  }
  if (d.tool_calls) {
    for (const t of d.tool_calls) mergeToolCall(rec.toolCalls, t);
    changed = "text";
  }
  if (choice.canvas) {
    const c = choice.canvas;
    if (rec.lastPhase !== null && rec.lastPhase !== c.phase) {
      const prev = rec.frames[rec.frames.length - 1];
      rec.phaseBase += prev.cells.filter((x) => x !== null).length;
    }
    rec.lastPhase = c.phase;
    rec.phaseSteps[c.phase] = c.step;
    rec.frames.push(c);
    const committed = rec.phaseBase + c.cells.filter((x) => x !== null).length;
    rec.points.push([nfe(rec), committed]);
    changed = "canvas";
  }
  return changed;
}

function numbers(rec) {
  const tokens = tokensOf(rec);
  const passes = nfe(rec);
  const secs = rec.tLast === null ? null : (rec.tLast - rec.t0) / 1000;
  return {
    tokens,
    nfe: passes,
    tpf: passes ? tokens / passes : null,
    ttft: rec.ttft === null ? null : rec.ttft / 1000,
    tps: secs ? tokens / secs : null,
  };
}

const fmt = {
  tokens: (v) => String(v),
  nfe: (v) => String(v),
  tpf: (v) => (v === null ? "–" : v.toFixed(2)),
  ttft: (v) => (v === null ? "–" : (v * 1000).toFixed(0) + " ms"),
  tps: (v) => (v === null ? "–" : v.toFixed(0)),
};
const LABELS = { tokens: "tokens", nfe: "NFE", tpf: "TPF", ttft: "TTFT", tps: "tok/s" };

function drawStats(dl, rec) {
  const n = numbers(rec);
  dl.replaceChildren();
  for (const k of Object.keys(LABELS)) {
    const dt = document.createElement("dt");
    dt.textContent = LABELS[k];
    const dd = document.createElement("dd");
    dd.textContent = fmt[k](n[k]);
    dd.dataset.stat = k;
    dl.append(dt, dd);
  }
}

// ---- the canvas ---------------------------------------------------------------------------------
function cellText(t) {
  return t.replace(/\n/g, "↵").replace(/\t/g, "⇥");
}

// Draw one canvas state as cells; the state is in the class, the glyph and the title (not colour only).
function drawCanvas(box, frame) {
  const fresh = new Set(frame.fresh);
  const revised = new Set(frame.revised);
  const cells = frame.cells.map((tok, i) => {
    const el = document.createElement("span");
    let kind;
    if (tok === null) kind = revised.has(i) ? "revised" : "masked";
    else kind = fresh.has(i) ? "fresh" : "old";
    el.className = "cell " + kind;
    el.dataset.state = kind;
    el.textContent = tok === null ? MASK : cellText(tok);
    el.title = `position ${i}: ${kind}`;
    return el;
  });
  box.replaceChildren(...cells);
  box.dataset.step = String(frame.step);
  box.dataset.phase = frame.phase;
  box.dataset.masked = String(frame.masked);
}

function summarize(frame) {
  const fresh = frame.fresh.length;
  return `${frame.phase}, step ${frame.step}: ${frame.masked} masked, ${fresh} committed this step, ${frame.revised.length} re-masked, ${frame.stable} final`;
}

function showFrame(frame, where) {
  drawCanvas($("#canvas"), frame);
  $("#canvas-summary").textContent = summarize(frame);
  $("#canvas-where").textContent = where;
}

function drawChart(svg, points) {
  const W = 320;
  const H = 120;
  const pad = 24;
  const maxX = Math.max(1, ...points.map((p) => p[0]));
  const maxY = Math.max(1, ...points.map((p) => p[1]));
  const xy = points.map(
    ([x, y]) =>
      `${(pad + (x / maxX) * (W - 2 * pad)).toFixed(1)},${(H - pad - (y / maxY) * (H - 2 * pad)).toFixed(1)}`,
  );
  const ns = "http://www.w3.org/2000/svg";
  const mk = (tag, attrs, text) => {
    const el = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    return el;
  };
  svg.replaceChildren(
    mk("line", { x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, class: "axis" }),
    mk("line", { x1: pad, y1: pad, x2: pad, y2: H - pad, class: "axis" }),
    mk("polyline", { points: xy.join(" "), class: "series" }),
    ...xy.map((p) => {
      const [cx, cy] = p.split(",");
      return mk("circle", { cx, cy, r: 2.5, class: "dot" });
    }),
    mk("text", { x: W - pad, y: H - 6, "text-anchor": "end" }, `${maxX} forward passes`),
    mk("text", { x: pad + 4, y: pad - 8 }, `${maxY} tokens`),
  );
}

// ---- chat ---------------------------------------------------------------------------------------
function setStatus(text) {
  $("#status").textContent = text;
}

function askForKey(msg) {
  $("#key-form").hidden = false;
  setStatus(msg + " — enter the API key");
  $("#api-key").focus();
}

function addUser(text) {
  const li = $("#msg-user").content.firstElementChild.cloneNode(true);
  $(".body", li).textContent = text;
  $("#conversation").append(li);
}

function drawReply(li, rec) {
  const r = $(".reasoning", li);
  if (rec.reasoning) {
    r.hidden = false;
    $(".reasoning-text", li).textContent = rec.reasoning;
    $("summary", r).textContent = `Reasoning (${rec.reasoning.length} characters)`;
  }
  $(".answer", li).textContent = rec.content;
  const calls = $(".tool-calls", li);
  calls.hidden = rec.toolCalls.length === 0;
  calls.replaceChildren(
    ...rec.toolCalls.map((c) => {
      const item = document.createElement("li");
      const code = document.createElement("code");
      code.textContent = `call ${c.function.name}(${c.function.arguments})`;
      item.append(code);
      return item;
    }),
  );
  drawStats($(".stats", li), rec);
}

function finishReply(li, rec, error) {
  const label = $(".state-label", li);
  if (error) {
    li.dataset.state = "error";
    label.textContent = error === "stopped" ? "stopped" : "failed";
    const e = $(".error", li);
    e.hidden = false;
    e.textContent = error;
  } else {
    li.dataset.state = "done";
    label.textContent = `done (${rec.finish || "stop"})`;
  }
  drawReply(li, rec);
  const button = $(".step-through", li);
  button.hidden = rec.frames.length === 0;
  button.addEventListener("click", () => openReplay(rec));
}

async function send(text) {
  const model = $("#c-model").value;
  addUser(text);
  state.history.push({ role: "user", content: text });
  const li = $("#msg-assistant").content.firstElementChild.cloneNode(true);
  $(".model-id", li).textContent = model;
  $("#conversation").append(li);
  const rec = newRecord();
  state.live = rec;
  closeReplay();
  state.abort = new AbortController();
  $("#send").disabled = true;
  $("#stop").disabled = false;
  let error = null;
  try {
    await streamChat(
      request(model, state.history),
      (chunk) => {
        const what = absorb(rec, chunk);
        if (what === "canvas" && $("#replay").hidden) {
          showFrame(rec.frames[rec.frames.length - 1], "live");
          drawChart($("#chart"), rec.points);
        }
        if (what) drawReply(li, rec);
      },
      state.abort.signal,
    );
    const msg = { role: "assistant", content: rec.content };
    if (rec.toolCalls.length) msg.tool_calls = rec.toolCalls.map(({ index, ...c }) => c);
    state.history.push(msg);
    setStatus("");
  } catch (e) {
    error = e.name === "AbortError" ? "stopped" : e.message;
    state.history.pop();
    setStatus(error);
  } finally {
    state.abort = null;
    $("#send").disabled = false;
    $("#stop").disabled = true;
  }
  finishReply(li, rec, error);
  drawChart($("#chart"), rec.points);
}

// ---- step-through -------------------------------------------------------------------------------
let replaying = null;

function openReplay(rec) {
  replaying = rec;
  const range = $("#replay-range");
  range.max = String(rec.frames.length - 1);
  range.value = "0";
  $("#replay").hidden = false;
  replayTo(0);
  range.focus();
}

function replayTo(i) {
  const rec = replaying;
  const n = rec.frames.length;
  const k = Math.max(0, Math.min(n - 1, i));
  $("#replay-range").value = String(k);
  $("#replay-label").textContent = `frame ${k + 1} of ${n}`;
  showFrame(rec.frames[k], `replay, frame ${k + 1} of ${n}`);
  drawChart($("#chart"), rec.points.slice(0, k + 2));
}

function closeReplay() {
  replaying = null;
  $("#replay").hidden = true;
  const rec = state.live;
  if (rec && rec.frames.length) {
    showFrame(rec.frames[rec.frames.length - 1], "live");
    drawChart($("#chart"), rec.points);
  }
}

// ---- race ---------------------------------------------------------------------------------------
function twinOf(models) {
  return models.find((m) => m.attention === "causal" && m.id.endsWith("-ar"));
}

async function racePane(pane, model, prompt) {
  pane.dataset.state = "decoding";
  $(".state-label", pane).textContent = "decoding…";
  $(".model-id", pane).textContent = model;
  const rec = newRecord();
  const text = $(".pane-text", pane);
  const box = $(".canvas", pane);
  text.textContent = "";
  box.replaceChildren();
  drawStats($(".counters", pane), rec);
  try {
    await streamChat(request(model, [{ role: "user", content: prompt }], { tools: undefined }), (chunk) => {
      const what = absorb(rec, chunk);
      if (what === "canvas") drawCanvas(box, rec.frames[rec.frames.length - 1]);
      if (what) {
        text.textContent = rec.content;
        drawStats($(".counters", pane), rec);
      }
    });
    pane.dataset.state = "done";
    $(".state-label", pane).textContent = "done";
  } catch (e) {
    pane.dataset.state = "error";
    $(".state-label", pane).textContent = "failed: " + e.message;
  }
  drawStats($(".counters", pane), rec);
  return rec;
}

// the model the twin races: the one whose id the twin's extends (the served default)
function racedBy(models, twin) {
  const base = twin.id.slice(0, -"-ar".length);
  return models.find((m) => m.id === base) || models.find((m) => m.id !== twin.id);
}

async function race(prompt) {
  const twin = twinOf(state.models);
  const diffusion = twin && racedBy(state.models, twin);
  if (!twin || !diffusion) return;
  $("#race-go").disabled = true;
  const left = () => racePane($("#pane-diffusion"), diffusion.id, prompt);
  const right = () => racePane($("#pane-ar"), twin.id, prompt);
  if ($("#race-order").value === "together") await Promise.all([left(), right()]);
  else {
    await left();
    await right();
  }
  $("#race-go").disabled = false;
}

// ---- wiring -------------------------------------------------------------------------------------
async function loadModels() {
  const resp = await fetch("/v1/models", { headers: headers() });
  if (!resp.ok) {
    const e = await failure(resp);
    if (e.status !== 401) setStatus(e.message);
    return;
  }
  $("#key-form").hidden = !state.key;
  state.models = (await resp.json()).data;
  const select = $("#c-model");
  select.replaceChildren(
    ...state.models.map((m) => {
      const o = document.createElement("option");
      o.value = m.id;
      o.textContent = m.id;
      o.title = `${m.attention} attention, context ${m.max_model_len}`;
      return o;
    }),
  );
  const twin = twinOf(state.models);
  $("#race-go").disabled = !twin;
  $("#race-note").textContent = twin
    ? "The same prompt and settings go to both models on this machine; together they share its cores."
    : "This server serves no AR twin: start `quicksilver serve` on the embedded model to race.";
  setStatus(`connected: ${state.models.map((m) => m.id).join(", ")}`);
}

function selectTab(name) {
  for (const t of ["chat", "race"]) {
    const on = t === name;
    const tab = $("#tab-" + t);
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $("#" + t + "-view").hidden = !on;
  }
}

function wire() {
  $("#key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.key = $("#api-key").value.trim();
    sessionStorage.setItem("qs-key", state.key);
    loadModels().catch((e) => setStatus("cannot reach the server: " + e.message));
  });
  $("#chat-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("#prompt").value.trim();
    if (!text || state.abort) return;
    $("#prompt").value = "";
    send(text);
  });
  $("#prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("#chat-form").requestSubmit();
    }
  });
  $("#stop").addEventListener("click", () => state.abort && state.abort.abort());
  $("#clear").addEventListener("click", () => {
    state.history = [];
    $("#conversation").replaceChildren();
  });
  $("#race-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("#race-prompt").value.trim();
    if (text) race(text);
  });
  $("#replay-range").addEventListener("input", (e) => replayTo(Number(e.target.value)));
  $("#replay-prev").addEventListener("click", () => replayTo(Number($("#replay-range").value) - 1));
  $("#replay-next").addEventListener("click", () => replayTo(Number($("#replay-range").value) + 1));
  $("#replay-close").addEventListener("click", closeReplay);
  const tabs = ["chat", "race"];
  for (const t of tabs) {
    const tab = $("#tab-" + t);
    tab.addEventListener("click", () => selectTab(t));
    tab.addEventListener("keydown", (e) => {
      if (e.key !== "ArrowRight" && e.key !== "ArrowLeft") return;
      const next = tabs[(tabs.indexOf(t) + 1) % tabs.length];
      selectTab(next);
      $("#tab-" + next).focus();
    });
  }
  if (state.key) $("#api-key").value = state.key;
  drawChart($("#chart"), [[0, 0]]);
  loadModels().catch((e) => setStatus("cannot reach the server: " + e.message));
}

document.addEventListener("DOMContentLoaded", wire);
