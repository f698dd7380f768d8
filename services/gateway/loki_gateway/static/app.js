// Loki's chat page. Plain JS, no build step.
//
// The page is a few plain scripts that share window.LokiChat (see chat-state.js, loaded
// first); this one, loaded after them, wires the page up: the narrow screens' drawer and
// actions menu, the buttons, the conversation to open, the engine's events. It publishes
// window.LokiApi, which the other scripts (attachments.js, projects.js, the panels) use.
"use strict";

LokiChat.part((C, $, state) => {
  // ---- narrow screens: the sidebar drawer and the actions menu ---------------------------
  function setActionsMenu(open) {
    $("actions-menu").classList.toggle("open", open);
    $("actions-btn").setAttribute("aria-expanded", String(open));
  }

  function setupNarrowScreens() {
    $("menu-btn").onclick = () => C.setDrawer(!document.body.classList.contains("drawer-open"));
    $("scrim").onclick = () => C.setDrawer(false);
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
      if (ev.key === "Escape") { setActionsMenu(false); C.setDrawer(false); }
    });
  }

  function init() {
    setupNarrowScreens();
    C.setupComposer();
    C.setupNewChat();
    C.box().addEventListener("scroll", C.onScroll, { passive: true });
    // an image drawn late (a thumbnail) keeps the view on the latest message
    C.box().addEventListener("load", () => { if (state.pinned) C.toBottom(); }, true);
    C.setupEngine();
    const fromHash = (location.hash.match(/c=([A-Za-z0-9_-]+)/) || [])[1];
    const start = fromHash || localStorage.getItem("lokiConv");
    // a message sent while the list was loading (after the key prompt, say) opened its
    // conversation already: do not switch away from it
    C.loadConversations().then(() => { if (!state.conversation) C.openConversation(start || null, true); });
    C.refreshEngine();
    C.watchEngine();
  }

  window.LokiApi = {
    api: C.api, apiJSON: C.apiJSON, refreshEngine: C.refreshEngine, notice: C.notice,
    engine: () => state.engine,
    loadConversations: C.loadConversations, openConversation: C.openConversation,
    // the tasks panel opens a run's conversation (not in the sidebar's list: kind "task")
    openTaskRun: (id, title) => { state.titles[id] = title; C.openConversation(id); },
    // the open conversation (attachments.js reads its thumbnails as that conversation's)
    conversation: () => state.conversation,
  };
  window.lokiDebug = state;
  state.renderStats = LokiLive.stats;
  init();
});
