// The open conversation's stream and state. GET /api/chat is read with fetch() (for the key
// header); it resumes from the last seen id (Last-Event-ID) after a network error or when the
// server says `event: reconnect`, so a reload or a drop never loses or repeats an event. Each
// event is drawn by chat-messages.js. Beside it: the conversation's state
// (GET /api/chat/state), the Stop button while a reply is generated, and the context gauge.
// Part of the chat page (chat-state.js).
"use strict";

LokiChat.part((C, $, state) => {
  async function stream(id) {
    const ctrl = new AbortController();
    state.abort = ctrl;
    let delay = 500;
    while (!ctrl.signal.aborted && state.conversation === id) {
      let reconnectNow = false;
      try {
        const usedKey = localStorage.getItem("lokiKey");
        const headers = Object.assign({ Accept: "text/event-stream" }, C.authHeaders());
        if (state.lastSeq) headers["Last-Event-ID"] = String(state.lastSeq);
        // a fresh open asks only for the last TAIL_TURNS turns (older pages: GET /api/chat/history)
        const tail = state.lastSeq ? "" : "&tail_turns=" + C.TAIL_TURNS;
        const resp = await fetch("/api/chat?conversation=" + encodeURIComponent(id) + tail, { headers, signal: ctrl.signal });
        if (resp.status === 401) { if (localStorage.getItem("lokiKey") === usedKey) await C.askKey(); continue; }
        if (resp.status === 404) { C.openConversation(null, true); C.loadConversations(); return; }
        if (!resp.ok || !resp.body) throw new Error("stream " + resp.status);
        delay = 500;
        for await (const received of C.sseFrames(resp)) {
          const batch = [];
          for (const f of received) {
            if (f.event === "reconnect") { reconnectNow = true; break; }
            if (f.event === "history") { try { state.historyBefore = JSON.parse(f.data).before || 0; } catch (e) { /* none */ } C.olderButton(); continue; }
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
            C.handleEvent(data);
            if (typeof data.seq === "number") state.lastSeq = data.seq;
          }
          $("messages").dataset.lastSeq = String(state.lastSeq);
          C.scheduleRender();
          if (!state.settled) C.settleSoon(id);
          if (reopen) { C.openConversation(id, true); return; } // leaving the loop cancels the reader
          if (reconnectNow) break;
        }
      } catch (e) {
        if (ctrl.signal.aborted) return;
      }
      if (!reconnectNow) { await new Promise((r) => setTimeout(r, delay)); delay = Math.min(delay * 2, 5000); }
    }
  }

  // ---- state, gauge --------------------------------------------------------------------
  function setGenerating(on) {
    if (state.paging) return;
    state.generating = on;
    $("stop-btn").hidden = !on;
    C.showEngine();
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
      const st = await C.apiJSON("/api/chat/state?conversation=" + encodeURIComponent(id));
      if (id !== state.conversation) return;
      if (st.n_ctx) state.nctx = st.n_ctx;
      if (!st.generating || !state.streamed) setCtxUsed(st.ctx_used || 0);
      if (st.generating) setGenerating(true);
      // the queue as the state saw it, unless a turn took a message since (a newer user event)
      if (st.pending && st.pending.length && state.userSeq <= st.last_seq) LokiQueue.sync(st.pending, C.cancelQueued);
    } catch (e) { /* the stream shows errors */ }
  }
  let stateTimer = null;
  function refreshStateSoon() { if (state.paging) return; clearTimeout(stateTimer); stateTimer = setTimeout(() => { refreshState(); C.loadConversations(); }, 300); }

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
    setTimeout(() => { gaugeQueued = false; setGauge(state.ctxBase + state.streamed, state.nctx); }, C.RENDER_INTERVAL_MS);
  }

  return { stream, setGenerating, setGauge, refreshState, refreshStateSoon, setCtxUsed, countToken };
});
