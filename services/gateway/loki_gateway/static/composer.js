// The composer and the conversation's actions: sending a message (with its attachments,
// attachments.js; shown queued until its turn takes it, queue-bubbles.js), Stop, Reset,
// Compact, Export, a cut reply's Continue, a queued message's Cancel. Part of the chat page
// (chat-state.js).
"use strict";

LokiChat.part((C, $, state) => {
  async function cancelQueued(text) {
    try {
      const r = await C.apiJSON("/api/chat/cancel_queued", { method: "POST", json: { conversation: state.conversation, content: text } });
      C.notice(r.ok ? "Queued message cancelled" : "Not cancelled: " + r.detail, r.ok ? "ok" : "");
      return r.ok;
    } catch (e) { C.notice("Cancel failed: " + e.message, "error"); return false; }
  }

  async function send(text) {
    const body = { content: text };
    const attached = window.LokiAttach ? window.LokiAttach.ids() : [];
    if (attached.length) body.attachments = attached;
    const pending = state.conversation && text ? LokiQueue.add(text) : null;
    if (state.conversation) body.conversation = state.conversation;
    let r;
    try { r = await C.apiJSON("/api/chat/send", { method: "POST", json: body }); }
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
    if (r.conversation !== state.conversation) { C.openConversation(r.conversation); C.loadConversations(); }
    else if (r.queued && pending) LokiQueue.markQueued(pending, cancelQueued);
  }

  async function control(action) {
    if (!state.conversation) return;
    try { await C.apiJSON("/api/chat/" + action, { method: "POST", json: { conversation: state.conversation } }); }
    catch (e) { C.notice(action + ": " + e.message, "error"); }
    C.refreshStateSoon();
  }

  // Compact shows that it runs (it may take as long as a summary) and what it did.
  async function compactNow() {
    const btn = $("compact-btn");
    if (!state.conversation || btn.disabled) return;
    btn.disabled = true;
    btn.textContent = "Compacting…";
    C.notice("Compacting the conversation…", "busy", 0);
    try {
      const r = await C.apiJSON("/api/chat/compact", { method: "POST", json: { conversation: state.conversation } });
      C.notice(r.ok ? "Compacted" : "Nothing to compact" + (r.detail ? " (" + r.detail + ")" : ""), r.ok ? "ok" : "");
    } catch (e) {
      C.notice("Compact failed: " + e.message, "error");
    } finally {
      btn.disabled = false;
      btn.textContent = "Compact";
      C.refreshStateSoon();
    }
  }

  async function exportConversation(ev) {
    ev.preventDefault();
    if (!state.conversation) return;
    const r = await C.api("/api/conversations/" + state.conversation + "/export");
    if (!r.ok) return;
    const url = URL.createObjectURL(await r.blob());
    const a = document.createElement("a");
    a.href = url; a.download = "loki-" + state.conversation + ".json";
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  function setupComposer() {
    $("composer").onsubmit = async (ev) => {
      ev.preventDefault();
      const text = $("input").value.trim();
      if (!text && !(window.LokiAttach && window.LokiAttach.count())) return;
      $("input").value = "";
      try { await send(text); } catch (e) { if (!e.shown) C.notice("Not sent: " + e.message, "error", 8000); $("input").value = text; }
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
  }

  return { cancelQueued, control, setupComposer };
});
