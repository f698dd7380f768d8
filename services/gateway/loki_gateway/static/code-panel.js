// Code mode in the chat page (issue 43): the header's mode switch and the Code panel.
// - The switch ("Code", aria-pressed) is shown once the chat service answers GET
//   /api/chat/mode for the open conversation; pressing it POSTs /api/chat/mode. Switching to
//   code mode when the project has no workspace opens the panel on its form first (create an
//   empty repository, or clone one from a local path), then switches. The thread says the
//   switch itself (the display event `mode_changed`, chat-messages.js).
// - The panel ("Files" in the header, shown in code mode): a side column on a wide screen
//   (1000 px and more, opened by itself in code mode unless the person closed it), a
//   full-screen sheet on a phone (closed by ✕ or Escape, the focus back on "Files"). It holds
//   the workspace (branch, head, uncommitted changes, sandbox; the create/clone form when there
//   is none), the criteria (criteria.js), the file tree (file-tree.js) and, in place of them,
//   the file viewer (file-viewer.js).
// - It is redrawn when a conversation opens, on the display events `mode_changed` and
//   `criteria` (the latter drawn from the event itself) and when a turn ends (files and
//   criteria may have changed), a few hundred ms after the last of them.
// Uses window.LokiApi (app.js), window.LokiChat (its state's conversation list: a
// conversation's project); window.LokiCode, called by conversations.js and chat-messages.js.
"use strict";

