// The Code panel's file tree (issue 43): the workspace of the open conversation's project,
// read from GET /api/chat/files one directory at a time (depth 1): a directory is a button
// (aria-expanded) whose entries are fetched the first time it is opened; a file is a button
// that opens it in the viewer (file-viewer.js). Directories first, .git never shown (the
// gateway leaves it out). A reload (end of a turn, Refresh) keeps the opened directories open.
// Uses window.LokiApi (app.js); window.LokiFileTree, driven by code-panel.js.
"use strict";

window.LokiFileTree = (function () {
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  let conversation = null;
  let onOpen = () => {};
  const expanded = new Set(); // directory paths the person opened
  let generation = 0; // a newer load makes the older answers moot

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const base = (path) => path.split("/").pop();

  function size(n) {
    if (n < 1024) return n + " B";
    if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " kB";
    return (n / 1024 / 1024).toFixed(1) + " MB";
  }

  async function list(path) {
    const q = "/api/chat/files?conversation=" + enc(conversation) + "&path=" + enc(path) + "&depth=1";
    return LokiApi.apiJSON(q);
  }

  // The entries under `path` and, for each opened directory among them, its own (fetched
  // before anything is drawn: a reload never flickers): {reply, subs: Map(path -> same)}.
  async function fetchTree(path) {
    const reply = await list(path);
    const open = (reply.entries || []).filter((e) => e.kind === "dir" && expanded.has(e.path));
    const subs = await Promise.all(open.map(async (e) => {
      try { return [e.path, await fetchTree(e.path)]; } catch (err) { return [e.path, { error: err }]; }
    }));
    return { reply, subs: new Map(subs) };
  }

  // Fills `ul` with the entries under `path`, the focus kept on the button of the same path.
  async function fill(ul, path, gen) {
    if (!ul.children.length) ul.append(el("li", "hint", "Loading…"));
    let data;
    try { data = await fetchTree(path); }
    catch (e) { data = { error: e }; }
    if (gen !== generation) return;
    const focused = ul.contains(document.activeElement) ? document.activeElement.dataset.path : null;
    draw(ul, path, data);
    if (focused) refocus(ul, focused);
  }

  function draw(ul, path, data) {
    ul.textContent = "";
    if (data.error) { ul.append(el("li", "error", "Not listed: " + data.error.message)); return; }
    const entries = data.reply.entries || [];
    if (!entries.length) ul.append(el("li", "hint", path === "." ? "The workspace is empty." : "(empty)"));
    for (const e of entries) {
      const li = el("li");
      li.dataset.path = e.path;
      if (e.kind === "dir") {
        const b = el("button", "tree-dir");
        b.type = "button";
        const twisty = el("span", "twisty");
        twisty.setAttribute("aria-hidden", "true");
        b.append(twisty, el("span", "name", base(e.path) + "/"));
        b.dataset.path = e.path;
        const sub = el("ul", "file-tree");
        sub.setAttribute("aria-label", "Files in " + e.path);
        b.onclick = () => toggle(b, sub, e.path);
        li.append(b, sub);
        const inner = data.subs.get(e.path);
        shown(b, sub, !!inner);
        if (inner) draw(sub, e.path, inner);
      } else {
        const b = el("button", "tree-file");
        b.type = "button";
        b.dataset.path = e.path;
        b.append(el("span", "name", base(e.path) + (e.kind === "symlink" ? " →" : "")));
        if (e.kind === "file") b.append(el("span", "size", size(e.size || 0)));
        b.title = e.path;
        b.onclick = () => onOpen(e.path, b);
        li.append(b);
      }
      ul.append(li);
    }
    if (data.reply.truncated) ul.append(el("li", "hint", "More files are not listed here."));
  }

  function refocus(ul, path) {
    for (const b of ul.querySelectorAll("button[data-path]")) if (b.dataset.path === path) { b.focus(); return; }
  }

  // A directory's button and list, open or closed.
  function shown(button, sub, open) {
    button.setAttribute("aria-expanded", String(open));
    button.querySelector(".twisty").textContent = open ? "▾" : "▸";
    sub.hidden = !open;
  }

  function toggle(button, sub, path) {
    const open = button.getAttribute("aria-expanded") !== "true";
    shown(button, sub, open);
    if (!open) { expanded.delete(path); return; }
    expanded.add(path);
    fill(sub, path, generation);
  }

  // The tree of `conv` (null: empty), its opened directories kept when it is the same one.
  function load(conv, opener) {
    if (opener) onOpen = opener;
    if (conv !== conversation) expanded.clear();
    conversation = conv;
    generation++;
    const root = $("file-tree");
    if (!conv) { root.textContent = ""; return Promise.resolve(); }
    return fill(root, ".", generation);
  }

  return { load };
})();
