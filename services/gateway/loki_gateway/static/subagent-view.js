// A sub-agent's transcript, drawn as a collapsible block nested under its tool call.
//
// The chat service puts a sub-agent's own events in the main conversation's log as
// loki={"event": "subagent", "tool_call_id", "inner": {"delta", "loki"?, "finish_reason"?}}
// (issue 19). chat-messages.js marks each tool-call bubble with data-call-id; draw() finds the
// call's bubble and draws, right under it, a collapsible <details class="subagent"
// data-subagent-of=id> (closed until opened): the task, the sub-agent's text,
// its tool calls and results (folded), and how it ended. Replay after a reload goes through the
// same path, so the block is rebuilt as it was drawn live.
"use strict";

window.LokiSubagent = (function () {
  // The latest bubble of the call ``id`` (a sub-agent runs right after its call is drawn).
  function callBubble(root, id) {
    let found = null;
    for (const el of root.querySelectorAll("[data-call-id]")) {
      if (el.dataset.callId === id) found = el;
    }
    return found;
  }

  // The run drawn under that bubble, kept on it: { el, body, status, text, calls, last }.
  function run(root, id) {
    const parent = callBubble(root, id);
    if (!parent) return null;
    if (parent._subagent) return parent._subagent;
    const el = document.createElement("details");
    el.className = "msg subagent";
    el.dataset.subagentOf = id;
    const s = document.createElement("summary");
    s.textContent = "Sub-agent transcript";
    const status = document.createElement("span");
    status.className = "status";
    status.textContent = " · working…";
    s.appendChild(status);
    const body = document.createElement("div");
    body.className = "body";
    el.append(s, body);
    parent.after(el); // right under the call's bubble (its own <details> stays closed)
    parent._subagent = { el, body, status, text: null, calls: {}, last: null };
    return parent._subagent;
  }

  function line(r, cls, text) {
    const d = document.createElement("div");
    d.className = "sub " + cls;
    d.textContent = text;
    r.body.appendChild(d);
    return d;
  }

  // Draw one nested event (ev.loki of a "subagent" event). False when the call's bubble is
  // not on the page (then nothing is drawn).
  function draw(root, loki) {
    const r = run(root, loki.tool_call_id);
    if (!r) return false;
    const inner = loki.inner || {};
    const delta = inner.delta || {};
    const mark = (inner.loki && inner.loki.event) || null;
    if (delta.role === "user") {
      const who = inner.loki && inner.loki.injected ? "Loki injected: " : "Task: ";
      line(r, "task", who + (typeof delta.content === "string" ? delta.content : JSON.stringify(delta.content)));
      r.text = null; r.last = "user";
      return true;
    }
    if (delta.role === "tool") {
      line(r, "result", "↳ result of " + (delta.name || "tool") + ": " + String(delta.content == null ? "" : delta.content).slice(0, 300));
      r.text = null; r.last = "tool";
      return true;
    }
    if (typeof delta.content === "string" && delta.content) {
      if (!r.text || r.last !== "content") r.text = line(r, "answer", "");
      r.text.textContent += delta.content;
      r.last = "content";
    }
    if (Array.isArray(delta.tool_calls)) {
      for (const tc of delta.tool_calls) {
        const idx = tc.index || 0;
        let c = r.calls[idx];
        if (!c || (tc.id && c.id && tc.id !== c.id)) c = r.calls[idx] = { id: tc.id, name: "", args: "", el: line(r, "call", "") };
        const fn = tc.function || {};
        if (fn.name) c.name += fn.name;
        if (fn.arguments) c.args += fn.arguments;
        c.el.textContent = "⚙ " + (c.name || "tool") + " " + c.args;
      }
      r.text = null; r.last = "call";
    }
    if (mark === "turn_end" || inner.finish_reason) {
      const reason = inner.finish_reason || "stop";
      const steps = inner.loki && inner.loki.steps;
      r.status.textContent = " · " + (reason === "stop" ? "done" : reason) + (steps ? " (" + steps + " step" + (steps > 1 ? "s" : "") + ")" : "");
      r.el.classList.add("ended");
    }
    return true;
  }

  return { draw };
})();
