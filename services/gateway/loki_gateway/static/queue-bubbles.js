// Messages sent but not yet taken by the chat service: shown at once below the running reply,
// marked queued when the send says they wait behind it, with a Cancel button. Cancel asks the
// chat service to drop the message from its queue (composer.js: POST /api/chat/cancel_queued); a
// message whose turn already started is never cancelled, and its bubble stays until the turn
// shows it as an ordinary user message. After a reload the queue is drawn again from the
// conversation's state (sync).
"use strict";

window.LokiQueue = (function () {
  const $ = (id) => document.getElementById(id);

  // The holder of the bubbles: the last child of #messages (new events go above it).
  function holder() {
    let p = $("pending");
    if (!p) { p = document.createElement("div"); p.id = "pending"; $("messages").appendChild(p); }
    return p;
  }

  function add(text) {
    const el = document.createElement("div");
    el.className = "msg user pending";
    const body = document.createElement("span");
    body.className = "text";
    body.textContent = text;
    el.appendChild(body);
    el.dataset.text = text;
    holder().appendChild(el);
    $("messages").scrollTop = $("messages").scrollHeight;
    return el;
  }

  // cancel(text) -> Promise<boolean>: true when the chat service dropped it.
  function markQueued(el, cancel) {
    if (!el.isConnected) return;
    el.classList.add("queued");
    el.title = "Queued: sent when the current reply ends";
    const btn = document.createElement("button");
    btn.type = "button";
    btn.className = "cancel-queued";
    btn.textContent = "Cancel";
    btn.onclick = async () => {
      btn.disabled = true;
      if (await cancel(el.dataset.text)) el.remove();
      else btn.remove(); // it started: the turn draws it as the user's message
    };
    el.appendChild(btn);
  }

  // The turn of a message started: its bubble gives way to the ordinary one.
  function drop(text) {
    for (const el of holder().children) if (el.dataset.text === text) { el.remove(); return; }
  }

  // After a reload: the chat service's queue (its texts, in order) shown again, each bubble
  // with its Cancel; those already shown are kept.
  function sync(texts, cancel) {
    const shown = {};
    for (const el of holder().children) shown[el.dataset.text] = (shown[el.dataset.text] || 0) + 1;
    for (const t of texts) {
      if (shown[t]) { shown[t]--; continue; }
      markQueued(add(t), cancel);
    }
  }

  return { holder: holder, add: add, markQueued: markQueued, drop: drop, sync: sync };
})();
