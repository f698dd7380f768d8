// The Code panel's file viewer (issue 43): a workspace file, read-only, with its syntax
// colours, from GET /api/chat/files/content. The gateway colours it with Pygments (spans with
// class names, the text escaped; the colours in /code-colours.css); the HTML is passed through
// DOMPurify keeping only <span class> before it is shown. A binary file says its type; a long
// one is cut and says where. "← Files" goes back to the tree, on the file's own button.
// Uses window.LokiApi (app.js), DOMPurify (vendor/purify.min.js); window.LokiFileViewer,
// driven by code-panel.js (which hides the other sections while a file is shown).
"use strict";

window.LokiFileViewer = (function () {
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  let shown = null; // {conversation, path}
  let onClose = () => {};
  let asked = 0;

  function size(n) {
    if (n < 1024) return n + " B";
    if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " kB";
    return (n / 1024 / 1024).toFixed(1) + " MB";
  }

  function safe(html) {
    if (!window.DOMPurify) return null;
    return DOMPurify.sanitize(html, { ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"] });
  }

  function draw(view) {
    const code = $("file-view-code");
    const note = $("file-view-note");
    if (view.binary) {
      $("file-view-meta").textContent = "Binary file · " + (view.mime || "unknown type") + " · " + size(view.size || 0);
      code.hidden = true;
      code.textContent = "";
    } else {
      const lines = view.total_lines || view.last_line || 0;
      $("file-view-meta").textContent = (view.language || "Text") + " · " + lines + " line" + (lines === 1 ? "" : "s") + " · " + size(view.size || 0);
      code.hidden = false;
      const html = safe(view.html || "");
      if (html === null) code.textContent = view.text || "";
      else code.innerHTML = html;
      code.dataset.language = view.language || "";
    }
    note.textContent = view.note || "";
    note.hidden = !view.note;
  }

  // Shows `path` of `conversation`'s workspace (reloaded when it is shown already).
  async function open(conversation, path) {
    const mine = ++asked;
    shown = { conversation, path };
    $("file-view").hidden = false;
    $("file-view-title").textContent = path;
    $("file-view-meta").textContent = "Loading…";
    try {
      const view = await LokiApi.apiJSON("/api/chat/files/content?conversation=" + enc(conversation) + "&path=" + enc(path));
      if (mine !== asked) return;
      draw(view);
    } catch (e) {
      if (mine !== asked) return;
      $("file-view-meta").textContent = "";
      $("file-view-code").textContent = "";
      $("file-view-code").hidden = true;
      $("file-view-note").textContent = "Not shown: " + e.message;
      $("file-view-note").hidden = false;
    }
  }

  function close() {
    const was = shown;
    shown = null;
    asked++;
    $("file-view").hidden = true;
    onClose(was ? was.path : null);
  }

  function reload() { return shown ? open(shown.conversation, shown.path) : Promise.resolve(); }

  function setup(closed) {
    onClose = closed;
    $("file-back").onclick = close;
  }

  return { open, close, reload, setup, current: () => shown };
})();
