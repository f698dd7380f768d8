// The sidebar: the conversation list (open, rename, delete with an Undo, "+ New chat"), the
// header's title, and the sidebar as a drawer on narrow screens. Opening a conversation
// starts its stream (chat-stream.js). Part of the chat page (chat-state.js).
"use strict";

LokiChat.part((C, $, state) => {
  async function loadConversations() {
    let list = [];
    // with projects (projects.js), only the active project's conversations
    const project = window.LokiProjects ? LokiProjects.active() : null;
    const path = project ? "/api/conversations?project=" + encodeURIComponent(project) : "/api/conversations";
    try { list = (await C.apiJSON(path)).conversations || []; } catch (e) { return; }
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
    try { await C.apiJSON("/api/conversations/" + c.id, { method: "PATCH", json: { title: t.trim() } }); }
    catch (e) { C.notice("Not renamed: " + e.message, "error"); }
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
      C.apiJSON("/api/conversations/" + c.id, { method: "DELETE", keepalive: !!keepalive })
        .catch((e) => C.notice("Not deleted: " + e.message, "error"))
        .finally(() => loadConversations());
    };
    for (const other of deleting.values()) other();
    deleting.set(c.id, commit);
    if (wasOpen) openConversation(null);
    setDrawer(false); // the Undo shows in the main view (a phone's drawer would cover it)
    loadConversations();
    C.notice("Deleted “" + (c.title || "Untitled") + "”", "ok", 6000, {
      label: "Undo",
      onclick: () => {
        if (done) return;
        done = true;
        deleting.delete(c.id);
        C.notice("Kept “" + (c.title || "Untitled") + "”", "ok");
        loadConversations().then(() => { if (wasOpen) openConversation(c.id); });
      },
      expire: () => commit(false),
    });
  }
  window.addEventListener("pagehide", () => { for (const commit of deleting.values()) commit(true); });

  // `auto`: opened by the page itself (at start, a stream that must reopen, a conversation
  // gone), not by the person: the drawer stays as they left it (one opened while the list
  // was loading is not snapped shut under their finger).
  function openConversation(id, auto) {
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
    C.unsettle();
    C.dropAnswers();
    $("messages").textContent = "";
    $("messages").dataset.conversation = id || "";
    $("messages").dataset.lastSeq = "0";
    $("messages").dataset.settled = "";
    if (!auto) setDrawer(false);
    C.setGenerating(false);
    state.ctxBase = 0; state.streamed = 0;
    if (id) { localStorage.setItem("lokiConv", id); history.replaceState(null, "", "#c=" + id); setTitle(state.titles[id]); }
    else { localStorage.removeItem("lokiConv"); history.replaceState(null, "", "#"); $("conv-title").textContent = "New chat"; C.setGauge(0, 0); }
    for (const li of $("conversations").children) {
      li.classList.toggle("active", li.dataset.id === id);
      const b = li.querySelector("button.title");
      if (b) { if (li.dataset.id === id) b.setAttribute("aria-current", "true"); else b.removeAttribute("aria-current"); }
    }
    if (id) { C.stream(id); C.refreshState(); }
    if (window.LokiCode) LokiCode.opened(id); // its mode, workspace and criteria (code-panel.js)
  }

  // "+ New chat" opens the empty Untitled conversation there is, if any, rather than a
  // second one.
  async function newChat() {
    await loadConversations();
    // untitled (the chat service titles a conversation by its first message) and, as its
    // state says, nothing in its log yet
    for (const c of (state.list || []).filter((x) => !x.title && !deleting.has(x.id))) {
      let st = null;
      try { st = await C.apiJSON("/api/chat/state?conversation=" + encodeURIComponent(c.id)); } catch (e) { continue; }
      if (st && !st.last_seq && !st.generating && !(st.pending && st.pending.length)) { openConversation(c.id); return; }
    }
    try {
      const r = await C.apiJSON("/api/conversations", { method: "POST", json: {} });
      await loadConversations();
      openConversation(r.conversation.id);
    } catch (e) { openConversation(null); }
  }

  function setupNewChat() {
    $("new-chat").onclick = async () => {
      const btn = $("new-chat");
      if (btn.getAttribute("aria-busy") === "true") return; // a double click makes one chat
      btn.setAttribute("aria-busy", "true");
      try { await newChat(); } finally { btn.removeAttribute("aria-busy"); }
    };
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

  // ---- narrow screens: the sidebar is a drawer -----------------------------------------------
  function setDrawer(open) {
    document.body.classList.toggle("drawer-open", open);
    $("scrim").hidden = !open;
    $("menu-btn").setAttribute("aria-expanded", String(open));
  }

  return { loadConversations, openConversation, setupNewChat, provisionalTitle, setDrawer };
});
