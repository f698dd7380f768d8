// A long conversation: opened at its latest message, older items drawn on scroll up (or by the
// "Show earlier messages" button), the view kept on what it showed; the turns before the
// first one the stream replayed come from GET /api/chat/history. Part of the chat page
// (chat-state.js).
"use strict";

LokiChat.part((C, $, state) => {
  // The replay that opens a conversation is over once the stream has been quiet this long (ms).
  const SETTLE_MS = 150;

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

  // Another conversation opens: the one before never settles.
  function unsettle() {
    clearTimeout(settleTimer);
    settleFirst = 0;
  }

  // The items of the conversation drawn in #messages (not the queue's holder, nor the
  // "older messages" button).
  function items() {
    return Array.from(C.box().children).filter((el) => el.id !== "pending" && el.id !== "older-btn");
  }

  // The opening replay is drawn: keep its last PAGE items, the earlier ones wait in
  // state.older, and land on the latest message.
  function settle() {
    state.settled = true;
    for (const a of state.dirty) a.render();
    state.dirty.clear();
    const all = items();
    if (all.length > C.PAGE) {
      state.older = all.slice(0, all.length - C.PAGE);
      for (const el of state.older) el.remove();
    }
    olderButton();
    toBottom();
    C.box().dataset.settled = "1";
  }

  function toBottom() { if (state.paging) return; const m = C.box(); m.scrollTop = m.scrollHeight; state.pinned = true; }

  // The button at the top of a paged conversation (the keyboard's way to older messages;
  // scrolling up draws them too).
  function olderButton() {
    let b = $("older-btn");
    if (!state.older.length && !state.historyBefore) { if (b) b.remove(); return; }
    if (!b) {
      b = document.createElement("button");
      b.id = "older-btn"; b.type = "button"; b.className = "older";
      b.onclick = () => showOlder();
      C.box().prepend(b);
    }
    b.textContent = state.older.length ? "Show earlier messages (" + state.older.length + ")" : "Show earlier messages";
  }

  // Draws the PAGE items before the first one drawn, the view kept on what it showed.
  function showOlder() {
    if (!state.older.length) { loadOlderPage(); return; }
    const m = C.box();
    const first = items()[0] || null;
    const before = first ? first.getBoundingClientRect().top : 0;
    const page = state.older.splice(Math.max(0, state.older.length - C.PAGE));
    const anchor = first || LokiQueue.holder();
    for (const el of page) m.insertBefore(el, anchor);
    if (first) m.scrollTop += first.getBoundingClientRect().top - before;
    olderButton();
  }

  function onScroll() {
    const m = C.box();
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
      const page = await C.apiJSON("/api/chat/history?conversation=" + encodeURIComponent(id)
        + "&before=" + state.historyBefore + "&turns=" + C.TAIL_TURNS);
      if (state.conversation !== id) return;
      state.historyBefore = page.older ? page.before : 0;
      state.older = drawPage(page.events || []).concat(state.older);
      showOlder();
      olderButton();
    } catch (e) {
      C.notice("Earlier messages could not be loaded: " + e.message, "error");
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
      for (const ev of events) C.handleEvent(ev);
      for (const a of state.dirty) a.render();
      for (const a of state.live) { a.finish(); a.el.classList.remove("typing"); }
    } finally {
      state.drawInto = null; state.paging = false;
      state.turn = saved.turn; state.live = saved.live; state.dirty = saved.dirty;
    }
    return Array.from(page.children);
  }

  return { settleSoon, unsettle, toBottom, olderButton, onScroll };
});