window.LokiCode = (function () {
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  const WIDE = "(min-width: 1000px)";
  const PREF = "lokiCodePanel"; // "closed": the person closed the side panel
  let conv = null;
  let code = null; // the open conversation's CodeState (null: unknown, or no chat answer)
  let workspace = null; // its project's WorkspaceInfo
  let switchAfterCreate = false; // the form was opened by the switch: switch once created
  let timer = null;

  const wide = () => window.matchMedia(WIDE).matches;
  const panelOpen = () => !$("code-panel").hidden;
  const fail = (e) => LokiDialog.error("code-error", e);

  function projectOf() {
    if (code && code.project) return code.project;
    const list = (window.LokiChat && LokiChat.state.list) || [];
    const info = list.find((c) => c.id === conv);
    return (info && info.project) || "default";
  }

  // ---- the switch ------------------------------------------------------------------------
  function drawSwitch() {
    const btn = $("mode-btn");
    btn.hidden = !conv || !code;
    const on = !!code && code.mode === "code";
    btn.setAttribute("aria-pressed", String(on));
    btn.classList.toggle("on", on);
    $("code-panel-btn").hidden = !on;
    document.body.classList.toggle("code-mode", on);
  }

  async function toggleMode() {
    if (!conv || !code) return;
    const target = code.mode === "code" ? "chat" : "code";
    if (target === "code") {
      try { workspace = await LokiApi.apiJSON("/api/workspace?project=" + enc(projectOf())); }
      catch (e) { workspace = null; } // no workspace service: the chat service says why
      if (workspace && !workspace.exists) {
        switchAfterCreate = true;
        await openPanel();
        $("code-ws-form").elements.namedItem("clone_from").focus();
        return;
      }
    }
    await switchMode(target);
  }

  async function switchMode(target) {
    const btn = $("mode-btn");
    btn.setAttribute("aria-busy", "true");
    try {
      code = await LokiApi.apiJSON("/api/chat/mode", { method: "POST", json: { conversation: conv, mode: target } });
      drawSwitch();
      if (target === "code" && (wide() || panelOpen()) && localStorage.getItem(PREF) !== "closed") openPanel();
      else if (target === "chat" && panelOpen() && !switchAfterCreate) closePanel(false);
      else if (panelOpen()) drawPanel();
    } catch (e) {
      LokiApi.notice("Mode not switched: " + e.message, "error", 6000);
    } finally {
      btn.removeAttribute("aria-busy");
    }
  }

  // ---- the panel --------------------------------------------------------------------------
  function openPanel() {
    const panel = $("code-panel");
    const was = panelOpen();
    panel.hidden = false;
    document.body.classList.add("code-open");
    $("code-panel-btn").setAttribute("aria-expanded", "true");
    localStorage.removeItem(PREF);
    sheet(!wide());
    const drawn = drawPanel();
    if (!was && !wide()) $("code-close").focus(); // a sheet over the page: the focus goes in
    return drawn;
  }

  // A sheet over the page (below 1000 px): what is behind it is inert while it is open.
  function sheet(on) {
    $("sidebar").inert = on;
    document.querySelector("main").inert = on;
  }

  function closePanel(byPerson) {
    if (!panelOpen()) return;
    if (LokiFileViewer.current()) LokiFileViewer.close();
    $("code-panel").hidden = true;
    document.body.classList.remove("code-open");
    sheet(false);
    $("code-panel-btn").setAttribute("aria-expanded", "false");
    switchAfterCreate = false;
    if (byPerson) {
      if (wide()) localStorage.setItem(PREF, "closed");
      const back = !$("code-panel-btn").hidden ? $("code-panel-btn") : $("mode-btn");
      if (!back.hidden) back.focus();
    }
  }

  function wsLine(info) {
    const parts = ["branch " + (info.branch || "?")];
    parts.push(info.head ? "at " + info.head.slice(0, 10) : "no commit yet");
    if (info.dirty) parts.push("uncommitted changes");
    if (info.origin) parts.push("cloned from " + info.origin);
    parts.push(info.sandbox ? "sandbox: " + info.sandbox : "no sandbox works here: commands are refused");
    return parts.join(" · ");
  }

  async function drawWorkspace() {
    const project = projectOf();
    $("code-project").textContent = "project " + project;
    try {
      workspace = await LokiApi.apiJSON("/api/workspace?project=" + enc(project));
    } catch (e) {
      workspace = null;
      $("code-ws-info").textContent = "The workspace service does not answer: " + e.message;
      $("code-ws-form").hidden = true;
      return;
    }
    $("code-ws-form").hidden = workspace.exists;
    $("code-ws-info").textContent = workspace.exists ? wsLine(workspace) : "";
    $("code-ws-create").textContent = switchAfterCreate ? "Create and switch to code mode" : "Create workspace";
  }

  async function drawPanel() {
    fail("");
    const inCode = !!code && code.mode === "code";
    LokiCriteria.render(code ? code.criteria : []);
    await drawWorkspace();
    if (!conv || !panelOpen()) return;
    if (inCode && workspace && workspace.exists) {
      await LokiFileTree.load(conv, openFile);
      await LokiFileViewer.reload();
    } else {
      LokiFileTree.load(null);
      const ul = $("file-tree");
      ul.textContent = "";
      LokiDialog.emptyRow(ul, inCode ? "No workspace yet." : "The files are shown in code mode.");
    }
  }

  async function createWorkspace(ev) {
    ev.preventDefault();
    const source = $("code-ws-form").elements.namedItem("clone_from").value.trim();
    const body = { project: projectOf() };
    if (source) body.clone_from = source;
    const btn = $("code-ws-create");
    btn.setAttribute("aria-busy", "true");
    LokiDialog.error("code-ws-error", "");
    try {
      workspace = await LokiApi.apiJSON("/api/workspace", { method: "POST", json: body });
      $("code-ws-form").elements.namedItem("clone_from").value = "";
      if (switchAfterCreate) { switchAfterCreate = false; await switchMode("code"); }
      else await drawPanel();
    } catch (e) {
      LokiDialog.error("code-ws-error", e);
    } finally {
      btn.removeAttribute("aria-busy");
    }
  }

  // ---- the viewer in the panel -----------------------------------------------------------
  function openFile(path) {
    $("code-panel").classList.add("viewing");
    LokiFileViewer.open(conv, path);
    $("file-back").focus();
  }

  function viewerClosed(path) {
    $("code-panel").classList.remove("viewing");
    if (!path) return;
    for (const b of $("file-tree").querySelectorAll("button.tree-file")) {
      if (b.dataset.path === path) { b.focus(); return; }
    }
  }

  // ---- what the page tells ---------------------------------------------------------------
  async function refresh() {
    const id = conv;
    if (!id) { code = null; drawSwitch(); return; }
    try {
      const st = await LokiApi.apiJSON("/api/chat/mode?conversation=" + enc(id));
      if (id !== conv) return;
      code = st;
    } catch (e) {
      if (id !== conv) return;
      code = null; // no chat service answering code mode: no switch
    }
    drawSwitch();
    const inCode = !!code && code.mode === "code";
    if (inCode && !panelOpen() && wide() && localStorage.getItem(PREF) !== "closed") openPanel();
    else if (panelOpen()) {
      if (!code || (!inCode && !switchAfterCreate)) closePanel(false);
      else await drawPanel();
    }
  }

  // A conversation was opened (null: none).
  function opened(id) {
    if (id === conv) return;
    conv = id;
    code = null;
    workspace = null;
    switchAfterCreate = false;
    if (LokiFileViewer.current()) LokiFileViewer.close();
    LokiCriteria.reset();
    LokiFileTree.load(null);
    drawSwitch();
    if (panelOpen() && !id) closePanel(false);
    refresh();
  }

  // A display event (`mode_changed`, `criteria`) or a turn's end (null).
  function changed(loki) {
    if (loki && loki.event === "criteria" && code && Array.isArray(loki.criteria)) {
      code.criteria = loki.criteria;
      LokiCriteria.render(code.criteria);
    }
    clearTimeout(timer);
    timer = setTimeout(refresh, 300);
  }

  function setup() {
    $("mode-btn").onclick = toggleMode;
    $("code-panel-btn").onclick = () => (panelOpen() ? closePanel(true) : openPanel());
    $("code-close").onclick = () => closePanel(true);
    $("code-refresh").onclick = () => refresh();
    $("code-ws-form").onsubmit = createWorkspace;
    LokiCriteria.setup(() => conv, (st) => { code = st; LokiCriteria.render(st.criteria); });
    LokiFileViewer.setup(viewerClosed);
    document.addEventListener("keydown", (ev) => {
      if (ev.key !== "Escape" || !panelOpen() || wide()) return;
      if (document.querySelector("dialog[open]")) return;
      if (LokiFileViewer.current()) LokiFileViewer.close(); else closePanel(true);
    });
    const open = window.LokiApi && LokiApi.conversation();
    if (open) opened(open);
  }

  setup();
  return { opened, changed, refresh };
})();
