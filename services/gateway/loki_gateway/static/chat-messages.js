// The conversation's events drawn as messages: user bubbles, reasoning, answers (incremental
// Markdown, live-markdown.js, drawn a few times a second), tool calls and results, markers
// (compaction, verifier, retry, mode switch, error) and the end-of-turn badge with its Continue
// button; the code tools' calls and results are drawn by tool-view.js, and a mode switch, a
// criteria change or a turn's end tell the Code panel (code-panel.js).
// chat-stream.js hands each event to handleEvent. Part of the chat page (chat-state.js).
"use strict";

LokiChat.part((C, $, state) => {
  const FOLD_CHARS = 600;

  // ---- messages sent but not yet taken: queue-bubbles.js ----------------------------------
  const pendingBox = LokiQueue.holder;
  const dropPending = LokiQueue.drop;

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
      C.setGenerating(true);
      return;
    }
    if (mark === "mode_changed") {
      // the conversation's mode switched (code-panel.js): a notice line, and the panel follows
      const el = document.createElement("div");
      el.className = "marker mode";
      const l = ev.loki;
      el.textContent = l.mode === "code"
        ? "code mode on" + (l.project ? ": the model works in project " + l.project + "'s workspace" : "")
          + (l.workspace_error ? " (workspace not ready: " + l.workspace_error + ")" : "")
        : "chat mode: the code tools are off";
      add(el);
      if (!state.paging && window.LokiCode) LokiCode.changed(l);
      return;
    }
    if (mark === "criteria") { if (!state.paging && window.LokiCode) LokiCode.changed(ev.loki); return; }
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
      if (!state.titles[state.conversation]) C.provisionalTitle(text || parts.files.map((f) => f.name).join(", "));
      C.setGenerating(true);
      return;
    }
    if (mark === "turn_start") { newTurn(); C.setGenerating(true); }
    if (delta.role === "tool") {
      const t = turn();
      const el = bubble("tool", "div");
      // a command's result (run, git): its exit code, command and output (tool-view.js)
      if (!(window.LokiToolView && LokiToolView.result(el, delta, ev.loki, box()))) {
        const head = document.createElement("div");
        head.textContent = "↳ result of " + (delta.name || "tool");
        el.appendChild(head);
        foldable(el, String(delta.content == null ? "" : delta.content));
      }
      add(el);
      t.last = "tool"; t.answer = null;
      return;
    }
    const t = turn();
    if (delta.reasoning_content || delta.content || delta.tool_calls) C.countToken();
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
        if (window.LokiToolView) LokiToolView.call(call); // the code tools' own line (tool-view.js)
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
      // code mode: the criteria the verification left failing or unchecked (code-panel.js)
      if (ev.loki && ev.loki.criteria_failed && ev.loki.criteria_failed.length) parts.push("criteria not met: " + ev.loki.criteria_failed.join(", "));
      if (ev.loki && ev.loki.criteria_unchecked && ev.loki.criteria_unchecked.length) parts.push("criteria not checked: " + ev.loki.criteria_unchecked.join(", "));
      badge.textContent = parts.join(" · ") || choice.finish_reason;
      if (choice.finish_reason === "length") {
        // Continue resumes the same assistant message (POST /api/chat/continue)
        const more = document.createElement("button");
        more.type = "button"; more.className = "continue"; more.textContent = "Continue";
        more.onclick = () => { more.remove(); C.control("continue"); };
        badge.append(" ", more);
      }
      add(badge);
      const pinned = state.pinned || !state.settled;
      finishAnswers();
      if (pinned) C.toBottom();
      state.turn = null;
      C.setGenerating(false);
      // the turn's own figure, else back to the last known one until the state is read again
      // (the streamed estimate, never a drop to the figure before the reply)
      C.setCtxUsed(ev.loki && typeof ev.loki.ctx_used === "number" ? ev.loki.ctx_used : state.ctxBase + state.streamed);
      C.refreshStateSoon();
      if (!state.paging && window.LokiCode) LokiCode.changed(null); // files and criteria may have changed
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
    const wait = Math.max(0, lastRender + C.RENDER_INTERVAL_MS - performance.now());
    renderTimer = setTimeout(() => requestAnimationFrame(renderDirty), wait);
  }

  function renderDirty() {
    renderTimer = null;
    lastRender = performance.now();
    const m = box();
    const atBottom = m.scrollHeight - m.scrollTop - m.clientHeight < 120 || !state.settled;
    for (const a of state.dirty) a.render();
    state.dirty.clear();
    if (atBottom) C.toBottom();
  }

  return { box, handleEvent, dropAnswers, scheduleRender };
});
