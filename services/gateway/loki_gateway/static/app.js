// Loki's chat page. Plain JS, no build step.
//
// The reply stream is read with fetch() (not EventSource) so the API key can be sent as a
// header; it resumes from the last seen id (Last-Event-ID) after a network error or when the
// server says `event: reconnect`, so a reload or a drop never loses or repeats an event.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const md = window.LokiMarkdown;
  const FOLD_CHARS = 600;
  // A streaming reply is drawn at most this often (ms): a few renders a second, not one per
  // animation frame, so an open tab leaves the engine its CPU.
  const RENDER_INTERVAL_MS = 200;

  const state = {
    conversation: null,
    lastSeq: 0,
    userSeq: 0,        // seq of the last user message drawn (a queued one taken by its turn)
    abort: null,
    generating: false,
    turn: null,        // pointers of the turn being drawn
    dirty: new Set(),  // answers (LokiLive) with text not drawn yet
    live: new Set(),   // answers still streaming: drawn whole once when their turn ends
    nctx: 0,           // the conversation's window, from its state (or the engine's)
    ctxBase: 0,        // ctx_used at the last state or end of turn
    streamed: 0,       // deltas streamed since then (about one token each)
    titles: {},        // conversation id -> title, from the list
    engine: null,      // the last engine info (pushed by /api/engine/events)
    older: [],         // the earliest items of a long conversation, not drawn yet (oldest first)
    settled: false,    // the replay that opened the conversation is drawn
    pinned: true,      // the view follows the latest message
  };
  // A long conversation opens on its latest PAGE items (bubbles, markers, badges); the
  // earlier ones are drawn PAGE at a time as the view is scrolled up to them.
  const PAGE = 40;
  // A conversation opens on its last TAIL_TURNS turns; older ones come a page at a time.
  const TAIL_TURNS = 30;
  // The replay that opens a conversation is over once the stream has been quiet this long (ms).
  const SETTLE_MS = 150;

  // ---- API -------------------------------------------------------------------------------
  function authHeaders() {
    const key = localStorage.getItem("lokiKey");
    return key ? { Authorization: "Bearer " + key } : {};
  }

  let keyPrompt = null;  // one dialog for all the requests refused at once
  function askKey() {
    if (keyPrompt) return keyPrompt;
    keyPrompt = new Promise((resolve) => {
      const dlg = $("key-dialog");
      const typed = () => $("key-input").value.trim();
      // stored at submit, before the dialog closes (its close event comes a task later)
      dlg.querySelector("form").onsubmit = () => { if (typed()) localStorage.setItem("lokiKey", typed()); };
      dlg.onclose = () => {
        const v = typed();
        if (v) localStorage.setItem("lokiKey", v);
        keyPrompt = null;
        resolve(!!v);
      };
      dlg.showModal();
    });
    return keyPrompt;
  }

  async function api(path, opts = {}, retried = false) {
    const usedKey = localStorage.getItem("lokiKey");
    const headers = Object.assign({}, opts.headers || {}, authHeaders());
    if (opts.json !== undefined) {
      headers["Content-Type"] = "application/json";
      opts = Object.assign({}, opts, { body: JSON.stringify(opts.json) });
    }
    const resp = await fetch(path, Object.assign({}, opts, { headers }));
    if (resp.status === 401) {
      // sent before a key was typed in: retry with it rather than asking again
      if (localStorage.getItem("lokiKey") !== usedKey) return api(path, opts, retried);
      if (!retried && (await askKey())) return api(path, opts, true);
    }
    return resp;
  }

  async function apiJSON(path, opts) {
    const resp = await api(path, opts);
    let body = null;
    try { body = await resp.json(); } catch (e) { body = null; }
    if (!resp.ok) {
      const msg = body && body.error ? body.error.message : resp.status + " " + resp.statusText;
      const err = new Error(msg);
      err.status = resp.status;
      err.code = body && body.error ? body.error.code : null;
      throw err;
    }
    return body;
  }

  // ---- conversations -------------------------------------------------------------------
  async function loadConversations() {
    let list = [];
    // with projects (projects.js), only the active project's conversations
    const project = window.LokiProjects ? LokiProjects.active() : null;
    const path = project ? "/api/conversations?project=" + encodeURIComponent(project) : "/api/conversations";
    try { list = (await apiJSON(path)).conversations || []; } catch (e) { return; }
    const ul = $("conversations");
    ul.textContent = "";
    // the open conversation keeps its title when the list leaves it out (a task's run)
    const open = state.conversation;
    state.titles = open && state.titles[open] ? { [open]: state.titles[open] } : {};
    state.list = list;
    for (const c of list) {
      state.titles[c.id] = c.title || "";
      if (deleting.has(c.id)) continue; // deleted, its Undo still offered
      const li = document.createElement("li");
      li.dataset.id = c.id;
      const name = c.title || "Untitled";
      // the title is the row's own button: reached by Tab, opened by Enter or Space
      const title = document.createElement("button");
      title.type = "button";
      title.className = "title";
      title.textContent = name;
      if (c.id === state.conversation) {
        li.classList.add("active"); title.setAttribute("aria-current", "true");
        if (c.title) setTitle(c.title);
      }
      title.onclick = () => openConversation(c.id);
      const ren = document.createElement("button");
      ren.type = "button"; ren.className = "row-icon"; ren.textContent = "✎";
      ren.title = "Rename"; ren.setAttribute("aria-label", "Rename " + name);
      ren.onclick = (ev) => { ev.stopPropagation(); renameConversation(c); };
      const del = document.createElement("button");
      del.type = "button"; del.className = "row-icon"; del.textContent = "×";
      del.title = "Delete"; del.setAttribute("aria-label", "Delete " + name);
      del.onclick = (ev) => { ev.stopPropagation(); deleteConversation(c); };
      li.append(title, ren, del);
      ul.appendChild(li);
    }
  }

  async function renameConversation(c) {
    const t = await LokiDialog.ask({ title: "Rename conversation", label: "Title", value: c.title || "", ok: "Rename" });
    if (t === null || !t.trim()) return;
    try { await apiJSON("/api/conversations/" + c.id, { method: "PATCH", json: { title: t.trim() } }); }
    catch (e) { notice("Not renamed: " + e.message, "error"); }
    loadConversations();
  }

  // Delete with an Undo: the row goes at once, the server deletes it when the Undo is gone
  // (a few seconds, another delete, or the page closing).
  const deleting = new Map(); // id -> commit()
  function deleteConversation(c) {
    const wasOpen = c.id === state.conversation;
    let done = false;
    const commit = (keepalive) => {
      if (done) return;
      done = true;
      deleting.delete(c.id);
      apiJSON("/api/conversations/" + c.id, { method: "DELETE", keepalive: !!keepalive })
        .catch((e) => notice("Not deleted: " + e.message, "error"))
        .finally(() => loadConversations());
    };
    for (const other of deleting.values()) other();
    deleting.set(c.id, commit);
    if (wasOpen) openConversation(null);
    setDrawer(false); // the Undo shows in the main view (a phone's drawer would cover it)
    loadConversations();
    notice("Deleted “" + (c.title || "Untitled") + "”", "ok", 6000, {
      label: "Undo",
      onclick: () => {
        if (done) return;
        done = true;
        deleting.delete(c.id);
        notice("Kept “" + (c.title || "Untitled") + "”", "ok");
        loadConversations().then(() => { if (wasOpen) openConversation(c.id); });
      },
      expire: () => commit(false),
    });
  }
  window.addEventListener("pagehide", () => { for (const commit of deleting.values()) commit(true); });

  function openConversation(id) {
    if (state.abort) state.abort.abort();
    state.abort = null;
    state.conversation = id;
    state.lastSeq = 0;
    state.userSeq = 0;
    state.turn = null;
    state.older = [];
    state.historyBefore = 0;
    state.settled = false;
    state.pinned = true;
    clearTimeout(settleTimer);
    settleFirst = 0;
    dropAnswers();
    $("messages").textContent = "";
    $("messages").dataset.conversation = id || "";
    $("messages").dataset.lastSeq = "0";
    $("messages").dataset.settled = "";
    setDrawer(false);
    setGenerating(false);
    state.ctxBase = 0; state.streamed = 0;
    if (id) { localStorage.setItem("lokiConv", id); history.replaceState(null, "", "#c=" + id); setTitle(state.titles[id]); }
    else { localStorage.removeItem("lokiConv"); history.replaceState(null, "", "#"); $("conv-title").textContent = "New chat"; setGauge(0, 0); }
    for (const li of $("conversations").children) {
      li.classList.toggle("active", li.dataset.id === id);
      const b = li.querySelector("button.title");
      if (b) { if (li.dataset.id === id) b.setAttribute("aria-current", "true"); else b.removeAttribute("aria-current"); }
    }
    if (id) { stream(id); refreshState(); }
  }

  // ---- SSE over fetch ------------------------------------------------------------------
  async function stream(id) {
    const ctrl = new AbortController();
    state.abort = ctrl;
    let delay = 500;
    while (!ctrl.signal.aborted && state.conversation === id) {
      let reconnectNow = false;
      try {
        const usedKey = localStorage.getItem("lokiKey");
        const headers = Object.assign({ Accept: "text/event-stream" }, authHeaders());
        if (state.lastSeq) headers["Last-Event-ID"] = String(state.lastSeq);
        // a fresh open asks only for the last TAIL_TURNS turns (older pages: GET /api/chat/history)
        const tail = state.lastSeq ? "" : "&tail_turns=" + TAIL_TURNS;
        const resp = await fetch("/api/chat?conversation=" + encodeURIComponent(id) + tail, { headers, signal: ctrl.signal });
        if (resp.status === 401) { if (localStorage.getItem("lokiKey") === usedKey) await askKey(); continue; }
        if (resp.status === 404) { openConversation(null); loadConversations(); return; }
        if (!resp.ok || !resp.body) throw new Error("stream " + resp.status);
        delay = 500;
        for await (const received of sseFrames(resp)) {
          const batch = [];
          for (const f of received) {
            if (f.event === "reconnect") { reconnectNow = true; break; }
            if (f.event === "history") { try { state.historyBefore = JSON.parse(f.data).before || 0; } catch (e) { /* none */ } olderButton(); continue; }
            if (f.data) batch.push(f);
          }
          let reopen = false;
          for (const f of batch) {
            let data;
            try { data = JSON.parse(f.data); } catch (e) { continue; }
            if (typeof data.seq === "number" && data.seq <= state.lastSeq) continue; // never twice
            if (typeof data.merged_from === "number" && state.lastSeq && data.merged_from <= state.lastSeq) {
              // resumed inside a run the server has merged since: part of its text is drawn
              // already; reload the conversation rather than append it twice
              reopen = true; break;
            }
            handleEvent(data);
            if (typeof data.seq === "number") state.lastSeq = data.seq;
          }
          $("messages").dataset.lastSeq = String(state.lastSeq);
          scheduleRender();
          if (!state.settled) settleSoon(id);
          if (reopen) { openConversation(id); return; } // leaving the loop cancels the reader
          if (reconnectNow) break;
        }
      } catch (e) {
        if (ctrl.signal.aborted) return;
      }
      if (!reconnectNow) { await new Promise((r) => setTimeout(r, delay)); delay = Math.min(delay * 2, 5000); }
    }
  }

  // The frames of an SSE response read with fetch(), a batch per network read (a batch is
  // drawn at once); the reader is cancelled when the loop over it ends early.
  async function* sseFrames(resp) {
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buf += dec.decode(value, { stream: true });
        const batch = [];
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          batch.push(parseFrame(buf.slice(0, cut)));
          buf = buf.slice(cut + 2);
        }
        yield batch;
      }
    } finally {
      reader.cancel().catch(() => {});
    }
  }

  function parseFrame(block) {
    const f = { id: null, event: null, data: "" };
    for (const line of block.split("\n")) {
      if (!line || line[0] === ":") continue;
      const i = line.indexOf(":");
      const name = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value[0] === " ") value = value.slice(1);
      if (name === "data") f.data = f.data ? f.data + "\n" + value : value;
      else if (name === "id") f.id = value;
      else if (name === "event") f.event = value;
    }
    return f;
  }

  // ---- drawing events ------------------------------------------------------------------
  function box() { return state.drawInto || $("messages"); }

  function add(el) {
    const m = box();
    if (state.drawInto) { m.appendChild(el); return el; }
    const atBottom = m.scrollHeight - m.scrollTop - m.clientHeight < 80;
    m.insertBefore(el, pendingBox());
    if (atBottom || !state.settled) m.scrollTop = m.scrollHeight;
    return el;
  }

  // ---- a long conversation: opened at its latest message, older items drawn on scroll up --
  // Settled once the stream has been quiet SETTLE_MS, or a second after its first events at
  // the latest (a reply streaming as the conversation opens never pauses that long).
  let settleTimer = null;
  let settleFirst = 0;
  function settleSoon(id) {
    clearTimeout(settleTimer);
    if (!settleFirst) settleFirst = performance.now();
    const wait = performance.now() - settleFirst > 1000 ? 0 : SETTLE_MS;
    settleTimer = setTimeout(() => { if (state.conversation === id && !state.settled) settle(); }, wait);
  }

  // The items of the conversation drawn in #messages (not the queue's holder, nor the
  // "older messages" button).
  function items() {
    return Array.from(box().children).filter((el) => el.id !== "pending" && el.id !== "older-btn");
  }

  // The opening replay is drawn: keep its last PAGE items, the earlier ones wait in
  // state.older, and land on the latest message.
  function settle() {
    state.settled = true;
    for (const a of state.dirty) a.render();
    state.dirty.clear();
    const all = items();
    if (all.length > PAGE) {
      state.older = all.slice(0, all.length - PAGE);
      for (const el of state.older) el.remove();
    }
    olderButton();
    toBottom();
    box().dataset.settled = "1";
  }

  function toBottom() { if (state.paging) return; const m = box(); m.scrollTop = m.scrollHeight; state.pinned = true; }

  // The button at the top of a paged conversation (the keyboard's way to older messages;
  // scrolling up draws them too).
  function olderButton() {
    let b = $("older-btn");
    if (!state.older.length && !state.historyBefore) { if (b) b.remove(); return; }
    if (!b) {
      b = document.createElement("button");
      b.id = "older-btn"; b.type = "button"; b.className = "older";
      b.onclick = () => showOlder();
      box().prepend(b);
    }
    b.textContent = state.older.length ? "Show earlier messages (" + state.older.length + ")" : "Show earlier messages";
  }

  // Draws the PAGE items before the first one drawn, the view kept on what it showed.
  function showOlder() {
    if (!state.older.length) { loadOlderPage(); return; }
    const m = box();
    const first = items()[0] || null;
    const before = first ? first.getBoundingClientRect().top : 0;
    const page = state.older.splice(Math.max(0, state.older.length - PAGE));
    const anchor = first || pendingBox();
    for (const el of page) m.insertBefore(el, anchor);
    if (first) m.scrollTop += first.getBoundingClientRect().top - before;
    olderButton();
  }

  function onScroll() {
    const m = box();
    state.pinned = m.scrollHeight - m.scrollTop - m.clientHeight < 80;
    if (state.settled && (state.older.length || state.historyBefore) && m.scrollTop < 400) showOlder();
  }

  // The turns before the first one the server sent (GET /api/chat/history), drawn off-screen
  // with the live turn set aside (an older page never touches the reply streaming now, the
  // gauge or the queue), then kept in state.older and shown like the hidden items.
  let loadingOlder = false;
  async function loadOlderPage() {
    const id = state.conversation;
    if (!state.historyBefore || loadingOlder || !id) return;
    loadingOlder = true;
    try {
      const page = await apiJSON("/api/chat/history?conversation=" + encodeURIComponent(id)
        + "&before=" + state.historyBefore + "&turns=" + TAIL_TURNS);
      if (state.conversation !== id) return;
      state.historyBefore = page.older ? page.before : 0;
      state.older = drawPage(page.events || []).concat(state.older);
      showOlder();
      olderButton();
    } catch (e) {
      notice("Earlier messages could not be loaded: " + e.message, "error");
    } finally {
      loadingOlder = false;
    }
  }

  function drawPage(events) {
    const saved = { turn: state.turn, live: state.live, dirty: state.dirty };
    const page = document.createElement("div");
    state.drawInto = page; state.paging = true;
    state.turn = null; state.live = new Set(); state.dirty = new Set();
    try {
      for (const ev of events) handleEvent(ev);
      for (const a of state.dirty) a.render();
      for (const a of state.live) { a.finish(); a.el.classList.remove("typing"); }
    } finally {
      state.drawInto = null; state.paging = false;
      state.turn = saved.turn; state.live = saved.live; state.dirty = saved.dirty;
    }
    return Array.from(page.children);
  }

  function newTurn() { state.turn = { answer: null, reasoning: null, tools: {}, last: null, lastEl: null }; return state.turn; }
  function turn() { return state.turn || newTurn(); }

  function bubble(cls, tag) {
    const el = document.createElement(tag || "div");
    el.className = "msg " + cls;
    return el;
  }

  function foldable(parent, text) {
    const pre = document.createElement("pre");
    parent.appendChild(pre);
    if (text.length <= FOLD_CHARS) { pre.textContent = text; return; }
    pre.textContent = text.slice(0, FOLD_CHARS) + "…";
    const more = document.createElement("button");
    more.className = "more"; more.type = "button"; more.textContent = "show more";
    let open = false;
    more.onclick = () => { open = !open; pre.textContent = open ? text : text.slice(0, FOLD_CHARS) + "…"; more.textContent = open ? "show less" : "show more"; };
    parent.appendChild(more);
  }

  function handleEvent(ev) {
    const choice = (ev.choices && ev.choices[0]) || {};
    const delta = choice.delta || {};
    const mark = (ev.loki && ev.loki.event) || null;

    if (mark === "reset") { dropAnswers(); box().textContent = ""; state.older = []; state.turn = null; return; }
    if (mark === "subagent") { LokiSubagent.draw(box(), ev.loki); return; } // nested under its call
    if (mark === "verify") {
      const el = document.createElement("div");
      el.className = "marker verify " + (ev.loki.verdict === "fail" ? "fail" : "pass");
      el.textContent = "answer checked: " + (ev.loki.verdict === "fail" ? "fail, correcting" : "pass")
        + (ev.loki.verdict === "fail" && ev.loki.reason ? " (" + ev.loki.reason + ")" : "");
      add(el);
      if (state.turn) { state.turn.last = "tool"; state.turn.answer = null; }
      return;
    }
    if (mark === "compaction") {
      const el = document.createElement("div");
      el.className = "marker compaction";
      const b = ev.loki.tokens_before, a = ev.loki.tokens_after;
      el.textContent = "conversation compacted" + (b ? " (" + b + " → " + a + " tokens)" : "")
        + (ev.loki.note ? ": " + ev.loki.note : "");
      add(el);
      state.turn = null;
      return;
    }
    if (delta.role === "user" && ev.loki && ev.loki.injected) {
      // a message Loki wrote itself (reminder, summary...): shown folded, not as the user's
      const el = bubble("tool injected", "details");
      const s = document.createElement("summary");
      s.textContent = "Loki injected: " + ev.loki.injected;
      const pre = document.createElement("pre");
      pre.textContent = typeof delta.content === "string" ? delta.content : JSON.stringify(delta.content);
      el.append(s, pre);
      if (ev.loki.images && window.LokiAttach) window.LokiAttach.thumbs(el, ev.loki.images);
      add(el);
      if (state.turn) { state.turn.last = "tool"; state.turn.answer = null; }
      return;
    }
    if (mark === "continue") {
      // a cut reply is resumed: its deltas go on in the last assistant bubble
      for (const b of box().querySelectorAll("button.continue")) b.remove();
      const all = box().querySelectorAll(".msg.assistant");
      const last = all[all.length - 1];
      const t = newTurn();
      if (last && last._answer) {
        // the finished bubble is drawn live again from its text so far
        const a = LokiLive.create(last);
        a.append(last._answer.text);
        last._answer = a;
        state.live.add(a);
        t.answer = a; t.last = "content"; last.classList.add("typing");
      }
      setGenerating(true);
      return;
    }
    if (mark === "retry") {
      const el = document.createElement("div");
      el.className = "marker";
      el.textContent = "retrying" + (ev.loki.reason ? ": " + ev.loki.reason : "");
      add(el);
      return;
    }
    if (delta.role === "user") {
      state.turn = null;
      for (const b of box().querySelectorAll("button.continue")) b.remove();
      const whole = typeof delta.content === "string" ? delta.content : JSON.stringify(delta.content);
      // inlined text files: a chip each, not their fenced text (attachments.js)
      const parts = window.LokiAttach ? window.LokiAttach.splitInlined(whole) : { text: whole, files: [] };
      const text = parts.text;
      if (!state.paging) {
        dropPending(text);
        if (typeof ev.seq === "number") state.userSeq = ev.seq;
      }
      const el = bubble("user");
      el.textContent = text;
      if (window.LokiAttach) window.LokiAttach.fileBlocks(el, parts.files);
      if (ev.loki && ev.loki.images && window.LokiAttach) window.LokiAttach.thumbs(el, ev.loki.images);
      add(el);
      if (!state.titles[state.conversation]) provisionalTitle(text || parts.files.map((f) => f.name).join(", "));
      setGenerating(true);
      return;
    }
    if (mark === "turn_start") { newTurn(); setGenerating(true); }
    if (delta.role === "tool") {
      const t = turn();
      const el = bubble("tool", "div");
      const head = document.createElement("div");
      head.textContent = "↳ result of " + (delta.name || "tool");
      el.appendChild(head);
      foldable(el, String(delta.content == null ? "" : delta.content));
      add(el);
      t.last = "tool"; t.answer = null;
      return;
    }
    const t = turn();
    if (delta.reasoning_content || delta.content || delta.tool_calls) countToken();
    if (typeof delta.reasoning_content === "string" && delta.reasoning_content) {
      if (t.last !== "reasoning" || !t.reasoning) {
        const el = bubble("reasoning", "details");
        const s = document.createElement("summary"); s.textContent = "Reasoning";
        const body = document.createElement("div"); body.className = "body";
        el.append(s, body);
        t.reasoning = { el, body, text: "" };
        add(el);
      }
      t.reasoning.text += delta.reasoning_content;
      t.reasoning.body.textContent = t.reasoning.text;
      t.last = "reasoning";
    }
    if (typeof delta.content === "string" && delta.content) {
      if (t.last !== "content" || !t.answer) t.answer = newAnswer();
      t.answer.append(delta.content);
      state.dirty.add(t.answer);
      t.last = "content";
    }
    if (Array.isArray(delta.tool_calls)) {
      for (const tc of delta.tool_calls) {
        const idx = tc.index || 0;
        let call = t.tools[idx];
        if (!call || (tc.id && call.id && tc.id !== call.id)) {
          const el = bubble("tool", "details");
          const s = document.createElement("summary");
          const pre = document.createElement("pre");
          el.append(s, pre);
          call = t.tools[idx] = { id: tc.id, name: "", args: "", el, s, pre };
          add(el);
        }
        if (tc.id && !call.el.dataset.callId) call.el.dataset.callId = tc.id; // a sub-agent nests here
        const fn = tc.function || {};
        if (fn.name) call.name += fn.name;
        if (fn.arguments) call.args += fn.arguments;
        call.s.textContent = "⚙ " + (call.name || "tool") + (call.args.length > 80 ? " (" + call.args.length + " chars)" : " " + call.args);
        call.pre.textContent = call.args;
      }
      t.last = "tool"; t.answer = null;
    }
    if (mark === "error") {
      const el = document.createElement("div");
      el.className = "marker error";
      el.textContent = "error: " + (ev.loki.message || ev.loki.detail || "the turn failed");
      add(el);
    }
    if (choice.finish_reason) {
      const tm = ev.timings || {};
      const badge = document.createElement("div");
      badge.className = "badge";
      const parts = [];
      if (tm.prompt_n != null || tm.cache_n != null) parts.push("prefill " + (tm.prompt_n ?? "?") + " new / " + (tm.cache_n ?? "?") + " cached");
      if (tm.predicted_n != null) parts.push(tm.predicted_n + " tokens" + (tm.predicted_per_second ? " at " + tm.predicted_per_second.toFixed(1) + " t/s" : ""));
      if (mark === "stopped" || choice.finish_reason === "stopped") parts.push("stopped");
      const cutAt = choice.finish_reason === "length" && ev.loki ? ev.loki.cut_at : null;
      if (choice.finish_reason === "length") parts.push(cutAt ? "reply cut at " + cutAt + " tokens" : "reply cut (window full)");
      if (ev.loki && ev.loki.prefix_unstable) parts.push("template re-renders the prefix");
      badge.textContent = parts.join(" · ") || choice.finish_reason;
      if (choice.finish_reason === "length") {
        // Continue resumes the same assistant message (POST /api/chat/continue)
        const more = document.createElement("button");
        more.type = "button"; more.className = "continue"; more.textContent = "Continue";
        more.onclick = () => { more.remove(); control("continue"); };
        badge.append(" ", more);
      }
      add(badge);
      const pinned = state.pinned || !state.settled;
      finishAnswers();
      if (pinned) toBottom();
      state.turn = null;
      setGenerating(false);
      // the turn's own figure, else back to the last known one until the state is read again
      // (the streamed estimate, never a drop to the figure before the reply)
      setCtxUsed(ev.loki && typeof ev.loki.ctx_used === "number" ? ev.loki.ctx_used : state.ctxBase + state.streamed);
      refreshStateSoon();
    }
  }

  // ---- answers: incremental Markdown (live-markdown.js), drawn a few times a second ------
  function newAnswer() {
    const el = bubble("assistant typing");
    add(el);
    const a = LokiLive.create(el);
    el._answer = a; // Continue draws a cut reply on in the same bubble
    state.live.add(a);
    return a;
  }

  function finishAnswers() {
    for (const a of state.live) { a.finish(); a.el.classList.remove("typing"); }
    state.live.clear();
    state.dirty.clear();
  }

  function dropAnswers() { state.live.clear(); state.dirty.clear(); }

  let renderTimer = null;
  let lastRender = 0;
  function scheduleRender() {
    if (renderTimer || !state.dirty.size) return;
    const wait = Math.max(0, lastRender + RENDER_INTERVAL_MS - performance.now());
    renderTimer = setTimeout(() => requestAnimationFrame(renderDirty), wait);
  }

  function renderDirty() {
    renderTimer = null;
    lastRender = performance.now();
    const m = box();
    const atBottom = m.scrollHeight - m.scrollTop - m.clientHeight < 120 || !state.settled;
    for (const a of state.dirty) a.render();
    state.dirty.clear();
    if (atBottom) toBottom();
  }

  // ---- state, gauge, engine ------------------------------------------------------------
  function setGenerating(on) {
    if (state.paging) return;
    state.generating = on;
    $("stop-btn").hidden = !on;
    showEngine();
  }

  function setGauge(used, nctx) {
    if (nctx) state.nctx = nctx;
    nctx = nctx || state.nctx;
    // Same figure as the server's: ctx_used / n_ctx of the conversation's state.
    const pct = nctx ? Math.min(100, Math.round((100 * used) / nctx)) : 0;
    $("gauge-fill").style.width = pct + "%";
    $("gauge-fill").classList.toggle("high", pct >= 80);
    $("gauge-text").textContent = used + " / " + (nctx || "?") + " (" + pct + "%)";
  }

  async function refreshState() {
    const id = state.conversation;
    if (!id) return;
    try {
      const st = await apiJSON("/api/chat/state?conversation=" + encodeURIComponent(id));
      if (id !== state.conversation) return;
      if (st.n_ctx) state.nctx = st.n_ctx;
      if (!st.generating || !state.streamed) setCtxUsed(st.ctx_used || 0);
      if (st.generating) setGenerating(true);
      // the queue as the state saw it, unless a turn took a message since (a newer user event)
      if (st.pending && st.pending.length && state.userSeq <= st.last_seq) LokiQueue.sync(st.pending, cancelQueued);
    } catch (e) { /* the stream shows errors */ }
  }
  let stateTimer = null;
  function refreshStateSoon() { if (state.paging) return; clearTimeout(stateTimer); stateTimer = setTimeout(() => { refreshState(); loadConversations(); }, 300); }

  async function firstJSON(paths) {
    for (const p of paths) {
      try {
        const r = await api(p);
        if (r.ok) return await r.json();
      } catch (e) { /* next */ }
    }
    return null;
  }

  // The engine's info: read once here (a preset switched, a retry), and pushed by the gateway
  // on every change (watchEngine), never polled.
  async function refreshEngine() {
    const info = await firstJSON(["/api/engine"]);
    if (info) setEngine(info);
    else { state.engine = null; showEngine(); }
    await refreshPresets();
  }

  function setEngine(info) {
    state.engine = info && info.state !== "unknown" ? info : null;
    showEngine();
    if (state.engine && !state.nctx && state.engine.n_ctx) setGauge(state.ctxBase + state.streamed, state.engine.n_ctx);
  }

  // GET /api/engine/events (SSE over fetch, for the key header): `event: engine` at once and
  // on each change; reconnects after a drop. The preset picker is read again when the
  // active preset changes.
  async function watchEngine() {
    let delay = 1000;
    for (;;) {
      try {
        const usedKey = localStorage.getItem("lokiKey");
        const resp = await fetch("/api/engine/events", { headers: Object.assign({ Accept: "text/event-stream" }, authHeaders()) });
        if (resp.status === 401) { if (localStorage.getItem("lokiKey") === usedKey) await askKey(); continue; }
        if (!resp.ok || !resp.body) throw new Error("engine events " + resp.status);
        delay = 1000;
        for await (const received of sseFrames(resp)) {
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
    const presets = await firstJSON(["/api/presets"]);
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
    if (info) document.dispatchEvent(new CustomEvent("loki:engine", { detail: info })); // preset-editor.js
  }

  // ---- the context gauge: the server's ctx_used, plus one token per streamed delta --------
  function setCtxUsed(used) {
    if (state.paging) return;
    state.ctxBase = used;
    state.streamed = 0;
    setGauge(used, state.nctx);
  }

  let gaugeQueued = false;
  function countToken() {
    if (state.paging) return;
    state.streamed++;
    if (gaugeQueued) return;
    gaugeQueued = true;
    setTimeout(() => { gaugeQueued = false; setGauge(state.ctxBase + state.streamed, state.nctx); }, RENDER_INTERVAL_MS);
  }

  // ---- the header title --------------------------------------------------------------------
  function setTitle(title) { $("conv-title").textContent = title || (state.conversation ? "Untitled" : "New chat"); }

  // Until the list says otherwise: the first line of the first message, as the chat service
  // names a conversation (first line, 60 characters).
  function provisionalTitle(text) {
    if (state.paging) return;
    const first = (text.trim().split("\n")[0] || "").slice(0, 60);
    if (first) setTitle(first);
  }

  // ---- messages sent but not yet taken: queue-bubbles.js ----------------------------------
  const pendingBox = LokiQueue.holder;
  const dropPending = LokiQueue.drop;

  async function cancelQueued(text) {
    try {
      const r = await apiJSON("/api/chat/cancel_queued", { method: "POST", json: { conversation: state.conversation, content: text } });
      notice(r.ok ? "Queued message cancelled" : "Not cancelled: " + r.detail, r.ok ? "ok" : "");
      return r.ok;
    } catch (e) { notice("Cancel failed: " + e.message, "error"); return false; }
  }

  // ---- notices: what an action did, or that it is under way --------------------------------
  // `action` ({label, onclick, expire}): a button after the text (an Undo); expire() runs
  // when the notice goes without it being pressed (replaced, or its time out).
  let noticeTimer = null;
  let noticeExpire = null;
  function notice(text, kind, ms, action) {
    const n = $("notice");
    const expire = noticeExpire;
    noticeExpire = null;
    if (expire) expire();
    n.textContent = text;
    n.className = kind || "";
    n.hidden = !text;
    if (action) {
      const b = document.createElement("button");
      b.type = "button"; b.className = "notice-action"; b.textContent = action.label;
      noticeExpire = action.expire || null;
      b.onclick = () => { noticeExpire = null; action.onclick(); };
      n.append(" ", b);
    }
    clearTimeout(noticeTimer);
    if (text && ms !== 0) noticeTimer = setTimeout(() => {
      n.hidden = true;
      const ex = noticeExpire; noticeExpire = null;
      if (ex) ex();
    }, ms || 4000);
  }

  // The sidebar's picker: what the switch did is said under it (never a modal alert); a
  // refused switch leaves the picker on the active preset (refreshEngine).
  async function switchPreset(id) {
    const msg = $("preset-picker-msg");
    const say = (text, isError) => { msg.textContent = text; msg.className = isError ? "hint error" : "hint"; msg.hidden = !text; };
    say("Switching to " + id + "…");
    try {
      const r = await apiJSON("/api/presets/switch", { method: "POST", json: { id: id } });
      const d = r.detail || {};
      say(d.error ? "Switched to " + id + ": " + d.error : "", !!d.error);
    } catch (e) { say("Preset not switched: " + e.message, true); }
    refreshEngine();
  }

  // ---- narrow screens: the sidebar drawer and the actions menu ---------------------------
  function setDrawer(open) {
    document.body.classList.toggle("drawer-open", open);
    $("scrim").hidden = !open;
    $("menu-btn").setAttribute("aria-expanded", String(open));
  }

  function setActionsMenu(open) {
    $("actions-menu").classList.toggle("open", open);
    $("actions-btn").setAttribute("aria-expanded", String(open));
  }

  function setupNarrowScreens() {
    $("menu-btn").onclick = () => setDrawer(!document.body.classList.contains("drawer-open"));
    $("scrim").onclick = () => setDrawer(false);
    $("actions-btn").onclick = (ev) => {
      ev.stopPropagation();
      setActionsMenu(!$("actions-menu").classList.contains("open"));
    };
    // a chosen action, a click elsewhere or Escape closes the menu
    $("actions").addEventListener("click", () => setActionsMenu(false));
    document.addEventListener("click", (ev) => {
      if (!$("actions-menu").contains(ev.target)) setActionsMenu(false);
    });
    document.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape") { setActionsMenu(false); setDrawer(false); }
    });
  }

  // ---- actions -------------------------------------------------------------------------
  async function send(text) {
    const body = { content: text };
    const attached = window.LokiAttach ? window.LokiAttach.ids() : [];
    if (attached.length) body.attachments = attached;
    const pending = state.conversation && text ? LokiQueue.add(text) : null;
    if (state.conversation) body.conversation = state.conversation;
    let r;
    try { r = await apiJSON("/api/chat/send", { method: "POST", json: body }); }
    catch (e) {
      if (pending) pending.remove();
      if (attached.length && window.LokiAttach) {
        // said next to the attachments (no vision, one gone, too large together): they stay
        window.LokiAttach.showError("Not sent: " + e.message);
        e.shown = true;
      }
      throw e;
    }
    if (attached.length) window.LokiAttach.clear();
    if (r.conversation !== state.conversation) { openConversation(r.conversation); loadConversations(); }
    else if (r.queued && pending) LokiQueue.markQueued(pending, cancelQueued);
  }

  async function control(action) {
    if (!state.conversation) return;
    try { await apiJSON("/api/chat/" + action, { method: "POST", json: { conversation: state.conversation } }); }
    catch (e) { notice(action + ": " + e.message, "error"); }
    refreshStateSoon();
  }

  // Compact shows that it runs (it may take as long as a summary) and what it did.
  async function compactNow() {
    const btn = $("compact-btn");
    if (!state.conversation || btn.disabled) return;
    btn.disabled = true;
    btn.textContent = "Compacting…";
    notice("Compacting the conversation…", "busy", 0);
    try {
      const r = await apiJSON("/api/chat/compact", { method: "POST", json: { conversation: state.conversation } });
      notice(r.ok ? "Compacted" : "Nothing to compact" + (r.detail ? " (" + r.detail + ")" : ""), r.ok ? "ok" : "");
    } catch (e) {
      notice("Compact failed: " + e.message, "error");
    } finally {
      btn.disabled = false;
      btn.textContent = "Compact";
      refreshStateSoon();
    }
  }

  async function exportConversation(ev) {
    ev.preventDefault();
    if (!state.conversation) return;
    const r = await api("/api/conversations/" + state.conversation + "/export");
    if (!r.ok) return;
    const url = URL.createObjectURL(await r.blob());
    const a = document.createElement("a");
    a.href = url; a.download = "loki-" + state.conversation + ".json";
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  function init() {
    setupNarrowScreens();
    $("composer").onsubmit = async (ev) => {
      ev.preventDefault();
      const text = $("input").value.trim();
      if (!text && !(window.LokiAttach && window.LokiAttach.count())) return;
      $("input").value = "";
      try { await send(text); } catch (e) { if (!e.shown) notice("Not sent: " + e.message, "error", 8000); $("input").value = text; }
    };
    $("input").onkeydown = (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $("composer").requestSubmit(); }
    };
    $("stop-btn").onclick = () => control("stop");
    $("reset-btn").onclick = async () => {
      const ok = await LokiDialog.ask({ title: "Empty this conversation?", text: "Its messages are removed; the conversation stays in the list.", ok: "Empty it", danger: true });
      if (ok) control("reset");
    };
    $("compact-btn").onclick = compactNow;
    $("export-btn").onclick = exportConversation;
    // "+ New chat" opens the empty Untitled conversation there is, if any, rather than a
    // second one.
    $("new-chat").onclick = async () => {
      const btn = $("new-chat");
      if (btn.getAttribute("aria-busy") === "true") return; // a double click makes one chat
      btn.setAttribute("aria-busy", "true");
      try { await newChat(); } finally { btn.removeAttribute("aria-busy"); }
    };
    async function newChat() {
      await loadConversations();
      // untitled (the chat service titles a conversation by its first message) and, as its
      // state says, nothing in its log yet
      for (const c of (state.list || []).filter((x) => !x.title && !deleting.has(x.id))) {
        let st = null;
        try { st = await apiJSON("/api/chat/state?conversation=" + encodeURIComponent(c.id)); } catch (e) { continue; }
        if (st && !st.last_seq && !st.generating && !(st.pending && st.pending.length)) { openConversation(c.id); return; }
      }
      try {
        const r = await apiJSON("/api/conversations", { method: "POST", json: {} });
        await loadConversations();
        openConversation(r.conversation.id);
      } catch (e) { openConversation(null); }
    }
    box().addEventListener("scroll", onScroll, { passive: true });
    // an image drawn late (a thumbnail) keeps the view on the latest message
    box().addEventListener("load", () => { if (state.pinned) toBottom(); }, true);
    $("engine-state").onclick = () => {
      const det = $("engine-details");
      det.hidden = !det.hidden;
      $("engine-state").setAttribute("aria-expanded", String(!det.hidden));
    };
    $("preset-picker").onchange = (ev) => switchPreset(ev.target.value);
    const fromHash = (location.hash.match(/c=([A-Za-z0-9_-]+)/) || [])[1];
    const start = fromHash || localStorage.getItem("lokiConv");
    // a message sent while the list was loading (after the key prompt, say) opened its
    // conversation already: do not switch away from it
    loadConversations().then(() => { if (!state.conversation) openConversation(start || null); });
    refreshEngine();
    watchEngine();
  }

  window.LokiApi = {
    api: api, apiJSON: apiJSON, refreshEngine: refreshEngine, notice: notice,
    engine: () => state.engine,
    loadConversations: loadConversations, openConversation: openConversation,
    // the tasks panel opens a run's conversation (not in the sidebar's list: kind "task")
    openTaskRun: (id, title) => { state.titles[id] = title; openConversation(id); },
    // the open conversation (attachments.js reads its thumbnails as that conversation's)
    conversation: () => state.conversation,
  };
  window.lokiDebug = state;
  state.renderStats = LokiLive.stats;
  init();
})();
