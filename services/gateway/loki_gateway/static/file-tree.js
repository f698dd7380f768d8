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

  // Fills `ul` with the entries under `path` (drawn at once when they come: a reload does
  // not flicker, and the focus stays on the button of the same path); the opened directories
  // among them are filled too.
  async function fill(ul, path, gen) {
    if (!ul.children.length) ul.append(el("li", "hint", "Loading…"));
    let reply;
    try { reply = await list(path); }
    catch (e) {
      if (gen !== generation) return;
      ul.textContent = "";
      ul.append(el("li", "error", "Not listed: " + e.message));
      return;
    }
    if (gen !== generation) return;
    const focused = ul.contains(document.activeElement) ? document.activeElement.dataset.path : null;
    ul.textContent = "";
    const entries = reply.entries || [];
    if (!entries.length) ul.append(el("li", "hint", path === "." ? "The workspace is empty." : "(empty)"));
    const opening = [];
    for (const e of entries) {
      const li = el("li");
      li.dataset.path = e.path;
      if (e.kind === "dir") {
        const b = el("button", "tree-dir");
        b.type = "button";
        b.setAttribute("aria-expanded", "false");
        const twisty = el("span", "twisty", "▸");
        twisty.setAttribute("aria-hidden", "true");
        b.append(twisty, el("span", "name", base(e.path) + "/"));
        b.dataset.path = e.path;
        const sub = el("ul", "file-tree");
        sub.hidden = true;
        sub.setAttribute("aria-label", "Files in " + e.path);
        b.onclick = () => toggle(b, sub, e.path);
        li.append(b, sub);
        if (expanded.has(e.path)) opening.push([b, sub, e.path]);
      } else {
        const b = el("button", "tree-file");
        b.type = "button";
        b.dataset.path = e.path;
        b.append(el("span", "name", base(e.path) + (e.kind === "symlink" ? " →" : "")));
        if (e.kind === "file") b.append(el("span", "size", size(e.size || 0)));
        b.setAttribute("aria-label", "Open " + e.path);
        b.onclick = () => onOpen(e.path, b);
        li.append(b);
      }
      ul.append(li);
    }
    if (reply.truncated) ul.append(el("li", "hint", "More files are not listed here."));
    if (focused) refocus(ul, focused);
    await Promise.all(opening.map(([b, sub, p]) => open(b, sub, p, gen)));
  }

  function refocus(ul, path) {
    for (const b of ul.querySelectorAll("button[data-path]")) if (b.dataset.path === path) { b.focus(); return; }
  }

  async function open(button, sub, path, gen) {
    button.setAttribute("aria-expanded", "true");
    button.querySelector(".twisty").textContent = "▾";
    sub.hidden = false;
    await fill(sub, path, gen);
  }

  function toggle(button, sub, path) {
    if (button.getAttribute("aria-expanded") === "true") {
      button.setAttribute("aria-expanded", "false");
      button.querySelector(".twisty").textContent = "▸";
      sub.hidden = true;
      expanded.delete(path);
      return;
    }
    expanded.add(path);
    open(button, sub, path, generation);
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
