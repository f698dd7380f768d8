// Loki's chat page: what its scripts share. Plain JS, no build step.
//
// The chat page is split in plain scripts (index.html loads them in order): this one, then
// chat-api.js, conversations.js, chat-stream.js, chat-paging.js, chat-messages.js,
// engine-status.js, composer.js, and app.js, which wires them up and publishes window.LokiApi
// for the other scripts. They share window.LokiChat: `$`, the constants, `state`, `notice`, and
// each script's functions that the others call (looked up when called, so the order they are
// defined in does not matter). Each script is a LokiChat.part((C, $, state) => {...}): it runs
// at once, and the functions it returns join LokiChat.
"use strict";

window.LokiChat = (function () {
  const $ = (id) => document.getElementById(id);

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

  const C = {
    $: $,
    state: state,
    notice: notice,
    part: (fn) => { Object.assign(C, fn(C, $, state)); },
    // A streaming reply is drawn at most this often (ms): a few renders a second, not one per
    // animation frame, so an open tab leaves the engine its CPU.
    RENDER_INTERVAL_MS: 200,
    // A long conversation opens on its latest PAGE items (bubbles, markers, badges); the
    // earlier ones are drawn PAGE at a time as the view is scrolled up to them.
    PAGE: 40,
    // A conversation opens on its last TAIL_TURNS turns; older ones come a page at a time.
    TAIL_TURNS: 30,
  };
  return C;
})();
