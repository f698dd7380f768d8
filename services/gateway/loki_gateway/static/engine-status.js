// The engine in the sidebar: its pill (the supervisor's state in a word, the details behind
// it), kept up to date by GET /api/engine/events, and the preset picker under it. Part of the
// chat page (chat-state.js).
"use strict";

LokiChat.part((C, $, state) => {
  // The engine's info: read once here (a preset switched, a retry), and pushed by the gateway
  // on every change (watchEngine), never polled.
  async function refreshEngine() {
    const info = await C.firstJSON(["/api/engine"]);
    if (info) setEngine(info);
    else { state.engine = null; showEngine(); }
    await refreshPresets();
  }

  function setEngine(info) {
    state.engine = info && info.state !== "unknown" ? info : null;
    showEngine();
    if (state.engine && !state.nctx && state.engine.n_ctx) C.setGauge(state.ctxBase + state.streamed, state.engine.n_ctx);
  }

  // GET /api/engine/events (SSE over fetch, for the key header): `event: engine` at once and
  // on each change; reconnects after a drop. The preset picker is read again when the
  // active preset changes.
  async function watchEngine() {
    let delay = 1000;
    for (;;) {
      try {
        const usedKey = localStorage.getItem("lokiKey");
        const resp = await fetch("/api/engine/events", { headers: Object.assign({ Accept: "text/event-stream" }, C.authHeaders()) });
        if (resp.status === 401) { if (localStorage.getItem("lokiKey") === usedKey) await C.askKey(); continue; }
        if (!resp.ok || !resp.body) throw new Error("engine events " + resp.status);
        delay = 1000;
        for await (const received of C.sseFrames(resp)) {
          for (const f of received) {
            if (f.event !== "engine" || !f.data) continue;
            let info;
            try { info = JSON.parse(f.data); } catch (e) { continue; }
            const presetChanged = !state.engine || state.engine.preset_id !== info.preset_id;
            setEngine(info);
            if (presetChanged) refreshPresets();
          }
        }
      } catch (e) { /* reconnect below */ }
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 10000);
    }
  }

  async function refreshPresets() {
    const presets = await C.firstJSON(["/api/presets"]);
    const sel = $("preset-picker");
    if (presets && Array.isArray(presets.presets)) {
      const cur = sel.value;
      sel.textContent = "";
      for (const p of presets.presets) {
        const o = document.createElement("option");
        o.value = p.id; o.textContent = p.name || p.id;
        if (p.id === (presets.active || cur)) o.selected = true;
        sel.appendChild(o);
      }
    }
  }

  // The engine pill: the supervisor's state in a word, "generating" while this page's reply
  // streams or another client holds the engine (in_flight leases); under it one plain
  // sentence when the model cannot use tools; the details (model, the template probe's
  // notes, launch notes) behind the pill, a button that opens them.
  const STATE_WORDS = {
    ready: "Ready", generating: "Generating", starting: "Starting", failed: "Failed",
    stopped: "Stopped", unknown: "Unknown",
  };
  const NO_TOOLS = "This model can't use tools: memory, recall and sub-agents are off";
  function engineSummary(info) {
    if (!info) return { st: "unknown", line: "" };
    let st = info.state || "unknown";
    if (st === "ready" && (state.generating || info.in_flight > 0)) st = "generating";
    const noTools = info.template && info.template.supports_tools === false;
    return { st: st, line: noTools ? NO_TOOLS : "" };
  }

  function showEngine() {
    const info = state.engine;
    const pill = $("engine-state");
    const { st, line } = engineSummary(info);
    const model = info && info.model ? String(info.model).split("/").pop() : "";
    pill.textContent = "Engine: " + (STATE_WORDS[st] || st) + (model ? " · " + model : "");
    pill.className = "pill " + st;
    pill.dataset.state = st;
    $("engine-note").textContent = line;
    $("engine-note").hidden = !line;
    const det = $("engine-details");
    det.textContent = "";
    const rows = [];
    if (info) {
      rows.push("State: " + (info.state || "unknown") + (info.in_flight ? " (" + info.in_flight + " request(s) in flight)" : ""));
      if (info.model) rows.push("Model: " + info.model);
      if (info.n_ctx) rows.push("Context window: " + info.n_ctx + " tokens");
      for (const n of (info.template && info.template.notes) || []) rows.push(n); // the template probe
      for (const n of info.notes || []) rows.push(n); // launch notes
    } else rows.push("The engine supervisor does not answer.");
    for (const r of rows) { const li = document.createElement("li"); li.textContent = r; det.appendChild(li); }
    if (info && Array.isArray(info.engines) && info.engines.length) showPool(det, info);
    if (info) document.dispatchEvent(new CustomEvent("loki:engine", { detail: info })); // preset-editor.js
  }

  // Several engines (LOKI_ENGINE_URLS, issue 44): after the rows above, one line for the pool
  // (how many engines, the routing policy, the supervisor granting leases) and one item per
  // engine: id, group, state, model, slots busy/total, what it granted (grants, moves in,
  // restores), and under it each slot with the conversation it last ran (a short id). Only
  // when the supervisor lists engines: with one engine the details are as before.
  function showPool(det, info) {
    const head = document.createElement("li");
    head.className = "engine-pool";
    let text = "Engines: " + info.engines.length;
    if (info.routing) text += " · routing " + info.routing;
    if (info.leader) text += " · leader " + info.leader;
    head.textContent = text;
    det.appendChild(head);
    for (const e of info.engines) det.appendChild(engineItem(e));
  }

  function engineItem(e) {
    const li = document.createElement("li");
    li.className = "engine-pool-engine";
    li.dataset.engine = e.id;
    const slots = Array.isArray(e.slots) ? e.slots : [];
    const busy = slots.filter((s) => s.busy).length;
    const model = e.model ? String(e.model).split("/").pop() : "";
    const parts = [e.id + (e.group && e.group !== "default" ? " (" + e.group + ")" : ""), e.state || "unknown"];
    if (model) parts.push(model);
    parts.push("slots " + busy + "/" + (e.total_slots || slots.length) + " busy");
    parts.push((e.grants || 0) + " grants, " + (e.moves_in || 0) + " moves in, " + (e.restores || 0) + " restores");
    li.appendChild(document.createTextNode(parts.join(" · ")));
    if (slots.length) {
      const ul = document.createElement("ul");
      for (const s of slots) {
        const item = document.createElement("li");
        item.className = "engine-pool-slot";
        let line = "slot " + s.id_slot + ": " + (s.busy ? "busy" : "free");
        if (s.waiting) line += ", " + s.waiting + " waiting";
        if (s.conversation) line += " · " + String(s.conversation).slice(0, 8) + (s.prefix ? " (" + s.prefix + " messages)" : "");
        if (s.saved) line += " · saved";
        item.textContent = line;
        ul.appendChild(item);
      }
      li.appendChild(ul);
    }
    return li;
  }

  // The sidebar's picker: what the switch did is said under it (never a modal alert); a
  // refused switch leaves the picker on the active preset (refreshEngine).
  async function switchPreset(id) {
    const msg = $("preset-picker-msg");
    const say = (text, isError) => { msg.textContent = text; msg.className = isError ? "hint error" : "hint"; msg.hidden = !text; };
    say("Switching to " + id + "…");
    try {
      const r = await C.apiJSON("/api/presets/switch", { method: "POST", json: { id: id } });
      const d = r.detail || {};
      say(d.error ? "Switched to " + id + ": " + d.error : "", !!d.error);
    } catch (e) { say("Preset not switched: " + e.message, true); }
    refreshEngine();
  }

  function setupEngine() {
    $("engine-state").onclick = () => {
      const det = $("engine-details");
      det.hidden = !det.hidden;
      $("engine-state").setAttribute("aria-expanded", String(!det.hidden));
    };
    $("preset-picker").onchange = (ev) => switchPreset(ev.target.value);
  }

  return { refreshEngine, watchEngine, showEngine, setupEngine };
});
